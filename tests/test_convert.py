"""End-to-end conversion on real files, a real LocalCluster and real HDF5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch import ConvertError, ConvertOptions, convert
from h5batch.config import load_job
from tests.conftest import REPO, shared_corpus
from tests.support import run
from tests.support.h5compare import assert_same_h5


def run_job(job_file: str | Path, out: Path, *overrides: str, **opts):
    job = load_job(job_file, [f"output.path={out}", *overrides])
    return convert(job, ConvertOptions(progress=False, **opts))


def read_variable(g: h5py.Group, i: int) -> np.ndarray:
    a, b = g["offsets"][i], g["offsets"][i + 1]
    return g["values"][a:b].reshape(g["shapes"][i])


def test_demo_round_trip_and_identical_across_worker_counts(demo_root, tmp_path):
    job = REPO / "jobs" / "demo.yaml"
    # The codec is set, not auto: auto weighs a decode speed measured at run time against a
    # memory copy, and on a loaded machine two runs can fall either side of the line (CI saw
    # blosc2-lz4 in one, none in the other); what this test compares is the worker count.
    s1 = run_job(job, tmp_path / "w1.h5", f"source.root={demo_root}", "cluster.workers=1", "output.codec=blosc2-lz4")
    s2 = run_job(job, tmp_path / "w2.h5", f"source.root={demo_root}", "cluster.workers=2", "cluster.batch_size=5",
                 "output.codec=blosc2-lz4")
    assert s1.counts == s2.counts == {"train": 30, "test": 6}
    assert s1.rejects == 0
    assert_same_h5(tmp_path / "w1.h5", tmp_path / "w2.h5")

    with h5py.File(tmp_path / "w1.h5", "r") as f:
        assert f.attrs["complete"]
        classes = list(f["class_names"].asstr()[...])
        assert classes == ["circle", "square", "triangle"]
        for split in ("train", "test"):
            g = f[split]
            sources = g["source"].asstr()[...]
            assert sources.shape == (g["label"].shape[0], 2)
            assert list(sources[:, 0]) == sorted(sources[:, 0], key=lambda p: (p.split("/")[1], int(p.split("_")[-1].split(".")[0])))
            for i, (wav, _png) in enumerate(sources):
                # label = class folder
                assert classes[g["label"][i]] == wav.split("/")[1]
                # audio: exact 16-bit PCM
                ref = sf.read(demo_root / wav, dtype="int16")[0]
                assert np.array_equal(read_variable(g["audio"], i), ref)
            assert g["image"].shape[1:] == (64, 64, 3)
    # Missing output of the job stays absent: no partial or commit record left behind.
    assert not list(tmp_path.glob("*.partial*"))


def test_png_pixels_round_trip_exactly_at_native_size(demo_root, tmp_path):
    run_job(REPO / "jobs" / "demo.yaml", tmp_path / "native.h5", f"source.root={demo_root}",
            "fields.image.size=null", "cluster.workers=1")
    with h5py.File(tmp_path / "native.h5", "r") as f:
        g = f["train"]
        assert g["image"].attrs["kind"] == "variable"
        shapes = set()
        for i, (_, png) in enumerate(g["source"].asstr()[...]):
            ref = np.asarray(Image.open(demo_root / png).convert("RGB"))
            got = read_variable(g["image"], i)
            assert np.array_equal(got, ref), png
            shapes.add(got.shape)
        assert len(shapes) > 1  # really variable


def test_paired_layout_round_trips_both_fields(paired_root, tmp_path):
    out = tmp_path / "paired.h5"
    s = run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=2",
                "fields.data.length=8000", "fields.target.length=8000")
    assert s.counts == {"train": 24, "test": 8}
    with h5py.File(out, "r") as f:
        assert "label" not in f["train"]
        for split in ("train", "test"):
            g = f[split]
            src = g["source"].asstr()[...]
            assert [p.split("/")[2] for p in src[:, 0]] == [f"{i}.wav" for i in range(len(src))]
            for i, (d, t) in enumerate(src):
                assert d.split("/")[1] == "data" and t.split("/")[1] == "label"
                assert np.array_equal(g["data"][i], sf.read(paired_root / d, dtype="int16")[0][:8000])
                assert np.array_equal(g["target"][i], sf.read(paired_root / t, dtype="int16")[0][:8000])


@pytest.mark.parametrize("codec", ["none", "gzip", "lzf", "zstd", "blosc2-zstd"])
def test_every_codec_round_trips(paired_root, tmp_path, codec):
    out = tmp_path / f"{codec}.h5"
    run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1",
            f"output.codec={codec}", "output.chunk_bytes=8192")
    with h5py.File(out, "r") as f:
        g = f["test"]
        for i, (d, _) in enumerate(g["source"].asstr()[...]):
            assert np.array_equal(read_variable(g["data"], i), sf.read(paired_root / d, dtype="int16")[0])


def test_gzip_output_reads_without_hdf5plugin(paired_root, tmp_path):
    out = tmp_path / "portable.h5"
    run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1",
            "output.codec=gzip")
    code = ("import sys, h5py; f = h5py.File(sys.argv[1], 'r'); v = f['train/data/values'][...];"
            "assert 'hdf5plugin' not in sys.modules; print(v.size)")
    res = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True)
    assert int(res.stdout) == 24 * 8000


def test_existing_output_is_not_overwritten_without_flag(paired_root, tmp_path):
    out = tmp_path / "once.h5"
    run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1")
    before = out.stat().st_mtime_ns
    # The same job again: already complete, nothing to do, file untouched.
    again = run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1")
    assert again.extra.get("already_complete") and again.samples == 32
    assert again.extra["checked"] == "discovery"  # paired_folders has no incremental discovery: the full one decides
    with pytest.raises(ConvertError, match="already exists") as e:
        run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1",
                "output.codec=gzip")
    assert e.value.exit_code == 2
    assert out.stat().st_mtime_ns == before
    run_job(REPO / "jobs" / "paired_audio.yaml", out, f"source.root={paired_root}", "cluster.workers=1", overwrite=True)


def test_cli_convert_then_inspect(paired_root, tmp_path):
    out = tmp_path / "cli.h5"
    job = REPO / "jobs" / "paired_audio.yaml"
    res = run.convert(job, "--json", workers=1, output=out, root=paired_root, progress=None, check=True)
    summary = json.loads(res.stdout)
    assert summary["counts"] == {"train": 24, "test": 8}
    res = run.run_h5batch("inspect", str(out))
    assert res.returncode == 0, res.stderr
    for text in ("[train] 24 samples", "[test] 8 samples", "data: audio variable", "target: audio variable",
                 "codec none", "compression ratio", "0 rejects", "job: paired_audio", "int16, 16000 Hz"):
        assert text in res.stdout, (text, res.stdout)
    # Without --json it says how to inspect the output: a path that works from where the
    # command ran (absolute when the output is not below it, not "../../tmp/...").
    for cwd, shown in ((REPO, str(out)), (tmp_path, "cli.h5")):
        res = run.convert(job, workers=1, output=out, root=paired_root, overwrite=True, progress=None, cwd=cwd,
                          check=True)
        assert f"inspect it with: h5batch inspect {shown}\n" in res.stderr, res.stderr
    res = run.run_h5batch("--help")
    assert res.returncode == 0, res.stderr
    for cmd in ("convert", "inspect"):
        assert cmd in res.stdout


@pytest.mark.corpora
def test_fsdd_every_recording_exact(tmp_path):
    root = shared_corpus("fsdd")
    out = tmp_path / "fsdd.h5"
    s = run_job(REPO / "jobs" / "fsdd.yaml", out, f"source.root={root}")
    assert s.counts == {"train": 2700, "test": 300}
    with h5py.File(out, "r") as f:
        classes = list(f["class_names"].asstr()[...])
        assert classes == [str(d) for d in range(10)]
        # codec auto: speech with silences shrinks ~1.3x with LZ4, under the 1.5x from which
        # reading fewer bytes pays -> stored raw
        assert f["train/audio"].attrs["codec"] == "none"
        assert "under the 1.50x" in f["train/audio"].attrs["codec_choice"]
        for split in ("train", "test"):
            g = f[split]
            src = g["source"].asstr()[...]
            labels = g["label"][...]
            offsets = g["audio/offsets"][...]
            values = g["audio/values"][...]
            for i, p in enumerate(src):
                digit, _, index = Path(p).stem.split("_")
                assert labels[i] == int(digit)
                assert (int(index) <= 4) == (split == "test")
                ref = sf.read(root / p, dtype="int16")[0]
                assert np.array_equal(values[offsets[i]:offsets[i + 1]], ref), p
    # The one non-wav file (the licence) is accounted for as a reject, not silently dropped.
    assert s.rejects == 1


@pytest.mark.corpora
def test_hymenoptera_fixed_and_native(tmp_path):
    root = shared_corpus("images")
    n_files = sum(1 for p in root.rglob("*") if p.is_file() and p.parent.parent.parent == root)
    for variant, overrides in (("fixed", []), ("native", ["fields.image.size=null"])):
        out = tmp_path / f"{variant}.h5"
        s = run_job(REPO / "jobs" / "hymenoptera.yaml", out, f"source.root={root}", *overrides)
        assert s.samples + s.rejects == n_files and s.rejects == 0
        with h5py.File(out, "r") as f:
            classes = list(f["class_names"].asstr()[...])
            for split in ("train", "val"):
                g = f[split]
                src = g["source"].asstr()[...]
                assert all(classes[lab] == p.split("/")[1] for lab, p in zip(g["label"][...], src))
                if variant == "fixed":
                    assert g["image"].shape[1:] == (224, 224, 3)
                else:
                    shapes = g["image/shapes"][...]
                    for i in (0, len(src) - 1):
                        with Image.open(root / src[i]) as im:
                            from PIL import ImageOps

                            ref = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
                        assert tuple(shapes[i]) == ref.shape
                        assert np.array_equal(read_variable(g["image"], i), ref)


def test_conversion_does_not_need_torch(paired_root, tmp_path):
    """Conversion runs with torch unimportable (only the reader needs it)."""
    out = tmp_path / "notorch.h5"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from h5batch.cli import main\n"
            f"rc = main(['convert', {str(REPO / 'jobs' / 'paired_audio.yaml')!r}, '--workers', '1', '--output', {str(out)!r},"
            f" '--set', 'source.root={paired_root}', '--progress', 'none'])\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "sys.exit(rc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    with h5py.File(out, "r") as f:
        assert f["train/source"].shape[0] == 24


def test_writer_follows_the_drivers_cwd_and_umask(demo_root, tmp_path, monkeypatch):
    """The writer is forked from a fork server whose cwd and umask were fixed when it
    started (the first conversion in this process): a later conversion in another
    directory, with a relative output path and another umask, must land there, with
    that umask."""
    import os

    job = REPO / "jobs" / "demo.yaml"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    run_job(job, Path("first.h5"), f"source.root={demo_root}", "cluster.workers=1")
    assert (tmp_path / "a" / "first.h5").is_file()
    monkeypatch.chdir(tmp_path / "b")
    old = os.umask(0o077)
    try:
        run_job(job, Path("out/second.h5"), f"source.root={demo_root}", "cluster.workers=1")
    finally:
        os.umask(old)
    out = tmp_path / "b" / "out" / "second.h5"
    assert out.is_file() and not (tmp_path / "a" / "out").exists()
    assert out.stat().st_mode & 0o077 == 0, oct(out.stat().st_mode)
    with h5py.File(out, "r") as f:
        assert f.attrs["complete"] and f["train"]["label"].shape == (30,)
