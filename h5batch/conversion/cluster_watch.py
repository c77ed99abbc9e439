"""Watching the LocalCluster a run started, while its driver waits for events.

Rules, and why:

* A thread of the driver looks at its own cluster's workers every :data:`WATCH_SECONDS`
  (:meth:`ClusterWatch.look`), not the driver's loop between events: that loop may wait a
  minute for a result held by the frozen worker itself (``driver.RESULT_TIMEOUT``). Clusters it did not start (a scheduler,
  dask-jobqueue) are not watched: they may legitimately be without workers for a while,
  and Dask's ``worker-ttl`` watches their heartbeats.
* No worker at all for ``policy.no_worker_timeout`` seconds stops the run (its progress
  committed). Reason: Dask keeps tasks waiting for workers forever, and a nanny that cannot
  start its worker again closes for good: the run would hang with nothing left to run it
  (``cluster.LOST_WORKER_TIMEOUT`` keeps Dask from closing nannies itself, the cause seen
  on a loaded machine).
* A worker whose heartbeat has not changed for ``policy.frozen_worker_timeout`` seconds is
  killed (SIGKILL; its nanny starts a new one, as after a crash). Reason: a worker sends one
  every half second or so from its event loop; one silent that long is frozen (a native call
  that holds the GIL, a deadlock, swapping), and then its own decode watch
  (``worker._Watched``) cannot run either. Dask restarts it only after ``worker-ttl``, 5
  minutes by default, and the run waited meanwhile with nothing to say (CI saw a conversion
  time out at 300 s so, cause unknown). Killed, not restarted through the scheduler: a
  stopped process cannot answer a close request, and a restart still waiting when the run
  ends is cancelled with a traceback. The kill fails its task, which runs again and, where
  it freezes its worker each time, is split down to the file like a crash. Silence is timed
  on this process's monotonic clock from the moment the worker's last heartbeat time was
  seen to change, not from that wall-clock time: a clock step or a suspended laptop must not
  look like frozen workers.
* Each kill is also appended to the file named by ``H5BATCH_EVENT_LOG``, when it is set.
  Reason: the test suite sets it and prints the kills of a session at its end: a freeze that
  the watch ends leaves a passing test, and its message would otherwise go unseen (the hang
  it stands in for was never reproduced outside CI).
"""

from __future__ import annotations

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
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

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
        try:
            with open(path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass
