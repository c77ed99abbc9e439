"""Blosc2's C library through ctypes (``h5batch/codecs/blosc2_lib.py``) makes the chunks the
``blosc2`` package makes, byte for byte, so ``codec: auto``'s trial gives the same ratio
either way; and a job whose trial runs on it has no writer that imports blosc2 for it."""

from __future__ import annotations

import numpy as np
import pytest

from h5batch.codecs import blosc2_lib, lz4_trial
from h5batch.config import job_from_dict
from h5batch.conversion.writer_start import codec_libraries

blosc2 = pytest.importorskip("blosc2")
LIB = blosc2_lib.library()
pytestmark = pytest.mark.skipif(LIB is None, reason="no declared layout for this blosc2 C library")


def _samples() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    t = np.arange(200_000)
    return [(np.sin(t / 40) * 3000 + rng.normal(0, 30, t.size)).astype(np.int16),
            rng.integers(-32768, 32767, 150_000).astype(np.int16),
            rng.standard_normal(90_000).astype(np.float32),
            np.zeros(5000, np.float32),
            np.arange(3, dtype=np.uint8)]


@pytest.mark.parametrize("level", [1, 5, 9])
@pytest.mark.parametrize("shuffle", [True, False])
def test_chunks_equal_the_packages_and_decode_back(level, shuffle):
    for a in _samples():
        raw = a.view(np.uint8)
        filt = "shuffle" if shuffle else "none"
        ours = blosc2_lib.compress2(LIB, raw, a.itemsize, level, "lz4", filt)
        theirs = blosc2.compress2(raw, typesize=a.itemsize, clevel=level, codec=blosc2.Codec.LZ4,
                                  filters=[blosc2.Filter.SHUFFLE if shuffle else blosc2.Filter.NOFILTER], nthreads=1)
        assert ours == theirs, (a.dtype, a.size, level, shuffle)
        out = np.empty_like(raw)
        assert blosc2_lib.decompress2(LIB, ours, out) == raw.nbytes
        assert np.array_equal(out, raw)
        assert np.array_equal(np.frombuffer(blosc2.decompress2(ours), np.uint8), raw)


def test_the_trials_chunks_and_ratio_are_the_packages():
    flat = np.concatenate([a.reshape(-1) for a in _samples()[:2]])
    chunks = lz4_trial.lz4_chunks(flat, None, True, lz4_trial.RATIO_PIECE)
    raw = flat.view(np.uint8)
    piece = lz4_trial.RATIO_PIECE
    expected = [blosc2.compress2(raw[p: p + piece], typesize=2, clevel=5, codec=blosc2.Codec.LZ4,
                                 filters=[blosc2.Filter.SHUFFLE], nthreads=1) for p in range(0, raw.size, piece)]
    assert chunks == expected
    assert lz4_trial.in_process()
    decode, copy = lz4_trial.speeds([flat], None, True)
    assert decode > 0 and copy > 0


def test_a_bad_buffer_is_an_error_not_a_crash():
    out = np.empty(64, np.uint8)
    with pytest.raises(ValueError, match="decompression failed"):
        blosc2_lib.decompress2(LIB, b"\x00" * 40, out)


@pytest.mark.parametrize("codec, prefer, expected", [("auto", "speed", ()), ("auto", "size", ("blosc2",)),
                                                     ("blosc2-lz4", "speed", ("blosc2",)), ("none", "speed", ())])
def test_a_writer_imports_blosc2_only_where_its_job_may_need_it(tmp_path, codec, prefer, expected):
    (tmp_path / "a.wav").write_bytes(b"")
    job = job_from_dict({"name": "t", "source": {"root": str(tmp_path)},
                         "fields": {"audio": {"type": "audio", "extensions": [".wav"]}},
                         "output": {"path": str(tmp_path / "o.h5"), "codec": codec, "prefer": prefer}},
                        check_paths=False)
    assert codec_libraries(job) == expected


def test_without_the_c_library_the_trial_uses_the_package_and_gets_the_same_figures(monkeypatch):
    """Where the C library does not load (another blosc2 release), the trial imports the
    package, and the writer measures (``in_process`` False): the chunks are the same."""
    flat = np.concatenate([a.reshape(-1) for a in _samples()[:2]])
    ours = lz4_trial.lz4_chunks(flat, 3, True, lz4_trial.RATIO_PIECE)
    monkeypatch.setattr(blosc2_lib, "library", lambda: None)
    assert not lz4_trial.in_process()
    assert lz4_trial.lz4_chunks(flat, 3, True, lz4_trial.RATIO_PIECE) == ours
    figures = lz4_trial.measure({"a": (flat, [flat])}, 3, True, 1.15)
    assert figures["a"][0] == pytest.approx(flat.nbytes / sum(len(c) for c in ours))
