"""The one-call WAV read (``h5batch.fields.wav_direct``) against the ordinary decode.

Rule under test: where ``read_into`` says it is done, the row holds exactly what
``decode_audio(path, fc, out)`` puts there, and where ``load`` returns an array (a field
without a length) it is exactly what ``decode_audio(path, fc)`` returns; everywhere else
they decline, and the ordinary path (which then runs) gives the same sample or the same
reject as without the fast path.
Real files written here: plain ones (shorter and longer than the field, odd data sizes,
other rates), and every header the fast path must not take.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import soundfile as sf

from h5batch.conversion.direct import direct_loaders, direct_readers
from h5batch.errors import DecodeError
from h5batch.fields.audio import AudioField, AudioKind, decode_audio
from h5batch.fields.blocks import STREAM_MIN_BYTES
from h5batch.fields.wav_direct import load, loader, read_into, reader

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


# -- load: fields without a length (every file its own number of samples) --------------


def _var(**kw) -> AudioField:
    return _field(length=None, **kw)


def _ordinary_var(path: str, fc: AudioField):
    try:
        return decode_audio(path, fc)
    except DecodeError as e:
        return e.reason


def _fast_var(path: str, fc: AudioField):
    """``load``'s array where it takes the file, else what the ordinary path gives."""
    a = loader(fc)(path)
    if a is not None:
        return a, True
    return _ordinary_var(path, fc), False


@pytest.mark.parametrize("frames", [1, 2, 999, 4000])
def test_load_takes_plain_files_of_any_length_and_equals(tmp_path, frames):
    x = _samples(frames, 100 + frames)
    path = _wav(tmp_path / "v.wav", x.tobytes())
    got, taken = _fast_var(path, _var())
    want = _ordinary_var(path, _var())
    assert taken and got.dtype == np.int16 and got.shape == (frames,)
    assert np.array_equal(got, want) and np.array_equal(got, x)


def test_load_soundfile_written_file_and_any_rate(tmp_path):
    x = _samples(2345, 101)
    sf.write(tmp_path / "s.wav", x, 22050, subtype="PCM_16")
    path = str(tmp_path / "s.wav")
    got, taken = _fast_var(path, _var(sample_rate=None))
    assert taken and np.array_equal(got, x) and np.array_equal(got, _ordinary_var(path, _var(sample_rate=None)))
    assert load(path, 22050) is not None and load(path, SR) is None  # another rate: the ordinary path decides


def test_load_odd_data_size_and_trailing_chunk(tmp_path):
    x = _samples(600, 102)
    odd = _wav(tmp_path / "o.wav", x.tobytes() + b"\x01")
    got, taken = _fast_var(odd, _var())
    assert taken and np.array_equal(got, x) and np.array_equal(got, _ordinary_var(odd, _var()))
    tail = _wav(tmp_path / "t.wav", x.tobytes(), after_data=b"LIST" + struct.pack("<I", 8) + b"\x55" * 8)
    got, taken = _fast_var(tail, _var())
    assert taken and np.array_equal(got, x) and np.array_equal(got, _ordinary_var(tail, _var()))


@pytest.mark.parametrize("case", sorted(DECLINED))
def test_load_declines_what_read_into_declines(tmp_path, case):
    path = DECLINED[case](tmp_path / "x.wav")
    got, taken = _fast_var(path, _var())
    assert not taken
    assert _same(got, _ordinary_var(path, _var()))


def test_load_leaves_a_file_the_ordinary_path_streams_to_it(tmp_path):
    """From STREAM_MIN_BYTES of samples on, decode_audio decodes block by block (bounded
    memory): ``load`` declines such a file rather than read it whole."""
    frames = STREAM_MIN_BYTES // 2
    path = _wav(tmp_path / "big.wav", np.arange(frames, dtype=np.int64).astype(np.int16).tobytes())
    assert load(path, SR) is None
    small = _wav(tmp_path / "small.wav", np.ones(frames - 1, dtype=np.int16).tobytes())
    assert load(small, SR) is not None


@pytest.mark.parametrize("settings", [
    {"dtype": "float32"}, {"length": LENGTH}, {"channels": "keep"}, {"store": "encoded"},
    {"transform": "numpy:negative"}, {"features": "log_mel"},
])
def test_fields_that_store_anything_else_get_no_loader(settings):
    fc = _field(**{"length": None, **settings})
    assert loader(fc) is None and AudioKind().direct_loader(fc) is None


def test_direct_loaders_per_field():
    loaders = direct_loaders((("a", _var()), ("b", _field())))
    assert loaders is not None and loaders[0] is not None and loaders[1] is None
    assert direct_loaders((("b", _field()),)) is None


def test_load_leaves_no_descriptor_open(tmp_path):
    good = _wav(tmp_path / "g.wav", _samples(LENGTH, 103).tobytes())
    bad = DECLINED["stereo"](tmp_path / "s.wav")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        assert load(good, SR) is not None
        assert load(bad, SR) is None and load(str(tmp_path), SR) is None
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_conversion_of_files_of_every_length_stores_what_the_ordinary_decode_gives(tmp_path):
    """End to end (``h5batch.convert``, decoding in the driver and a forked decoder): files
    the loader takes, and files it leaves to the ordinary path (a stereo file, mixed to
    mono; a soundfile-written one with a ``fact``-free but extensible header; a cut one,
    rejected), stored as the ordinary decode gives them, in manifest order."""
    import io

    import h5py

    from h5batch import ConvertOptions, convert
    from h5batch.config import job_from_dict

    root = tmp_path / "corpus"
    (root / "train" / "yes").mkdir(parents=True)
    (root / "train" / "no").mkdir()
    paths = {}
    for i in range(12):
        rel = f"train/{('yes', 'no')[i % 2]}/{i:02d}.wav"
        paths[rel] = _wav(root / rel, _samples(200 + 97 * i, 200 + i).tobytes())
    paths["train/yes/20.wav"] = DECLINED["stereo"](root / "train" / "yes" / "20.wav")
    sf.write(root / "train" / "no" / "21.wav", _samples(1234, 21), SR, subtype="PCM_16")
    paths["train/no/21.wav"] = str(root / "train" / "no" / "21.wav")
    cut = _wav(root / "train" / "no" / "22.wav", _samples(300, 22).tobytes(), data_len=4000)
    job = job_from_dict({
        "name": "var", "source": {"root": str(root), "layout": "class_folders"},
        "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "dtype": "int16"}},
        "output": {"path": str(tmp_path / "out.h5"), "codec": "none", "overwrite": True},
        "cluster": {"kind": "inprocess", "batch_size": 4, "dashboard": False},
        "policy": {"max_reject_fraction": 0.5},
    }, file="<test>")
    summary = convert(job, ConvertOptions(overwrite=True, progress=False, log=io.StringIO()))
    fc = job.fields["audio"]
    with h5py.File(summary.path, "r") as f:
        rejected = dict(zip(f["rejects"]["path"].asstr()[:], f["rejects"]["reason"].asstr()[:]))
        assert list(rejected) == ["train/no/22.wav"]
        assert rejected["train/no/22.wav"] == _ordinary_var(cut, fc)
        g = f["train"]
        offs, values = g["audio"]["offsets"][:], g["audio"]["values"][:]
        stored = {src: values[offs[row]: offs[row + 1]] for row, src in enumerate(g["source"].asstr()[:])}
    assert sorted(stored) == sorted(paths)
    for rel, path in paths.items():
        want = decode_audio(path, fc)
        assert stored[rel].dtype == want.dtype and np.array_equal(stored[rel], want), rel


def test_sample_decoders_take_the_batches_paths_and_fall_back(tmp_path):
    """``direct.sample_decoders`` (what the codec trial decodes with): per field the direct
    reader into a new row, the direct loader, or the ordinary decode; a file the fast path
    declines goes to the ordinary decode, which decodes it or raises its reject."""
    from h5batch.conversion.direct import sample_decoders

    fields = (("fixed", _field()), ("var", _var()), ("float", _var(dtype="float32")))
    decoders = sample_decoders(fields)
    good = _wav(tmp_path / "g.wav", _samples(LENGTH, 104).tobytes())
    stereo = DECLINED["stereo"](tmp_path / "s.wav")
    garbage = DECLINED["not_audio"](tmp_path / "n.wav")
    for decode in decoders:
        assert decode(good) is not None and decode(stereo) is not None
        with pytest.raises(DecodeError):
            decode(garbage)
