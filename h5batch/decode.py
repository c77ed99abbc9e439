"""Decoders and preprocessing: pure functions ``path -> numpy array`` run on Dask workers.

Audio arrays are ``(frames,)`` (mono / first channel) or ``(frames, channels)`` (keep),
dtype int16 (16-bit PCM kept exact) or float32 in [-1, 1]. Image arrays are
``(height, width, channels)`` uint8, channels 3 (RGB) or 1 (L).

Every failure raises :class:`DecodeError` with a reason a person can act on; the job puts
the file in the rejects list and goes on.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .config import AudioField, FieldConfig, ImageField


class DecodeError(Exception):
    """A file could not be turned into a sample. ``reason`` says why."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self):  # keep both arguments when the error crosses processes
        return (DecodeError, (self.path, self.reason))


_MAGIC = [
    (b"RIFF", "WAV (RIFF)"), (b"fLaC", "FLAC"), (b"OggS", "Ogg"), (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG", "PNG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"ID3", "MP3"), (b"\xff\xfb", "MP3"),
    (b"PK\x03\x04", "ZIP"), (b"%PDF", "PDF"),
]


def sniff(path: str) -> str:
    """A short description of what a file's first bytes look like (for error messages)."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if not head:
        return "empty"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "text"
    return "unknown binary"


def _check_readable(path: str) -> None:
    try:
        with open(path, "rb") as fh:
            if not fh.read(1):
                raise DecodeError(path, "empty file (0 bytes)")
    except PermissionError as e:
        raise DecodeError(path, f"cannot read file: {e.strerror}") from e
    except FileNotFoundError as e:
        raise DecodeError(path, "file disappeared since discovery") from e
    except IsADirectoryError as e:
        raise DecodeError(path, "is a directory") from e


# ---------------------------------------------------------------------------
# Audio
# ---------------------------------------------------------------------------


def _to_int16(x: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int16 with rounding and clipping (as PCM writers do)."""
    return np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)


def decode_audio(path: str, fc: AudioField) -> np.ndarray:
    """Read one audio file and apply the field's preprocessing.

    Returns ``(frames,)`` or ``(frames, channels)`` of ``fc.dtype``. 16-bit PCM read as
    int16 without resampling or mixing is bit-exact with ``soundfile.read(path, dtype='int16')``.
    """
    import soundfile as sf

    _check_readable(path)
    try:
        f = sf.SoundFile(path)
    except Exception as e:  # libsndfile's own message is the useful part
        kind = sniff(path)
        hint = f" (content looks like {kind})" if kind not in ("WAV (RIFF)", "FLAC", "Ogg") else ""
        raise DecodeError(path, f"not a readable audio file{hint}: {e}") from e
    with f:
        sr, frames, channels = f.samplerate, f.frames, f.channels
        if frames <= 0:
            raise DecodeError(path, "audio has zero frames")
        target_sr = fc.sample_rate or sr
        if sr != target_sr and not fc.resample:
            raise DecodeError(path, f"sample rate {sr} Hz, job expects {target_sr} Hz (set resample: true to convert)")
        exact_int = fc.dtype == "int16" and sr == target_sr and (channels == 1 or fc.channels != "mono")
        is_float_src = f.subtype in ("FLOAT", "DOUBLE")
        try:
            if exact_int and not is_float_src:
                x = f.read(dtype="int16", always_2d=True)
            else:
                x = f.read(dtype="float32", always_2d=True)
        except Exception as e:
            raise DecodeError(path, f"truncated or corrupt audio data: {e}") from e
    if x.shape[0] == 0:
        raise DecodeError(path, "audio has zero frames")
    if x.shape[0] < frames:
        raise DecodeError(path, f"truncated audio: header says {frames} frames, read {x.shape[0]}")
    if x.dtype == np.float32 and not np.isfinite(x).all():
        raise DecodeError(path, "audio contains NaN or Inf samples")
    # Channels: (frames, channels) -> what the field asks for.
    if fc.channels == "mono" and x.shape[1] > 1:
        x = x.astype(np.float32).mean(axis=1, keepdims=True) / (32768.0 if x.dtype == np.int16 else 1.0)
    elif fc.channels == "first":
        x = x[:, :1]
    if sr != target_sr:
        import soxr

        x = soxr.resample(x.astype(np.float32) / (32768.0 if x.dtype == np.int16 else 1.0), sr, target_sr, quality="HQ")
        x = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[1] if x.ndim == 2 else 1)
    if fc.dtype == "int16" and x.dtype != np.int16:
        x = _to_int16(x)
    elif fc.dtype == "float32" and x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    if fc.length is not None:
        # Rule (recorded in the output's field attrs): keep the start, crop or zero-pad the end.
        n = x.shape[0]
        if n >= fc.length:
            x = x[: fc.length]
        else:
            x = np.concatenate([x, np.zeros((fc.length - n, x.shape[1]), dtype=x.dtype)])
    if fc.channels != "keep":
        x = x[:, 0]
    return np.ascontiguousarray(x)


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------


def _resize_cover_crop(im, size_hw: tuple[int, int]):
    """Resize so the image covers ``size_hw`` (shorter side fits), then centre-crop."""
    from PIL import Image

    th, tw = size_hw
    w, h = im.size
    scale = max(th / h, tw / w)
    nw, nh = max(tw, round(w * scale)), max(th, round(h * scale))
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.Resampling.BILINEAR, reducing_gap=3.0)
    left, top = (nw - tw) // 2, (nh - th) // 2
    return im.crop((left, top, left + tw, top + th))


def decode_image(path: str, fc: ImageField) -> np.ndarray:
    """Read one image: EXIF orientation applied, converted to ``fc.mode``, optionally
    resized (shorter side) and centre-cropped to ``fc.size``. Returns ``(H, W, C)`` uint8."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    _check_readable(path)
    Image.MAX_IMAGE_PIXELS = fc.max_pixels  # Pillow's bomb guard stays on, at the job's limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DecodeError(path, f"decompression bomb guard: {e}") from e
    except UnidentifiedImageError as e:
        raise DecodeError(path, f"not a readable image (content looks like {sniff(path)})") from e
    except Exception as e:
        raise DecodeError(path, f"cannot open image: {e}") from e
    with im:
        w, h = im.size
        if w * h > fc.max_pixels:
            raise DecodeError(path, f"image is {w}x{h} = {w * h} pixels, above max_pixels {fc.max_pixels} (decompression-bomb guard)")
        if w <= 0 or h <= 0:
            raise DecodeError(path, f"image has empty size {w}x{h}")
        try:
            if fc.size is not None and fc.draft and im.format == "JPEG":
                # Let libjpeg decode at 1/2, 1/4 or 1/8 scale while still covering the target
                # (after EXIF rotation the axes may swap, so ask for the larger side both ways).
                th, tw = fc.size
                scale = max(th / min(w, h), tw / min(w, h), th / max(w, h), tw / max(w, h))
                need = max(1, math.ceil(max(w, h) * scale)), max(1, math.ceil(max(w, h) * scale))
                im.draft(fc.mode, (min(w, need[0]), min(h, need[1])))
            im.load()
            im = ImageOps.exif_transpose(im)
            if im.mode != fc.mode:
                if im.mode in ("RGBA", "LA", "P") and fc.mode == "RGB":
                    im = im.convert("RGBA")
                    bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
                    im = Image.alpha_composite(bg, im)
                im = im.convert(fc.mode)
            if fc.size is not None:
                im = _resize_cover_crop(im, (fc.size[0], fc.size[1]))
            arr = np.asarray(im, dtype=np.uint8)
        except DecodeError:
            raise
        except Exception as e:
            raise DecodeError(path, f"truncated or corrupt image data: {e}") from e
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return np.ascontiguousarray(arr)


def decode_field(path: str, fc: FieldConfig) -> np.ndarray:
    """Dispatch on the field type."""
    if isinstance(fc, AudioField):
        return decode_audio(path, fc)
    if isinstance(fc, ImageField):
        return decode_image(path, fc)
    raise TypeError(f"unknown field config {type(fc).__name__}")


def is_fixed_shape(fc: FieldConfig) -> bool:
    """True when every sample of the field has the same shape (stored as ``(N, *shape)``)."""
    if isinstance(fc, AudioField):
        return fc.length is not None and fc.channels != "keep"
    return fc.size is not None
