"""Set-up of each Dask worker process of a LocalCluster (a Dask preload: ``dask_setup``).

A terminal's Ctrl-C reaches every process of the group, the workers too. The driver is the
one that decides what happens (commit, then close the cluster, which stops the workers);
a worker that raised KeyboardInterrupt itself would only print a traceback from its event
loop onto the user's console. So the workers ignore SIGINT. For the same reason their Dask
log shows errors only, as the driver's does (``silence_logs``): a SIGTERM sent to the whole
group makes a worker close its connections, which Dask reports with a traceback at INFO
level although nothing is wrong. One ERROR is noise too: when the driver closes the cluster
(after a SIGTERM, say), a worker whose heartbeat was on its way logs "Failed to communicate
with scheduler during heartbeat" with a traceback (seen once in the fault matrix under load);
a scheduler lost during a run is reported by the driver itself, so that record is dropped.
"""

from __future__ import annotations

import logging
import signal
import threading


class _HeartbeatAtShutdown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to communicate with scheduler during heartbeat" not in record.getMessage()


def dask_setup(worker) -> None:  # the name Dask calls in a preload module
    logging.getLogger("distributed").setLevel(logging.ERROR)
    logging.getLogger("distributed.worker").addFilter(_HeartbeatAtShutdown())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
