"""Decoding a long audio file block by block, into a buffer the caller provides.

:func:`h5batch.fields.audio.decode_audio` sends every exactly counted file here. The
output is allocated once from the header's frame count and filled :data:`BLOCK_FRAMES`
frames at a time.

Rules, and why:

* The field's rules (channels, resampling, dtype, length) run per block
  (:class:`BlockSink`); ``ResampleStream`` fed by blocks equals ``soxr.resample`` on the
  whole signal (``tests/test_long_files.py``). Reason: the output must not depend on a
  file's length or on whether it was streamed.
* Memory is the output plus one block. Reason: a 2-hour 48 kHz stereo recording is
  2.8 GB as float32.
* The file is read to its end even when ``length`` crops it, and the checks come in one
  order (zero frames, fewer frames than the header says, NaN/Inf): the same file gets the
  same reject with the same reason.
* Only formats whose header frame count is exact stream (:data:`EXACT_FORMATS`); an MP3's
  or an Ogg's count is an estimate, so those (and FFmpeg's formats) are read whole and fed
  to :class:`BlockSink` as one block.

``alloc(shape, dtype)`` returns a writable C-contiguous array of exactly that shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import DecodeError

BLOCK_FRAMES = 1 << 16  # frames per read: 512 KB of float32 stereo
# libsndfile containers whose header frame count is exact (not MP3, not Ogg).
EXACT_FORMATS = frozenset({"WAV", "WAVEX", "FLAC", "AIFF", "W64", "RF64", "CAF", "AU", "NIST", "IRCAM"})

Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def to_int16(x: np.ndarray) -> np.ndarray:
    """float32 in [-1, 1] -> int16 with rounding and clipping (as PCM writers do)."""
    return np.clip(np.rint(x * 32768.0), -32768, 32767).astype(np.int16)


def streams(fc: Any) -> bool:
    """Whether a field's samples may be decoded block by block into a caller's buffer:
    audio stored decoded, with no ``transform`` or ``features`` to run on the whole array."""
    return (getattr(fc, "type", None) == "audio" and getattr(fc, "store", "decoded") == "decoded"
            and getattr(fc, "transform", None) is None and getattr(fc, "features", None) is None)


def out_frames(frames: int, sr: int, target_sr: int, length: int | None) -> int:
    """Frames of the output: ``length``, or soxr's bound for a resample (exactly what
    ``soxr.resample`` allocates: ``frames * out / in + 1``), or the input's."""
    if length is not None:
        return length
    return int(frames * target_sr / sr) + 1 if sr != target_sr else frames


class BlockSink:
    """The output of one file, filled block by block with the field's rules."""

    def __init__(self, fc: Any, sr: int, src_channels: int, frames: int, read_dtype: np.dtype, alloc: Alloc):
        target_sr = fc.sample_rate or sr
        self.fc = fc
        self.mix = fc.channels == "mono" and src_channels > 1
        self.first = fc.channels == "first" and src_channels > 1
        ch = 1 if (self.mix or self.first) else src_channels
        self.limit = out_frames(frames, sr, target_sr, fc.length)
        # soxr.resample's own cap on its output; the stream never exceeds it in practice.
        self.cap = int(frames * target_sr / sr) + 1 if sr != target_sr else None
        self.made = 0
        self.out_dtype = np.dtype(fc.dtype)
        shape = (self.limit, ch) if fc.channels == "keep" else (self.limit,)
        self.out = alloc(shape, self.out_dtype)
        self.rows = self.out.reshape(self.limit, ch)
        self.pos = 0
        self.nonfinite = False
        self.stream = None
        if sr != target_sr:
            import soxr

            self.stream = soxr.ResampleStream(sr, target_sr, ch, dtype="float32", quality="HQ")
        # Straight reads into the output: no rule changes the samples.
        self.direct = (not self.mix and not self.first and self.stream is None
                       and np.dtype(read_dtype) == self.out_dtype)

    def direct_rows(self, n: int) -> np.ndarray | None:
        """Where the next ``n`` source frames may be read straight into, or None."""
        if self.direct and self.pos + n <= self.limit:
            return self.rows[self.pos: self.pos + n]
        return None

    def feed(self, x: np.ndarray, in_place: bool = False) -> None:
        """Take the next source frames ``(k, channels)``; ``in_place``: they were read
        into :meth:`direct_rows`."""
        if x.dtype == np.float32 and not self.nonfinite and not np.isfinite(x).all():
            self.nonfinite = True  # raised after the length checks, as the whole-file path does
        if in_place:
            self.pos += x.shape[0]
            return
        if self.mix:
            x = x.astype(np.float32).mean(axis=1, keepdims=True) / (32768.0 if x.dtype == np.int16 else 1.0)
        elif self.first:
            x = x[:, :1]
        if self.stream is not None:
            y = x.astype(np.float32) / (32768.0 if x.dtype == np.int16 else 1.0)
            x = self.stream.resample_chunk(np.ascontiguousarray(y), last=False)
        self._put(x)

    def _put(self, x: np.ndarray) -> None:
        if self.cap is not None:
            x = x[: self.cap - self.made]
            self.made += x.shape[0]
        m = min(x.shape[0], self.limit - self.pos)
        if m <= 0:
            return
        x = x[:m]
        if self.out_dtype == np.int16 and x.dtype != np.int16:
            x = to_int16(x)
        elif self.out_dtype == np.float32 and x.dtype == np.int16:
            x = x.astype(np.float32) / 32768.0
        self.rows[self.pos: self.pos + m] = x
        self.pos += m

    def finish(self, path: str, facts: dict | None = None) -> np.ndarray:
        """The output: resampler flushed, the end zero-padded to ``length`` or cut to
        the frames made; ``facts["length"]``: the frames before the padding."""
        if self.nonfinite:
            raise DecodeError(path, "audio contains NaN or Inf samples")
        if self.stream is not None:
            self._put(self.stream.resample_chunk(np.zeros((0, self.rows.shape[1]), np.float32), last=True))
        if facts is not None:
            facts["length"] = self.pos
        if self.fc.length is not None:
            self.rows[self.pos:] = 0  # the field's rule: zero-pad the end
            return self.out
        return self.out[: self.pos]


def from_pcm16(path: str, fh, layout: Any, fc: Any, alloc: Alloc, facts: dict | None = None) -> np.ndarray:
    """A plain 16-bit PCM WAV (:func:`h5batch.fields.wav.pcm16_layout`), block by block."""
    sr, ch = layout.sample_rate, layout.channels
    target_sr = fc.sample_rate or sr
    # Without resampling, frames past the field's length are cropped anyway.
    frames = layout.frames if fc.length is None or sr != target_sr else min(layout.frames, fc.length)
    sink = BlockSink(fc, sr, ch, frames, np.dtype(np.int16), alloc)
    scratch = np.empty((min(BLOCK_FRAMES, frames), ch), np.int16)
    total = frames * ch * 2
    try:
        fh.seek(layout.data_offset)
    except OSError as e:
        raise DecodeError(path, f"cannot read file: {e.strerror or e}") from e
    for pos in range(0, frames, BLOCK_FRAMES):
        k = min(BLOCK_FRAMES, frames - pos)
        rows = sink.direct_rows(k)
        buf = rows if rows is not None else scratch[:k]
        try:
            got = fh.readinto(memoryview(buf).cast("B"))
        except OSError as e:
            raise DecodeError(path, f"cannot read file: {e.strerror or e}") from e
        if got != buf.nbytes:
            raise DecodeError(path, f"truncated audio: expected {total} data bytes, read {pos * ch * 2 + got}")
        sink.feed(buf, in_place=rows is not None)
    return sink.finish(path, facts)


def from_soundfile(path: str, f: Any, read_dtype: str, fc: Any, alloc: Alloc,
                   facts: dict | None = None) -> np.ndarray:
    """An open ``soundfile.SoundFile`` (checked by the caller), read to its end block by block."""
    frames, ch = f.frames, f.channels
    sink = BlockSink(fc, f.samplerate, ch, frames, np.dtype(read_dtype), alloc)
    scratch = np.empty((min(BLOCK_FRAMES, frames), ch), read_dtype)
    done = 0
    while done < frames:
        k = min(BLOCK_FRAMES, frames - done)
        rows = sink.direct_rows(k)
        try:
            x = f.read(frames=k, dtype=read_dtype, always_2d=True, out=rows if rows is not None else scratch[:k])
        except Exception as e:
            raise DecodeError(path, f"truncated or corrupt audio data: {e}") from e
        done += x.shape[0]
        sink.feed(x, in_place=rows is not None)
        if x.shape[0] < k:
            break
    if done == 0:
        raise DecodeError(path, "audio has zero frames")
    if done < frames:
        raise DecodeError(path, f"truncated audio: header says {frames} frames, read {done}")
    return sink.finish(path, facts)
