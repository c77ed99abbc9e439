"""``codec: auto`` weighs read speed and size (h5batch/conversion/auto.py).

The rule is checked on given measurements, so nothing here depends on how busy the machine
is: float32 clips (1.5-1.8x smaller, ~2 GB/s to decode against ~10 GB/s to copy) are stored
uncompressed by default and compressed with ``output.prefer: size``; a codec that decodes
faster than the reading it saves is kept; the ``codec_choice`` text states the ratio and the
break-even speed, the log line the measured speeds. The measurement itself and one real
conversion are checked for what they produce (figures, attributes), not for their values.
"""

from __future__ import annotations

import io
import math
import re

import blosc2
import h5py
import numpy as np
import pytest

from h5batch import ConvertOptions, convert, generate
from h5batch.codecs import AUTO_CODEC, CodecSpec, lz4_trial
from h5batch.config import job_from_dict
from h5batch.conversion.auto import (
    MIN_RATIO,
    CodecChoice,
    break_even,
    choose,
    decode_cost,
    read_saving,
)
from h5batch.errors import ConfigError


def _choice(ratio: float, decode: float | None, copy: float | None, prefer: str = "speed") -> CodecChoice:
    name = choose(ratio, decode, copy, prefer)
    return CodecChoice("data", CodecSpec(name, None if name == "none" else 5), ratio, 32, decode, copy, prefer)


# -- the decision, from given measurements ----------------------------------------------


def test_float32_clips_are_stored_uncompressed_unless_size_is_preferred():
    # The case: 1.76x smaller, 1.9 GB/s per core to decode, ~10 GB/s to copy.
    assert choose(1.76, 1.9, 10.0, "speed") == "none"
    assert choose(1.76, 1.9, 10.0, "size") == AUTO_CODEC
    # decoding 1 GB costs 0.53 s; reading 1/1.76 of the bytes saves 0.043 s
    assert decode_cost(1.9) == pytest.approx(0.526, abs=1e-3)
    assert read_saving(1.76, 10.0) == pytest.approx(0.0432, abs=1e-4)


def test_a_codec_that_decodes_faster_than_the_reading_it_saves_is_kept():
    # int16 speech with long silences: 8x smaller; it pays at 1.14x the copy speed
    assert break_even(8.0) == pytest.approx(8 / 7)
    assert choose(8.0, 12.0, 10.0, "speed") == AUTO_CODEC
    assert choose(8.0, 11.0, 10.0, "speed") == "none"  # just under the break-even speed
    # FSDD-like speech, 1.31x: compressed only on request
    assert choose(1.31, 2.1, 26.0, "speed") == "none"
    assert choose(1.31, 2.1, 26.0, "size") == AUTO_CODEC


def test_under_the_ratio_threshold_nothing_is_compressed_whatever_the_speeds():
    for prefer in ("speed", "size"):
        assert choose(MIN_RATIO - 0.01, 1000.0, 1.0, prefer) == "none"
        assert choose(1.0, None, None, prefer) == "none"
    assert break_even(1.0) == math.inf
    assert choose(3.0, None, None, "speed") == "none"  # not measured: no credit for speed


# -- what the file and the log say -----------------------------------------------------------


def test_codec_choice_states_the_ratio_the_break_even_speed_and_how_to_keep_compression():
    c = _choice(1.76, 1.9, 10.0)
    assert c.codec.name == "none"
    assert c.why() == ("auto: none; blosc2-lz4 shrank 32 trial samples spread over the corpus 1.76x, but decoding "
                       "it costs more than reading the bytes it saves (it pays where decoding runs at least 2.32x "
                       "as fast as a memory copy, page cache hot); output.prefer: size keeps it")
    # the log line adds the measured speeds (not stored: a rerun must write the same file)
    assert c.describe() == ("data: none (" + c.why() + "; measured here: blosc2-lz4 decodes at 1.90 GB/s per core "
                            "(0.526 s/GB) against a 0.0432 s/GB saving in reading (memory copy 10.0 GB/s))")
    kept = _choice(8.0, 12.0, 10.0)
    assert kept.why().startswith("auto: blosc2-lz4; blosc2-lz4 shrank 32 trial samples spread over the corpus 8.00x, "
                                 "and decoding it costs less than reading the bytes it saves (it pays where decoding "
                                 "runs at least 1.14x")
    size = _choice(1.76, 1.9, 10.0, "size")  # the ratio alone decides: the wording of files before prefer
    assert size.codec.name == AUTO_CODEC
    assert size.why() == "auto: blosc2-lz4 shrank 32 trial samples spread over the corpus 1.76x; threshold 1.15x"
    assert "decodes at 1.90 GB/s per core" in size.describe()


def test_below_the_threshold_the_text_is_that_of_earlier_files():
    """Shipped jobs whose fields do not compress keep byte-identical outputs."""
    c = _choice(1.07, None, None)
    assert c.why() == "auto: blosc2-lz4 shrank 32 trial samples spread over the corpus 1.07x; threshold 1.15x"
    assert c.describe() == "data: none (" + c.why() + ")"


# -- the measurement -----------------------------------------------------------------------


def test_trial_speeds_measures_both_speeds_and_leaves_blosc2s_threads_alone():
    rng = np.random.default_rng(0)
    clips = [(rng.integers(-3000, 3000, 16000) / 32768).astype(np.float32) for _ in range(8)]
    before = blosc2.nthreads
    decode, copy = lz4_trial.speeds(clips, None, True)
    assert blosc2.nthreads == before
    assert 0.0 < decode < math.inf and 0.0 < copy < math.inf


# -- the job file ----------------------------------------------------------------------------


def _job(output: dict):
    return job_from_dict({"source": {"root": "corpus"}, "fields": {"audio": {"type": "audio"}},
                          "output": {"path": "out/x.h5", **output}}, "job.yaml", check_paths=False)


def test_output_prefer_is_checked_at_the_door():
    assert _job({}).output.prefer == "speed"
    assert _job({"prefer": "size"}).output.prefer == "size"
    with pytest.raises(ConfigError) as e:
        _job({"prefer": "small"})
    assert e.value.key == "output.prefer" and "'speed', 'size'" in str(e.value) and "'small'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        _job({"codec": "gzip", "prefer": "size"})
    assert e.value.key == "output.prefer" and "only codec 'auto'" in str(e.value) and "'gzip'" in str(e.value)


def test_prefer_at_its_default_leaves_the_job_hash_unchanged():
    assert _job({}).hash() == _job({"prefer": "speed"}).hash() != _job({"prefer": "size"}).hash()


# -- one real conversion -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def float32_outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("f32") / "corpus"
    generate.make_paired_audio(root, n_train=16, n_test=4, seconds=0.5)
    out = {}
    for prefer in ("speed", "size"):
        field = {"type": "audio", "extensions": [".wav"], "sample_rate": 16000, "dtype": "float32", "length": 8000}
        job = job_from_dict({
            "name": "f32",
            "source": {"root": str(root), "layout": "paired_folders"},
            "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
            "output": {"path": str(root.parent / f"{prefer}.h5"), "codec": "auto", "prefer": prefer},
            "cluster": {"kind": "local", "workers": 1, "dashboard": False},
        }, file="<test>")
        log = io.StringIO()
        summary = convert(job, ConvertOptions(overwrite=True, progress=False, log=log))
        out[prefer] = (summary.path, log.getvalue())
    return out


SHRANK = r"blosc2-lz4 shrank \d+ trial samples spread over the corpus (\d+\.\d\d)x"


def test_float32_conversion_records_why_in_the_attribute_and_the_log(float32_outputs):
    from h5batch.tools.inspect import describe, render

    ratios = []
    for prefer, (path, log) in float32_outputs.items():
        with h5py.File(path, "r") as f:
            for name in ("data", "target"):
                ds = f[f"train/{name}"]
                why = str(ds.attrs["codec_choice"])
                ratio = float(re.search(SHRANK, why).group(1))
                ratios.append(ratio)
                if ratio < MIN_RATIO or prefer == "size":
                    assert re.fullmatch("auto: " + SHRANK + r"; threshold 1\.15x", why), why
                    assert ds.attrs["codec"].startswith("blosc2-lz4" if ratio >= MIN_RATIO else "none")
                else:  # whichever way the measured speeds went, the text says which and why
                    assert re.fullmatch(r"auto: (none|blosc2-lz4); " + SHRANK + r", (but|and) decoding it costs "
                                        r"(more|less) than reading the bytes it saves \(it pays where decoding runs "
                                        r"at least \d+\.\d\dx as fast as a memory copy, page cache hot\)"
                                        r"(; output.prefer: size keeps it)?", why), why
                    assert why.split(";")[0] == f"auto: {ds.attrs['codec'].split('-5')[0]}"
                if ratio >= MIN_RATIO:
                    assert re.search(rf"{name}: \S+ \({re.escape(why)}; measured here: blosc2-lz4 decodes at "
                                     r"\d+\.\d\d GB/s per core \([0-9.e+-]+ s/GB\) against a [0-9.e+-]+ s/GB saving "
                                     r"in reading \(memory copy \d+\.\d GB/s\)\)", log), log
        assert "why this codec: auto" in render(describe(str(path)))
    assert max(ratios) >= MIN_RATIO  # float32 from 16-bit PCM shrinks ~1.5x: the speed rule was in play
