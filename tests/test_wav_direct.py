"""The one-call WAV read (``h5batch.fields.wav_direct``) against the ordinary decode.

Rule under test: where ``read_into`` says it is done, the row holds exactly what
``decode_audio(path, fc, out)`` puts there; everywhere else it declines, and the ordinary
path (which then runs) gives the same sample or the same reject as without the fast path.
Real files written here: plain ones (shorter and longer than the field, odd data sizes,
other rates), and every header the fast path must not take.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import soundfile as sf

from h5batch.conversion.worker import direct_readers
from h5batch.errors import DecodeError
from h5batch.fields.audio import AudioField, AudioKind, decode_audio
from h5batch.fields.wav_direct import read_into, reader

SR = 16000
LENGTH = 1000


def _field(**kw) -> AudioField:
    kw.setdefault("sample_rate", SR)
    kw.setdefault("length", LENGTH)
    return AudioField(**kw)


def _wav(path, data: bytes, rate: int = SR, channels: int = 1, bits: int = 16, tag: int = 1,
         fmt_extra: bytes = b"", before_data: bytes = b"", after_data: bytes = b"", data_len: int | None = None):
    """A RIFF/WAVE file written byte by byte (so odd headers are possible)."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits) + fmt_extra
    n = len(data) if data_len is None else data_len
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + before_data
            + b"data" + struct.pack("<I", n) + data + (b"\0" if len(data) % 2 else b"") + after_data)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return str(path)


def _samples(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-32768, 32767, size=frames, dtype=np.int16)


def _ordinary(path: str, fc: AudioField):
    """What the ordinary path gives: the row, or the reject's reason."""
    out = np.full(LENGTH, 7, dtype=np.int16)
    try:
        return decode_audio(path, fc, out).copy()
    except DecodeError as e:
        return e.reason


def _fast(path: str, fc: AudioField):
    """The fast path's row where it takes the file, else what the ordinary path gives
    after it declined (the row it may have scribbled on is handed to the ordinary path)."""
    out = np.full(LENGTH, 7, dtype=np.int16)
    if reader(fc)(path, out):
        return out.copy(), True
    try:
        return decode_audio(path, fc, out).copy(), False
    except DecodeError as e:
        return e.reason, False


def _same(a, b) -> bool:
    return (isinstance(a, str) and a == b) or (not isinstance(a, str) and not isinstance(b, str)
                                               and np.array_equal(a, b))


@pytest.mark.parametrize("frames", [1, 999, LENGTH, LENGTH + 1, 3 * LENGTH])
def test_plain_files_are_taken_and_equal(tmp_path, frames):
    x = _samples(frames, frames)
    path = _wav(tmp_path / "a.wav", x.tobytes())
    got, taken = _fast(path, _field())
    assert taken
    want = _ordinary(path, _field())
    assert np.array_equal(got, want)
    n = min(frames, LENGTH)
    assert np.array_equal(got[:n], x[:n]) and not got[n:].any()


def test_soundfile_written_file_is_taken(tmp_path):
    x = _samples(1500, 1)
    sf.write(tmp_path / "s.wav", x, SR, subtype="PCM_16")
    got, taken = _fast(str(tmp_path / "s.wav"), _field())
    assert taken and np.array_equal(got, x[:LENGTH])


def test_any_rate_when_the_field_names_none(tmp_path):
    x = _samples(800, 2)
    path = _wav(tmp_path / "r.wav", x.tobytes(), rate=22050)
    fc = _field(sample_rate=None)
    got, taken = _fast(path, fc)
    assert taken and np.array_equal(got, _ordinary(path, fc))


def test_odd_data_size_keeps_whole_frames(tmp_path):
    x = _samples(600, 3)
    path = _wav(tmp_path / "o.wav", x.tobytes() + b"\x01")  # 1201 data bytes: 600 frames
    got, taken = _fast(path, _field())
    assert taken and np.array_equal(got, _ordinary(path, _field()))
    assert np.array_equal(got[:600], x) and not got[600:].any()


def test_trailing_chunk_after_short_data_is_not_read_as_samples(tmp_path):
    x = _samples(500, 4)
    path = _wav(tmp_path / "t.wav", x.tobytes(), after_data=b"LIST" + struct.pack("<I", 8) + b"\x55" * 8)
    got, taken = _fast(path, _field())
    assert taken and np.array_equal(got, _ordinary(path, _field()))
    assert not got[500:].any()


# Files the fast path must decline; the ordinary path then decides (sample or reject).
DECLINED = {
    "stereo": lambda p: _wav(p, _samples(2 * LENGTH, 5).tobytes(), channels=2),
    "other_rate": lambda p: _wav(p, _samples(LENGTH, 6).tobytes(), rate=8000),
    "float32": lambda p: _wav(p, np.zeros(LENGTH, np.float32).tobytes(), bits=32, tag=3),
    "fmt_18_bytes": lambda p: _wav(p, _samples(LENGTH, 7).tobytes(), fmt_extra=b"\0\0"),
    "chunk_before_data": lambda p: _wav(p, _samples(LENGTH, 8).tobytes(),
                                        before_data=b"fact" + struct.pack("<I", 4) + b"\0" * 4),
    "truncated_data": lambda p: _wav(p, _samples(300, 9).tobytes(), data_len=2 * LENGTH),
    "size_unknown": lambda p: _wav(p, _samples(LENGTH, 10).tobytes(), data_len=0xFFFFFFFF),
    "zero_data": lambda p: _wav(p, b""),
    "one_data_byte": lambda p: _wav(p, b"\x01"),
    "header_only_cut": lambda p: (p.write_bytes(b"RIFF\x24\0\0\0WAVEfmt "), str(p))[1],
    "empty": lambda p: (p.write_bytes(b""), str(p))[1],
    "not_audio": lambda p: (p.write_bytes(b"hello, this is text and not a wav file at all" * 40), str(p))[1],
    "missing": lambda p: str(p),
    "directory": lambda p: (p.mkdir(), str(p))[1],
}


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_declined_files_give_what_the_ordinary_path_gives(tmp_path, case):
    path = DECLINED[case](tmp_path / "x.wav")
    got, taken = _fast(path, _field())
    assert not taken
    assert _same(got, _ordinary(path, _field())), (got, _ordinary(path, _field()))


def test_ffmpeg_extension_is_declined(tmp_path):
    path = _wav(tmp_path / "a.m4a", _samples(LENGTH, 11).tobytes())
    assert not read_into(path, np.zeros(LENGTH, np.int16), LENGTH, SR)


def test_wrong_row_is_declined(tmp_path):
    path = _wav(tmp_path / "a.wav", _samples(LENGTH, 12).tobytes())
    assert not read_into(path, np.zeros(LENGTH + 1, np.int16), LENGTH, SR)
    assert not read_into(path, np.zeros(LENGTH, np.float32), LENGTH, SR)
    assert not read_into(path, np.zeros((LENGTH, 2), np.int16)[:, 0], LENGTH, SR)  # not contiguous
    assert read_into(path, np.zeros(LENGTH, np.int16), LENGTH, SR)


@pytest.mark.parametrize("settings", [
    {"dtype": "float32"}, {"length": None}, {"channels": "keep"}, {"store": "encoded"},
    {"transform": "numpy:negative"}, {"features": "log_mel"},
])
def test_fields_that_store_anything_else_get_no_reader(settings):
    assert reader(_field(**settings)) is None
    assert AudioKind().direct_reader(_field(**settings)) is None


def test_direct_readers_per_field():
    fields = (("a", _field()), ("b", _field(dtype="float32")))
    readers = direct_readers(fields)
    assert readers is not None and readers[0] is not None and readers[1] is None
    assert direct_readers((("b", _field(dtype="float32")),)) is None


def test_no_descriptor_left_open(tmp_path):
    good = _wav(tmp_path / "g.wav", _samples(LENGTH, 13).tobytes())
    bad = DECLINED["stereo"](tmp_path / "s.wav")
    before = len(os.listdir("/proc/self/fd"))
    out = np.zeros(LENGTH, np.int16)
    for _ in range(50):
        read_into(good, out, LENGTH, SR)
        read_into(bad, out, LENGTH, SR)
        read_into(str(tmp_path), out, LENGTH, SR)
    assert len(os.listdir("/proc/self/fd")) == before
