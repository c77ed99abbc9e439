"""Set-up of each Dask worker process of a LocalCluster (a Dask preload: ``dask_setup``).

A terminal's Ctrl-C reaches every process of the group, the workers too. The driver is the
one that decides what happens (commit, then close the cluster, which stops the workers);
a worker that raised KeyboardInterrupt itself would only print a traceback from its event
loop onto the user's console. So the workers ignore SIGINT. For the same reason their Dask
log shows errors only, as the driver's does (``silence_logs``): a SIGTERM sent to the whole
group makes a worker close its connections, which Dask reports with a traceback at INFO
level although nothing is wrong.
"""

from __future__ import annotations

import logging
import signal
import threading


def dask_setup(worker) -> None:  # the name Dask calls in a preload module
    logging.getLogger("distributed").setLevel(logging.ERROR)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
