"""The plain path and ds.loader(): DataLoader(ds, batch_size, shuffle=True) with torch's default
collate, and H5Dataset.loader(), return the samples direct reads give, at 0 and 2 workers;
the default collate re-uses the batch's columns (no copy, recycled shared memory);
pin_memory on a CPU-only torch."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from h5batch.torch import H5Dataset, collate
from h5batch.torch.loader import H5DataLoader, accelerator_available
from h5batch.torch.rows import BatchRow, VariableLengthCollateError
from tests.test_reader import demo, paired  # noqa: F401  -- module fixtures (real converted files)


def direct(path, split="train") -> dict:
    """source -> {field: tensor}: every sample read one by one in this process."""
    ds = H5Dataset(path, split, with_source=True, recycle=False)
    return {ds[i]["source"]: ds[i] for i in range(len(ds))}


def check_epoch(loader, ref: dict, fields=("data", "target"), transposed=False) -> list:
    """Check every sample of one epoch against ``ref``; returns the sources in order.
    ``transposed``: torch's default_collate turns the per-sample tuples of paths into one
    tuple per field."""
    seen = []
    for batch in loader:
        sources = list(zip(*batch["source"])) if transposed else batch["source"]
        for j, src in enumerate(sources):
            for k in fields:
                assert torch.equal(batch[k][j], ref[src][k]), (src, k)
            seen.append(src)
    assert sorted(seen) == sorted(ref), "every sample once per epoch"
    return seen


def inode(t: torch.Tensor) -> int:
    fd, _ = t.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_dataloader_with_default_collate_returns_direct_reads(paired, workers):  # noqa: F811
    path = paired[0]
    ref = direct(path)
    ds = H5Dataset(path, "train", with_source=True)
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    for _ in range(2):
        check_epoch(loader, ref, transposed=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_ds_loader_returns_direct_reads_in_a_new_order_each_epoch(paired, workers):  # noqa: F811
    path = paired[0]
    ref = direct(path)
    ds = H5Dataset(path, "train", with_source=True)
    loader = ds.loader(batch_size=8, num_workers=workers, seed=3)
    assert isinstance(loader, H5DataLoader) and loader.collate_fn is collate
    assert loader.persistent_workers == (workers > 0)
    orders = [check_epoch(loader, ref) for _ in range(2)]
    assert orders[0] != orders[1], "the sampler rolls on to the next epoch"
    loader.set_epoch(0)
    assert check_epoch(loader, ref) == orders[0], "epoch 0 again: a pure function of (seed, epoch)"
    sequential = ds.loader(batch_size=8, shuffle=False, num_workers=workers)
    assert check_epoch(sequential, ref) == [ds[i]["source"] for i in range(len(ds))]


def test_default_collate_returns_the_batch_columns_without_a_copy(paired):  # noqa: F811
    ds = H5Dataset(paired[0], "train")
    batch = ds.__getitems__([5, 1, 9, 2])
    assert all(type(v) is BatchRow for v in batch[0].values())
    out = default_collate(batch)
    ours = collate(ds.__getitems__([5, 1, 9, 2]))
    for k in ("data", "target"):
        assert type(out[k]) is torch.Tensor
        assert out[k].data_ptr() == batch.columns[k].data_ptr(), "the column itself"
        assert torch.equal(out[k], ours[k])
    # Anything else done with the rows is plain torch, and gives plain tensors.
    rows = [batch[j]["data"] for j in range(4)]
    stacked = torch.stack(rows)
    assert type(stacked) is torch.Tensor and stacked.data_ptr() != batch.columns["data"].data_ptr()
    assert torch.equal(stacked, ours["data"]) and type(rows[0] * 2) is torch.Tensor
    assert torch.equal(torch.stack(rows[::-1]), ours["data"].flip(0)), "not the column: a real stack"
    assert type(ds[3]["data"]) is torch.Tensor, "ds[i] is plain tensors"


def test_default_collate_recycles_worker_memory(paired):  # noqa: F811
    ds = H5Dataset(paired[0], "train", with_source=True)
    ref = direct(paired[0])
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    files, batches = set(), 0
    for _ in range(3):
        for b in loader:
            files.add(inode(b["data"]))
            assert inode(b["data"]) == inode(b["target"])
            batches += 1
            for j, src in enumerate(zip(*b["source"])):
                assert torch.equal(b["data"][j], ref[src]["data"])
    assert len(files) <= batches // 2, f"{len(files)} shared-memory files for {batches} batches"


def test_default_collate_names_the_way_out_for_variable_fields(demo):  # noqa: F811
    ds = H5Dataset(demo[0], "train", fields=["audio"])
    with pytest.raises(VariableLengthCollateError, match="collate_fn=h5batch.torch.collate"):
        next(iter(DataLoader(ds, batch_size=6)))
    batch = next(iter(ds.loader(batch_size=6, shuffle=False)))
    assert batch["audio"].shape[0] == 6 and batch["audio_lengths"].shape == (6,)


@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_with_recycled_batches(paired, workers):  # noqa: F811
    """pin_memory=True: on a torch without an accelerator DataLoader turns it off (with a
    warning), ds.loader() without one; with one, every batch is pinned. Either way batches
    stay right and (with workers) recycled."""
    path = paired[0]
    ref = direct(path)
    ds = H5Dataset(path, "train", with_source=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ds.loader() warns about nothing
        loader = ds.loader(batch_size=4, num_workers=workers, pin_memory=True)
    assert loader.pin_memory == accelerator_available()
    files = set()
    for _ in range(2):
        for b in loader:
            assert b["data"].is_pinned() == accelerator_available()
            for j, src in enumerate(b["source"]):
                assert torch.equal(b["data"][j], ref[src]["data"])
            if workers and not accelerator_available():
                files.add(inode(b["data"]))
    if files:
        assert len(files) <= 10, f"{len(files)} shared-memory files for 20 batches"


def test_loader_arguments_are_checked(paired):  # noqa: F811
    ds = H5Dataset(paired[0], "train")
    with pytest.raises(ValueError, match="rank/world_size"):
        ds.loader(shuffle=False, world_size=2, rank=1)
    with pytest.raises(ValueError, match="not both"):
        ds.loader(sampler=range(3), batch_sampler=[[0]])
    with pytest.raises(ValueError, match="epoch"):
        ds.loader().set_epoch(-1)
    split = [ds.loader(batch_size=4, world_size=2, rank=r, seed=1) for r in (0, 1)]
    got = [np.concatenate([b["data"][:, 0].numpy() for b in dl]) for dl in split]
    assert len(got[0]) == len(got[1]) == len(ds) // 2


@pytest.mark.parametrize("kw", [{}, {"as_float": False}, {"channels_first": True}, {"direct_chunks": False},
                                {"shared_memory": True}])
def test_single_sample_reads_equal_batch_reads(demo, paired, kw):  # noqa: F811
    """ds[i] of fixed fields takes the one-sample path (h5batch/torch/single.py): the same
    values, dtypes, axes, label and source as sample 0 of __getitems__([i])."""
    for path, fields in ((paired[0], None), (demo[0], ["image"])):
        ds = H5Dataset(path, "train", fields=fields, with_source=True, **kw)
        for i in [0, 7, len(ds) - 1, -2]:
            one, ref = ds[i], ds.__getitems__([i]).sample(0)
            assert one.keys() == ref.keys()
            for k, v in ref.items():
                if isinstance(v, torch.Tensor):
                    assert type(one[k]) is torch.Tensor and one[k].dtype == v.dtype
                    assert one[k].shape == v.shape and torch.equal(one[k], v), (path.name, kw, i, k)
                    assert one[k].is_shared() == bool(kw.get("shared_memory")), k
                else:
                    assert one[k] == v
        with pytest.raises(IndexError):
            ds[len(ds)]
