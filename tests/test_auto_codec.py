"""``codec: auto`` chooses for where reads will come from (h5batch/conversion/auto.py).

The rule is checked on given figures (ratio, estimated output size, RAM, file system), so
nothing here depends on the machine: an output that fits in half the RAM is read from the
page cache and stored uncompressed by default; a larger one, or one on a network file
system, is compressed when it shrinks >= 1.5x; ``output.prefer: size`` compresses wherever
the trial reaches 1.15x. One real conversion is checked for what it records.
"""

from __future__ import annotations

import io
import re

import h5py
import numpy as np
import pytest

from h5batch import ConvertOptions, convert, generate
from h5batch.codecs import AUTO_CODEC, CodecSpec
from h5batch.config import job_from_dict
from h5batch.conversion.auto import MIN_RATIO, CodecChoice, Reads, choose, lz4_ratio, network_fs
from h5batch.errors import ConfigError

GB = 10**9
HOT = Reads(106 * 10**6, 24 * GB)  # the padded clips of the issue: 106 MB on a 24 GB machine
COLD = Reads(40 * GB, 24 * GB)
NFS = Reads(106 * 10**6, 24 * GB, "nfs4")


def _choice(ratio: float, reads: Reads | None, prefer: str = "speed") -> CodecChoice:
    name = choose(ratio, reads, prefer)
    weighed = reads if ratio >= MIN_RATIO and prefer == "speed" else None
    return CodecChoice("data", CodecSpec(name, None if name == "none" else 5), ratio, 32, prefer, weighed)


# -- the decision, from given figures ---------------------------------------------------------


def test_an_output_read_from_storage_is_compressed_from_1_5x():
    assert choose(9.9, COLD, "speed") == AUTO_CODEC
    assert choose(9.9, NFS, "speed") == AUTO_CODEC
    assert choose(1.49, COLD, "speed") == "none"  # under 1.5x: not worth a decode on any storage
    assert choose(1.5, COLD, "speed") == AUTO_CODEC


def test_an_output_in_the_page_cache_is_stored_raw_unless_size_is_preferred():
    assert choose(9.9, HOT, "speed") == "none"
    assert choose(9.9, HOT, "size") == AUTO_CODEC
    assert choose(1.2, HOT, "size") == AUTO_CODEC
    for prefer in ("speed", "size"):
        assert choose(MIN_RATIO - 0.01, COLD, prefer) == "none"


def test_half_the_ram_is_the_line():
    assert not Reads(12 * GB, 24 * GB).from_storage
    assert Reads(12 * GB + 1, 24 * GB).from_storage


# -- what the file says ------------------------------------------------------------------------


def test_codec_choice_states_the_ratio_where_reads_come_from_and_the_assumption():
    cold = _choice(9.9, COLD)
    assert cold.codec.name == AUTO_CODEC
    assert cold.why() == ("auto: blosc2-lz4; blosc2-lz4 shrank 32 trial samples spread over the corpus 9.90x, and "
                          "the output (~40 GB estimated) is larger than half this machine's RAM: reads come "
                          "from storage, assumed at most 2 GB/s, where decoding costs less than reading the bytes it "
                          "saves")
    assert "network file system (nfs4)" in _choice(9.9, NFS).why()
    hot = _choice(9.9, HOT)
    assert hot.why() == ("auto: none; blosc2-lz4 shrank 32 trial samples spread over the corpus 9.90x, but the "
                         "output (~106 MB estimated) fits in half the RAM: reads come from the "
                         "page cache, where a memory copy beats a decode; output.prefer: size compresses it")
    assert _choice(1.3, COLD).why().endswith("under the 1.50x from which reading fewer bytes pays; "
                                             "output.prefer: size compresses it")
    assert hot.describe() == "data: none (" + hot.why() + "; RAM here: 24 GB)"


def test_below_the_threshold_and_with_prefer_size_the_text_is_that_of_earlier_files():
    """Shipped jobs whose fields do not compress keep byte-identical outputs."""
    c = _choice(1.07, COLD)
    assert c.why() == "auto: blosc2-lz4 shrank 32 trial samples spread over the corpus 1.07x; threshold 1.15x"
    size = _choice(1.76, HOT, "size")
    assert size.codec.name == AUTO_CODEC
    assert size.why() == "auto: blosc2-lz4 shrank 32 trial samples spread over the corpus 1.76x; threshold 1.15x"


def test_the_ratio_is_that_of_hdf5s_filter_and_a_local_folder_is_not_a_network_one(tmp_path):
    silence = np.zeros(1 << 18, np.int16)
    noise = np.random.default_rng(0).integers(-32768, 32767, 1 << 18).astype(np.int16)
    assert lz4_ratio(silence, None, True) > 50
    assert lz4_ratio(noise, None, True) < 1.1
    assert network_fs(str(tmp_path / "x.h5")) is None


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
                else:  # a tiny output: the page cache, or under 1.5x
                    assert ds.attrs["codec"] == "none" and why.startswith("auto: none; "), why
                    assert "page cache" in why or "under the 1.50x" in why, why
                assert f"{name}: " in log and why in log
                assert ("RAM here: " in log) == (prefer == "speed" and ratio >= MIN_RATIO)
        assert "why this codec: auto" in render(describe(str(path)))
    assert max(ratios) >= MIN_RATIO  # float32 from 16-bit PCM shrinks ~1.5x: the rule was in play
