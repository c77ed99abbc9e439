"""Re-encoding for ``store: encoded`` with ``transcode``: what bytes an image or audio
field keeps instead of its source file's.

Rules, and why:

* Images (``{format: jpeg|png|webp, quality: 90, max_size: 256}``, Pillow): the picture as
  the decoder sees it (EXIF orientation applied, converted to the field's ``mode``,
  transparency on white), its longer side shrunk to ``max_size`` if larger (aspect kept,
  Lanczos), encoded once. The reader decodes those bytes with the field's ``mode`` and
  ``size`` settings, so a fixed-size field stays fixed.
* Audio (``{format: flac}``, soundfile): the decoded samples (after resampling, channel
  mixing and ``length``) as FLAC, 16-bit for ``dtype: int16`` (lossless: the reader returns
  exactly what decoded storage holds), 24-bit for ``float32``.
* The bytes depend on the encoder's version (Pillow, libsndfile are decisive packages of
  the pre-flight); ``verify --sources`` re-encodes and compares them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ConfigError, DecodeError


@dataclass(frozen=True)
class ImageTranscode:
    """``transcode:`` of an image field."""

    format: Literal["jpeg", "png", "webp"] = "jpeg"
    quality: int = 90  # jpeg / webp: 1..100 (png: ignored)
    max_size: int | None = None  # longer side, pixels; None: as decoded


@dataclass(frozen=True)
class AudioTranscode:
    """``transcode:`` of an audio field."""

    format: Literal["flac"] = "flac"


def validate_image(t: ImageTranscode, file: str, key: str) -> None:
    if not 1 <= t.quality <= 100:
        raise ConfigError(file, f"{key}.transcode.quality", f"must be 1..100, got {t.quality}")
    if t.max_size is not None and t.max_size <= 0:
        raise ConfigError(file, f"{key}.transcode.max_size", f"must be a positive number of pixels, got {t.max_size}")


def encode_image(path: str, arr: np.ndarray, t: ImageTranscode) -> bytes:
    """``(H, W, C)`` uint8 -> the bytes of ``t.format`` (shrunk to ``t.max_size``)."""
    from PIL import Image

    im = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
    w, h = im.size
    if t.max_size is not None and max(w, h) > t.max_size:
        scale = t.max_size / max(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    try:
        if t.format == "png":
            im.save(buf, format="PNG", optimize=False)
        elif t.format == "webp":
            im.save(buf, format="WEBP", quality=t.quality, method=4)
        else:
            im.save(buf, format="JPEG", quality=t.quality, optimize=False)
    except Exception as e:  # e.g. an image larger than the format allows
        raise DecodeError(path, f"cannot transcode to {t.format}: {type(e).__name__}: {e}") from e
    return buf.getvalue()


def encode_audio(path: str, a: np.ndarray, sample_rate: int, t: AudioTranscode) -> bytes:
    """Decoded ``(frames,)`` / ``(frames, channels)`` int16 or float32 -> FLAC bytes."""
    import soundfile as sf

    subtype = "PCM_16" if a.dtype == np.int16 else "PCM_24"
    buf = io.BytesIO()
    try:
        sf.write(buf, a, sample_rate, format="FLAC", subtype=subtype)
    except Exception as e:
        raise DecodeError(path, f"cannot transcode to {t.format}: {type(e).__name__}: {e}") from e
    return buf.getvalue()
