"""The reader at the memory limit: uncompressed chunks used in place from the file mapping
with bounded resident memory, and batch memory reused without workers
(h5batch/torch/recycle.py), on real files made by the real converter."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5batch import generate
from h5batch.torch import H5Dataset, collate
from h5batch.torch.recycle import PRIVATE_SLOTS, PrivatePool
from tests.test_reader import make_h5

SMALL_CHUNKS = "output.chunk_bytes=65536"
FIELDS = ("data", "target")


@pytest.fixture(scope="module")
def storages(tmp_path_factory):
    """The same 48 clips of 4,000 samples stored int16 / float32, fixed / variable, codec none."""
    d = tmp_path_factory.mktemp("reader-preads")
    generate.make_paired_audio(d / "corpus", n_train=48, n_test=1, seconds=0.25)
    out = {}
    for dtype in ("int16", "float32"):
        for fixed in (True, False):
            length = "4000" if fixed else "null"
            path = d / f"{dtype}-{'fixed' if fixed else 'variable'}.h5"
            make_h5("paired_audio.yaml", path, d / "corpus", SMALL_CHUNKS, "output.codec=none",
                    *(f"fields.{f}.{k}={v}" for f in FIELDS for k, v in (("length", length), ("dtype", dtype))))
            out[dtype, fixed] = path
    return out


def _reference(path: Path, fixed: bool) -> dict[str, list[np.ndarray]]:
    """Every train sample's stored values, read with h5py alone."""
    with h5py.File(path, "r") as f:
        g = f["train"]
        if fixed:
            return {k: list(g[k][...]) for k in FIELDS}
        ref = {}
        for k in FIELDS:
            values, offsets = g[k]["values"][...], g[k]["offsets"][...]
            ref[k] = [values[offsets[i]: offsets[i + 1]] for i in range(len(offsets) - 1)]
        return ref


@pytest.mark.parametrize("dtype", ["int16", "float32"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "variable"])
def test_plain_chunks_read_equal_to_hdf5_in_any_order(storages, dtype, fixed):
    path = storages[dtype, fixed]
    ref = _reference(path, fixed)
    rng = np.random.default_rng(0)
    idx = [*rng.permutation(48).tolist(), 5, 5, 0, 47]  # any order, duplicates
    for as_float in (True, False):
        ds = H5Dataset(path, "train", as_float=as_float)
        out = collate(ds.__getitems__(idx))
        for k in FIELDS:
            for j, i in enumerate(idx):
                want = ref[k][i].astype(np.float32) / np.float32(32768) if as_float and dtype == "int16" else ref[k][i]
                got = out[k][j].numpy() if fixed else out[k][j, : int(out[k + "_lengths"][j])].numpy()
                assert got.dtype == want.dtype and np.array_equal(got, want), (k, i)
            assert "mapped" in ds._stores[k].verified
        ds.close()
        assert ds._mapping is None


def test_mmap_off_reads_the_same_without_a_mapping(storages):
    path = storages["float32", True]
    a = collate(H5Dataset(path, "train").__getitems__(range(48)))
    ds = H5Dataset(path, "train", mmap=False)
    b = collate(ds.__getitems__(range(48)))
    assert all(torch.equal(a[k], b[k]) for k in FIELDS)
    assert all(s.mapping is None for s in ds._stores.values())


def test_workers_read_the_same_through_their_own_mappings(storages):
    path = storages["float32", False]
    ds = H5Dataset(path, "train")
    want = collate(ds.__getitems__(range(48)))  # opened in the parent before the fork
    loader = DataLoader(ds, batch_size=16, num_workers=2, collate_fn=collate)
    got = list(loader)
    for k in FIELDS:
        assert torch.equal(torch.cat([b[k] for b in got]), want[k])
    ds.close()


def _rss_file() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) << 10
    pytest.skip("no RssFile in /proc/self/status")


def test_main_process_memory_stays_bounded_over_epochs(tmp_path):
    """Three epochs of a 25 MB plain float32 file at 0 workers map (almost) none of it."""
    generate.make_paired_audio(tmp_path / "corpus", n_train=200, n_test=1, seconds=1.0)
    path = tmp_path / "big.h5"
    make_h5("paired_audio.yaml", path, tmp_path / "corpus", SMALL_CHUNKS, "output.codec=none",
            *(f"fields.{f}.{k}={v}" for f in FIELDS for k, v in (("length", "16000"), ("dtype", "float32"))))
    ds = H5Dataset(path, "train")
    loader = ds.loader(batch_size=16, num_workers=0)
    for b in loader:
        del b
    before = _rss_file()
    for _ in range(3):
        for b in loader:
            del b
    grown = _rss_file() - before
    assert grown < 4 << 20, f"file pages mapped over 3 epochs: {grown >> 20} MiB of a {os.path.getsize(path) >> 20} MiB file"


def test_batches_reuse_memory_only_once_dropped(storages):
    path = storages["float32", True]
    ref = collate(H5Dataset(path, "train", recycle=False).__getitems__(range(48)))
    ds = H5Dataset(path, "train")
    loader = ds.loader(batch_size=8, shuffle=False)
    seen = set()
    for _ in range(3):
        for b in loader:
            seen.add(b["data"].untyped_storage().data_ptr())
    assert len(seen) <= PRIVATE_SLOTS and ds._private.reused > 0
    kept = list(loader)  # held: none may be overwritten by a later batch
    assert len({b["data"].untyped_storage().data_ptr() for b in kept}) == len(kept)
    for k in FIELDS:
        assert torch.equal(torch.cat([b[k] for b in kept]), ref[k])
    assert H5Dataset(path, "train", recycle=False)._private is None


def test_private_pool_hands_out_only_unheld_storages():
    pool = PrivatePool()
    a = pool.storage(1000)
    view = torch.empty(0).set_(a, 0, (10,))
    del a
    b = pool.storage(1000)  # the first is still viewed
    assert b.data_ptr() != view.untyped_storage().data_ptr()
    del view
    c = pool.storage(900)
    assert pool.reused == 1 and c.nbytes() >= 900
    pool.pid = -1  # as in a forked child: the parent's storages are not handed out
    assert pool.storage(1000).data_ptr() not in {b.data_ptr(), c.data_ptr()} and len(pool.slots) == 1


def test_strided_destinations_read_the_same(tmp_path):
    """``channels_first`` images: each (H, W, C) row lands in a transposed view of the batch,
    which a read cannot fill directly (read into a temporary, then copied)."""
    generate.make_demo_corpus(tmp_path / "corpus", per_class=3)
    path = tmp_path / "demo.h5"
    make_h5("demo.yaml", path, tmp_path / "corpus", SMALL_CHUNKS, "output.codec=none")
    idx = [4, 0, 5, 4, 2]
    for kw in ({"as_float": False}, {"as_float": False, "channels_first": True}, {"channels_first": True}):
        fast = H5Dataset(path, "train", **kw)
        a = collate(fast.__getitems__(idx))
        b = collate(H5Dataset(path, "train", mmap=False, **kw).__getitems__(idx))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a if k != "source")
        assert fast._stores["image"].mapping is not None


def test_held_batches_from_workers_without_shared_memory_stay_intact(storages):
    """``shared_memory=False`` in a worker: the batch it sends is moved into shared memory in
    place, so the worker must not reuse its memory (it overwrote batches the main process
    still held: 4 of 6 differed)."""
    path = storages["float32", True]
    ref = collate(H5Dataset(path, "train", recycle=False).__getitems__(range(48)))
    ds = H5Dataset(path, "train", shared_memory=False)
    kept = list(ds.loader(batch_size=8, shuffle=False, num_workers=1))
    assert len(kept) == 6
    for k in FIELDS:
        assert torch.equal(torch.cat([b[k] for b in kept]), ref[k])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_datasets_dropped_without_close_leave_no_descriptor(storages):
    """A dataset read and then dropped (no ``close()``) leaves nothing open: the mapping's
    descriptor goes with it."""
    import gc

    path = storages["float32", True]
    H5Dataset(path, "train").__getitems__(range(8))  # warm: imports and the like
    gc.collect()
    before = _open_fds()
    for _ in range(20):
        ds = H5Dataset(path, "train")
        ds.__getitems__(range(48))
        assert any(s.mapping is not None for s in ds._stores.values())  # the mapped path was in use
        del ds
    gc.collect()
    assert _open_fds() - before <= 1
