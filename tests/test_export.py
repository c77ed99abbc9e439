"""``h5batch export`` on real converted files: the files export converts back to the same
samples, WebDataset shards read back (with the webdataset package and with tarfile) hold
what H5Dataset yields, tombstoned rows are left out, and what cannot be exported is named."""

from __future__ import annotations

import csv
import io
import json
import shutil
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch import ConvertOptions, convert, generate
from h5batch.cli import main
from h5batch.config import job_from_dict
from h5batch.export import TARGETS, ExportError, export
from h5batch.torch import H5Dataset

CAPTIONS = ("a tone, a shape", "naïve “quotes”, commas", "line one\nline two")


def converted(job) -> None:
    """``convert(job)``, the driver's cached versions dropped first: the preflight compares
    the driver's source digest (cached per process) with each worker's, so a source edit
    between two conversions of one test process (a shared checkout) would fail the second."""
    from h5batch.conversion import preflight

    preflight.collect_versions.cache_clear()
    convert(job, ConvertOptions(progress=False))


def annotated_job(root: Path, out: Path, table: str, **fields) -> object:
    """Demo-like job over ``root`` (class_folders) with a text and two value fields read
    from ``table`` (``key: path``)."""
    return job_from_dict({
        "source": {"root": str(root), "layout": "class_folders", "tables": [{"path": table, "key": "path"}]},
        "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": 16000, "dtype": "int16"},
                   "image": {"type": "image", "extensions": [".png"], "mode": "RGB", "size": [32, 32]},
                   "caption": {"type": "text", "column": "caption"},
                   "loudness": {"type": "value", "column": "loudness", "dtype": "float32"},
                   "kind": {"type": "value", "column": "kind", "dtype": "category"},
                   "xy": {"type": "value", "columns": ["x", "y"], "dtype": "float32"},
                   "tags": {"type": "multilabel", "columns": ["is_a", "is_b"]}, **fields},
        "output": {"path": str(out), "chunk_bytes": 65536}, "cluster": {"workers": 1}}, "test.yaml")


def make_annotated(d: Path) -> Path:
    """The demo corpus plus ``meta.csv`` (a caption, a float, a category, a float pair and
    two binary targets per sample), converted."""
    root = d / "corpus"
    generate.make_demo_corpus(root, per_class=4)
    wavs = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.wav"))
    with open(root / "meta.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "caption", "loudness", "kind", "x", "y", "is_a", "is_b"])
        for i, p in enumerate(wavs):
            w.writerow([p, CAPTIONS[i % 3], f"{0.25 * i - 1:.2f}", ("low", "mid", "high")[i % 3],
                        f"{i / 7:.6f}", str(-i), i % 2, int(i % 3 == 0)])
    out = d / "annotated.h5"
    converted(annotated_job(root, out, "meta.csv"))
    return out


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> Path:
    return make_annotated(tmp_path_factory.mktemp("export"))


def reference(path: Path, split: str) -> dict[str, dict]:
    """H5Dataset's samples of ``split``, by the stem of their first source file."""
    ds = H5Dataset(path, split, as_float=False, with_source=True)
    with h5py.File(path) as f:
        kinds = [x.decode() if isinstance(x, bytes) else str(x) for x in f[split]["kind"].attrs["categories"]]
    out = {}
    for i in range(len(ds)):
        s = ds[i]
        stem = Path(s["source"][0]).stem
        out[stem] = {"audio": s["audio"].numpy(), "image": s["image"].numpy(),
                     "label": ds.class_names[int(s["label"])], "caption": s["caption"],
                     "loudness": float(s["loudness"]), "kind": kinds[int(s["kind"])],
                     "xy": s["xy"].numpy().tolist(), "tags": s["tags"].numpy().tolist(),
                     "source": list(s["source"])}
    return out


def assert_same(a: dict, b: dict, *, sources: bool = True) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        x, y = a[k], b[k]
        assert np.array_equal(x["audio"], y["audio"]) and x["audio"].dtype == y["audio"].dtype, k
        assert np.array_equal(x["image"], y["image"]), k
        assert (x["label"], x["caption"], x["kind"]) == (y["label"], y["caption"], y["kind"]), k
        assert np.float32(x["loudness"]) == np.float32(y["loudness"]), k
        assert np.array_equal(np.float32(x["xy"]), np.float32(y["xy"])) and x["tags"] == y["tags"], k
        if sources:
            assert x["source"] == y["source"], k


# --------------------------------------------------------------------------- files


def test_files_export_converts_back_to_the_same_samples(annotated, tmp_path, capsys):
    out = tmp_path / "files"
    assert main(["export", str(annotated), "--to", "files", str(out)]) == 0
    assert "samples/s" in capsys.readouterr().err
    rows = list(csv.DictReader(open(out / "labels.csv", newline="", encoding="utf-8")))
    with h5py.File(annotated) as f:
        splits = json.loads(f.attrs["splits"])
        counts = {s: int(f[s].attrs["num_samples"]) for s in splits}
    assert [r["split"] for r in rows] == [s for s in splits for _ in range(counts[s])]
    for r in rows:  # class_folders layout: <split>/<class>/<stem>.wav + .png
        assert r["path"] == r["audio"] == f"{r['split']}/{r['label']}/{Path(r['source'].split(';')[0]).stem}.wav"
        assert (out / r["audio"]).is_file() and (out / r["image"]).is_file()
    assert sf.info(str(out / rows[0]["audio"])).subtype == "PCM_16"
    # The exported folder is a corpus: class_folders + labels.csv as the annotation table.
    again = tmp_path / "again.h5"
    converted(annotated_job(out, again, "labels.csv"))
    with h5py.File(again) as f:
        assert json.loads(f.attrs["splits"]) == splits
        assert sorted(f["class_names"].asstr()[...]) == sorted(H5Dataset(annotated).class_names)
    for split in splits:
        first, second = reference(annotated, split), reference(again, split)
        assert_same(first, second, sources=False)


def test_an_occupied_folder_needs_overwrite(annotated, tmp_path, capsys):
    out = tmp_path / "files"
    assert main(["export", str(annotated), "--to", "files", str(out), "--split", "test"]) == 0
    assert main(["export", str(annotated), "--to", "files", str(out), "--split", "test"]) == 2
    assert "already exists" in capsys.readouterr().err
    (out / "test" / "stale.wav").write_bytes(b"old")
    assert main(["export", str(annotated), "--to", "files", str(out), "--split", "test", "--overwrite"]) == 0
    assert not (out / "test" / "stale.wav").exists() and not (out / "train").exists()
    assert {r["split"] for r in csv.DictReader(open(out / "labels.csv"))} == {"test"}


# ---------------------------------------------------------------------- webdataset


def test_webdataset_shards_hold_what_the_reader_yields(annotated, tmp_path):
    import webdataset as wds

    out = tmp_path / "wds"
    summary = export(annotated, "webdataset", out, shard_size=5)
    assert json.loads((out / "export.json").read_text())["splits"] == summary["splits"]
    for split, info in summary["splits"].items():
        ref = reference(annotated, split)
        assert info["samples"] == len(ref) and len(info["shards"]) == -(-len(ref) // 5)
        assert sorted(p.name for p in out.glob(f"{split}-*.tar")) == info["shards"]
        urls = [str(out / s) for s in info["shards"]]
        got = {}
        for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8"):
            meta = s["json"]
            assert s["__key__"] == meta["key"] and "." not in meta["key"]
            stem = Path(meta["source"][0]).stem
            audio, rate = sf.read(io.BytesIO(s["wav"]), dtype="int16")
            assert rate == 16000
            assert meta["label"] == H5Dataset(annotated).class_names[s["cls"]]
            got[stem] = {"audio": audio, "image": s["png"], "label": meta["label"], "caption": meta["caption"],
                         "loudness": meta["loudness"], "kind": meta["kind"], "source": meta["source"],
                         "xy": [meta["xy"]["x"], meta["xy"]["y"]], "tags": [meta["tags"]["is_a"], meta["tags"]["is_b"]]}
            assert meta["split"] == split
        assert_same(ref, got)
        # The same shards through tarfile: members <key>.<ext>, a sample's members together.
        keys, exts = [], []
        for shard in urls:
            with tarfile.open(shard) as tar:
                for m in tar.getmembers():
                    key, _, ext = m.name.partition(".")
                    if not keys or keys[-1] != key:
                        keys.append(key)
                    exts.append(ext)
                    if ext == "png":
                        im = np.asarray(Image.open(tar.extractfile(m)))
                        assert im.shape == (32, 32, 3)
        assert len(keys) == len(set(keys)) == len(ref)
        assert exts == ["wav", "png", "cls", "json"] * len(ref)


def test_export_skips_tombstoned_rows(annotated, tmp_path):
    synced = tmp_path / "synced.h5"
    shutil.copy(annotated, synced)
    with h5py.File(synced, "r+") as f:  # what `h5batch sync` leaves for two removed files
        n = int(f["train"].attrs["num_samples"])
        f["train"].create_dataset("tombstones", data=np.array([1, n - 2], dtype=np.int64))
        dead = set(f["train"]["source"].asstr()[[1, n - 2], 0])
    assert len(H5Dataset(synced, "train")) == n - 2
    summary = export(synced, "webdataset", tmp_path / "wds", splits=["train"])
    assert summary["splits"]["train"]["samples"] == n - 2
    with tarfile.open(tmp_path / "wds" / "train-000000.tar") as tar:
        names = tar.getnames()
    assert "train_00000001.json" not in names and f"train_{n - 2:08d}.json" not in names
    assert "train_00000000.json" in names and f"train_{n - 1:08d}.json" in names
    export(synced, "files", tmp_path / "files", splits=["train"])
    rows = list(csv.DictReader(open(tmp_path / "files" / "labels.csv")))
    assert len(rows) == n - 2 and [int(r["row"]) for r in rows] == [r for r in range(n) if r not in (1, n - 2)]
    assert not {r["source"].split(";")[0] for r in rows} & dead


def test_what_cannot_be_exported_is_named(annotated, tmp_path, capsys):
    assert main(["export", str(annotated), "--to", "zip", str(tmp_path / "x")]) == 2
    assert "unknown target" in capsys.readouterr().err and set(TARGETS) == {"webdataset", "files"}
    assert main(["export", str(annotated), "--to", "files", str(tmp_path / "x"), "--split", "val"]) == 2
    assert "no split 'val'" in capsys.readouterr().err
    assert main(["export", str(annotated), "--to", "files", str(tmp_path / "x"), "--fields", "nope"]) == 2
    assert "bad fields" in capsys.readouterr().err
    feats = tmp_path / "features.h5"
    shutil.copy(annotated, feats)
    with h5py.File(feats, "r+") as f:  # an audio field stored as log-mel features
        for split in json.loads(f.attrs["splits"]):
            f[split]["audio"].attrs["features"] = json.dumps({"n_mels": 80})
    with pytest.raises(ExportError, match="field 'audio' cannot be exported to webdataset: it stores log-mel"):
        export(feats, "webdataset", tmp_path / "w")
    # Left out, the rest exports.
    summary = export(feats, "webdataset", tmp_path / "w", fields=["image", "caption"], splits=["test"])
    with tarfile.open(tmp_path / "w" / summary["splits"]["test"]["shards"][0]) as tar:
        assert {n.partition(".")[2] for n in tar.getnames()} == {"png", "cls", "json"}


# ------------------------------------------------------------ unlabelled paired audio


def test_paired_audio_exports_as_paired_folders_and_named_members(tmp_path):
    """Two audio fields, no labels: ``<split>/<field>/<stem>.wav`` (the paired_folders
    layout, converted again) and members ``<key>.data.wav`` / ``<key>.target.wav``."""
    from h5batch.config import load_job

    repo = Path(__file__).resolve().parents[1]

    def job(root: Path, out: Path, *extra: str):
        return load_job(repo / "jobs" / "paired_audio.yaml",  # data as (T, 1): a channel axis
                        [f"output.path={out}", f"source.root={root}", "cluster.workers=1",
                         "fields.data.channels=keep", *extra])

    generate.make_paired_audio(tmp_path / "corpus", n_train=6, n_test=2, seconds=0.25)
    first = tmp_path / "paired.h5"
    converted(job(tmp_path / "corpus", first))
    files = tmp_path / "files"
    export(first, "files", files)
    rows = list(csv.DictReader(open(files / "labels.csv")))
    assert all(r["data"] == f"{r['split']}/data/{Path(r['data']).name}" and r["label"] == "" for r in rows)
    again = tmp_path / "again.h5"
    converted(job(files, again, "fields.target.folder=target"))
    for split in ("train", "test"):
        a, b = H5Dataset(first, split, as_float=False), H5Dataset(again, split, as_float=False)
        assert len(a) == len(b) > 0 and not a.labelled and a[0]["data"].ndim == 2
        for i in range(len(a)):  # same stems, same natural order
            for name in ("data", "target"):
                assert np.array_equal(a[i][name].numpy(), b[i][name].numpy())
    export(first, "webdataset", tmp_path / "wds", splits=["test"])
    with tarfile.open(tmp_path / "wds" / "test-000000.tar") as tar:
        exts = [m.name.partition(".")[2] for m in tar.getmembers()]
    assert exts == ["data.wav", "target.wav", "json"] * 2
