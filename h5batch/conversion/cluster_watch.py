"""Watching the LocalCluster a run started, while its driver waits for events.

Rules, and why:

* A driver thread looks at its own cluster's workers every :data:`WATCH_SECONDS`
  (:meth:`ClusterWatch.look`), not the event loop, which may wait on the frozen worker
  itself (``driver.RESULT_TIMEOUT``). Clusters it did not start are not watched: they may
  lack workers for a while, and Dask's ``worker-ttl`` watches them.
* No worker for ``policy.no_worker_timeout`` seconds stops the run (progress committed).
  Reason: Dask waits for workers forever, and a nanny that cannot restart its worker closes
  for good (see ``cluster.LOST_WORKER_TIMEOUT``).
* A worker whose heartbeat has not changed for ``policy.frozen_worker_timeout`` seconds is
  SIGKILLed (its nanny starts a new one). Reason: a frozen worker (GIL-holding native call,
  deadlock, swapping) cannot run its own decode watch, and Dask restarts it only after
  ``worker-ttl`` (5 min). Killed, not restarted through the scheduler: a stopped process
  cannot answer a close request. The failed task reruns and, if it freezes each time, is
  split down to the file like a crash. Silence is timed on the monotonic clock from when
  the heartbeat was seen to change, so a clock step or suspend is not a freeze.
* Each kill is appended to ``H5BATCH_EVENT_LOG`` when set. Reason: the test suite prints
  them, since a freeze the watch ends leaves a passing test.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from typing import Any

from ..config import PolicyConfig
from ..errors import ConvertError

WATCH_SECONDS = 5.0  # how often the driver looks at its own cluster's workers
EVENT_LOG = "H5BATCH_EVENT_LOG"  # see the module docstring


class ClusterWatch:
    """The looks of one run at its LocalCluster, on a thread (see the module docstring): a
    stop is put in ``events`` as ``("watch", ConvertError)``; ``then`` says what the user
    does after it; ``output`` names the run in the event log."""

    def __init__(self, client: Any, cluster: Any, policy: PolicyConfig, say, events: queue.Queue, then: str,
                 output: str = ""):
        self.client, self.cluster, self.policy, self.say, self.events, self.then = \
            client, cluster, policy, say, events, then
        self.output = output
        self.every = min(WATCH_SECONDS, policy.no_worker_timeout, policy.frozen_worker_timeout / 2)
        self.no_worker_since: float | None = None
        self.seen: dict[str, tuple[Any, float]] = {}  # address -> (its last heartbeat time, when seen)
        self.killed: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="h5batch-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            error = self.look()
            if error is not None:
                self.events.put(("watch", error))
                return

    def look(self) -> ConvertError | None:
        """One look; the error that stops the run, if it must stop."""
        try:
            workers = self.client.scheduler_info(n_workers=-1)["workers"]
        except Exception:  # noqa: BLE001 - a closing scheduler: the run's own wait tells
            return None
        if workers:
            self.no_worker_since = None
            self._kill_frozen(workers)
            return None
        limit = self.policy.no_worker_timeout
        since = self.no_worker_since = self.no_worker_since or time.monotonic()
        if time.monotonic() - since <= limit:
            return None
        return ConvertError(f"every worker of the local Dask cluster is gone and none came back in "
                            f"{limit:g} s (policy.no_worker_timeout; the machine may be short of memory or "
                            f"CPU); {self.then}")

    def _kill_frozen(self, workers: dict[str, dict]) -> None:
        limit = self.policy.frozen_worker_timeout
        now = time.monotonic()
        for address, w in workers.items():
            beat = w.get("last_seen")
            if address not in self.seen or self.seen[address][0] != beat:
                self.seen[address] = (beat, now)
                continue
            silent = now - self.seen[address][1]
            if silent > limit and address not in self.killed:
                self.killed.add(address)
                pid = self._pid(address)
                if pid is None:
                    continue  # not a worker process of this run's nannies: nothing to kill
                text = (f"worker {address} has sent no heartbeat for {silent:.0f} s "
                        f"(policy.frozen_worker_timeout {limit:g} s): killed it, its batch is decoded again")
                self.say(text)
                _record(f"{self.output}: {text}")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _pid(self, address: str) -> int | None:
        """The process id of the worker at ``address``, from the cluster's nannies."""
        for nanny in list(getattr(self.cluster, "workers", {}).values()):
            if getattr(nanny, "worker_address", None) == address:
                return getattr(nanny, "pid", None) or None  # None: its process is not running
        return None


def _record(line: str) -> None:
    """Append ``line`` to the event log, where there is one (see the module docstring)."""
    path = os.environ.get(EVENT_LOG)
    if path:
        with contextlib.suppress(OSError):
            with open(path, "a") as f:
                f.write(line + "\n")
