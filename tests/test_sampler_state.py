"""Sampler state and order: resume in a fresh loader, world-size-invariant global batches,
shuffle quality on a class-sorted corpus. Real files, real (Stateful)DataLoaders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks.audio_corpus import make_audio_corpus
from benchmarks.quality import batch_label_kl, chunks_touched, label_batches_kl
from h5batch import ConvertOptions, convert
from h5batch.config import load_job
from h5batch.torch import ChunkShuffleSampler, GlobalBatchSampler, H5Dataset, collate, sampler_state

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 3
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")


@pytest.fixture(scope="module")
def sorted_h5(tmp_path_factory) -> Path:
    """FSDD-style flat corpus, 10 digits x 300 files, named so that the file is class-sorted;
    the train split holds 270 per class in chunk groups of 64 samples."""
    d = tmp_path_factory.mktemp("sorted")
    make_audio_corpus(d / "corpus", n_files=3000, seconds=0.05, sample_rate=8000)
    job = load_job(REPO / "jobs" / "fsdd.yaml",
                   [f"output.path={d / 'f.h5'}", f"source.root={d / 'corpus'}", "cluster.workers=1",
                    "output.chunk_bytes=38400"])
    convert(job, ConvertOptions(progress=False))
    return d / "f.h5"


def _dataset(path: Path) -> H5Dataset:
    return H5Dataset(path, "train", with_source=True)


def _loader(cls, ds, sampler, workers: int):
    kw = dict(collate_fn=collate, num_workers=workers)
    if isinstance(sampler, ChunkShuffleSampler):
        return cls(ds, sampler=sampler, batch_size=50, **kw)
    return cls(ds, batch_sampler=sampler, **kw)


def _samplers(ds):
    return {"chunk": lambda: ChunkShuffleSampler(ds, seed=7),
            "global": lambda: GlobalBatchSampler(ds, 64, seed=7)}


def _epochs(loader, epochs: int = EPOCHS) -> list[list[list[str]]]:
    return [[list(b["source"]) for b in loader] for _ in range(epochs)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["chunk", "global"])
def test_fresh_loader_resumes_mid_epoch_1_like_an_uninterrupted_run(sorted_h5, kind, workers):
    ds = _dataset(sorted_h5)
    make = _samplers(ds)[kind]
    whole = _epochs(_loader(StatefulDataLoader, ds, make(), workers))
    assert whole[0] != whole[1] != whole[2]  # epochs roll on without set_epoch
    for epoch in whole:
        assert len({s for b in epoch for s in b}) == len(ds)  # every sample in every epoch

    first = _loader(StatefulDataLoader, ds, make(), workers)
    got = [[list(b["source"]) for b in first]]
    got.append([])
    for k, b in enumerate(first):
        got[1].append(list(b["source"]))
        if k == 9:
            state = first.state_dict()
            break
    del first
    state = json.loads(json.dumps(state, default=int))  # what a checkpoint file holds

    resumed = _loader(StatefulDataLoader, _dataset(sorted_h5), make(), workers)
    resumed.load_state_dict(state)
    got[1] += [list(b["source"]) for b in resumed]  # the rest of epoch 1, loop ends there
    got.append([list(b["source"]) for b in resumed])  # epoch 2, no set_epoch
    assert got == whole


def test_state_saved_after_an_epoch_resumes_at_the_next(sorted_h5):
    ds = _dataset(sorted_h5)
    whole = _epochs(_loader(StatefulDataLoader, ds, ChunkShuffleSampler(ds, seed=3), 2), 2)
    first = _loader(StatefulDataLoader, ds, ChunkShuffleSampler(ds, seed=3), 2)
    assert [list(b["source"]) for b in first] == whole[0]
    state = first.state_dict()  # between epochs: the usual checkpoint
    resumed = _loader(StatefulDataLoader, ds, ChunkShuffleSampler(ds, seed=3), 2)
    resumed.load_state_dict(state)
    assert [list(b["source"]) for b in resumed] == whole[1]


def test_set_epoch_users_resume_too():
    s = ChunkShuffleSampler(1000, chunk_size=10, seed=1)
    ref = [list(s.indices(e)) for e in range(3)]
    s.set_epoch(1)
    it = iter(s)
    head = [next(it) for _ in range(123)]
    state = s.state_dict()
    assert state["epoch"] == 1 and state["position"] == 123 and head == ref[1][:123]
    for before in (True, False):  # set_epoch(1) before or after load_state_dict
        t = ChunkShuffleSampler(1000, chunk_size=10, seed=99)
        if before:
            t.set_epoch(1)
        t.load_state_dict(state)
        if not before:
            t.set_epoch(1)
        assert list(t) == ref[1][123:] and t.seed == 1
        t.set_epoch(2)
        assert list(t) == ref[2]
    # A loop abandoned half-way starts the same epoch again; only a drawn-out epoch rolls on.
    u = ChunkShuffleSampler(1000, chunk_size=10, seed=1)
    it = iter(u)
    [next(it) for _ in range(10)]
    assert list(u) == ref[0] and list(u) == ref[1]


def test_other_num_workers_continue_from_the_loader_state(sorted_h5):
    ds = _dataset(sorted_h5)
    whole = _epochs(DataLoader(ds, sampler=ChunkShuffleSampler(ds, seed=5), batch_size=50,
                               collate_fn=collate), 2)
    two = _loader(StatefulDataLoader, ds, ChunkShuffleSampler(ds, seed=5), 2)
    got = []
    for k, b in enumerate(two):
        got.append(list(b["source"]))
        if k == 6:
            break
    state = sampler_state(two.state_dict())  # the position of the last delivered batch
    assert state["position"] == 7 * 50  # not where the prefetching sampler has got to
    s = ChunkShuffleSampler(ds, seed=0)
    s.load_state_dict(state)
    plain = DataLoader(ds, sampler=s, batch_size=50, collate_fn=collate, num_workers=0)
    got += [list(b["source"]) for b in plain]
    got += [list(b["source"]) for b in plain]
    assert got == whole[0] + whole[1]


@pytest.mark.parametrize("split", ["by_chunk", "interleaved"])
def test_global_batches_are_the_same_on_1_2_4_ranks(sorted_h5, split):
    ds = _dataset(sorted_h5)
    runs = {}
    for world in (1, 2, 4):
        loaders = [DataLoader(ds, batch_sampler=GlobalBatchSampler(ds, 64, rank=r, world_size=world, seed=2,
                                                                   split=split), collate_fn=collate)
                   for r in range(world)]
        epochs = []
        for _ in range(2):
            per_rank = [[b["source"] for b in loader] for loader in loaders]
            assert len({len(p) for p in per_rank}) == 1
            assert all(len(b) == 64 // world for p in per_rank for b in p)
            epochs.append([sorted(s for p in per_rank for s in p[i]) for i in range(len(per_rank[0]))])
        runs[world] = epochs
    assert runs[1] == runs[2] == runs[4]
    assert runs[1][0] != runs[1][1]
    everything = sorted(s for b in runs[1][0] for s in b)
    assert len(set(everything)) == len(ds)  # every sample; the last batch is completed


def test_global_state_loads_into_another_world_size():
    ref = GlobalBatchSampler(1000, 40, chunk_size=16, seed=4)
    whole = [sorted(b) for b in ref.global_batches(0)] + [sorted(b) for b in ref.global_batches(1)]
    two = [GlobalBatchSampler(1000, 40, rank=r, world_size=2, chunk_size=16, seed=4) for r in range(2)]
    its = [iter(s) for s in two]
    got = [sorted(next(its[0]) + next(its[1])) for _ in range(11)]
    state = two[0].state_dict()
    assert state["position"] == 11 == two[1].state_dict()["position"]
    four = [GlobalBatchSampler(1000, 40, rank=r, world_size=4, chunk_size=16) for r in range(4)]
    for s in four:
        s.load_state_dict(state)
    for _ in range(2):
        parts = [list(s) for s in four]
        got += [sorted(sum((p[i] for p in parts), [])) for i in range(len(parts[0]))]
    assert got == whole


def test_bad_states_are_refused_naming_the_key():
    s = ChunkShuffleSampler(100, chunk_size=10)
    with pytest.raises(ValueError, match="samples=100"):
        ChunkShuffleSampler(101, chunk_size=10).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="world_size"):
        ChunkShuffleSampler(100, chunk_size=10, world_size=2).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="GlobalBatchSampler"):
        GlobalBatchSampler(100, 10, chunk_size=10).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="global_batch_size"):
        GlobalBatchSampler(100, 10, chunk_size=10).load_state_dict(
            GlobalBatchSampler(100, 20, chunk_size=10).state_dict())
    with pytest.raises(ValueError, match="past the end"):
        s.load_state_dict({**s.state_dict(), "position": 101})
    with pytest.raises(ValueError, match="multiple of world_size"):
        GlobalBatchSampler(100, 10, world_size=4)


def test_class_sorted_batches_mix_like_a_permutation_and_read_locally(sorted_h5):
    ds = H5Dataset(sorted_h5, "train")
    labels = np.asarray(ds._index_array("label"))
    assert np.all(np.diff(labels) >= 0) and ds.chunk_rows == 64 and len(ds) == 2700  # class-sorted
    for seed in range(3):
        new = ChunkShuffleSampler(ds, seed=seed)
        old = ChunkShuffleSampler(ds, seed=seed, window=8, mixing="random")
        loader = DataLoader(ds, sampler=new, batch_size=64, collate_fn=collate)
        kl = label_batches_kl([b["label"].tolist() for b in loader], labels)
        assert kl <= 0.15, kl
        assert batch_label_kl(old.indices(0), labels, 64) > 0.4
    # Reads stay chunk-local: the default cache decodes every chunk once per epoch.
    loads = sum(store.loads for store in ds._stores.values())
    assert loads <= 3 * 1.5 * len(ds.chunk_starts())  # 3 epochs; a few straddling samples
    full = np.random.default_rng(0).permutation(len(ds))
    assert chunks_touched([full[:64]], ds.chunk_starts()) > 30  # a permutation's batch: ~all
    assert chunks_touched([new.indices(0)[:64]], ds.chunk_starts()) <= new.window
