"""Decoder warnings are caught per file on the workers, counted in the summary and written
to ``OUT.warnings.txt``, never onto the console.

Real warnings from real files made at test time: a JPEG whose EXIF block points past the
file (Pillow: ``UserWarning: Tag data larger than file``), a palette PNG with byte
transparency read as ``L`` (Pillow: ``Palette images with Transparency ...``) and an MP3
with junk after its frames (libmpg123, from C, onto fd 2: ``Warning: Xing stream size off
by more than 1%``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch.conversion import decoder_warnings as dw
from h5batch.errors import DecodeError
from h5batch.fields.audio import AudioField, decode_audio
from h5batch.fields.image import ImageField, decode_image
from tests.support.run import convert

EXIF_WARNING = "UserWarning: Tag data larger than file. Skipping tag 270"
MPG123_WARNING = "Warning: Xing stream size off by more than 1%"


def _bad_exif_jpeg(path: Path) -> Path:
    """A loadable JPEG whose EXIF ImageDescription (tag 270) points past the file, with
    orientation 6 (rotated when decoded)."""
    ifd = (struct.pack("<H", 2) + struct.pack("<HHII", 0x010E, 2, 100, 4000) + struct.pack("<HHII", 0x0112, 3, 1, 6)
           + struct.pack("<I", 0))
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(
        path, exif=b"Exif\x00\x00II*\x00" + struct.pack("<I", 8) + ifd)
    return path


def _palette_png(path: Path) -> Path:
    im = Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).convert("P")
    im.save(path, transparency=bytes([0, 255, 128] + [255] * 253))
    return path


def _mp3_with_junk(path: Path, seconds: float = 0.5) -> Path:
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="MP3",
             subtype="MPEG_LAYER_III")
    path.write_bytes(path.read_bytes() + bytes(range(256)) * 8)  # the Xing byte count is now 1% off
    return path


def _clean_mp3(path: Path, seconds: float = 0.5) -> Path:
    t = np.arange(int(16000 * seconds)) / 16000
    sf.write(path, (0.2 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), 16000, format="MP3",
             subtype="MPEG_LAYER_III")
    return path


def test_watch_keeps_each_files_python_and_native_warnings(tmp_path, capfd):
    jpg, png, mp3 = _bad_exif_jpeg(tmp_path / "a.jpg"), _palette_png(tmp_path / "p.png"), _mp3_with_junk(tmp_path / "m.mp3")
    quiet = _clean_mp3(tmp_path / "q.mp3")
    with dw.batch():
        with dw.watch("a.jpg"):
            assert decode_image(str(jpg), ImageField()).shape == (24, 16, 3)  # loaded, and rotated
        with dw.watch("m.mp3"):
            decode_audio(str(mp3), AudioField(extensions=[".mp3"]))
        with dw.watch("q.mp3"):
            decode_audio(str(quiet), AudioField(extensions=[".mp3"]))
        os.write(2, b"between two files\n")  # not a decoder's: passed on when the batch ends
        with dw.watch("p.png"):
            decode_image(str(png), ImageField(mode="L"))
            os.write(2, b"2026-12-01 12:00:00,123 - distributed.worker - WARNING - a Dask record\n")
        found = dw.take(["a.jpg", "m.mp3", "q.mp3", "p.png"])
    assert [p for p, _ in found] == ["a.jpg", "m.mp3", "p.png"]
    text = dict(found)
    assert text["a.jpg"] == f"{EXIF_WARNING} (x2)"  # Pillow reads the EXIF block twice
    assert text["m.mp3"].startswith(MPG123_WARNING)
    assert text["p.png"] == ("UserWarning: Palette images with Transparency expressed in bytes should be "
                             "converted to RGBA images")
    err = capfd.readouterr().err
    assert "between two files" in err and "distributed.worker - WARNING - a Dask record" in err
    assert "Tag data" not in err and "Xing" not in err and "Palette" not in err
    assert dw.take(["a.jpg"]) == []  # taken once


def test_a_failing_decode_keeps_its_warnings(tmp_path, capfd):
    jpg = _bad_exif_jpeg(tmp_path / "a.jpg")
    with dw.batch():
        with pytest.raises(DecodeError), dw.watch("a.jpg"):
            decode_image(str(jpg), ImageField())  # warns, then the file turns out bad
            os.write(2, b"native: giving up\n")
            raise DecodeError("a.jpg", "rejected after the warnings")
        found = dw.take(["a.jpg"])
    assert found == [("a.jpg", f"{EXIF_WARNING} (x2) | native: giving up")]
    assert "giving up" not in capfd.readouterr().err


def test_outside_a_batch_python_warnings_are_still_kept(tmp_path):
    with dw.watch("a.jpg"):
        decode_image(str(_bad_exif_jpeg(tmp_path / "a.jpg")), ImageField())
    assert dw.take(["a.jpg"]) == [("a.jpg", f"{EXIF_WARNING} (x2)")]


def test_warning_log_starts_fresh_and_resumes_without_repeating(tmp_path):
    path = str(tmp_path / "out.warnings.txt")
    Path(path).write_text("old\tfrom an earlier job\n")
    log = dw.WarningLog(path, resume=False)
    assert not os.path.exists(path) and log.files == 0
    log.add([("a.jpg", "UserWarning: x"), ("b.mp3", "Warning: y\nsecond line")])
    resumed = dw.WarningLog(path, resume=True)
    resumed.add([("a.jpg", "UserWarning: x"), ("c.png", "UserWarning: z")])  # a.jpg re-decoded after a crash
    assert Path(path).read_text().splitlines() == ["a.jpg\tUserWarning: x", "b.mp3\tWarning: y second line",
                                                   "c.png\tUserWarning: z"]
    assert resumed.files == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_conversion_writes_warnings_to_the_log_not_the_console(tmp_path, workers):
    root = tmp_path / "corpus"
    for split, cls in (("train", "a"), ("train", "b"), ("test", "a")):
        (root / split / cls).mkdir(parents=True)
    _bad_exif_jpeg(root / "train/a/1.jpg")
    _clean_mp3(root / "train/a/1.mp3")
    Image.new("RGB", (20, 16), (9, 9, 9)).save(root / "train/a/2.jpg")
    _mp3_with_junk(root / "train/a/2.mp3")
    Image.new("RGB", (20, 16), (1, 2, 3)).save(root / "train/b/3.jpg")
    _clean_mp3(root / "train/b/3.mp3")
    _bad_exif_jpeg(root / "test/a/4.jpg")
    _mp3_with_junk(root / "test/a/4.mp3")
    job = tmp_path / "job.yaml"
    out = tmp_path / "out" / "x.h5"
    # batch_size auto (1 worker) also decodes a trial of the files on the driver: quiet too
    batch = ", batch_size: 2" if workers == 2 else ""
    job.write_text(f"""
source: {{root: {root}, layout: class_folders}}
fields:
  image: {{type: image, extensions: [.jpg]}}
  audio: {{type: audio, extensions: [.mp3], dtype: float32}}
output: {{path: {out}, codec: none}}
cluster: {{kind: local, workers: {workers}, dashboard: false{batch}}}
""")
    res = convert(job, check=True, progress="log")
    log = out.with_suffix(".warnings.txt")
    lines = dict(line.split("\t", 1) for line in log.read_text().splitlines())
    assert sorted(lines) == ["test/a/4.jpg", "test/a/4.mp3", "train/a/1.jpg", "train/a/2.mp3"]
    assert lines["train/a/1.jpg"] == f"{EXIF_WARNING} (x2)" and lines["test/a/4.jpg"] == f"{EXIF_WARNING} (x2)"
    assert lines["train/a/2.mp3"].startswith(MPG123_WARNING) and lines["test/a/4.mp3"].startswith(MPG123_WARNING)
    console = res.stderr + res.stdout
    assert f"4 files gave decoder warnings, see {log}" in console
    assert "Tag data" not in console and "Xing" not in console and "UserWarning" not in console
    assert "wrote " in console and "4 samples" in console
