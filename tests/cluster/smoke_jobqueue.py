#!/usr/bin/env python
"""Smoke test: dask_jobqueue.SLURMCluster against the local throw-away SLURM.

Run after `tests/cluster/slurm_local.sh start`.  Takes no arguments; exits 0 on
success.  SLURM_CONF defaults to the one slurm_local.sh writes, so eval'ing
`slurm_local.sh env` first is optional.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

STATE = os.environ.get("H5BATCH_SLURM_DIR", "/tmp/h5batch-slurm")
os.environ.setdefault("SLURM_CONF", os.path.join(STATE, "slurm.conf"))

from dask_jobqueue import SLURMCluster  # noqa: E402
from distributed import Client  # noqa: E402

N_JOBS = 2
WORKER_TIMEOUT = 120  # seconds


def squeue_ids() -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%A"], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    return out.split()


def main() -> int:
    if not os.path.exists(os.environ["SLURM_CONF"]):
        print(f"no {os.environ['SLURM_CONF']}: run tests/cluster/slurm_local.sh start", file=sys.stderr)
        return 3
    before = set(squeue_ids())
    with tempfile.TemporaryDirectory(prefix="h5batch-jq-") as tmp:
        t0 = time.monotonic()
        cluster = SLURMCluster(
            cores=1,
            memory="2GB",
            processes=1,
            queue="debug",
            walltime="00:10:00",
            interface="lo",  # workers and scheduler bind to 127.0.0.1
            log_directory=os.path.join(tmp, "logs"),  # else slurm-%j.out lands in the cwd
            local_directory=os.path.join(tmp, "scratch"),
        )
        try:
            print(cluster.job_script())
            print("scheduler:", cluster.scheduler_address)
            cluster.scale(jobs=N_JOBS)
            with Client(cluster) as client:
                client.wait_for_workers(N_JOBS, timeout=WORKER_TIMEOUT)
                t_workers = time.monotonic() - t0
                result = client.submit(lambda x: x + 1, 1).result(timeout=60)
                assert result == 2, result
                print(f"{N_JOBS} workers up after {t_workers:.1f} s; result={result}")
        finally:
            cluster.close()
        # cluster.close() scancels its jobs; give slurm a moment to drop them
        deadline = time.monotonic() + 30
        while True:
            left = set(squeue_ids()) - before
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if left:
            print(f"jobs still in squeue after close: {sorted(left)}", file=sys.stderr)
            return 1
        print(f"OK: no jobs left in squeue; total {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
