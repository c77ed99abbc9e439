"""Batches filled on several threads (h5batch.torch.batch.copy_all, chunks.gather_rows).

The parallel path must give exactly what one thread gives, and must not read a chunk cache
buffer after the cache recycled it for another chunk."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from h5batch.torch.batch import PARALLEL_MIN_BYTES, copy_all, float_copy
from h5batch.torch.chunks import ChunkStore, gather_rows


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_copy_all_on_two_threads_equals_one_thread(two_threads):
    rng = np.random.default_rng(0)
    src = rng.integers(-32768, 32767, size=(96, 8000), dtype=np.int16)
    rows = rng.permutation(96)
    got = np.empty((96, 8000), np.float32)
    assert got.nbytes >= 2 * PARALLEL_MIN_BYTES  # enough for two threads
    copy_all([(got[j], src[i]) for j, i in enumerate(rows)], float_copy(32768.0))
    assert np.array_equal(got, src[rows].astype(np.float32) * np.float32(1 / 32768))
    small = np.empty((3, 5), np.int16)
    copy_all([(small[j], src[j, :5]) for j in range(3)])  # below the threshold: one thread
    assert np.array_equal(small, src[:3, :5])


@pytest.mark.parametrize("compression", ["gzip", None])
@pytest.mark.parametrize("shards", [1, 2])
def test_gather_rows_on_two_threads_with_a_tiny_cache(tmp_path, two_threads, compression, shards):
    rng = np.random.default_rng(1)
    data = rng.integers(-32768, 32767, size=(400, 2048), dtype=np.int16)
    per = 400 // shards  # shard k holds rows [k*per, (k+1)*per) in a dataset of its own
    with h5py.File(tmp_path / "d.h5", "w") as f:
        for k in range(shards):
            f.create_dataset(f"x{k}", data=data[k * per:(k + 1) * per], chunks=(4, 2048), compression=compression)
    with h5py.File(tmp_path / "d.h5", "r") as f:
        # Two cached chunks (per shard) for a batch that touches ~80: buffers are recycled mid-batch.
        stores = [ChunkStore(f[f"x{k}"], capacity=2) for k in range(shards)]
        idx = rng.integers(0, 400, size=300)  # duplicates too
        order = np.argsort(idx, kind="stable")
        which, rows = idx // per, idx % per
        out = np.empty((300, 2048), np.float32)
        assert out.nbytes >= 2 * PARALLEL_MIN_BYTES  # enough for two threads
        gather_rows(stores, which[order], rows[order], order, out, float_copy(32768.0))
        assert np.array_equal(out, data[idx].astype(np.float32) * np.float32(1 / 32768))
        assert sum(s.loads for s in stores) == len(np.unique(idx // 4))
