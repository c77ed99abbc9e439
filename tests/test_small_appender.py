"""A split's per-sample metadata (sources, checksums, labels) is buffered by the writer and
written once per commit and at the end (h5batch/writer/append.py: SmallAppender). Real h5py
files; a real conversion killed at a commit has the committed rows in its file, and resumes."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from h5batch import generate
from h5batch.writer.append import SmallAppender, small_dataset
from tests.conftest import REPO
from tests.support.processes import kill_group, wait_for
from tests.support.run import convert_cmd, run
from tests.support.run import start as start_process

STR = h5py.string_dtype("utf-8")


def test_buffered_rows_reach_the_file_at_flush_in_order(tmp_path):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        plain = SmallAppender(small_dataset(f, "plain", (2,), np.uint32, 8))
        buf = SmallAppender(small_dataset(f, "buf", (2,), np.uint32, 8), buffered=True)
        src = SmallAppender(small_dataset(f, "src", (), STR, 8), buffered=True)
        rows = [np.arange(6, dtype=np.uint32).reshape(3, 2) + 10 * k for k in range(4)]
        for k, r in enumerate(rows[:3]):
            plain.append(r)
            buf.append(r)
            src.append(np.array([f"a/{k}/{i}.wav" for i in range(3)], dtype=object))
        src.append([])  # a batch whose samples were all rejected
        assert plain.ds.shape == (9, 2) and buf.ds.shape == (0, 2), "buffered rows are not written yet"
        assert buf.n == src.n == 9
        buf.flush()
        src.flush()
        np.testing.assert_array_equal(buf.ds[...], plain.ds[...])
        assert [s.decode() for s in src.ds[...]] == [f"a/{k}/{i}.wav" for k in range(3) for i in range(3)]
        buf.append(rows[3])  # after a flush: appended after the rows written
        buf.flush()
        buf.flush()  # nothing left: no change
        np.testing.assert_array_equal(buf.ds[...], np.concatenate(rows))
        assert buf.n == buf.ds.shape[0] == 12


def test_a_commit_writes_the_buffered_rows(tmp_path):
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=96, n_test=0, seconds=0.25, seed=5)
    out = tmp_path / "o.h5"
    partial = Path(str(out) + ".partial")
    args = convert_cmd(REPO / "jobs" / "paired_audio.yaml", output=out, root=root,
                       settings=("cluster.batch_size=16", "policy.commit_every=0", "output.codec=none",
                                 "fields.data.length=4000", "fields.target.length=4000"))
    proc = start_process(args, {"H5BATCH_FAULTS": "pause_at=commit:2"}, new_session=True)
    try:
        wait_for(Path(str(partial) + ".paused"), proc)
    finally:
        kill_group(proc)
    with h5py.File(partial, "r") as f:
        g = f["train"]
        n = int(g.attrs["num_samples"])
        assert n >= 32, "two commits, each after a whole batch of 16"
        assert g["source"].shape[0] == g["checksum"].shape[0] == n
        assert [s.decode() for s in g["source"][:n, 0]] == [f"train/data/{i}.wav" for i in range(n)]
        assert np.count_nonzero(g["checksum"][:n]) == 4 * n  # data, data_lengths, target, target_lengths
    # The same command resumes from there (and removes the killed run's shared memory).
    res = run(args)
    assert res.returncode == 0, res.stderr
    assert "batches already committed" in res.stderr
    with h5py.File(out, "r") as f:
        g = f["train"]
        assert [s.decode() for s in g["source"][:, 0]] == [f"train/data/{i}.wav" for i in range(96)]
        assert g["checksum"].shape == (96, 4) and np.count_nonzero(g["checksum"][...]) == 384
