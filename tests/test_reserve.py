"""The output's disk space reserved ahead of the writes (h5batch/writer/reserve.py): the
reservation is there while a conversion writes, it changes no byte or size of the file,
and what the samples did not fill is given back at the end, also after a ``kill -9`` and
a resumed run. Real files, a real conversion subprocess killed with a real signal."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from h5batch import generate
from h5batch.writer.reserve import _SLACK, reserve, trim
from tests.conftest import REPO
from tests.support.processes import kill_group, wait_for
from tests.support.run import convert_cmd, run
from tests.support.run import start as start_process

JOB = REPO / "jobs" / "paired_audio.yaml"


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_reserve_keeps_bytes_and_size_and_trim_gives_the_blocks_back(tmp_path):
    p = tmp_path / "f.bin"
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    p.write_bytes(data)
    before = allocated(p)
    if not reserve(str(p), 8 << 20):
        pytest.skip("this filesystem has no fallocate(KEEP_SIZE)")
    assert p.stat().st_size == len(data) and p.read_bytes() == data
    assert allocated(p) >= len(data) + (8 << 20) - 4096  # the blocks are there, past the end
    with open(p, "ab") as fh:  # writes past the end land in them, as HDF5's appends do
        fh.write(b"x" * 100_000)
    assert p.stat().st_size == len(data) + 100_000
    trim(str(p))
    assert p.read_bytes() == data + b"x" * 100_000
    assert allocated(p) < p.stat().st_size + _SLACK, "the unused reservation was not given back"
    assert allocated(p) >= before


def test_a_reservation_the_disk_cannot_hold_is_no_error(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"abc")
    assert reserve(str(p), 1 << 62) is False  # ENOSPC / EFBIG: the writes will say whether it fits
    assert p.read_bytes() == b"abc" and allocated(p) < _SLACK
    assert reserve(str(p), 0) is False
    trim(str(tmp_path / "missing.bin"))  # nothing to trim: no error


@pytest.mark.parametrize("placed", [False, True])
def test_conversion_reserves_its_samples_bytes_and_trims_them_after_kill_and_resume(tmp_path, placed):
    """``placed``: the workers write the chunks the writer placed at the start (alloc time
    EARLY: the file's size covers them from the start, sparse); not placed where the
    transport is the network (the workers ship every row, conversion/direct_chunks.py).
    Placed, the same kill and resume check the run's fence (conversion/fence.py): the driver
    closed the stored batches, and the resumed run removes what the kill left."""
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=160, n_test=40, seconds=0.5, seed=3)
    # Rejected files leave their share of the reservation unused: the end must give it back.
    bad = sorted((root / "train" / "data").glob("*.wav"))[-8:]
    for p in bad:
        p.write_bytes(b"RIFF" + bytes(100))
    probe = tmp_path / "probe"
    probe.touch()
    if not reserve(str(probe), 1):
        pytest.skip("this filesystem has no fallocate(KEEP_SIZE)")
    out = tmp_path / "out.h5"
    partial = Path(str(out) + ".partial")
    fence = Path(str(partial) + ".fence")
    # Fixed-length fields: the plan knows their bytes without a trial (batch_size and
    # codec are set, so none runs).
    args = convert_cmd(JOB, workers=None, output=out, root=root,
                       settings=("cluster.batch_size=4", "policy.commit_every=0", "output.chunk_bytes=16384",
                                 "output.codec=none", "fields.data.length=8000", "fields.target.length=8000",
                                 f"cluster.transport={'auto' if placed else 'network'}"))
    proc = start_process(args, {"H5BATCH_FAULTS": "pause_at=commit:2"}, new_session=True)
    try:
        wait_for(Path(str(partial) + ".paused"), proc)
        samples = 200 * 2 * 8000 * 2  # 200 pairs, two 0.5 s clips of 16-bit samples at 16 kHz
        size = partial.stat().st_size
        # Reserved from the file's first end on: what 2 batches wrote is inside it.
        assert allocated(partial) >= samples, (allocated(partial), size)
        # The reservation changes no size: the file ends where 2 batches did, or where the
        # placed chunks do.
        assert (samples < size < samples * 1.1) if placed else (size < samples / 2)
        # (The workers write only while their batch is open in the run's fence, which the
        # kill leaves behind: conversion/fence.py. The resumed run closes and removes it.)
        assert fence.exists() == placed
        if placed:  # the stored batches were closed before the writer had them; not the last
            state = fence.read_bytes()
            assert len(state) == 50 and state[:2] == b"\1\1" and state[-1:] == b"\0", state
    finally:
        kill_group(proc)
    res = run(args)
    assert res.returncode == 0, res.stderr
    assert "batches already committed" in res.stderr
    assert not fence.exists()
    assert out.stat().st_size > samples
    assert allocated(out) < out.stat().st_size + _SLACK, "the finished output kept blocks past its end"
    with h5py.File(out) as f:
        assert f["train/data"].shape[0] + f["test/data"].shape[0] == 200 - len(bad)
