"""ChunkShuffleSampler: coverage, determinism, locality, distributed split."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from h5batch import ConvertOptions, convert, generate
from h5batch.config import load_job
from h5batch.torch import ChunkShuffleSampler, H5Dataset, collate

REPO = Path(__file__).resolve().parents[1]

SIZES = [(0, 4), (1, 4), (7, 4), (100, 8), (101, 8), (1000, 85), (37, 100)]


@pytest.mark.parametrize("n,k", SIZES)
@pytest.mark.parametrize("window", [1, 3, 8])
def test_every_index_exactly_once_per_epoch(n, k, window):
    s = ChunkShuffleSampler(n, chunk_size=k, window=window, seed=5)
    for epoch in range(3):
        s.set_epoch(epoch)
        got = list(s)
        assert len(got) == len(s) == n
        assert sorted(got) == list(range(n))


def test_reproducible_and_different_across_epochs_and_seeds():
    def order(seed, epoch):
        s = ChunkShuffleSampler(1000, chunk_size=10, window=4, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert order(0, 0) == order(0, 0) and order(7, 3) == order(7, 3)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    # The default epoch is 0; a fully drawn epoch rolls on to the next by itself.
    s = ChunkShuffleSampler(1000, chunk_size=10, window=4)
    assert list(s) == order(0, 0) and list(s) == order(0, 1) and s.epoch == 1
    # set_epoch still chooses the epoch (and repeats it when called with the same one).
    s.set_epoch(1)
    assert list(s) == order(0, 1)


@pytest.mark.parametrize("n,k,window", [(1000, 10, 4), (1003, 16, 3), (500, 7, 1)])
def test_windows_span_at_most_window_chunks(n, k, window):
    s = ChunkShuffleSampler(n, chunk_size=k, window=window, seed=2)
    order = np.array(list(s))
    chunks = order // k
    # Walking the order, each consecutive run of window*k positions (aligned to windows)
    # touches at most `window` chunks, and every chunk appears in exactly one window.
    seen_in: dict[int, int] = {}
    pos = 0
    w = 0
    while pos < n:
        members: set[int] = set()
        while pos < n and (len(members) < window or chunks[pos] in members):
            members.add(int(chunks[pos]))
            pos += 1
        for c in members:
            assert c not in seen_in, f"chunk {c} in windows {seen_in[c]} and {w}"
            seen_in[c] = w
        w += 1
    assert len(seen_in) == -(-n // k)
    # Shuffled, not sequential: chunk order and the order within a window both change.
    assert not np.array_equal(order, np.arange(n))


def test_full_window_is_a_plain_permutation_of_everything():
    s = ChunkShuffleSampler(64, chunk_size=8, window=8, seed=0)
    order = list(s)
    assert sorted(order) == list(range(64))
    # Samples of one chunk are spread over the whole epoch, not kept together.
    first_chunk_positions = sorted(order.index(i) for i in range(8))
    assert first_chunk_positions[-1] - first_chunk_positions[0] > 8


@pytest.mark.parametrize("n", [0, 1, 5, 100, 101, 103])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_partition_the_epoch(n, world):
    for drop_last in (False, True):
        parts = []
        for rank in range(world):
            s = ChunkShuffleSampler(n, chunk_size=6, window=2, seed=9, rank=rank,
                                    world_size=world, drop_last=drop_last)
            s.set_epoch(4)
            parts.append(list(s))
            assert len(parts[-1]) == len(s)
        assert len({len(p) for p in parts}) == 1  # equal lengths on every rank
        flat = [i for p in parts for i in p]
        if drop_last:
            assert len(set(flat)) == len(flat) == (n // world) * world  # disjoint
        else:
            assert set(flat) == set(range(n))  # covers everything
            assert len(flat) == -(-n // world) * world
            if n >= world:  # padding repeats at most world - 1 samples
                assert len(flat) - len(set(flat)) == len(flat) - n


def test_ranks_follow_the_global_order():
    whole = ChunkShuffleSampler(100, chunk_size=10, seed=1)
    whole.set_epoch(2)
    parts = []
    for rank in range(4):
        s = ChunkShuffleSampler(100, chunk_size=10, seed=1, rank=rank, world_size=4)
        s.set_epoch(2)
        parts += list(s)
    assert parts == list(whole)


def test_bad_arguments():
    with pytest.raises(ValueError, match="rank"):
        ChunkShuffleSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="window"):
        ChunkShuffleSampler(10, window=0)
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkShuffleSampler(10, chunk_size=0)
    with pytest.raises(TypeError, match="epoch"):
        ChunkShuffleSampler(10).set_epoch(1.5)


@pytest.fixture(scope="module")
def paired_h5(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sampler")
    generate.make_paired_audio(d / "corpus", n_train=50, n_test=2, seconds=0.25)
    job = load_job(REPO / "jobs" / "paired_audio.yaml",
                   [f"output.path={d / 'p.h5'}", f"source.root={d / 'corpus'}", "cluster.workers=1",
                    "output.chunk_bytes=40000", "fields.data.length=2000"])
    convert(job, ConvertOptions(progress=False))
    return d / "p.h5"


def test_chunk_size_comes_from_the_file_and_batches_stay_in_windows(paired_h5):
    ds = H5Dataset(paired_h5, "train")
    with h5py.File(paired_h5, "r") as f:
        rows = f["train"]["data"].chunks[0]
    assert ds.chunk_rows == rows == 10  # 40000 bytes // (2000 x int16)
    s = ChunkShuffleSampler(ds, window=2, seed=4)
    assert s.chunk_size == rows and len(s) == len(ds) == 50
    loader = DataLoader(ds, batch_sampler=BatchSampler(s, batch_size=8, drop_last=False),
                        collate_fn=collate)
    seen = []
    for b in loader:
        assert b["data"].shape[1:] == (2000,)
        seen.append(b["data"])
    assert sum(len(x) for x in seen) == 50
    # Same samples as a sequential read, only reordered.
    everything = collate(ds.__getitems__(s.indices(0).tolist()))["data"]
    assert torch.equal(torch.cat(seen), everything)
    # Only the variable field: samples grouped by the values chunk they start in.
    var = H5Dataset(paired_h5, "train", fields=["target"])
    with h5py.File(paired_h5, "r") as f:
        offsets = f["train"]["target"]["offsets"][...]
        per_chunk = f["train"]["target"]["values"].chunks[0]
    starts = var.chunk_starts()
    first_chunk = offsets[:-1] // per_chunk
    assert starts[0] == 0 and len(starts) == len(np.unique(first_chunk))
    assert all(first_chunk[a] != first_chunk[a - 1] for a in starts[1:])
    sv = ChunkShuffleSampler(var, window=2, seed=1)
    assert sorted(sv) == list(range(50)) and np.array_equal(sv.chunk_starts, starts)
    # Both fields: groups follow the field with the most samples per chunk.
    assert np.array_equal(ds.chunk_starts(), np.arange(0, 50, 10))


def test_uneven_chunk_groups_stay_together():
    class Groups:
        def __len__(self):
            return 30

        def chunk_starts(self):
            return np.array([0, 1, 5, 6, 20])

    s = ChunkShuffleSampler(Groups(), window=1, seed=3)
    order = list(s)
    assert sorted(order) == list(range(30))
    groups = np.searchsorted([0, 1, 5, 6, 20], order, side="right")
    # window=1: each group's samples are consecutive in the order.
    runs = [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    assert sorted(runs) == [1, 2, 3, 4, 5]
