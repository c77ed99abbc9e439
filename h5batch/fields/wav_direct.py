"""The fast path of a mono 16-bit audio field: a plain mono 16-bit WAV read in one system
call, into its row (fixed length) or a new array (variable length).

Rule: where a field stores exactly a file's samples (``dtype: int16``, no ``channels:
keep``, no ``transform``, ``features`` or ``store: encoded``), no decoder library is used:
:func:`read_into` (with ``length``) reads header and samples with one ``preadv`` straight
into the row, cropped or zero-padded; :func:`load` (without) does so into a new array, for
files below :data:`~.blocks.STREAM_MIN_BYTES` (bigger ones are streamed to bound memory).

Either succeeds only on the canonical 44-byte header: ``RIFF``/``WAVE``, a 16-byte PCM
``fmt`` chunk, mono, 16 bits, block align 2, the job's sample rate (if named), ``data`` at
byte 36 with its declared bytes present. Anything else declines (False, None) and the caller
decodes the ordinary way (:func:`h5batch.fields.audio.decode_audio`), which rewrites the
sample or rejects the file.

Reason: it is what the ordinary path does (:func:`~.audio.pcm16_layout`, one ``readinto``)
without the Python around it (file object, header read, chunk walk, warning watch), over
half of a short file's decode. ``tests/test_wav_direct.py`` holds both paths byte-equal.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from .blocks import STREAM_MIN_BYTES
from .ffmpeg import wants_ffmpeg

HEADER = 44  # bytes of the canonical header: RIFF (12) + fmt chunk (8 + 16) + data chunk header (8)
_HEADER = struct.Struct("<4sI4s4sIHHIIHH4sI")
_NO_SIZE = 0xFFFFFFFF  # a streaming writer's "size unknown"


def _plain_int16(fc: Any) -> bool:
    """Whether field ``fc`` stores a mono 16-bit file's samples as they are (see the module)."""
    return (getattr(fc, "dtype", None) == "int16" and getattr(fc, "channels", "keep") != "keep"
            and getattr(fc, "store", "decoded") == "decoded" and getattr(fc, "transform", None) is None
            and getattr(fc, "features", None) is None)


def _data_bytes(head: bytearray, got: int, size: int, rate: int | None) -> int | None:
    """The ``data`` chunk's declared bytes when ``head`` (``got`` bytes read of a file of
    ``size``) is the canonical header of a plain mono 16-bit WAV at ``rate`` (any: None)
    whose data the file holds (see the module); None otherwise."""
    if got < HEADER:
        return None
    riff, _, wave, fmt, fmt_len, tag, channels, sr, _, align, bits, data, data_len = _HEADER.unpack(head)
    if (riff != b"RIFF" or wave != b"WAVE" or fmt != b"fmt " or fmt_len != 16 or tag != 1 or channels != 1
            or bits != 16 or align != 2 or (rate is not None and sr != rate) or sr < 1 or data != b"data"
            or data_len < 2 or data_len == _NO_SIZE or HEADER + data_len > size):
        return None
    return data_len


def reader(fc: Any) -> Callable[[str, np.ndarray], bool] | None:
    """:func:`read_into` bound to field ``fc`` when its stored sample is a mono 16-bit
    file's samples, cropped or zero-padded (see the module); None otherwise."""
    if not _plain_int16(fc) or getattr(fc, "length", None) is None:
        return None
    rate, length = fc.sample_rate, int(fc.length)

    def read(path: str, out: np.ndarray) -> bool:
        return read_into(path, out, length, rate)

    return read


def read_into(path: str, out: np.ndarray, length: int, rate: int | None) -> bool:
    """Fill ``out`` (a C-contiguous ``(length,)`` int16 row) with the samples of the plain
    mono 16-bit WAV at ``path``, cropped or zero-padded to ``length``; True when done.
    False (``out`` may then hold anything) when the file is not such a file at ``rate``
    Hz (``None``: any rate): the caller decodes it the ordinary way."""
    if out.shape != (length,) or out.dtype != np.int16 or not out.flags.c_contiguous or wants_ffmpeg(path):
        return False
    read = _read(path, lambda _size: out, rate, length)
    if read is None:
        return False
    n = read[1]
    if n < length:
        out[n:] = 0  # the field's rule: keep the start, zero-pad the end
    return True


def loader(fc: Any) -> Callable[[str], np.ndarray | None] | None:
    """:func:`load` bound to field ``fc`` when its stored sample is a mono 16-bit file's
    samples, whatever their number (no ``length``; see the module); None otherwise."""
    if not _plain_int16(fc) or getattr(fc, "length", None) is not None:
        return None
    rate = fc.sample_rate

    def read(path: str) -> np.ndarray | None:
        return load(path, rate)

    return read


def load(path: str, rate: int | None) -> np.ndarray | None:
    """The samples of the plain mono 16-bit WAV at ``path`` as a new ``(frames,)`` int16
    array (a view of the first ``frames`` of the one read), or None when the file is not
    such a file at ``rate`` Hz (``None``: any rate), or is one the ordinary path streams:
    the caller decodes it the ordinary way."""
    if wants_ffmpeg(path):
        return None
    read = _read(path, lambda size: np.empty((size - HEADER) // 2, dtype=np.int16)
                 if HEADER + 2 <= size < HEADER + STREAM_MIN_BYTES else None, rate)
    if read is None:
        return None
    out, n = read
    return out[:n] if n < len(out) else out


def _read(path: str, target: Callable[[int], np.ndarray | None], rate: int | None,
          limit: int | None = None) -> tuple[np.ndarray, int] | None:
    """``(samples array, samples it holds)`` of the plain mono 16-bit WAV at ``path``:
    the file opened, its size taken, its first :data:`HEADER` bytes and ``target(size)``
    (the array the samples go to; None: not this file) filled by one ``preadv``, at most
    ``limit`` samples counted. None where the file cannot be opened or read (a directory,
    EIO: the ordinary path names the cause), ``target`` declines it, the header is not
    the canonical one at ``rate`` (:func:`_data_bytes`), or the file shrank since its size
    was read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        out = target(size)
        if out is None:
            return None
        head = bytearray(HEADER)
        got = os.preadv(fd, [head, out], 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    data_len = _data_bytes(head, got, size, rate)
    if data_len is None:
        return None
    n = data_len // 2 if limit is None else min(data_len // 2, limit)
    return (out, n) if got >= HEADER + 2 * n else None
