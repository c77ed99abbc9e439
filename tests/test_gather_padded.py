"""``chunks.gather_padded``: variable-length 1-D samples copied (and converted) into a padded
batch on the copy threads, with a cache too small to hold the batch's blocks (so pending
copies must be flushed before a cache buffer is recycled)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from h5batch.torch.batch import float_copy
from h5batch.torch.chunks import ChunkStore, gather_padded


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("capacity", [1, 2, 64])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shards", [1, 2])
def test_gather_padded_equals_numpy(tmp_path, compression, capacity, threads, shards):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 200_000, size=40)  # > 2 MiB a batch: copies run on 2 threads
    lengths[5] = 0  # an empty sample: its row is all padding
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(-32768, 32767, size=int(offsets[-1]), dtype=np.int16)
    path = tmp_path / "v.h5"
    cuts = [0, 20, 40][:: 3 - shards]  # shard k holds samples [cuts[k], cuts[k+1]), values of its own
    with h5py.File(path, "w") as f:
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            f.create_dataset(f"v{k}", data=values[offsets[a]:offsets[b]], chunks=(16384,), compression=compression)
    pick = np.array([7, 5, 30, 2, 2, 19, 39, 0, 11], dtype=np.int64)  # duplicates, any order
    which = np.searchsorted(cuts, pick, side="right") - 1
    base = offsets[np.asarray(cuts)[which]]
    lo, hi = offsets[pick] - base, offsets[pick + 1] - base
    order = np.argsort(pick, kind="stable")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with h5py.File(path, "r") as f:
            stores = [ChunkStore(f[f"v{k}"], capacity) for k in range(shards)]
            out = np.full((len(pick), int((hi - lo).max())), np.float32(7.0))
            gather_padded(stores, which, lo, hi, order, out, float_copy(32768.0))
            raw = np.full(out.shape, np.int16(7))
            gather_padded(stores, which, lo, hi, order, raw)  # no conversion: values as stored
    finally:
        torch.set_num_threads(old)
    for j, i in enumerate(pick):
        want = values[offsets[i]: offsets[i + 1]]
        n = len(want)
        np.testing.assert_array_equal(out[j, :n], want.astype(np.float32) / np.float32(32768))
        assert not out[j, n:].any()  # padding is zero, never the 7s that were there
        np.testing.assert_array_equal(raw[j, :n], want)
        assert not raw[j, n:].any()
    if capacity < 64:
        assert sum(s.loads for s in stores) > capacity * shards  # the caches really were recycled during the batch
