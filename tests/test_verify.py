"""``h5batch verify``: a sound file passes; each kind of damage is found and named."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import distributed  # noqa: F401  (before job.py's dask.config.set; see test_bad_inputs)
import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import ConvertOptions, convert
from h5batch.config import job_from_dict
from h5batch.tools import verify as V
from h5batch.tools.verify import VerifyError, verify_file
from h5batch.transport.segments import list_segments

H5BATCH = str(Path(sys.executable).with_name("h5batch"))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """conftest's leak check, restricted to runs driven by this process (/dev/shm is shared
    with conversions other processes run concurrently)."""
    mine = f"h5b-{os.getpid():x}x"
    before = {n for n in list_segments() if n.startswith(mine)}
    yield
    assert not {n for n in list_segments() if n.startswith(mine)} - before


@pytest.fixture(scope="module")
def made(demo_root, tmp_path_factory):
    """A demo conversion: audio variable-length int16, image fixed (16, 16, 3); no codec,
    small chunks (so a flipped byte lands in a known sample)."""
    out = tmp_path_factory.mktemp("verify") / "demo.h5"
    job = job_from_dict({
        "source": {"root": str(demo_root), "layout": "class_folders"},
        "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": 16000},
                   "image": {"type": "image", "extensions": [".png"], "size": [16, 16]}},
        "output": {"path": str(out), "codec": "none", "chunk_bytes": 4096},
        "cluster": {"workers": 1, "batch_size": 8, "dashboard": False},
    }, "verify-demo.yaml")
    s = convert(job, ConvertOptions(progress=False, log=io.StringIO()))
    return s.path


def _copy(src: str, tmp_path: Path, name: str = "copy.h5") -> str:
    dst = str(tmp_path / name)
    shutil.copyfile(src, dst)
    return dst


def _texts(report) -> str:
    return "\n".join(str(p) for p in report.problems)


def test_sound_file_passes(made) -> None:
    report = verify_file(made, sources=True)
    assert report.ok, _texts(report)
    with h5py.File(made, "r") as f:
        n = sum(f[s]["source"].shape[0] for s in ("train", "test"))
        raw = sum(f[s]["image"].nbytes + f[s]["audio"]["values"].nbytes for s in ("train", "test"))
    assert report.samples == n and report.sources_compared == 2 * n
    assert report.bytes_checked == raw
    assert report.inputs == 2 * n + report.rejects


def test_cli_ok_and_json(made) -> None:
    r = subprocess.run([H5BATCH, "verify", made, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] and d["problems"] == [] and "OK" in r.stderr


def test_reads_whole_chunks_in_few_calls(made, monkeypatch) -> None:
    calls: list[tuple[int, int, int, bool]] = []
    real = V._FieldData.read

    def counting(self, lo, hi):
        calls.append((lo, hi, self.chunk, self.fixed))
        return real(self, lo, hi)

    monkeypatch.setattr(V._FieldData, "read", counting)
    assert verify_file(made).ok
    assert len(calls) == 4  # one call per split and field: everything fits in read_bytes
    calls.clear()
    report = verify_file(made, read_bytes=8192)  # tiny slices: many calls, same verdict
    assert report.ok and len(calls) > 4
    assert len(calls) < report.samples * 2  # still not one call per sample
    for lo, _hi, chunk, fixed in calls:
        if fixed:  # fixed-shape fields are read in whole chunks
            assert lo % chunk == 0


@pytest.mark.parametrize("chunk,n", [(1, 7), (4, 10), (5, 5), (3, 1)])
def test_windows_fixed_are_chunk_aligned(chunk, n) -> None:
    offs = np.arange(n + 1)
    wins = list(V._windows(offs, chunk, 2 * chunk))
    assert wins[0][0] == 0 and wins[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(wins, wins[1:], strict=False))
    assert all(i % chunk == 0 for i, _ in wins)


def test_windows_variable_cover_every_sample() -> None:
    sizes = np.array([5, 0, 300, 1, 1, 40, 0, 7, 900, 3])
    offs = np.concatenate([[0], np.cumsum(sizes)])
    wins = list(V._windows(offs, 16, 64))
    assert [i for i, _ in wins] == sorted({i for i, _ in wins})
    assert wins[0][0] == 0 and wins[-1][1] == len(sizes)
    assert all(j > i for i, j in wins)
    assert all(a[1] == b[0] for a, b in zip(wins, wins[1:], strict=False))


def _flip(path: str, dsname: str, chunk: int, at: int) -> None:
    with h5py.File(path, "r") as f:
        info = f[dsname].id.get_chunk_info(chunk)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + at)
        b = fh.read(1)
        fh.seek(info.byte_offset + at)
        fh.write(bytes([b[0] ^ 1]))


def test_flipped_byte_fixed_field_names_the_sample(made, tmp_path) -> None:
    dst = _copy(made, tmp_path)
    with h5py.File(dst, "r") as f:
        ds = f["train"]["image"]
        row = int(np.prod(ds.shape[1:]))
        chunk_rows = ds.chunks[0]
        info = ds.id.get_chunk_info(1)
        sample = info.chunk_offset[0] + 1  # second row of chunk 1
        src = f["train"]["source"].asstr()[sample, 1]
    _flip(dst, "train/image", 1, row + 17)
    report = verify_file(dst)
    assert [str(p) for p in report.problems] == [
        f"train/image[{sample}] ({src}): " + report.problems[0].what]
    assert "checksum mismatch" in report.problems[0].what and chunk_rows > 1


def test_flipped_byte_variable_field_names_the_sample(made, tmp_path) -> None:
    dst = _copy(made, tmp_path)
    with h5py.File(dst, "r") as f:
        g = f["test"]["audio"]
        offs = g["offsets"][...]
        info = g["values"].id.get_chunk_info(2)
        element = info.chunk_offset[0] + 100
        sample = int(np.searchsorted(offs, element, side="right") - 1)
        src = f["test"]["source"].asstr()[sample, 0]
    _flip(dst, "test/audio/values", 2, 200)  # int16: byte 200 is element 100
    r = subprocess.run([H5BATCH, "verify", dst], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert f"test/audio[{sample}] ({src}): checksum mismatch" in r.stderr, r.stderr


def _edit(path: str, fn) -> None:
    with h5py.File(path, "r+") as f:
        fn(f)


def _set(dsname: str, index, value):
    def fn(f):
        ds = f[dsname]
        a = ds[...]
        a[index] = value(a) if callable(value) else value
        ds[...] = a
    return fn


def _add_reject(f) -> None:
    path = f["train"]["source"].asstr()[0, 0]
    for k, v in (("path", path), ("stage", "decode"), ("reason", "made up")):
        ds = f["rejects"][k]
        ds.resize(ds.shape[0] + 1, axis=0)
        ds[-1] = v
    f.attrs["num_inputs"] = f.attrs["num_inputs"] + 1


DAMAGE = [
    ("checksum", _set("train/checksum", (3, 0), lambda a: a[3, 0] ^ 1), "train/audio[3]", "checksum mismatch"),
    ("offsets decrease", _set("train/audio/offsets", 4, lambda a: a[3] - 1), "train/audio[3]", "offsets decrease"),
    ("offsets end", _set("train/audio/offsets", -1, lambda a: a[-1] - 1), "train/audio/offsets", "offsets[-1]"),
    ("offsets start", _set("test/audio/offsets", 0, 2), "test/audio[0]", "offsets[0] is 2"),
    ("shape product", _set("train/audio/shapes", (2, 0), lambda a: a[2, 0] + 1), "train/audio[2]", "stored shape"),
    ("label range", _set("train/label", 5, 99), "train/label[5]", "label 99 is outside -1..2"),
    ("num_inputs", lambda f: f.attrs.__setitem__("num_inputs", f.attrs["num_inputs"] + 1), "/", "1 inputs unaccounted"),
    ("duplicate source", _set("test/source", 1, lambda a: a[0]), "/", "source of 2 samples"),
    ("sample and reject", _add_reject, "/", "both a sample's file"),
    ("incomplete", lambda f: f.attrs.__setitem__("complete", False), "/", "complete is not true"),
    ("num_samples", lambda f: f["test"].attrs.__setitem__("num_samples", 1), "test", "num_samples is 1"),
    ("field missing", lambda f: f["test"].__delitem__("image"), "test/image", "field missing"),
    ("field count", lambda f: f["train"]["image"].resize(3, axis=0), "train/image", "has 3 samples"),
]


@pytest.mark.parametrize("edit,where,what", [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damage_is_found(made, tmp_path, edit, where, what) -> None:
    dst = _copy(made, tmp_path)
    _edit(dst, edit)
    report = verify_file(dst)
    assert any(p.where == where and what in p.what for p in report.problems), _texts(report)


def test_rejects_jsonl_must_agree(made, tmp_path) -> None:
    dst = _copy(made, tmp_path, "x.h5")
    (tmp_path / "x.rejects.jsonl").write_text(json.dumps({"path": "a", "stage": "decode", "reason": "b"}) + "\n")
    assert "x.rejects.jsonl lists 1 rejects that differ" in _texts(verify_file(dst))


def test_sources_changed_or_gone(made, demo_root, tmp_path) -> None:
    root = tmp_path / "corpus"
    shutil.copytree(demo_root, root, symlinks=True)
    with h5py.File(made, "r") as f:
        wav, png = f["train"]["source"].asstr()[4]
    x, sr = sf.read(root / wav, dtype="int16")
    x[len(x) // 2] ^= 1
    sf.write(root / wav, x, sr, subtype="PCM_16")
    os.unlink(root / png)
    report = verify_file(made, sources=True, root=str(root))
    got = {(p.where, p.source): p.what for p in report.problems}
    assert got[("train/audio[4]", wav)] == f"differs from its source: 1 of {len(x)} values differ"
    assert got[("train/image[4]", png)] == "source no longer decodes: file disappeared since discovery"
    assert len(got) == 2


def test_cannot_verify(tmp_path) -> None:
    (tmp_path / "x.h5").write_bytes(b"not hdf5")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = 1
    for p, words in ((tmp_path / "x.h5", "cannot open as HDF5"), (tmp_path / "plain.h5", "not an h5batch file"),
                     (tmp_path / "none.h5", "no such file")):
        with pytest.raises(VerifyError, match=words):
            verify_file(str(p))
    r = subprocess.run([H5BATCH, "verify", str(tmp_path / "x.h5")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cannot open as HDF5" in r.stderr
