"""The direct 16-bit PCM WAV reader gives exactly what libsndfile gives.

Each case writes the same int16 signal as a WAV (read by h5batch's own PCM16 path) and as
a 16-bit FLAC (lossless, read by libsndfile), and decodes both with the same field
settings: any difference in cropping, padding, channel handling, scaling or resampling
between the two paths shows up as unequal arrays.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import soundfile as sf

from h5batch.errors import DecodeError
from h5batch.fields.audio import AudioField, decode_audio
from h5batch.fields.wav import pcm16_layout


def _signal(frames: int, channels: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.integers(-32768, 32767, size=(frames, channels), dtype=np.int16)
    x[:3] = [[-32768] * channels, [32767] * channels, [0] * channels]  # the extremes, exactly
    return x


def _pair(tmp_path, x: np.ndarray, rate: int, subtype: str = "PCM_16", fmt: str = "WAV"):
    wav, flac = tmp_path / "a.wav", tmp_path / "a.flac"
    sf.write(wav, x, rate, subtype=subtype, format=fmt)
    sf.write(flac, x, rate, subtype="PCM_16", format="FLAC")
    return str(wav), str(flac)


def _head(path: str):
    with open(path, "rb") as fh:
        head = fh.read(4096)
    import os

    return pcm16_layout(head, os.path.getsize(path))


CASES = [
    # (frames, channels, rate, field settings)
    (1000, 1, 16000, {}),
    (1000, 1, 16000, {"length": 600}),  # crop
    (1000, 1, 16000, {"length": 1500}),  # zero-pad
    (1000, 1, 16000, {"dtype": "float32"}),
    (1000, 2, 16000, {"channels": "keep"}),
    (1000, 2, 16000, {"channels": "mono"}),  # mixed as float, then back to int16
    (1000, 2, 16000, {"channels": "mono", "dtype": "float32", "length": 800}),
    (1000, 2, 16000, {"channels": "first", "length": 1200}),
    (1600, 1, 16000, {"sample_rate": 8000, "resample": True}),
    (1600, 2, 16000, {"sample_rate": 8000, "resample": True, "channels": "keep", "length": 500}),
]


@pytest.mark.parametrize("frames,channels,rate,settings", CASES)
def test_pcm16_path_equals_libsndfile(tmp_path, frames, channels, rate, settings):
    x = _signal(frames, channels)
    wav, flac = _pair(tmp_path, x, rate)
    assert _head(wav) is not None, "the WAV must take the direct PCM16 path"
    fc = AudioField(**settings)
    got, want = decode_audio(wav, fc), decode_audio(flac, fc)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_wavex_and_extra_chunks(tmp_path):
    """WAVE_FORMAT_EXTENSIBLE and a LIST chunk before the data still take the direct path."""
    x = _signal(900, 2, seed=1)
    wav, flac = _pair(tmp_path, x, 22050, fmt="WAVEX")
    assert _head(wav) is not None
    fc = AudioField(channels="keep")
    np.testing.assert_array_equal(decode_audio(wav, fc), decode_audio(flac, fc))
    # Insert a LIST chunk between fmt and data by hand.
    raw = open(wav, "rb").read()
    i = raw.index(b"data")
    info = b"INFOISFT" + struct.pack("<I", 6) + b"h5b\x00\x00\x00"
    lst = b"LIST" + struct.pack("<I", len(info)) + info
    body = raw[12:i] + lst + raw[i:]
    path = tmp_path / "list.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)
    assert _head(str(path)) is not None
    np.testing.assert_array_equal(decode_audio(str(path), fc), x)


def test_other_formats_use_libsndfile(tmp_path):
    """24-bit, float and 8-bit WAVs are not PCM16: libsndfile reads them."""
    x = _signal(500, 1)
    for subtype in ("PCM_24", "FLOAT", "PCM_U8"):
        wav = tmp_path / f"{subtype}.wav"
        sf.write(wav, x.astype(np.float32) / 32768, 16000, subtype=subtype)
        assert _head(str(wav)) is None
        got = decode_audio(str(wav), AudioField(dtype="float32"))
        want = sf.read(wav, dtype="float32")[0]
        np.testing.assert_array_equal(got, want)


def test_truncated_pcm16_is_rejected(tmp_path):
    x = _signal(1000, 1)
    wav = tmp_path / "t.wav"
    sf.write(wav, x, 16000, subtype="PCM_16")
    raw = wav.read_bytes()
    wav.write_bytes(raw[: len(raw) - 101])
    assert _head(str(wav)) is None  # the data chunk is not all there
    with pytest.raises(DecodeError, match="truncated audio"):
        decode_audio(str(wav), AudioField())


def test_sample_rate_mismatch_named(tmp_path):
    wav, _ = _pair(tmp_path, _signal(100, 1), 8000)
    with pytest.raises(DecodeError, match="sample rate 8000 Hz, the field stores 16000 Hz"):
        decode_audio(wav, AudioField(sample_rate=16000))
