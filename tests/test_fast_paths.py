"""The fast paths, checked on content with a real LocalCluster.

* Rejected items and a decode that hangs leave every other sample exact.
* ``codec: auto`` compresses a field only where a trial shows it pays: here the noise
  field is stored uncompressed (chunks written straight from shared memory) and the
  mostly silent field with Blosc2-LZ4.

Every output is compared sample by sample with the source files, and the outputs of the
different paths with each other.
"""

from __future__ import annotations

import io
import re

import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import ConvertOptions, convert
from h5batch.config import job_from_dict
from tests.support.h5compare import assert_same_h5

SR = 16000
LENGTH = 3000  # frames stored per sample
N = 30  # pairs in train
BAD_TRUNCATED = 5  # data/5.wav cut short inside its data chunk: the pair is rejected
BAD_GARBAGE = 9  # label/9.wav is not audio: the pair is rejected
SHORT = 10  # data/10.wav has 1000 frames: zero-padded to LENGTH
HANG = 17  # the hang test's file


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """root/train/{data,label}/N.wav; returns (root, expected {N: (data, target)})."""
    root = tmp_path_factory.mktemp("fast") / "corpus"
    rng = np.random.default_rng(3)
    expected = {}
    for i in range(N):
        frames = 1000 if i == SHORT else LENGTH + 500
        noise = rng.integers(-20000, 20000, size=frames, dtype=np.int16)
        clean = np.zeros(frames, dtype=np.int16)
        clean[100:400] = (3000 * np.sin(np.arange(300) * 0.05 * (i + 1))).astype(np.int16)
        for folder, x in (("data", noise), ("label", clean)):
            d = root / "train" / folder
            d.mkdir(parents=True, exist_ok=True)
            sf.write(d / f"{i}.wav", x, SR, subtype="PCM_16")
        pad = lambda x: np.pad(x[:LENGTH], (0, max(0, LENGTH - len(x))))  # noqa: E731
        expected[i] = (pad(noise), pad(clean))
    raw = (root / "train" / "data" / f"{BAD_TRUNCATED}.wav").read_bytes()
    (root / "train" / "data" / f"{BAD_TRUNCATED}.wav").write_bytes(raw[:2000])
    (root / "train" / "label" / f"{BAD_GARBAGE}.wav").write_bytes(b"RIFF" + bytes(rng.integers(0, 255, 3000, dtype=np.uint8)))
    for bad in (BAD_TRUNCATED, BAD_GARBAGE):
        del expected[bad]
    return root, expected


def _convert(root, out, codec: str, **cluster):
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": LENGTH}
    job = job_from_dict({
        "name": "fast",
        "source": {"root": str(root), "layout": "paired_folders"},
        "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
        # prefer size: auto then compresses what shrinks (the silences) whatever its decode speed
        "output": {"path": str(out), "codec": codec, "chunk_bytes": 4 * 2 * LENGTH, "overwrite": True,
                   **({"prefer": "size"} if codec == "auto" else {})},
        "cluster": {"kind": "local", "workers": 2, "batch_size": 8, "dashboard": False, **cluster},
        "policy": {"max_reject_fraction": 0.5, "decode_timeout": 1.0},
    }, file="<test>")
    log = io.StringIO()
    summary = convert(job, ConvertOptions(overwrite=True, progress=False, log=log))
    return summary, log.getvalue()


def _check_content(out, expected):
    with h5py.File(out, "r") as f:
        g = f["train"]
        names = [int(p.split("/")[-1][:-4]) for p in g["source"].asstr()[:, 0]]
        assert names == sorted(expected)
        for row, i in enumerate(names):
            np.testing.assert_array_equal(g["data"][row], expected[i][0])
            np.testing.assert_array_equal(g["target"][row], expected[i][1])
        rejected = set(f["rejects"]["path"].asstr()[:])
    return rejected


@pytest.fixture(scope="module")
def outputs(corpus, tmp_path_factory):
    root, _ = corpus
    d = tmp_path_factory.mktemp("fast-out")
    return {
        "auto": _convert(root, d / "auto.h5", "auto"),
        "none": _convert(root, d / "none.h5", "none"),
        # compress_on: workers (older job files) is ignored: the writer compresses.
        "lz4-writer": _convert(root, d / "lz4w.h5", "blosc2-lz4", compress_on="writer"),
        "lz4-workers": _convert(root, d / "lz4k.h5", "blosc2-lz4", compress_on="workers"),
    }


def test_every_path_stores_the_source_exactly(corpus, outputs):
    _, expected = corpus
    for name, (summary, _) in outputs.items():
        rejected = _check_content(summary.path, expected)
        assert rejected == {f"train/data/{BAD_TRUNCATED}.wav", f"train/label/{BAD_TRUNCATED}.wav",
                            f"train/data/{BAD_GARBAGE}.wav", f"train/label/{BAD_GARBAGE}.wav"}, name


def test_auto_stores_noise_raw_and_silence_compressed(outputs):
    summary, log = outputs["auto"]
    assert "data: none" in log and "target: blosc2-lz4" in log, log
    with h5py.File(summary.path, "r") as f:
        data, target = f["train/data"], f["train/target"]
        assert data.compression is None and not data._filters
        assert "32026" in target._filters  # the Blosc2 plugin filter
        assert data.attrs["codec"] == "none" and target.attrs["codec"].startswith("blosc2-lz4")
        # 30 items, each field with one undecodable file: 29 trial samples
        ratios = {}
        for name, ds in (("data", data), ("target", target)):
            m = re.fullmatch(r"auto: blosc2-lz4 shrank 29 trial samples spread over the corpus "
                             r"([0-9.]+)x; threshold 1.15x", ds.attrs["codec_choice"])
            assert m, ds.attrs["codec_choice"]
            ratios[name] = float(m.group(1))
        assert ratios["data"] < 1.15 <= ratios["target"]
        # the uncompressed chunks hold exactly the rows (nothing but the data on disk)
        assert data.id.get_storage_size() == data.chunks[0] * LENGTH * 2 * -(-data.shape[0] // data.chunks[0])
    shown = inspect_text(summary.path)
    assert "why this codec: auto: blosc2-lz4 shrank 29 trial samples" in shown
    none_summary, _ = outputs["none"]
    with h5py.File(none_summary.path, "r") as f:
        assert f["train/target"].id.get_storage_size() > 2 * target_size(summary.path)


def inspect_text(path) -> str:
    from h5batch.tools.inspect import describe, render

    return render(describe(str(path)))


def target_size(path) -> int:
    with h5py.File(path, "r") as f:
        return f["train/target"].id.get_storage_size()


def test_compress_on_workers_is_ignored_with_a_warning(outputs):
    assert_same_h5(outputs["lz4-writer"][0].path, outputs["lz4-workers"][0].path)
    warning = "cluster.compress_on: workers is ignored: chunks are compressed in the writer"
    assert outputs["lz4-workers"][1].count(warning) == 1
    assert warning not in outputs["lz4-writer"][1]


def test_hung_decode_rejects_its_pair_and_keeps_the_rest(corpus, tmp_path, monkeypatch):
    """The hung file's pair is rejected and every other sample is still exact."""
    root, expected = corpus
    monkeypatch.setenv("H5BATCH_FAULTS", f"hang_on={HANG}.wav")  # the workers inherit it
    summary, log = _convert(root, tmp_path / "hang.h5", "none")
    expected = {k: v for k, v in expected.items() if k != HANG}
    rejected = _check_content(summary.path, expected)
    assert f"train/data/{HANG}.wav" in rejected and f"train/label/{HANG}.wav" in rejected


def test_auto_batch_size_from_the_first_samples(corpus, tmp_path):
    """~16 MB of decoded samples per task, at least 8 batches; an integer is kept."""
    from h5batch.conversion.auto import resolve
    from h5batch.layouts import discover

    root, _ = corpus
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR}
    base = {"name": "bs", "source": {"root": str(root), "layout": "paired_folders"},
            "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
            "output": {"path": str(tmp_path / "x.h5")}}
    job = job_from_dict(base, file="<test>")
    m = discover(job)
    auto = resolve(job, m)
    # variable length: sized from the decoded trial (3,500 frames x 2 bytes x 2 fields, one
    # short file) -> ~1,200 items per 16 MB, capped so 28 items still make 8 batches
    assert 13_000 < auto.item_bytes < 14_100
    assert auto.batch_size == 4
    assert "batch_size auto: 4 items per task" in " ".join(auto.describe(job))
    job = job_from_dict({**base, "cluster": {"batch_size": 8}}, file="<test>")
    assert resolve(job, m).batch_size == 8


def test_the_trial_leaves_no_thread_behind(corpus, tmp_path):
    """The trial's decode threads end with it: a process with a thread besides its main one
    may not fork (h5batch.forking.can_fork), and a later conversion or sync in the same
    process (a notebook's) would lose its forked writer, decoders and stat pass."""
    import threading

    from h5batch.conversion.auto import resolve
    from h5batch.layouts import discover

    root, _ = corpus
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": LENGTH}
    job = job_from_dict({"name": "threads", "source": {"root": str(root), "layout": "paired_folders"},
                         "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
                         "output": {"path": str(tmp_path / "x.h5")}}, file="<test>")
    m = discover(job)
    for _ in range(2):
        assert resolve(job, m).codecs["data"].samples > 0
        assert not [t for t in threading.enumerate() if t.name == "h5batch-trial"]


def test_trial_gives_up_on_a_file_that_hangs(corpus, tmp_path, monkeypatch):
    """The codec trial runs in the driver, before the workers' watchdog: a decode that
    hangs is abandoned after policy.decode_timeout and left out of the trial."""
    from h5batch.conversion.auto import resolve
    from h5batch.layouts import discover

    root, _ = corpus
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": LENGTH}
    job = job_from_dict({"name": "hang", "source": {"root": str(root), "layout": "paired_folders"},
                         "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
                         "output": {"path": str(tmp_path / "x.h5"), "prefer": "size"},
                         "policy": {"decode_timeout": 1.0}},
                        file="<test>")
    m = discover(job)
    normal = resolve(job, m).codecs["data"].samples
    monkeypatch.setenv("H5BATCH_FAULTS", "hang_on=0.wav")
    # item 0 is always a trial pick; its decode sleeps an hour, past this test's
    # pytest-timeout: a trial that waited for it fails the test
    hung = resolve(job, m)
    assert hung.codecs["data"].samples == normal - 1 and hung.codecs["target"].samples == normal - 1
    assert hung.codecs["data"].codec.name == "none" and hung.codecs["target"].codec.name == "blosc2-lz4"
