"""Recycled shared memory between DataLoader workers and the main process (h5batch.torch.recycle).

A worker may reuse a batch's storage only after the main process dropped every tensor on it:
batches the main process still holds must keep their samples, and storages must really be
reused (the same shared-memory file comes back), with fork and with spawn.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5batch import ConvertOptions, convert, generate
from h5batch.config import load_job
from h5batch.torch import ChunkShuffleSampler, H5Dataset, collate

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paired120(tmp_path_factory):
    d = tmp_path_factory.mktemp("recycle")
    generate.make_paired_audio(d / "corpus", n_train=120, n_test=1, seconds=0.25)
    job = load_job(REPO / "jobs" / "paired_audio.yaml",
                   [f"output.path={d / 'p.h5'}", f"source.root={d / 'corpus'}", "cluster.workers=1",
                    "fields.data.length=3000", "fields.target.length=3000",
                    "output.chunk_bytes=65536"])
    convert(job, ConvertOptions(progress=False))
    return d / "p.h5"


def reference(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """source -> {field: float32 row}, read in the main process (no workers, no recycling)."""
    ds = H5Dataset(path, "train", with_source=True, recycle=False)
    b = collate(ds.__getitems__(range(len(ds))))
    return {src: {k: b[k][j].numpy().copy() for k in ("data", "target")}
            for j, src in enumerate(b["source"])}


def inode(t: torch.Tensor) -> int:
    """The shared-memory file behind a tensor that came from a DataLoader worker."""
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def check(batch: dict, ref: dict) -> None:
    for j, src in enumerate(batch["source"]):
        for k in ("data", "target"):
            assert np.array_equal(batch[k][j].numpy(), ref[src][k]), f"{k} of {src} overwritten"


def run_epochs(path: Path, ref: dict, recycle: bool, epochs: int, **loader_kw) -> tuple[int, set[int]]:
    """Iterate ``epochs`` epochs with 2 workers; check every batch when it arrives, keep
    every third batch to the end of its epoch and check it again then. Returns the number
    of batches received and the distinct shared-memory files they used (a batch's columns
    share one storage, so one file per batch at most)."""
    ds = H5Dataset(path, "train", with_source=True, recycle=recycle)
    sampler = ChunkShuffleSampler(ds, seed=5)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate,
                        persistent_workers=True, **loader_kw)
    batches, files = 0, set()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        held, seen = [], 0
        for i, b in enumerate(loader):
            check(b, ref)
            seen += len(b["source"])
            batches += 1
            assert inode(b["data"]) == inode(b["target"]), "a batch's columns share one storage"
            files.add(inode(b["data"]))
            if i % 3 == 0:
                held.append(b)
        assert seen == len(ds)
        for b in held:  # the workers went on recycling while these were held
            check(b, ref)
        del held, b
    return batches, files


def test_workers_reuse_released_storage_and_never_touch_held_batches(paired120):
    ref = reference(paired120)
    batches, files = run_epochs(paired120, ref, recycle=True, epochs=3)
    assert batches == 3 * 15
    # 45 batches came through far fewer shared-memory files: storages were reused.
    assert len(files) <= batches // 2, f"{len(files)} files for {batches} batches"


def test_without_recycling_every_batch_has_fresh_storage(paired120):
    ref = reference(paired120)
    batches, files = run_epochs(paired120, ref, recycle=False, epochs=1)
    assert len(files) == batches == 15


def test_recycling_with_spawned_workers(paired120):
    ref = reference(paired120)
    batches, files = run_epochs(paired120, ref, recycle=True, epochs=2,
                                multiprocessing_context="spawn")
    assert batches == 2 * 15
    assert len(files) <= batches // 2, f"{len(files)} files for {batches} batches"


def test_more_batches_held_than_slots_fall_back_to_fresh_storage(paired120):
    """Hold every batch of an epoch: each worker runs out of its 32 slots (one storage per
    batch of 1, 60 batches each) and must allocate fresh storage instead of overwriting a
    held batch."""
    from h5batch.torch import recycle

    ref = reference(paired120)
    ds = H5Dataset(paired120, "train", with_source=True)
    loader = DataLoader(ds, batch_size=1, sampler=ChunkShuffleSampler(ds, seed=9), num_workers=2,
                        collate_fn=collate)
    held = list(loader)
    assert len(held) == 120 and len(held) // 2 > recycle.MAX_SLOTS
    for b in held:
        check(b, ref)
    del held
    # And recycling resumes once they are dropped: a second epoch is as right as the first.
    again = list(loader)
    for b in again:
        check(b, ref)


def test_recycling_under_the_file_system_sharing_strategy(paired120):
    """In a fresh process (the strategy is process-wide, and one pool per process: the pool
    must be made under it, as a training script makes it); a crash there fails this test
    and does not take the pytest worker down with it."""
    res = subprocess.run([sys.executable, "-c", "import sys; from tests.test_recycle import _file_system_epochs; "
                          "_file_system_epochs(sys.argv[1])", str(paired120)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stdout[-2000:], res.stderr[-4000:])


def _file_system_epochs(path: str) -> None:
    torch.multiprocessing.set_sharing_strategy("file_system")
    ref = reference(Path(path))
    ds = H5Dataset(path, "train", with_source=True)
    released_before = ds._pool.released.copy()
    loader = DataLoader(ds, batch_size=8, sampler=ChunkShuffleSampler(ds, seed=2), num_workers=2,
                        collate_fn=collate, persistent_workers=True)
    for _ in range(2):
        kept = []
        for i, b in enumerate(loader):
            check(b, ref)
            if i % 4 == 0:
                kept.append(b)
        for b in kept:
            check(b, ref)
    assert (ds._pool.released != released_before).any(), "the main process never released a lease"
    print("ok")


def test_datasets_share_one_pool_and_one_file_descriptor(paired120):
    """A ConcatDataset of many files must not hold a shared-memory descriptor per file."""
    fds = len(os.listdir("/proc/self/fd"))
    many = [H5Dataset(paired120, "train") for _ in range(300)]
    assert len({id(ds._pool) for ds in many}) == 1
    assert len(os.listdir("/proc/self/fd")) - fds < 10
    both = torch.utils.data.ConcatDataset(many[:2])
    ref = reference(paired120)
    loader = DataLoader(both, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate)
    seen = 0
    for b in loader:  # samples of either dataset, each read through the one pool
        assert b["data"].shape[1:] == (3000,)
        seen += b["data"].shape[0]
        for j in range(b["data"].shape[0]):
            assert any(np.array_equal(b["data"][j].numpy(), r["data"]) for r in ref.values())
    assert seen == 240


def test_two_loaders_at_once_share_the_pool_without_mixing_batches(paired120):
    """Train and validation loaders run side by side on the one pool: every batch of each,
    held or not, keeps its own samples."""
    ref = reference(paired120)
    loaders = []
    for seed in (3, 4):
        ds = H5Dataset(paired120, "train", with_source=True)
        loaders.append(DataLoader(ds, batch_size=8, sampler=ChunkShuffleSampler(ds, seed=seed),
                                  num_workers=2, collate_fn=collate, persistent_workers=True))
    for _ in range(2):
        held = []
        for i, (a, b) in enumerate(zip(*loaders, strict=True)):
            check(a, ref)
            check(b, ref)
            if i % 3 == 0:
                held += [a, b]
        for b in held:
            check(b, ref)



def test_main_process_keeps_slot_storages_mapped(paired120):
    """A slot's storage stays mapped in the main process between its batches (torch's
    rebuild finds it alive in its shared-memory cache), so reading a batch there does not
    fault its pages in again; the storages of exited workers are dropped soon after."""
    from h5batch.torch import recycle

    ds = H5Dataset(paired120, "train")
    sampler = ChunkShuffleSampler(ds, seed=1)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=collate,
                        persistent_workers=True)
    for b in loader:  # first epoch: the slots are new to this process
        float(b["data"].sum())
    sampler.set_epoch(1)
    # Held storages are alive, so no new storage can sit at one of their addresses: a batch
    # whose storage is one of them was rebuilt on the storage already mapped.
    mapped = {h.storage._cdata for h in recycle._RELEASES.held.values()}
    reused = batches = 0
    used = set()
    for b in loader:
        used.add(b["data"].untyped_storage()._cdata)
        reused += b["data"].untyped_storage()._cdata in mapped
        batches += 1
        float(b["data"].sum())
        del b
    assert batches == 15 and reused >= 12, f"{reused} of {batches} batches on an already mapped storage"
    # (held may still list workers of earlier tests for up to WATCH_INTERVAL)
    pids = {key[1] for key, h in recycle._RELEASES.held.items() if h.storage._cdata in used}
    assert len(pids) == 2, "each of the 2 workers' slots are held"
    del loader  # the workers exit; the storages they shared must not outlive them for long
    deadline = time.monotonic() + 4 * recycle.WATCH_INTERVAL + 2
    while time.monotonic() < deadline and any(key[1] in pids for key in recycle._RELEASES.held):
        time.sleep(0.1)
    assert not any(key[1] in pids for key in recycle._RELEASES.held), "storages of exited workers still held"


def _held_in_child(conn) -> None:
    from h5batch.torch import recycle

    conn.send(len(recycle._RELEASES.held))
    conn.close()


def test_forked_children_do_not_inherit_held_storages(paired120):
    """The next epoch's workers are forked from the main process: they must not keep the
    storages it holds mapped (that memory would live as long as they do)."""
    import multiprocessing as mp

    from h5batch.torch import recycle

    ds = H5Dataset(paired120, "train")
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate, persistent_workers=True)
    for _ in loader:
        pass
    assert recycle._RELEASES.held, "the main process holds the workers' slots"
    parent, child = mp.get_context("fork").Pipe()
    p = mp.get_context("fork").Process(target=_held_in_child, args=(child,))
    p.start()
    assert parent.recv() == 0
    p.join(10)
    assert recycle._RELEASES.held, "the parent's are untouched"
