"""``h5batch.hf.to_dataset`` on a real converted file: the ``datasets`` rows are what
H5Dataset yields, with ClassLabel / Image / string features; the cache follows the file
(a synced file is read again); streaming gives the same rows; and why the ``hdf5`` packaged
loader is not the way in."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from h5batch.hf import to_dataset
from h5batch.torch import H5Dataset
from tests.test_export import annotated, converted  # noqa: F401  -- module fixture: a real converted file

datasets = pytest.importorskip("datasets")


def assert_rows_equal(rows, path, split: str, *, as_float: bool = False) -> None:
    ref = H5Dataset(path, split, as_float=as_float, with_source=True)
    rows = list(rows)
    assert len(rows) == len(ref) > 0
    for i, row in enumerate(rows):
        s = ref[i]
        audio = np.asarray(row["audio"]["array"])
        assert row["audio"]["sampling_rate"] == 16000
        np.testing.assert_array_equal(audio, s["audio"].numpy())
        assert np.asarray(row["image"]).shape == (32, 32, 3)
        img = s["image"].numpy()
        got = np.asarray(row["image"])
        np.testing.assert_array_equal(got.astype(np.float32) / np.float32(255) if as_float else got, img)
        assert row["label"] == int(s["label"]) and row["caption"] == s["caption"]
        assert np.float32(row["loudness"]) == s["loudness"].numpy() and row["kind"] == int(s["kind"])
        assert list(row["source"]) == list(s["source"])
        assert [row["xy"]["x"], row["xy"]["y"]] == s["xy"].tolist()
        assert [row["tags"]["is_a"], row["tags"]["is_b"]] == s["tags"].tolist()


def test_rows_equal_the_readers_samples_with_named_features(annotated, tmp_path):  # noqa: F811
    dd = to_dataset(annotated, cache_dir=tmp_path / "hf")
    assert isinstance(dd, datasets.DatasetDict)
    with h5py.File(annotated) as f:
        cats = [x.decode() if isinstance(x, bytes) else str(x) for x in f["train"]["kind"].attrs["categories"]]
    names = list(H5Dataset(annotated).class_names)
    for split, ds in dd.items():
        feats = ds.features
        assert isinstance(feats["label"], datasets.ClassLabel) and feats["label"].names == names
        assert isinstance(feats["kind"], datasets.ClassLabel) and feats["kind"].names == cats
        assert isinstance(feats["image"], datasets.Image)
        assert feats["caption"] == datasets.Value("string") and feats["loudness"] == datasets.Value("float32")
        assert feats["audio"]["array"].feature == datasets.Value("int16")
        assert feats["xy"] == {"x": datasets.Value("float32"), "y": datasets.Value("float32")}
        assert feats["tags"] == {"is_a": datasets.Value("uint8"), "is_b": datasets.Value("uint8")}
        assert ds.data.column("audio").type.field("array").type.value_type == "int16"  # stored as int16
        assert len(ds) == len(H5Dataset(annotated, split))
        assert_rows_equal(ds, annotated, split)
    one = to_dataset(annotated, "test", cache_dir=tmp_path / "hf")
    assert isinstance(one, datasets.Dataset) and one.split == "test"
    assert one.cache_files == dd["test"].cache_files  # same file, same arguments: the cache is reused


def test_a_changed_file_is_read_again(annotated, tmp_path):  # noqa: F811
    synced = tmp_path / "synced.h5"
    shutil.copy(annotated, synced)
    before = to_dataset(synced, "train", cache_dir=tmp_path / "hf")
    n = len(before)
    with h5py.File(synced, "r+") as f:  # what `h5batch sync` leaves for a removed file
        f["train"].create_dataset("tombstones", data=np.array([0, 2], dtype=np.int64))
        gone = set(f["train"]["source"].asstr()[[0, 2], 0])
    after = to_dataset(synced, "train", cache_dir=tmp_path / "hf")
    assert len(after) == n - 2 and after.cache_files != before.cache_files
    assert not {row["source"][0] for row in after} & gone
    assert_rows_equal(after, synced, "train")


def test_streaming_and_float_audio(annotated, tmp_path):  # noqa: F811
    it = to_dataset(annotated, "test", streaming=True)
    assert isinstance(it, datasets.IterableDataset)
    assert_rows_equal(it, annotated, "test")
    flt = to_dataset(annotated, "test", as_float=True, cache_dir=tmp_path / "hf")
    assert flt.features["audio"]["array"].feature == datasets.Value("float32")
    assert_rows_equal(flt, annotated, "test", as_float=True)
    sub = to_dataset(annotated, "test", fields=["caption"], cache_dir=tmp_path / "hf")
    assert set(sub.features) == {"caption", "label", "source"}  # the source stays: it names the sample


def test_the_hdf5_packaged_loader_does_not_fit_the_layout(annotated, tmp_path):  # noqa: F811
    """The reason the bridge exists: datasets' own ``hdf5`` loader takes the file as one
    table of equal-length datasets, which an h5batch file is not."""
    import hdf5plugin  # noqa: F401  -- the loader's h5py needs the plugin codecs too

    with pytest.raises(datasets.exceptions.DatasetGenerationError) as e:
        datasets.load_dataset("hdf5", data_files={"train": str(annotated)}, cache_dir=str(tmp_path / "l"))
    assert "expected length" in str(e.value.__cause__)


def test_unlabelled_paired_audio_with_a_channel_axis(tmp_path):
    """Two audio fields, one of them (T, 1): no label column, a list of sources, and the
    channel axis kept (a list of frames of C values)."""
    from h5batch import generate
    from h5batch.config import load_job
    from tests.conftest import REPO

    generate.make_paired_audio(tmp_path / "corpus", n_train=4, n_test=2, seconds=0.25)
    out = tmp_path / "paired.h5"
    converted(load_job(REPO / "jobs" / "paired_audio.yaml",
                       [f"output.path={out}", f"source.root={tmp_path / 'corpus'}", "cluster.workers=1",
                        "fields.data.channels=keep"]))
    for streaming in (False, True):
        ds = to_dataset(out, "train", cache_dir=tmp_path / "hf", streaming=streaming)
        assert set(ds.features) == {"data", "target", "source"}
        assert ds.features["data"]["array"].feature == datasets.List(datasets.Value("int16"), length=1)
        ref = H5Dataset(out, "train", as_float=False, with_source=True)
        rows = list(ds)
        assert len(rows) == len(ref) == 4
        for i, row in enumerate(rows):
            assert np.array_equal(np.asarray(row["data"]["array"], dtype=np.int16), ref[i]["data"].numpy())
            assert np.array_equal(np.asarray(row["target"]["array"], dtype=np.int16), ref[i]["target"].numpy())
            assert list(row["source"]) == list(ref[i]["source"])
