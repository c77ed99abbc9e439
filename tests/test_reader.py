"""h5batch.torch.H5Dataset and collate on real files made by the real converter."""

from __future__ import annotations

import pickle
import shutil
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5batch import ConvertOptions, convert, generate
from h5batch.config import load_job
from h5batch.fields import decode_field
from h5batch.torch import Batch, ChunkShuffleSampler, Collate, H5Dataset, collate
from tests.support.memory import rss_over_epoch

REPO = Path(__file__).resolve().parents[1]
SMALL_CHUNKS = "output.chunk_bytes=65536"  # several chunks even in tiny files


def make_h5(job_name: str, out: Path, corpus: Path, *overrides: str):
    """Convert ``corpus`` with ``jobs/<job_name>`` into ``out``; returns the job config."""
    job = load_job(REPO / "jobs" / job_name,
                   [f"output.path={out}", f"source.root={corpus}", "cluster.workers=1", *overrides])
    convert(job, ConvertOptions(progress=False))
    return job


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Labelled demo file: variable int16 audio, fixed (64, 64, 3) uint8 images."""
    d = tmp_path_factory.mktemp("reader-demo")
    generate.make_demo_corpus(d / "corpus", per_class=10)
    job = make_h5("demo.yaml", d / "demo.h5", d / "corpus", SMALL_CHUNKS)
    return d / "demo.h5", d / "corpus", job


@pytest.fixture(scope="module")
def demo_native(tmp_path_factory):
    """Demo corpus at native image size and (T, 1) audio: variable fields of rank 2 and 3."""
    d = tmp_path_factory.mktemp("reader-native")
    generate.make_demo_corpus(d / "corpus", per_class=4)
    job = make_h5("demo.yaml", d / "native.h5", d / "corpus", SMALL_CHUNKS,
                  "fields.image.size=null", "fields.audio.channels=keep")
    return d / "native.h5", d / "corpus", job


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """Unlabelled paired file with fixed-length int16 fields data/target."""
    d = tmp_path_factory.mktemp("reader-paired")
    generate.make_paired_audio(d / "corpus", n_train=40, n_test=4, seconds=0.25)
    job = make_h5("paired_audio.yaml", d / "paired.h5", d / "corpus", SMALL_CHUNKS,
                  "fields.data.length=3000", "fields.target.length=3000")
    return d / "paired.h5", d / "corpus", job


def reference(corpus: Path, job, sources, fields) -> dict[str, np.ndarray]:
    """Decode a sample's source files the way the converter does."""
    sources = (sources,) if isinstance(sources, str) else sources
    return {f: decode_field(str(corpus / p), job.fields[f]) for f, p in zip(fields, sources, strict=True)}


def as_float(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.int16:
        return a.astype(np.float32) * np.float32(1 / 32768)
    return a.astype(np.float32) / np.float32(255)


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("fixture", ["demo", "paired", "demo_native"])
def test_every_sample_equals_its_decoded_source(fixture, request):
    path, corpus, job = request.getfixturevalue(fixture)
    names = list(job.fields)
    for split in ("train", "test"):
        raw = H5Dataset(path, split, as_float=False, with_source=True)
        flt = H5Dataset(path, split)
        assert len(raw) == len(flt) > 0
        with h5py.File(path, "r") as f:
            labels = f[split]["label"][...] if "label" in f[split] else None
        for i in range(len(raw)):
            s, x = raw[i], flt[i]
            ref = reference(corpus, job, s["source"], names)
            for name in names:
                assert s[name].numpy().dtype == ref[name].dtype
                assert np.array_equal(s[name].numpy(), ref[name]), (split, i, name)
                assert x[name].dtype == torch.float32
                assert np.array_equal(x[name].numpy(), as_float(ref[name])), (split, i, name)
            if labels is None:
                assert "label" not in s
            else:
                assert s["label"].dtype == torch.int64 and s["label"].dim() == 0
                assert int(s["label"]) == labels[i]
                assert raw.class_names[labels[i]] == s["source"][0].split("/")[1]


def test_getitems_equals_getitem_any_order_with_duplicates(demo, paired):
    rng = np.random.default_rng(1)
    for path in (demo[0], paired[0]):
        for kw in ({}, {"as_float": False}, {"channels_first": True}, {"direct_chunks": False}):
            ds = H5Dataset(path, "train", with_source=True, **kw)
            idx = [*rng.integers(0, len(ds), 20).tolist(), 3, 3, -1, 0]
            batch = ds.__getitems__(idx)
            assert isinstance(batch, Batch) and len(batch) == len(idx)
            for j, i in enumerate(idx):
                one = ds[i]
                assert batch[j].keys() == one.keys()
                for k, v in one.items():
                    if isinstance(v, torch.Tensor):
                        assert torch.equal(batch[j][k], v), (path.name, kw, i, k)
                    else:
                        assert batch[j][k] == v


def _read_both_ways(path, **other) -> tuple[H5Dataset, H5Dataset]:
    """Read every sample (in reverse) with the default reader and with ``other`` options;
    assert the batches are equal; return both datasets (their stores show the paths taken)."""
    fast = H5Dataset(path, "train", as_float=False)
    slow = H5Dataset(path, "train", as_float=False, **other)
    everything = list(range(len(fast)))[::-1]
    a, b = collate(fast.__getitems__(everything)), collate(slow.__getitems__(everything))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    return fast, slow


def test_direct_chunk_reads_agree_with_hdf5_and_are_used(demo):
    direct, hdf5 = _read_both_ways(demo[0], direct_chunks=False)
    stores = direct._stores
    assert stores["image"].direct and stores["audio"].direct
    assert stores["image"].verified and stores["audio"].verified
    assert not any(s.direct for s in hdf5._stores.values())


def test_uncompressed_chunks_are_used_in_place(paired):
    """codec none (auto's choice for this noise): chunks are views of a file mapping."""
    path = paired[0]
    with h5py.File(path) as f:
        assert f["train/data"].attrs["codec"] == "none"
    mapped, plain = _read_both_ways(path, mmap=False)
    store = mapped._stores["data"]
    assert store.mapping is not None and "mapped" in store.verified and store.loads > 0
    assert all(s.mapping is None for s in plain._stores.values())


@pytest.mark.parametrize("codec", ["gzip", "lzf"])
def test_other_codecs_read_the_same(codec, demo, tmp_path):
    path, corpus, _ = demo
    out = tmp_path / f"{codec}.h5"
    make_h5("demo.yaml", out, corpus, SMALL_CHUNKS, f"output.codec={codec}")
    ref = collate(H5Dataset(path, "train").__getitems__(range(24)))
    ds = H5Dataset(out, "train")
    got = collate(ds.__getitems__(range(24)))
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    # gzip = shuffle + deflate is decoded in Python; lzf has no Python decoder here.
    assert ds._stores["image"].direct == (codec == "gzip")


# ------------------------------------------------------------------------------ collate


def test_collate_pads_variable_fields_and_stacks_fixed(demo):
    ds = H5Dataset(demo[0], "train", with_source=True)
    idx = [5, 0, 17, 9]
    out = collate(ds.__getitems__(idx))
    assert set(out) == {"audio", "audio_lengths", "image", "label", "source"}
    assert out["image"].shape == (4, 64, 64, 3) and out["image"].dtype == torch.float32
    lengths = out["audio_lengths"]
    assert lengths.dtype == torch.int64 and out["audio"].shape == (4, int(lengths.max()))
    for j, i in enumerate(idx):
        s = ds[i]
        n = int(lengths[j])
        assert torch.equal(out["audio"][j, :n], s["audio"])
        assert not out["audio"][j, n:].any()
        assert torch.equal(out["image"][j], s["image"])
        assert out["source"][j] == s["source"]
    listed = Collate(variable="list")(ds.__getitems__(idx))
    assert [t.shape[0] for t in listed["audio"]] == lengths.tolist()
    padded = Collate(pad_value=-2.0)(ds.__getitems__(idx))
    j = int(lengths.argmin())
    assert (padded["audio"][j, int(lengths[j]):] == -2.0).all()


def test_collate_of_rank_2_and_3_variable_fields(demo_native):
    ds = H5Dataset(demo_native[0], "train", channels_first=True)
    idx = [0, 3, 1]
    out = collate(ds.__getitems__(idx))
    assert out["image_lengths"].shape == (3, 3) and out["audio_lengths"].shape == (3, 2)
    for j, i in enumerate(idx):
        img = ds[i]["image"]
        c, h, w = img.shape
        assert c == 3 and out["image_lengths"][j].tolist() == [c, h, w]
        assert torch.equal(out["image"][j, :, :h, :w], img)
        assert not out["image"][j, :, h:, :].any() and not out["image"][j, :, :, w:].any()
        assert torch.equal(H5Dataset(demo_native[0], "train")[i]["image"], img.permute(1, 2, 0))


def test_transform_and_default_collate_still_work(demo):
    ds = H5Dataset(demo[0], "train", fields=["image"],
                   transform=lambda s: {"x": s["image"].mean(), "label": s["label"]})
    out = next(iter(DataLoader(ds, batch_size=5, collate_fn=collate)))
    assert out["x"].shape == (5,) and out["label"].shape == (5,)
    # torch's default collate stacks the per-sample dicts of a Batch.
    plain = H5Dataset(demo[0], "train", fields=["image"])
    default = next(iter(DataLoader(plain, batch_size=5)))
    ours = next(iter(DataLoader(plain, batch_size=5, collate_fn=collate)))
    assert default.keys() == ours.keys()
    for k in ours:
        assert torch.equal(default[k], ours[k])


# ------------------------------------------------------------- processes and pickling


def test_pickles_without_handles_after_use(demo):
    ds = H5Dataset(demo[0], "train", with_source=True)
    first = ds[3]
    assert ds._file is not None
    payload = pickle.dumps(ds)
    assert b"h5py" not in payload and len(payload) < 20_000
    clone = pickle.loads(payload)
    assert clone._file is None and clone._stores == {} and clone._index == {}
    again = clone[3]
    assert torch.equal(again["image"], first["image"]) and again["source"] == first["source"]
    ds.close()
    assert ds._file is None and torch.equal(ds[3]["audio"], first["audio"])


@pytest.mark.parametrize("shared", [None, False])
def test_two_workers_yield_every_sample_once_per_epoch(demo, shared):
    path = demo[0]
    ds = H5Dataset(path, "train", with_source=True, shared_memory=shared)
    ds[0]  # opened in the parent first: the forked workers must reopen
    with h5py.File(path, "r") as f:
        expected = Counter(tuple(r) for r in f["train"]["source"].asstr()[...])
        labels = dict(zip((tuple(r) for r in f["train"]["source"].asstr()[...]), f["train"]["label"][...], strict=True))
    sampler = ChunkShuffleSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=7, sampler=sampler, num_workers=2, collate_fn=collate,
                        persistent_workers=True)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen: Counter = Counter()
        for b in loader:
            assert b["image"].shape[0] == len(b["source"]) == b["label"].shape[0]
            for src, lab in zip(b["source"], b["label"].tolist(), strict=True):
                seen[src] += 1
                assert labels[src] == lab
        assert seen == expected


def test_spawned_worker_reads_the_same(paired):
    ds = H5Dataset(paired[0], "test", with_source=True)
    ref = collate(ds.__getitems__(range(len(ds))))
    loader = DataLoader(ds, batch_size=len(ds), num_workers=1, collate_fn=collate,
                        multiprocessing_context="spawn")
    (got,) = list(loader)
    assert got["source"] == ref["source"]
    for k in ("data", "target"):
        assert torch.equal(got[k], ref[k])


@pytest.fixture(scope="module")
def many_small(tmp_path_factory):
    """A few thousand small samples (3000 x 2 x 4000 int16 = 48 MB decoded)."""
    d = tmp_path_factory.mktemp("reader-rss")
    generate.make_paired_audio(d / "corpus", n_train=3000, n_test=1, seconds=0.25)
    make_h5("paired_audio.yaml", d / "rss.h5", d / "corpus",
            "fields.data.length=4000", "fields.target.length=4000", "cluster.batch_size=256")
    return d / "rss.h5"


def test_worker_rss_is_flat_over_an_epoch(many_small):
    """No growth from one epoch to the next. Within an epoch the decoded-chunk cache's
    content (and so the RSS) moves with the chunks of the current window: measured with
    the stratified order, +21 MiB from batch ~100 on, the same in every epoch. So the
    baseline is the end of a first epoch, and the second must end where it did."""
    ds = H5Dataset(many_small, "train")
    assert len(ds) == 3000
    loader = DataLoader(ds, batch_size=16, sampler=ChunkShuffleSampler(ds, seed=1),
                        num_workers=2, collate_fn=collate, persistent_workers=True)

    def two_epochs():
        for _ in range(2):
            yield from loader

    report = rss_over_epoch(two_epochs(), warmup=188)
    assert report.batches == 2 * 188 and len(report.workers) == 2
    for pid, (warm, end) in report.workers.items():
        assert end <= 1.05 * warm, f"worker {pid}: RSS {warm >> 20} MiB after epoch 1 -> {end >> 20} MiB after epoch 2"


# -------------------------------------------------------------------------------- errors


def test_clear_errors(demo, tmp_path):
    path = demo[0]
    with pytest.raises(KeyError, match="splits: test, train"):
        H5Dataset(path, "val")
    with pytest.raises(KeyError, match="fields: audio, image"):
        H5Dataset(path, "train", fields=["audio", "nope"])
    ds = H5Dataset(path, "train", locking=False)
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    with pytest.raises(IndexError):
        ds.__getitems__([0, -len(ds) - 1])
    assert torch.equal(ds[-1]["image"], ds[len(ds) - 1]["image"])
    partial = tmp_path / "partial.h5"
    shutil.copy(path, partial)
    with h5py.File(partial, "r+") as f:
        f.attrs["complete"] = False
    with pytest.raises(ValueError, match="not complete"):
        H5Dataset(partial)
