"""Tests for h5batch.generate: layouts, formats, determinism, the marker and the registry."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from benchmarks.audio_corpus import FSDD_SPEAKERS, make_audio_corpus
from h5batch import generate
from h5batch.generate.common import split_counts


def _tree(root: Path) -> dict[str, bytes]:
    """Relative path -> file bytes for every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _files(d: Path, suffix: str) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.suffix == suffix)


# ----------------------------------------------------------------- demo


def test_demo_layout_counts_and_formats(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    s = generate.make_demo_corpus(root, per_class=5, test_fraction=0.4, seed=3)
    assert s.kind == "demo" and not s.skipped
    assert s.counts == {
        "train": {c: 3 for c in generate.DEMO_CLASSES},
        "test": {c: 2 for c in generate.DEMO_CLASSES},
    }
    assert s.n_files == 2 * 3 * 5
    assert s.n_bytes == sum(len(b) for name, b in _tree(root).items() if not name.startswith("."))

    for split, n in (("train", 3), ("test", 2)):
        for cls in generate.DEMO_CLASSES:
            d = root / split / cls
            wavs, pngs = _files(d, ".wav"), _files(d, ".png")
            assert len(wavs) == len(pngs) == n
            assert [Path(w).stem for w in wavs] == [Path(p).stem for p in pngs]
            assert all(re.fullmatch(rf"{cls}_\d{{4}}", Path(w).stem) for w in wavs)
            for w in wavs:
                info = sf.info(str(d / w))
                assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
                assert 0.5 * 16000 <= info.frames <= 1.5 * 16000
                x, _ = sf.read(str(d / w), dtype="int16")
                peak = int(np.abs(x.astype(np.int32)).max())
                assert 0.45 * 32767 < peak < 32767  # loud, but not clipped
            for p in pngs:
                with Image.open(d / p) as im:
                    assert im.format == "PNG" and im.mode == "RGB"
                    assert 40 <= im.width <= 96 and 40 <= im.height <= 96
                    assert len(im.getcolors()) == 2  # background + one filled shape
    # The last indices of each class go to test.
    assert _files(root / "test" / "circle", ".png") == ["circle_0003.png", "circle_0004.png"]


def test_demo_is_deterministic_and_seed_sensitive(tmp_path: Path) -> None:
    a = generate.make_demo_corpus(tmp_path / "a", per_class=3, seed=1)
    generate.make_demo_corpus(tmp_path / "b", per_class=3, seed=1)
    generate.make_demo_corpus(tmp_path / "c", per_class=3, seed=2)
    ta, tb, tc = _tree(a.root), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert ta == tb  # byte-identical, marker included
    assert ta.keys() == tc.keys()
    assert all(ta[k] != tc[k] for k in ta if not k.startswith("."))


def test_demo_classes_sound_different(tmp_path: Path) -> None:
    generate.make_demo_corpus(tmp_path, per_class=1, test_fraction=0.0)

    def spectral_flatness(cls: str) -> float:
        x, sr = sf.read(str(tmp_path / "train" / cls / f"{cls}_0000.wav"))
        mag = np.abs(np.fft.rfft(x)) + 1e-9
        # fraction of energy in the strongest 0.2 % bins: high for a steady sine
        top = np.sort(mag**2)[::-1]
        return float(top[: max(1, len(top) // 500)].sum() / top.sum())

    assert spectral_flatness("circle") > spectral_flatness("square")
    assert spectral_flatness("circle") > spectral_flatness("triangle")


# ----------------------------------------------------------------- paired


def test_paired_layout_and_lengths(tmp_path: Path) -> None:
    root = tmp_path / "paired"
    s = generate.make_paired_audio(root, n_train=3, n_test=2, seconds=0.25, sample_rate=8000, seed=5)
    assert s.counts == {"train": {"data": 3, "label": 3}, "test": {"data": 2, "label": 2}}
    assert s.n_files == 10
    for split, n in (("train", 3), ("test", 2)):
        names = [f"{i}.wav" for i in range(n)]
        assert sorted(_files(root / split / "data", ".wav")) == sorted(names)
        assert sorted(_files(root / split / "label", ".wav")) == sorted(names)
        for name in names:
            noisy, sr_n = sf.read(str(root / split / "data" / name), dtype="int16")
            clean, sr_c = sf.read(str(root / split / "label" / name), dtype="int16")
            assert sr_n == sr_c == 8000
            assert noisy.shape == clean.shape == (2000,)
            assert not np.array_equal(noisy, clean)
            # the label is the noise-free version of the input
            assert np.corrcoef(noisy.astype(float), clean.astype(float))[0, 1] > 0.5
            assert np.abs(noisy.astype(np.int32)).max() < 32767


# ----------------------------------------------------------------- images


def test_image_corpus(tmp_path: Path) -> None:
    kw = dict(n_per_class=5, splits={"train": 0.6, "val": 0.4}, seed=4)
    s = generate.make_image_corpus(tmp_path / "x", **kw)
    generate.make_image_corpus(tmp_path / "y", **kw)
    assert s.counts == {"train": {"ants_like": 3, "bees_like": 3}, "val": {"ants_like": 2, "bees_like": 2}}
    assert _tree(s.root) == _tree(tmp_path / "y")
    assert _files(s.root / "val" / "bees_like", ".jpg") == ["bees_like_0003.jpg", "bees_like_0004.jpg"]
    aspects = []
    for path in sorted(s.root.rglob("*.jpg")):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 160 <= im.width <= 640 and 160 <= im.height <= 640
            aspects.append(im.width / im.height)
            # textured + noisy: not a trivially compressible flat image
            assert path.stat().st_size > 0.5 * im.width * im.height / 8
    assert len(aspects) == 10 and len(set(aspects)) > 5


def test_image_split_counts_apportion_exactly() -> None:
    assert split_counts(50, [0.8, 0.2]) == [40, 10]
    assert split_counts(7, [1, 1, 1]) == [3, 2, 2]
    assert split_counts(3, [0.5, 0.0, 0.5]) == [2, 0, 1]
    assert sum(split_counts(101, [0.7, 0.15, 0.15])) == 101


# ----------------------------------------------------------------- flat audio (benchmarks/)


def test_audio_corpus_names_and_content(tmp_path: Path) -> None:
    root = tmp_path / "fsdd"
    s = make_audio_corpus(root, n_files=25, seconds=0.1, sample_rate=8000, classes=3, seed=9)
    names = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
    assert len(names) == 25 and all(p.is_file() for p in root.iterdir())
    pat = re.compile(rf"(\d+)_({'|'.join(FSDD_SPEAKERS)})_(\d+)\.wav")
    parsed = [pat.fullmatch(n) for n in names]
    assert all(parsed)
    assert {m.group(1) for m in parsed} == {"0", "1", "2"}
    assert s.counts == {"all": {"0": 9, "1": 8, "2": 8}}
    assert "0_george_0.wav" in names and "0_george_1.wav" in names and "0_jackson_0.wav" in names
    for name in names[::5]:
        raw = (root / name).read_bytes()
        x, sr = sf.read(io.BytesIO(raw), dtype="int16")
        assert sr == 8000 and x.dtype == np.int16 and 400 <= len(x) <= 800
        assert 0 < np.abs(x.astype(np.int32)).max() < 32767
        # the hand-written header is exactly what soundfile itself would write
        again = io.BytesIO()
        sf.write(again, x, sr, subtype="PCM_16", format="WAV")
        assert again.getvalue() == raw

    make_audio_corpus(
        tmp_path / "again", n_files=25, seconds=0.1, sample_rate=8000, classes=3, seed=9
    )
    assert _tree(root) == _tree(tmp_path / "again")


def test_marker_short_circuits_and_rejects_other_arguments(tmp_path: Path) -> None:
    root = tmp_path / "m"
    first = generate.make_demo_corpus(root, per_class=2, seed=0)
    marker = json.loads((root / generate.MARKER_NAME).read_text())
    assert marker["complete"] is True and marker["args"] == {
        "per_class": 2,
        "test_fraction": 0.2,
        "seed": 0,
    }

    victim = next(root.rglob("*.png"))
    victim.unlink()
    again = generate.make_demo_corpus(root, per_class=2, seed=0)
    assert again.skipped and not victim.exists()  # nothing was regenerated
    assert (again.counts, again.n_files, again.n_bytes) == (
        first.counts,
        first.n_files,
        first.n_bytes,
    )

    with pytest.raises(ValueError, match=re.escape(str(root))):
        generate.make_demo_corpus(root, per_class=3, seed=0)
    with pytest.raises(ValueError, match=re.escape(str(root))):
        generate.make_paired_audio(root, n_train=1, n_test=1)


def test_incomplete_marker_is_regenerated(tmp_path: Path) -> None:
    root = tmp_path / "r"
    generate.make_paired_audio(root, n_train=2, n_test=1, seconds=0.05)
    expected = _tree(root)
    marker = root / generate.MARKER_NAME
    meta = json.loads(marker.read_text())
    marker.write_text(
        json.dumps({k: meta[k] for k in ("kind", "version", "args")} | {"complete": False})
    )
    (root / "train" / "data" / "1.wav").unlink()
    s = generate.make_paired_audio(root, n_train=2, n_test=1, seconds=0.05)
    assert not s.skipped
    assert _tree(root) == expected


def test_refuses_non_empty_directory_without_marker(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="no .h5batch-synth.json marker"):
        generate.make_paired_audio(tmp_path, n_train=1, n_test=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_argument_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        generate.make_demo_corpus(tmp_path / "a", test_fraction=1.5)
    with pytest.raises(TypeError):
        generate.make_demo_corpus(tmp_path / "b", per_class=2.5)
    with pytest.raises(ValueError):
        generate.make_image_corpus(tmp_path / "e", splits={"train": -1.0})


# ----------------------------------------------------------------- registry


def test_corpora_registry_names_what_source_generate_may_ask_for() -> None:
    assert generate.CORPORA == {"demo": generate.make_demo_corpus, "paired_audio": generate.make_paired_audio}

