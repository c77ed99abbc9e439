"""A split's per-sample metadata (sources, checksums, labels: h5batch/writer/append.py,
SmallAppender): a real conversion killed at a commit has the committed rows in its file, and
resumes."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from h5batch import generate
from tests.conftest import REPO
from tests.support.processes import kill_group, wait_for
from tests.support.run import convert_cmd, run
from tests.support.run import start as start_process


def test_a_commit_covers_the_per_sample_rows(tmp_path):
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
