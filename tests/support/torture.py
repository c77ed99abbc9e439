"""A torture corpus: every kind of bad input we know of, mixed with good files.

:func:`make_torture_corpus` writes four small corpora under one root, each converted by
one job of :func:`torture_jobs`:

``audio/``      class_folders, field ``audio`` (.wav/.flac, 16 kHz, no resampling)
``image/``      class_folders, field ``image`` (.jpg/.jpeg/.png, RGB, native size,
                ``max_pixels`` 1,000,000)
``paired/``     paired_folders, fields ``data`` + ``target`` (folders ``data`` and ``label``)
``manifest/``   manifest layout; the CSV is ``lists/manifest.csv`` (outside the corpus root)
``outside/``    files that symlinks and manifest rows point at from the corpora

It returns ``{"<corpus>/<reject path>": expected reason substring}`` for every bad input:
the reject path is what the output's ``/rejects/path`` holds (relative to that corpus's
root; for manifest rows that are not a file, ``manifest.csv:<line>``). The good files are
listed by :func:`good_files`. Everything is deterministic for a given seed.

Test data, not product: only ``tests/test_bad_inputs.py`` converts it, so it lives in the
test suite's support package.

BEWARE: an unreadable file (``chmod 000``) is only made when not running as root: root
reads it anyway, so it would not be bad. ``skipped()`` says what was left out and why.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from PIL import Image

SR = 16000
MAX_PIXELS = 1_000_000
_INDEX = "torture.json"


# ---------------------------------------------------------------------------
# Byte makers
# ---------------------------------------------------------------------------


def _tone(rng: np.random.Generator, frames: int, channels: int = 1) -> np.ndarray:
    t = np.arange(frames) / SR
    f0 = rng.uniform(200, 900)
    x = 0.4 * np.sin(2 * np.pi * f0 * t) + 0.05 * rng.standard_normal(frames)
    x = np.repeat(x[:, None], channels, axis=1) * np.linspace(1.0, 0.6, channels)
    return x.astype(np.float32) if channels > 1 else x[:, 0].astype(np.float32)


def _wav(x: np.ndarray, sr: int = SR, subtype: str = "PCM_16", fmt: str = "WAV") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, sr, subtype=subtype, format=fmt)
    return buf.getvalue()


def _wav_with_tag(tag: int, payload: bytes) -> bytes:
    """A well-formed RIFF/WAVE header declaring codec ``tag`` (WAVEFORMATEX, cbSize 0)."""
    fmt_chunk = struct.pack("<HHIIHHH", tag, 2, 48000, 48000 * 4, 4, 16, 0)
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
            + b"data" + struct.pack("<I", len(payload)) + payload)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _image(rng: np.random.Generator, h: int, w: int, mode: str = "RGB") -> Image.Image:
    yy, xx = np.mgrid[0:h, 0:w]
    base = (xx * rng.uniform(2, 9) + yy * rng.uniform(2, 9)) % 256
    rgb = np.stack([base, (base * 3) % 256, 255 - base], axis=-1).astype(np.uint8)
    rgb ^= rng.integers(0, 8, rgb.shape, dtype=np.uint8)
    im = Image.fromarray(rgb, "RGB")
    if mode == "RGBA":
        im.putalpha(Image.fromarray((xx * 255 // max(w - 1, 1)).astype(np.uint8), "L"))
    elif mode != "RGB":
        im = im.convert(mode)
    return im


def _encode(im: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_bomb(side: int = 20000) -> bytes:
    """A 1-bit ``side`` x ``side`` PNG of zeros: ~50 KB on disk, ``side**2`` pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + side // 8)
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _patch_sof(jpeg: bytes, marker: int | None = None, bits: int | None = None) -> bytes:
    """Change the frame marker (SOFn) or the sample precision of a baseline JPEG."""
    i = jpeg.index(b"\xff\xc0")
    out = bytearray(jpeg)
    if marker is not None:
        out[i + 1] = marker
    if bits is not None:
        out[i + 4] = bits
    return bytes(out)


# ---------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------


class _Maker:
    def __init__(self, root: Path, seed: int):
        self.root = root
        self.rng = np.random.default_rng(seed)
        self.bad: dict[str, str] = {}
        self.good: dict[str, list[str]] = {}
        self.skipped: list[str] = []

    def write(self, corpus: str, rel: str, data: bytes, reason: str | None = None, *,
              record: bool = True) -> Path:
        """Write a file; ``reason`` None = a good file (unless ``record`` is False: a file
        that is no input of its job, e.g. one the manifest does not list)."""
        path = self.root / corpus / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if record:
            self.record(corpus, rel, reason)
        return path

    def link(self, corpus: str, rel: str, target: str, reason: str | None, *, record: bool = True) -> None:
        path = self.root / corpus / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
        if record:
            self.record(corpus, rel, reason)

    def record(self, corpus: str, rel: str, reason: str | None) -> None:
        if reason is None:
            self.good.setdefault(corpus, []).append(rel)
        else:
            self.bad[f"{corpus}/{rel}"] = reason

    def good_wav(self, corpus: str, rel: str, seconds: float = 0.25, **kw: Any) -> bytes:
        frames = int(SR * seconds * self.rng.uniform(0.6, 1.4))
        data = _wav(_tone(self.rng, frames), **kw)
        self.write(corpus, rel, data)
        return data

    def unreadable(self, corpus: str, rel: str, data: bytes) -> None:
        if os.geteuid() == 0:
            self.skipped.append(f"{corpus}/{rel}: unreadable file not made (running as root, "
                                f"which reads chmod 000 files)")
            return
        path = self.write(corpus, rel, data, "Permission denied")
        path.chmod(0)


def _audio(m: _Maker) -> None:
    c = "audio"
    good = _wav(_tone(m.rng, 4000))
    for split, classes in (("train", ("cat", "dog")), ("test", ("cat", "dog"))):
        for cls in classes:
            for k in range(3):
                m.good_wav(c, f"{split}/{cls}/{cls}_{k}.wav")
    m.write(c, "train/cat/stereo.wav", _wav(_tone(m.rng, 3000, channels=2)))
    m.write(c, "train/cat/float.wav", _wav(_tone(m.rng, 2500), subtype="FLOAT"))
    m.write(c, "train/dog/pcm24.wav", _wav(_tone(m.rng, 2000), subtype="PCM_24"))
    m.write(c, "train/dog/lossless.flac", _wav(_tone(m.rng, 3500), fmt="FLAC"))
    m.write(c, "test/dog/2.wav", _wav(_tone(m.rng, 1000)))  # natural order: 2 before 10
    m.write(c, "test/dog/10.wav", _wav(_tone(m.rng, 1000)))
    m.write(c, "train/notes.txt", b"recorded in the garden\n", "not inside a class folder")

    m.write(c, "train/dog/truncated.wav", good[: len(good) // 2], "truncated audio")
    m.write(c, "train/dog/truncated_header.wav", good[:30], "truncated or malformed WAV header")
    m.write(c, "train/dog/empty.wav", b"", "empty file (0 bytes)")
    m.write(c, "train/cat/photo.wav", _encode(_image(m.rng, 16, 16), "JPEG"), "content looks like JPEG")
    m.write(c, "train/cat/ac3.wav", _wav_with_tag(0x2000, m.rng.bytes(3072)), "unsupported audio codec")
    m.write(c, "train/cat/silence.wav", _wav(np.zeros(0, np.int16)), "zero frames")
    nan = _tone(m.rng, 1000)
    nan[500] = np.nan
    m.write(c, "train/dog/nan.wav", _wav(nan, subtype="FLOAT"), "NaN or Inf")
    inf = _tone(m.rng, 1000)
    inf[10] = np.inf
    m.write(c, "test/cat/inf.wav", _wav(inf, subtype="FLOAT"), "NaN or Inf")
    m.write(c, "test/dog/cd.wav", _wav(_tone(m.rng, 2205), sr=22050), "sample rate 22050 Hz, the field stores 16000 Hz")
    m.write(c, "train/dog/readme.md", b"# notes\n", "extension '.md' is not accepted")
    # Same stem twice in a one-field job: two files, two samples (keys dog/dup.flac, dog/dup.wav).
    m.write(c, "train/dog/dup.flac", _wav(_tone(m.rng, 1200), fmt="FLAC"))
    m.write(c, "train/dog/dup.wav", _wav(_tone(m.rng, 1200)))
    m.link(c, "train/dog/gone.wav", "does_not_exist.wav", "broken symlink")
    m.link(c, "train/cat/escape.wav", "../../../outside/secret.wav", "symlink points outside the corpus root")
    # a second path to a file already in the corpus: one sample, and this path a reject
    m.link(c, "train/cat/inside.wav", "cat_0.wav", "same file as train/cat/cat_0.wav, through a symlink")
    m.link(c, "train/cat/loop", ".", "symlink loop")
    m.write(c, "stray.wav", good, "not inside a split folder")
    m.unreadable(c, "train/dog/locked.wav", good)


def _images(m: _Maker) -> None:
    c = "image"
    jpeg = _encode(_image(m.rng, 40, 56), "JPEG", quality=90)
    for split in ("train", "val"):
        for cls in ("ants", "bees"):
            for k in range(2):
                h, w = int(m.rng.integers(12, 40)), int(m.rng.integers(12, 40))
                m.write(c, f"{split}/{cls}/{cls}_{k}.png", _encode(_image(m.rng, h, w), "PNG"))
            m.write(c, f"{split}/{cls}/{cls}_photo.jpg", _encode(_image(m.rng, 24, 32), "JPEG", quality=85))
    m.write(c, "train/ants/gray.png", _encode(_image(m.rng, 20, 18, "L"), "PNG"))
    m.write(c, "train/ants/alpha.png", _encode(_image(m.rng, 17, 23, "RGBA"), "PNG"))
    m.write(c, "train/bees/palette.png", _encode(_image(m.rng, 15, 21, "P"), "PNG"))
    m.write(c, "train/bees/really_png.jpeg", _encode(_image(m.rng, 9, 11), "PNG"))  # decodable: good

    m.write(c, "train/ants/truncated.jpg", jpeg[: len(jpeg) // 2], "truncated image data")
    m.write(c, "train/ants/garbage.jpg", jpeg[:4] + m.rng.bytes(2000), "corrupt JPEG")
    m.write(c, "train/bees/empty.png", b"", "empty file (0 bytes)")
    m.write(c, "train/bees/notes.png", b"this is a text file, not a picture\n" * 4, "content looks like text")
    m.write(c, "val/bees/sound.png", _wav(_tone(m.rng, 800)), "content looks like WAV")
    m.write(c, "train/bees/twelve_bit.jpg", _patch_sof(jpeg, bits=12), "unsupported JPEG: 12-bit")
    m.write(c, "val/ants/hierarchical.jpg", _patch_sof(jpeg, marker=0xC5), "unsupported JPEG coding process")
    m.write(c, "val/ants/bomb.png", _png_bomb(), "decompression bomb")
    m.link(c, "val/ants/moved.jpg", "../../nowhere/moved.jpg", "broken symlink")
    m.link(c, "train/bees/escape.png", "../../../outside/secret.png", "symlink points outside the corpus root")


def _paired(m: _Maker) -> None:
    c = "paired"
    for split, stems in (("train", (1, 2, 6, 7, 8)), ("test", (1, 2))):
        for k in stems:
            m.good_wav(c, f"{split}/data/{k}.wav", seconds=0.15)
            m.good_wav(c, f"{split}/label/{k}.wav", seconds=0.15)
    m.write(c, "train/data/3.wav", _wav(_tone(m.rng, 900)), "paired sample incomplete")
    m.write(c, "train/label/4.wav", _wav(_tone(m.rng, 900)), "paired sample incomplete")
    data5 = _wav(_tone(m.rng, 1600))
    m.write(c, "train/data/5.wav", data5, "paired file train/label/5.wav was rejected")
    m.write(c, "train/label/5.wav", data5[: len(data5) * 2 // 3], "truncated audio")
    m.write(c, "test/data/9.wav", _wav(_tone(m.rng, 700)), "paired file test/label/9.wav was rejected")
    m.write(c, "test/label/9.wav", _wav(_tone(m.rng, 700), sr=8000), "sample rate 8000 Hz")
    m.write(c, "test/noise/1.wav", _wav(_tone(m.rng, 300)), "not inside a field folder")
    m.link(c, "test/label/2b.wav", "missing.wav", "broken symlink")


def _manifest(m: _Maker) -> None:
    c = "manifest"
    rows: list[dict[str, str]] = []
    for k in range(6):
        rel = f"clips/{'ab'[k % 2]}/clip{k}.wav"
        m.good_wav(c, rel, seconds=0.1)
        rows.append({"path": rel, "label": ["yes", "no"][k % 2], "split": "train" if k < 4 else "test"})
    m.write(c, "clips/a/empty.wav", b"", "empty file (0 bytes)")
    rows.append({"path": "clips/a/empty.wav", "label": "yes", "split": "train"})
    m.write(c, "clips/unlisted.wav", _wav(_tone(m.rng, 500)), record=False)  # not listed: no input
    m.link(c, "clips/b/escape.wav", "../../../outside/secret.wav", None, record=False)  # row below
    lines = [("path", "label", "split")] + [(r["path"], r["label"], r["split"]) for r in rows]
    extra = [
        (("../outside/secret.wav", "yes", "train"), "../outside/secret.wav", "points outside the corpus root"),
        (("clips/b/escape.wav", "no", "train"), "clips/b/escape.wav", "points outside the corpus root"),
        (("clips/a/missing.wav", "no", "test"), "clips/a/missing.wav", "file does not exist"),
        ((rows[0]["path"], "yes", "train"), None, "duplicate: clips/a/clip0.wav is already listed in row 2"),
        (("./clips/b/clip1.wav", "no", "test"), None, "duplicate: clips/b/clip1.wav is already listed in row 3"),
        (("", "no", "train"), None, "row has no 'path' value"),
    ]
    for fields, reject, reason in extra:
        lines.append(fields)
        key = reject if reject is not None else f"manifest.csv:{len(lines)}"
        m.bad[f"{c}/{key}"] = reason
    out = m.root / "lists" / "manifest.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(",".join(r) + "\n" for r in lines))


def make_torture_corpus(root: str | os.PathLike[str], seed: int = 0) -> dict[str, str]:
    """Create the torture corpora under ``root`` (which must not exist or be empty).

    Returns ``{"<corpus>/<reject path>": reason substring}`` for every bad input; the good
    files are in :func:`good_files`. See the module docstring for the layout.
    """
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; the torture corpus needs a fresh folder")
    m = _Maker(root, seed)
    outside = root / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.wav").write_bytes(_wav(_tone(m.rng, 800)))
    (outside / "secret.png").write_bytes(_encode(_image(m.rng, 8, 8), "PNG"))
    _audio(m)
    _images(m)
    _paired(m)
    _manifest(m)
    (root / _INDEX).write_text(json.dumps({"seed": seed, "bad": m.bad, "good": m.good, "skipped": m.skipped},
                                          indent=1, sort_keys=True))
    return dict(m.bad)


def good_files(root: str | os.PathLike[str]) -> dict[str, list[str]]:
    """``{corpus: [relative paths]}`` of the files that must become samples."""
    return json.loads((Path(root) / _INDEX).read_text())["good"]


def skipped(root: str | os.PathLike[str]) -> list[str]:
    """Bad kinds that could not be made here, and why."""
    return json.loads((Path(root) / _INDEX).read_text())["skipped"]


def torture_jobs(root: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                 workers: int = 1) -> dict[str, dict[str, Any]]:
    """Job dicts (for :func:`h5batch.config.job_from_dict`) converting each torture corpus
    to ``out_dir/<corpus>.h5`` with ``policy.max_reject_fraction`` 1.0."""
    root, out_dir = Path(root), Path(out_dir)
    audio = {"type": "audio", "extensions": [".wav", ".flac"], "sample_rate": SR, "resample": False,
             "dtype": "int16"}
    common = {"cluster": {"kind": "local", "workers": workers, "batch_size": 4, "dashboard": False},
              "policy": {"max_reject_fraction": 1.0}}

    def job(name: str, source: dict, fields: dict, codec: str) -> dict[str, Any]:
        return {"name": f"torture-{name}", "source": source, "fields": fields,
                "output": {"path": str(out_dir / f"{name}.h5"), "codec": codec, "chunk_bytes": 4096,
                           "overwrite": True}, **common}

    return {
        "audio": job("audio", {"root": str(root / "audio"), "layout": "class_folders"},
                     {"audio": audio}, "none"),
        "image": job("image", {"root": str(root / "image"), "layout": "class_folders", "splits": ["train", "val"]},
                     {"image": {"type": "image", "extensions": [".jpg", ".jpeg", ".png"], "mode": "RGB",
                                "max_pixels": MAX_PIXELS}}, "gzip"),
        "paired": job("paired", {"root": str(root / "paired"), "layout": "paired_folders"},
                      {"data": {**audio, "folder": "data"}, "target": {**audio, "folder": "label"}}, "blosc2-lz4"),
        "manifest": job("manifest", {"root": str(root / "manifest"), "layout": "manifest",
                                     "manifest": str(root / "lists" / "manifest.csv")},
                        {"audio": {**audio, "column": "path"}}, "zstd"),
    }


BROKEN_WAV = b"RIFF\x00\x00\x00\x00WAVEnot a wav file at all"


def paired_with_rejects(root: Path, bad: tuple[str, ...], **kw: Any) -> Path:
    """:func:`h5batch.generate.make_paired_audio` under ``root`` (``kw`` its settings), the
    files ``bad`` (relative paths) then overwritten by a broken WAV that becomes a reject."""
    from h5batch import generate

    generate.make_paired_audio(root, **kw)
    for rel in bad:
        (root / rel).write_bytes(BROKEN_WAV)
    return root
