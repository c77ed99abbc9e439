"""The torture corpus through the real converter: every bad input is rejected with its
specific reason, the job goes on, every good file is a sample with exact content, nothing
is lost, ``verify`` passes, and a flipped byte in a copy of the output is caught."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

# job.py enters dask.config.set() before anything imported distributed; leaving that
# context then deletes distributed's config defaults and the next LocalCluster of this
# process fails (KeyError: 'comm'). Importing distributed first avoids it.
import distributed  # noqa: F401
import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch import ConvertError, ConvertOptions, convert
from h5batch.config import job_from_dict
from h5batch.errors import DecodeError
from h5batch.fields import decode_field
from h5batch.fields.audio import AudioField
from h5batch.tools.verify import verify_file
from h5batch.transport.segments import list_segments
from tests.support.torture import good_files, make_torture_corpus, skipped, torture_jobs

H5BATCH = str(Path(sys.executable).with_name("h5batch"))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """conftest's leak check, restricted to runs driven by this process: /dev/shm is
    shared, and conversions run concurrently by other processes come and go during a test."""
    mine = f"h5b-{os.getpid():x}x"
    before = {n for n in list_segments() if n.startswith(mine)}
    yield
    leaked = {n for n in list_segments() if n.startswith(mine)} - before
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


def _run(jd: dict, name: str):
    return convert(job_from_dict(jd, f"torture-{name}.yaml"), ConvertOptions(progress=False, log=io.StringIO()))


@pytest.fixture(scope="module")
def torture(tmp_path_factory):
    base = tmp_path_factory.mktemp("torture")
    root = base / "corpus"
    bad = make_torture_corpus(root, seed=0)
    jobs = torture_jobs(root, base / "out")
    jobs["image"]["cluster"]["workers"] = 2  # one job with two workers
    results = {name: _run(jd, name) for name, jd in jobs.items()}
    return SimpleNamespace(root=root, base=base, bad=bad, good=good_files(root), jobs=jobs, results=results)


def _rejects(path: str) -> dict[str, tuple[str, str]]:
    with h5py.File(path, "r") as f:
        g = f["rejects"]
        rows = list(zip(*(g[k].asstr()[...] for k in ("path", "stage", "reason")), strict=True))
    out = {p: (s, r) for p, s, r in rows}
    assert len(out) == len(rows), "a path is rejected twice"
    return out


def _sources(path: str) -> dict[str, list[str]]:
    """split -> flat list of source paths."""
    with h5py.File(path, "r") as f:
        return {s: [str(p) for p in f[s]["source"].asstr()[...].reshape(-1)] for s in json.loads(f.attrs["splits"])}


def test_corpus_has_every_kind(torture) -> None:
    reasons = " | ".join(torture.bad.values())
    for kind in ("truncated audio", "corrupt JPEG", "truncated image data", "empty file", "content looks like JPEG",
                 "content looks like text", "unsupported audio codec", "unsupported JPEG", "decompression bomb",
                 "zero frames", "NaN or Inf", "the field stores 16000 Hz", "paired sample incomplete", "broken symlink",
                 "symlink points outside", "points outside the corpus root", "file does not exist", "duplicate"):
        assert kind in reasons, kind
    if os.geteuid() == 0:
        assert any("running as root" in s for s in skipped(torture.root))
    else:
        assert "Permission denied" in reasons


def test_conversions_finish(torture) -> None:
    for name, s in torture.results.items():
        assert s.ok and os.path.exists(s.path), name
        assert not os.path.exists(s.path + ".partial"), name
        assert s.samples == len(torture.good[name]) // (2 if name == "paired" else 1), name


def test_every_bad_input_rejected_with_its_reason(torture) -> None:
    problems = []
    for name, s in torture.results.items():
        rejects = _rejects(s.path)
        expected = {k.split("/", 1)[1]: v for k, v in torture.bad.items() if k.split("/", 1)[0] == name}
        for rel, want in expected.items():
            got = rejects.get(rel)
            if got is None:
                problems.append(f"{name}/{rel}: not rejected (want {want!r})")
            elif want not in got[1]:
                problems.append(f"{name}/{rel}: reason {got[1]!r} lacks {want!r}")
        for rel in sorted(set(rejects) - set(expected)):
            problems.append(f"{name}/{rel}: unexpected reject {rejects[rel]}")
        with open(s.rejects_file) as fh:
            listed = {d["path"]: (d["stage"], d["reason"]) for d in map(json.loads, fh)}
        if listed != rejects:
            problems.append(f"{name}: {s.rejects_file} differs from /rejects")
    assert not problems, "\n".join(problems)


def test_good_files_are_samples(torture) -> None:
    for name, s in torture.results.items():
        stored = sorted(p for paths in _sources(s.path).values() for p in paths)
        assert stored == sorted(torture.good[name]), name


def _stored_samples(path: str, field: str):
    """(split, source, array) of every sample of a single-source field."""
    with h5py.File(path, "r") as f:
        for split in json.loads(f.attrs["splits"]):
            g = f[split]
            src = g["source"].asstr()[...]
            k = json.loads(g["source"].attrs["fields"]).index(field)
            src = src.reshape(len(src), -1)[:, k]
            node = g[field]
            offs, shapes, values = node["offsets"][...], node["shapes"][...], node["values"][...]
            for i, p in enumerate(src):
                yield split, str(p), values[offs[i]:offs[i + 1]].reshape(shapes[i])


def test_audio_content_is_exact(torture) -> None:
    root = torture.root / "audio"
    fc = AudioField(sample_rate=16000)
    with h5py.File(torture.results["audio"].path, "r") as f:
        assert list(f["class_names"].asstr()[...]) == ["cat", "dog"]
        labels = {s: f[s]["label"][...] for s in ("train", "test")}
        srcs = {s: f[s]["source"].asstr()[...] for s in ("train", "test")}
    for s in labels:
        assert [["cat", "dog"][k] for k in labels[s]] == [p.split("/")[1] for p in srcs[s]]
    assert [p for p in srcs["test"] if p.startswith("test/dog/") and p[9].isdigit()] == ["test/dog/2.wav", "test/dog/10.wav"]
    n = 0
    for _, src, arr in _stored_samples(torture.results["audio"].path, "audio"):
        info = sf.info(str(root / src))
        if info.channels == 1 and info.subtype == "PCM_16":  # 16-bit PCM: soundfile's int16 exactly
            want, _ = sf.read(str(root / src), dtype="int16")
            n += 1
        else:  # mixed down / converted: the decoder's documented rule
            want = decode_field(str(root / src), fc)
        assert arr.dtype == np.int16 and np.array_equal(arr, want), src
    assert n >= 14


def test_image_content_is_exact(torture) -> None:
    root = torture.root / "image"
    n = 0
    for _, src, arr in _stored_samples(torture.results["image"].path, "image"):
        with Image.open(root / src) as im:
            if im.mode in ("RGB", "L"):
                want = np.asarray(im.convert("RGB"))
            else:  # alpha composited over white
                rgba = im.convert("RGBA")
                want = np.asarray(Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB"))
            n += 1
        assert arr.dtype == np.uint8 and np.array_equal(arr, want), src
    assert n == len(torture.good["image"])


def test_paired_content_is_exact(torture) -> None:
    root = torture.root / "paired"
    with h5py.File(torture.results["paired"].path, "r") as f:
        pairs = f["train"]["source"].asstr()[...]
    assert pairs.shape == (5, 2)
    assert all(d.replace("/data/", "/label/") == t for d, t in pairs)
    for field in ("data", "target"):
        for _, src, arr in _stored_samples(torture.results["paired"].path, field):
            want, _ = sf.read(str(root / src), dtype="int16")
            assert np.array_equal(arr, want), src


def _disk_entries(root: Path) -> set[str]:
    """Every non-hidden file, symlink and symlinked folder under ``root`` (not followed)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        for d in list(dirnames):
            if (Path(dirpath) / d).is_symlink():
                out.add((rel / d).as_posix())
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.update((rel / f).as_posix() for f in filenames if not f.startswith("."))
    return out


@pytest.mark.parametrize("name", ["audio", "image", "paired"])
def test_nothing_lost_on_disk(torture, name) -> None:
    """Every file of a folder corpus is exactly one of: a sample's file, a reject."""
    s = torture.results[name]
    sources = [p for paths in _sources(s.path).values() for p in paths]
    rejects = set(_rejects(s.path))
    assert len(sources) == len(set(sources))
    assert not set(sources) & rejects
    entries = _disk_entries(torture.root / name)
    if name == "image":  # image job lists splits train and val; nothing else is there
        entries = {e for e in entries if e.split("/")[0] in ("train", "val")}
    assert entries == set(sources) | rejects
    with h5py.File(s.path, "r") as f:
        assert int(f.attrs["num_inputs"]) == len(sources) + len(rejects)


def test_nothing_lost_manifest(torture) -> None:
    """Every manifest row is a sample or a reject, under its path or ``manifest.csv:line``."""
    s = torture.results["manifest"]
    sources = {p for paths in _sources(s.path).values() for p in paths}
    rejects = set(_rejects(s.path))
    with open(torture.root / "lists" / "manifest.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            p = row["path"]
            assert (os.path.normpath(p) in sources or p in rejects
                    or f"manifest.csv:{reader.line_num}" in rejects), (reader.line_num, p)
    with h5py.File(s.path, "r") as f:
        assert int(f.attrs["num_inputs"]) == len(sources) + len(rejects)


def test_verify_passes_with_sources(torture) -> None:
    for name, s in torture.results.items():
        report = verify_file(s.path, sources=True)
        assert report.ok, [str(p) for p in report.problems]
        assert report.sources_compared == len(torture.good[name])
    r = subprocess.run([H5BATCH, "verify", torture.results["paired"].path, "--sources"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stderr and "22 of 22 inputs accounted for" in r.stderr


def _flip_middle_of_chunk(src: str, dst: str, dsname: str, chunk: int) -> tuple[int, int]:
    """Copy ``src`` to ``dst`` and flip one byte in the middle of a stored chunk.
    Returns the element range the chunk covers."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r") as f:
        ds = f[dsname]
        info = ds.id.get_chunk_info(chunk)
        lo = info.chunk_offset[0]
        hi = min(lo + ds.chunks[0], ds.shape[0])
    pos = info.byte_offset + info.size // 2
    with open(dst, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0x5A]))
    return lo, hi


@pytest.mark.parametrize("name,field,codec", [("audio", "audio", "none"), ("image", "image", "gzip"),
                                              ("paired", "target", "blosc2-lz4"), ("manifest", "audio", "zstd")])
def test_flipped_byte_is_caught(torture, tmp_path, name, field, codec) -> None:
    s = torture.results[name]
    assert torture.jobs[name]["output"]["codec"] == codec
    dst = str(tmp_path / f"{name}.h5")
    lo, hi = _flip_middle_of_chunk(s.path, dst, f"train/{field}/values", 0)
    with h5py.File(dst, "r") as f:
        offs = f["train"][field]["offsets"][...]
        src = f["train"]["source"].asstr()[...]
        k = json.loads(f["train"]["source"].attrs["fields"]).index(field)
    src = src.reshape(len(src), -1)[:, k]
    covered = {str(src[i]) for i in range(len(src)) if offs[i] < hi and offs[i + 1] > lo}
    report = verify_file(dst)
    assert not report.ok
    text = "\n".join(str(p) for p in report.problems)
    assert f"train/{field}" in text
    named = {p for p in src if str(p) in text}
    assert named and named <= covered, (text, covered)
    assert ("checksum mismatch" in text) or ("corrupt chunk" in text)
    if codec == "none":
        assert len(report.problems) == 1 and "checksum mismatch" in text


def test_flipped_byte_cli_names_the_sample(torture, tmp_path) -> None:
    dst = str(tmp_path / "audio.h5")
    _flip_middle_of_chunk(torture.results["audio"].path, dst, "train/audio/values", 1)
    r = subprocess.run([H5BATCH, "verify", dst], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "1 problems" in r.stderr and "train/audio[" in r.stderr and ".wav)" in r.stderr
    assert "checksum mismatch" in r.stderr


def test_max_reject_fraction_exceeded(torture, tmp_path) -> None:
    jd = json.loads(json.dumps(torture.jobs["paired"]))
    jd["policy"]["max_reject_fraction"] = 0.1
    jd["output"]["path"] = str(tmp_path / "strict.h5")
    with pytest.raises(ConvertError) as ei:
        _run(jd, "strict")
    e = ei.value
    assert e.exit_code == 1
    msg = str(e)
    assert "8 of 22 input files rejected" in msg and "max_reject_fraction" in msg, msg
    assert "rejects.jsonl" in msg
    assert not os.path.exists(tmp_path / "strict.h5")  # never presented as a finished output
    assert (tmp_path / "strict.rejects.jsonl").exists()


def _decode_as_nobody(path: str) -> str:
    """Decode ``path`` in a forked child that dropped root (uid 65534): the reason."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no exceptions may escape into pytest
        code = 0
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            try:
                decode_field(path, AudioField())
                msg = "decoded"
            except DecodeError as e:
                msg = e.reason
            os.write(w, msg.encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        out = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0
    return out


def test_unreadable_file_reason(torture) -> None:
    """chmod 000: as a normal user the decoder says Permission denied. Root reads such
    files anyway, so as root the decoder runs in a child that dropped to uid 65534."""
    good = torture.root / "audio" / "train" / "cat" / "cat_0.wav"
    d = tempfile.mkdtemp(prefix="h5batch-unreadable-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        path = os.path.join(d, "locked.wav")
        shutil.copyfile(good, path)
        os.chmod(path, 0)
        if os.geteuid() == 0:
            reason = _decode_as_nobody(path)
        else:
            with pytest.raises(DecodeError) as ei:
                decode_field(path, AudioField())
            reason = ei.value.reason
        assert reason == "cannot read file: Permission denied"
    finally:
        shutil.rmtree(d)


def test_streaming_wav_header_is_not_truncation(tmp_path) -> None:
    """Writers that stream set the RIFF/data sizes to 0xFFFFFFFF ("unknown"): not truncated."""
    import struct

    x = (np.sin(np.arange(3000) / 7) * 8000).astype(np.int16)
    sf.write(tmp_path / "s.wav", x, 16000, subtype="PCM_16")
    b = bytearray((tmp_path / "s.wav").read_bytes())
    i = b.find(b"data")
    b[4:8] = b[i + 4:i + 8] = struct.pack("<I", 0xFFFFFFFF)
    (tmp_path / "s.wav").write_bytes(bytes(b))
    assert np.array_equal(decode_field(str(tmp_path / "s.wav"), AudioField(sample_rate=16000)), x)
