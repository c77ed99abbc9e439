"""No multiprocessing semaphore is left in /dev/shm by a conversion: released when it ends,
and unlinked by the next run when ``kill -9`` of the process group left them (the Dask
nannies' ``sem.mp-*`` files used to pile up: 12 per killed run, 1,022 after a day of tests)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from h5batch import generate
from h5batch.transport import semaphores
from tests.conftest import PARALLEL
from tests.support.processes import wait_for
from tests.support.run import convert_cmd, run, start


def test_killed_run_leaves_no_semaphore_after_the_next_run(tmp_path):
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=60, n_test=20, seconds=0.3, seed=3)
    job = Path(__file__).parents[1] / "jobs" / "paired_audio.yaml"
    out = tmp_path / "out.h5"
    cmd = convert_cmd(job, output=out, root=root, workers=2,
                      settings=["cluster.kind=local", "cluster.batch_size=4", "policy.commit_every=0",
                                "output.chunk_bytes=16384"])
    proc = start(cmd, {"H5BATCH_FAULTS": "pause_at=commit:3"}, new_session=True)
    wait_for(Path(str(out) + ".partial.paused"), proc)
    during = semaphores.list_tagged(proc.pid)
    assert during, "the running conversion has no tagged semaphores: the tag is not applied"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    left = semaphores.list_tagged(proc.pid)
    assert left, "kill -9 of the group left no semaphore: this test no longer tests anything"
    # (Untagged semaphores are not counted: other tests may run beside this one. During a
    # paused run, every sem.mp-* file its processes map is tagged: checked in /proc/*/maps.)

    res = run(cmd)  # resumes, and first removes what the dead run left
    assert res.returncode == 0, res.stderr
    said = re.search(r"removed (\d+) semaphores left in /dev/shm by dead runs", res.stderr)
    # Beside this test, a conversion of the other xdist worker that started meanwhile removes
    # every dead run's semaphores too (seen in CI): then none is left for this run to remove.
    # Without any clean-up at all, the check below still fails.
    if said or not PARALLEL:
        assert said and int(said[1]) >= len(left), res.stderr  # (and any of other dead runs)
    assert not semaphores.list_tagged(proc.pid)
