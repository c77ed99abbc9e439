"""The ``image`` field kind: settings, decoder and what the output and the reader say.

Arrays are ``(height, width, channels)`` uint8, channels 3 (``mode: RGB``) or 1 (``L``).

Rules, and why:

* EXIF orientation is applied and transparency is composited on white before converting
  to RGB, so a sample looks the way an image viewer shows the file.
* ``size: [H, W]`` resizes the shorter side to cover and centre-crops (fixed shape); a
  JPEG may first be decoded at 1/2, 1/4 or 1/8 scale by libjpeg (``draft``), never below
  the target, since decoding fewer pixels is the cheapest resize.
* Pillow's decompression-bomb guard stays on, at the field's ``max_pixels``: a corrupt or
  hostile header must not make a worker allocate gigabytes.
* Every failure raises :class:`~h5batch.errors.DecodeError` naming the cause (corrupt
  header, truncated data, an unsupported JPEG process or bit depth, what the content looks
  like); the job puts the file in the rejects list and goes on.
* ``store: encoded`` keeps the file's bytes (or, with ``transcode``, a JPEG/PNG/WebP of the
  decoded picture at most ``max_size`` on its longer side) and the reader decodes them with
  the settings above (:mod:`h5batch.fields.encoded`, :mod:`h5batch.fields.transcode`);
  ``transform`` runs a user function on the decoded array (:mod:`h5batch.fields.transform`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError
from .base import FieldKind, late
from .files import check_readable, sniff
from .transcode import ImageTranscode, encode_image, validate_image


@dataclass(frozen=True)
class ImageField:
    """Decode with Pillow. Arrays are ``(H, W, C)`` uint8 (C = 3 for RGB, 1 for L)."""

    type: Literal["image"] = "image"
    extensions: list[str] = field(default_factory=lambda: [".jpg", ".jpeg", ".png"])
    mode: Literal["RGB", "L"] = "RGB"
    size: list[int] | None = None  # [H, W]: resize shorter side + centre crop; None = native
    max_pixels: int = 89_478_485  # Pillow's decompression-bomb guard (its default)
    draft: bool = True  # let the JPEG decoder downscale while decoding when resizing
    folder: str | None = None
    column: str | None = None
    store: Literal["decoded", "encoded"] = late("decoded")  # encoded: keep the file's bytes
    transcode: ImageTranscode | None = late()  # with store: encoded, re-encode (jpeg, png, webp)
    transform: str | None = late()  # "package.module:function" run on the decoded array


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


# SOF markers of the hierarchical (differential) JPEG processes: libjpeg has no decoder.
_JPEG_HIERARCHICAL = {0xC5: "SOF5", 0xC6: "SOF6", 0xC7: "SOF7", 0xCD: "SOF13", 0xCE: "SOF14", 0xCF: "SOF15"}


def jpeg_frame(path: str) -> tuple[int, int] | None:
    """``(SOF marker, sample precision in bits)`` of a JPEG, or None when not found."""
    with open(path, "rb") as fh:
        data = fh.read(1 << 16)  # the frame header comes before the scan data
    if not data.startswith(b"\xff\xd8"):
        return None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):
            pos += 2
            continue
        if marker == 0xDA:  # start of scan: no frame header before it
            return None
        length = int.from_bytes(data[pos + 2: pos + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return (marker, data[pos + 4]) if pos + 4 < len(data) else None
        pos += 2 + length
    return None


def _unsupported_jpeg(path: str) -> str | None:
    """Why libjpeg cannot decode a well-formed JPEG, or None when it should."""
    frame = jpeg_frame(path)
    if frame is None:
        return None
    marker, bits = frame
    if marker in _JPEG_HIERARCHICAL:
        return (f"unsupported JPEG coding process: hierarchical ({_JPEG_HIERARCHICAL[marker]}), "
                f"which libjpeg cannot decode")
    if bits != 8:
        return f"unsupported JPEG: {bits}-bit samples (Pillow decodes 8-bit JPEG only)"
    return None


def _image_open_reason(path: str, err: Exception) -> str:
    """Why Pillow could not open ``path``."""
    from PIL import UnidentifiedImageError

    kind = sniff(path)
    if kind in ("JPEG", "PNG", "GIF", "BMP"):
        why = _unsupported_jpeg(path) if kind == "JPEG" else None
        if why:
            return why
        detail = "Pillow cannot identify it" if isinstance(err, UnidentifiedImageError) else str(err)
        return f"corrupt {kind} header: {detail}"
    return f"not a readable image (content looks like {kind})"


def _image_load_reason(path: str, err: Exception) -> str:
    """Why Pillow opened ``path`` but could not decode its pixels."""
    if sniff(path) == "JPEG":
        why = _unsupported_jpeg(path)
        if why:
            return why
    text = str(err)
    if "truncated" in text.lower():
        return f"truncated image data: {text}"
    return f"corrupt image data: {text}"


def decode_image(path: str, fc: ImageField) -> np.ndarray:
    """Read one image: EXIF orientation applied, converted to ``fc.mode``, optionally
    resized (shorter side) and centre-cropped to ``fc.size``. Returns ``(H, W, C)`` uint8."""
    from PIL import Image, ImageOps

    check_readable(path)
    Image.MAX_IMAGE_PIXELS = fc.max_pixels  # Pillow's bomb guard stays on, at the job's limit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(path)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DecodeError(path, f"decompression bomb guard: more pixels than max_pixels {fc.max_pixels} ({e})") from e
    except Exception as e:  # UnidentifiedImageError, or a parse error in a plugin
        raise DecodeError(path, _image_open_reason(path, e)) from e
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
                side = max(1, math.ceil(max(w, h) * (max(fc.size) / min(w, h))))
                im.draft(fc.mode, (min(w, side), min(h, side)))
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
            raise DecodeError(path, _image_load_reason(path, e)) from e
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return np.ascontiguousarray(arr)


class ImageKind(FieldKind):
    """``type: image``: decoded with Pillow."""

    name = "image"
    config_class = ImageField

    def validate(self, fc: ImageField, file: str, key: str) -> None:
        if fc.size is not None and (len(fc.size) != 2 or min(fc.size) <= 0):
            raise ConfigError(file, f"{key}.size", f"must be [height, width] > 0, got {fc.size}")
        if fc.max_pixels <= 0:
            raise ConfigError(file, f"{key}.max_pixels", "must be positive")
        if fc.transcode is not None:
            validate_image(fc.transcode, file, key)

    def decode(self, path: str, fc: ImageField) -> np.ndarray:
        return decode_image(path, fc)

    def transcode(self, path: str, fc: ImageField) -> bytes:
        # The picture at its own size (EXIF, mode, alpha applied); the reader resizes.
        return encode_image(path, decode_image(path, dataclasses.replace(fc, size=None)), fc.transcode)

    def fixed_shape(self, fc: ImageField) -> tuple[tuple[int, ...], np.dtype] | None:
        if fc.size is None:
            return None
        h, w = fc.size
        return (int(h), int(w), 3 if fc.mode == "RGB" else 1), np.dtype(np.uint8)

    def attrs(self, fc: ImageField) -> dict[str, Any]:
        return {"mode": fc.mode, "axes": "height,width,channel",
                "resize": "shorter side to fit, centre crop" if fc.size else "native size"}

    def packages(self, fc: ImageField) -> set[str]:
        return {"pillow"}

    def float_scale(self, dtype: np.dtype) -> float | None:
        return 255.0 if np.dtype(dtype) == np.uint8 else None  # uint8 -> [0, 1]

    def channels_first_axes(self, ndim: int) -> tuple[int, ...] | None:
        return (2, 0, 1) if ndim == 3 else None  # (H, W, C) -> (C, H, W)
