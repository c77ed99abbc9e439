"""The codec registry (h5batch/codecs/): every registered codec writes chunks that plain h5py
reads back, its Python encoder agrees with HDF5, a bad level names the codec's range, a codec
registered from outside the package is accepted everywhere without editing another module,
and the docs name every codec."""

from __future__ import annotations

import re
import zlib
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (registers the plugin filters for reading)
import numpy as np
import pytest

from h5batch import codecs
from h5batch.codecs import CODECS, ChunkDecoder, Codec, CodecSpec, make_encoder, self_check
from h5batch.codecs.base import uses_shuffle
from h5batch.config import job_from_dict
from h5batch.errors import ConfigError
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Overrides conftest's /dev/shm check: nothing here converts."""
    yield


DTYPES = ["u1", "<i2", "<f4"]


def _chunkish(dtype: str, rows: int = 8) -> np.ndarray:
    """Varied but compressible rows (like PCM or pixels)."""
    return ((np.arange(rows * 1000).reshape(rows, 1000) * 7919 % 50).cumsum(axis=1) % 251).astype(dtype)


def _job(output: dict[str, Any]):
    return job_from_dict({"source": {"root": "corpus"}, "fields": {"audio": {"type": "audio"}},
                          "output": {"path": "out/x.h5", **output}}, "job.yaml", check_paths=False)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", codecs.names())
def test_every_codec_round_trips_through_h5py(name, dtype, shuffle, tmp_path):
    codec = codecs.get(name)
    data = _chunkish(dtype)
    levels = [None] if codec.levels is None else [None, codec.levels[0], codec.levels[-1]]
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        for i, level in enumerate(levels):
            spec = CodecSpec(name, level, shuffle)
            kwargs = spec.dataset_kwargs(data.itemsize)
            # HDF5 compressing itself
            f.create_dataset(f"hdf5_{i}", data=data, chunks=(4, 1000), **kwargs)
            # the writer's path: Python encoder + write_direct_chunk
            enc = make_encoder(spec, data.dtype)
            assert (enc is None) == (name == "lzf")  # lzf: only HDF5 encodes
            if enc is not None:
                ds = f.create_dataset(f"direct_{i}", shape=data.shape, dtype=data.dtype, chunks=(4, 1000), **kwargs)
                for row in (0, 4):
                    ds.id.write_direct_chunk((row, 0), enc(np.ascontiguousarray(data[row:row + 4])))
                assert self_check(spec, data.dtype.str)
    with h5py.File(path, "r") as f:
        for key in f:
            ds = f[key]
            np.testing.assert_array_equal(ds[...], data, err_msg=key)
            plist = ds.id.get_create_plist()
            stored = tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))
            # the stored pipeline is the codec's filter ids, the shuffle filter only where it applies
            expect = tuple(fid for fid in codec.filter_ids if fid != 2 or uses_shuffle(shuffle, data.itemsize))
            assert stored == expect, key
            assert name in codecs.for_filters(stored)  # how inspect names a dataset without a codec attribute
            decoder = ChunkDecoder.for_dataset(ds)
            if name == "lzf":
                assert decoder is None  # no Python decode step: read through HDF5
                continue
            assert decoder is not None
            for row in (0, 4):
                mask, raw = ds.id.read_direct_chunk((row, 0))
                out = np.empty((4, 1000), dtype=data.dtype)
                decoder.decode(raw, mask, out)
                np.testing.assert_array_equal(out, data[row:row + 4], err_msg=key)


def test_labels_and_filter_parameters_are_those_stored_in_existing_files():
    """Labels and filter parameters are written into every output: they must not drift."""
    assert CodecSpec("gzip").label() == "gzip-4+shuffle"
    assert CodecSpec("gzip", 9, False).label() == "gzip-9"
    assert CodecSpec("none").label() == "none"
    assert CodecSpec("lzf").label() == "lzf+shuffle"
    assert CodecSpec("zstd").label() == "zstd-3+shuffle"
    assert CodecSpec("blosc2-lz4").label() == "blosc2-lz4-5+shuffle"
    assert CodecSpec("blosc2-zstd", 7).label() == "blosc2-zstd-7+shuffle"
    assert CodecSpec("gzip", 6).dataset_kwargs(2) == {"compression": "gzip", "compression_opts": 6, "shuffle": True}
    assert CodecSpec("gzip").dataset_kwargs(1) == {"compression": "gzip", "compression_opts": 4, "shuffle": False}
    assert CodecSpec("none").dataset_kwargs(4) == {}
    assert CodecSpec("zstd").dataset_kwargs(2) == {"shuffle": True, "compression": 32015, "compression_opts": (3,)}
    b2 = CodecSpec("blosc2-lz4").dataset_kwargs(2)
    assert b2["compression"] == 32026 and b2["compression_opts"][4:7] == (5, 1, 1)  # clevel, shuffle, lz4


@pytest.mark.parametrize("name", [n for n in codecs.names() if codecs.get(n).levels is not None])
def test_a_bad_level_names_the_codecs_range_and_the_value(name):
    levels = codecs.get(name).levels
    lo, hi = levels[0], levels[-1]
    for bad in (lo - 1, hi + 1):
        with pytest.raises(ConfigError) as e:
            _job({"codec": name, "level": bad})
        assert e.value.key == "output.level"
        assert f"{name} levels are {lo}..{hi}, got {bad}" in str(e.value)
    assert _job({"codec": name, "level": hi}).output.level == hi


def test_auto_checks_levels_against_the_codec_it_compresses_with():
    with pytest.raises(ConfigError, match=r"blosc2-lz4 levels are 0\.\.9, got 12 \(codec auto uses blosc2-lz4\)"):
        _job({"codec": "auto", "level": 12})


def test_unknown_codec_errors_list_the_registry():
    with pytest.raises(ConfigError) as e:
        _job({"codec": "brotli"})
    assert "must be one of " + ", ".join(repr(c) for c in codecs.choices()) in str(e.value)
    with pytest.raises(ValueError, match=r"unknown codec 'brotli' \(registered: none, gzip, lzf, zstd, blosc2-lz4, blosc2-zstd\)"):
        codecs.get("brotli")
    assert codecs.choices()[0] == "auto"


class _Deflate1(Codec):
    """A throwaway codec defined outside the package: HDF5's deflate at one fixed level."""

    name = "test-deflate"
    default_level = 1
    levels = range(1, 2)
    filter_ids = (1,)
    uses_shuffle = False

    def dataset_kwargs(self, level, shuffle, itemsize):
        return {"compression": "gzip", "compression_opts": level}

    def encoder(self, level, shuffle, dtype):
        return lambda a: zlib.compress(a, level)

    def decode_steps(self):
        return {}  # the registered gzip codec already undoes filter 1


@pytest.fixture
def deflate1(monkeypatch):
    monkeypatch.setitem(CODECS, _Deflate1.name, _Deflate1())  # removed again after the test
    return _Deflate1.name


def test_a_codec_registered_from_outside_is_accepted_without_editing_other_modules(deflate1, tmp_path):
    job = _job({"codec": deflate1, "level": 1})
    assert job.output.codec == deflate1 and deflate1 in codecs.choices()
    with pytest.raises(ConfigError, match=r"test-deflate levels are 1\.\.1, got 3"):
        _job({"codec": deflate1, "level": 3})
    from h5batch.commands.bench import _codecs

    assert _codecs(f"auto,{deflate1}") == ("auto", deflate1)
    spec = CodecSpec(deflate1)
    assert spec.label() == "test-deflate-1" and self_check(spec, "<i2")
    data = _chunkish("<i2", 4)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        ds = f.create_dataset("x", shape=data.shape, dtype=data.dtype, chunks=data.shape, **spec.dataset_kwargs(2))
        ds.id.write_direct_chunk((0, 0), make_encoder(spec, data.dtype)(data))
        np.testing.assert_array_equal(ds[...], data)
        decoder = ChunkDecoder.for_dataset(ds)
        out = np.empty_like(data)
        decoder.decode(ds.id.read_direct_chunk((0, 0))[1], 0, out)
        np.testing.assert_array_equal(out, data)


def _table_names(text: str, heading: str) -> set[str]:
    """The backticked names in the first column of the first table under ``heading``."""
    section = text.split(heading, 1)[1]
    rows = re.findall(r"^\|([^|\n]*)\|", section.split("\n\n#", 1)[0], flags=re.M)
    return {n for cell in rows for n in re.findall(r"`([^`]+)`", cell)}


def test_the_readme_codec_table_names_every_registered_codec():
    names = _table_names((REPO / "README.md").read_text(), "### Choosing a codec")
    missing = [n for n in codecs.choices() if n not in names]
    assert not missing, f"README.md 'Choosing a codec' lacks a row for {missing}"


def test_the_format_docs_name_every_registered_codec():
    names = _table_names((REPO / "docs" / "FORMAT.md").read_text(), "| codec | HDF5 filters |")
    missing = [n for n in codecs.names() if n not in names]
    assert not missing, f"docs/FORMAT.md's codec table lacks {missing}"
    jobs = (REPO / "docs" / "jobs.md").read_text()
    row = next(line for line in jobs.splitlines() if line.startswith("| `codec` |"))
    missing = [n for n in codecs.choices() if f"`{n}`" not in row]
    assert not missing, f"docs/jobs.md's output.codec row lacks {missing}"


# -- the reader's Blosc2 decode path ------------------------------------------------------


@pytest.mark.parametrize("content", ["noise", "ramp", "constant", "zeros"])
def test_blosc2_chunks_are_decompressed_from_inside_their_frame(content, tmp_path):
    """Our encoder's one-chunk frames are decoded by handing the chunk inside them to
    blosc2.decompress (no SChunk per HDF5 chunk); frames it does not recognise (an all-zero
    chunk stored as a special value, HDF5's own b2nd frames) take the SChunk path; all decode
    to the same rows as HDF5."""
    from h5batch.codecs.blosc2 import frame_chunk

    rows = {"noise": np.random.default_rng(0).normal(0, 1000, (8, 2000)), "ramp": np.arange(16000).reshape(8, 2000),
            "constant": np.full((8, 2000), 7), "zeros": np.zeros((8, 2000))}[content].astype("<f4")
    spec = CodecSpec("blosc2-lz4")
    with h5py.File(tmp_path / "x.h5", "w") as f:
        ours = f.create_dataset("ours", shape=rows.shape, dtype=rows.dtype, chunks=rows.shape, **spec.dataset_kwargs(4))
        ours.id.write_direct_chunk((0, 0), make_encoder(spec, rows.dtype)(rows))
        f.create_dataset("hdf5", data=rows, chunks=rows.shape, **spec.dataset_kwargs(4))
    with h5py.File(tmp_path / "x.h5", "r") as f:
        for name, fast in (("ours", content != "zeros"), ("hdf5", False)):
            ds = f[name]
            raw = ds.id.read_direct_chunk((0, 0))[1]
            assert (frame_chunk(raw, rows.nbytes) is not None) == fast, name
            out = np.empty_like(rows)
            kind = ChunkDecoder.for_dataset(ds).decode(raw, 0, out)
            assert kind.endswith("-blosc2-chunk") == fast, kind
            np.testing.assert_array_equal(out, rows, err_msg=name)
            np.testing.assert_array_equal(ds[...], rows, err_msg=name)
    assert frame_chunk(b"\x00" * 200, 100) is None


@pytest.mark.parametrize("name", ["blosc2-lz4", "gzip", "zstd"])
def test_the_reader_decodes_compressed_chunks_from_the_file_mapping(name, tmp_path):
    """With the file mapped, ChunkStore looks each compressed chunk's location up once and
    decodes it from the mapping: the same rows as HDF5, in every epoch."""
    import mmap

    from h5batch.torch.chunks import ChunkStore

    data = _chunkish("<i2", 40)
    spec = CodecSpec(name)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", shape=(40, 1000), dtype=data.dtype, chunks=(8, 1000), **spec.dataset_kwargs(2))
        enc = make_encoder(spec, data.dtype)
        for row in range(0, 40, 8):
            ds.id.write_direct_chunk((row, 0), enc(np.ascontiguousarray(data[row:row + 8])))
    with h5py.File(path, "r") as f, open(path, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        ds = f["x"]
        expect = ds[...]
        mapped, plain = ChunkStore(ds, 2, True, mapping), ChunkStore(ds, 2, True, None)
        for _ in range(2):
            for c in range(5):
                np.testing.assert_array_equal(mapped.get(c), expect[c * 8:(c + 1) * 8], err_msg=f"chunk {c}")
                np.testing.assert_array_equal(plain.get(c), expect[c * 8:(c + 1) * 8], err_msg=f"chunk {c}")
        assert mapped.packed is not None and plain.packed is None and mapped.direct
        assert all(mapped._chunk_info(c)[0] is not None for c in range(5))
        assert mapped.verified == plain.verified != set()
        del mapped, plain, ds
        mapping.close()  # no view of the mapping is left behind


def test_the_reader_lists_every_chunk_once(tmp_path):
    """ChunkStore finds chunk locations in one listing of the index (chunk_iter), not one
    lookup per chunk, whose cost grows with the index: every block's offset, size and filter
    mask equal HDF5's own lookup, blocks never written have none, and the rows read equal
    HDF5's, the last partial block included."""
    import mmap

    from h5batch.torch.chunks import ChunkStore

    data = _chunkish("<i2", 48)
    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", shape=(45, 1000), maxshape=(None, 1000), dtype=data.dtype, chunks=(8, 1000))
        for c in (0, 1, 3, 5):  # blocks 2 and 4 stay unwritten; block 5 holds rows 40-44, zero-padded
            ds.id.write_direct_chunk((c * 8, 0), np.ascontiguousarray(data[c * 8:(c + 1) * 8]))
    with h5py.File(path, "r") as f, open(path, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        ds = f["x"]
        store = ChunkStore(ds, 2, True, mapping)
        np.testing.assert_array_equal(store.get(0), data[:8])
        assert store.table is not None and len(store.table[0]) == 6
        for c in range(6):
            info = ds.id.get_chunk_info_by_coord((c * 8, 0))
            if info.byte_offset is None:  # not written: HDF5 leaves size and mask undefined
                assert c in (2, 4) and store._chunk_info(c)[0] is None
            else:
                assert store._chunk_info(c) == (info.byte_offset, info.size, info.filter_mask), c
        assert store._chunk_info(6) == (None, 0, 0)  # past the extent
        for c in (1, 3, 5):
            np.testing.assert_array_equal(store.get(c), ds[c * 8:(c + 1) * 8], err_msg=f"block {c}")
        assert len(store.get(5)) == 5
        del store, ds
        mapping.close()
