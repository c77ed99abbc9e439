"""More decoders for an in-process run: child processes forked from the driver at the start.

Rule: where the driver forks its writer (:func:`~.writer_start.can_fork`: Linux, no thread
yet) and the job may decode in process (``cluster.kind`` ``auto`` or ``inprocess``), it
forks :func:`count` decoders right after the writer, before discovery; where the
writer came from the fork server (a notebook, a script with threads), an in-process run
starts them from that server when it begins decoding. Each waits on its own pipe for
``decode_batch`` calls and answers with their results. An in-process run with forked
decoders decodes on them alone (:class:`~.inprocess.InProcessClient` serves one shared
queue to all); the driver's own decode thread decodes where there are none (one worker, a
spawn-only platform) and takes over once they have all died. A run that gets a LocalCluster
(or has nothing to decode) closes them at once.

Reason: on a small job the one decode thread was the critical path (FSDD: ~80 % of the
decode phase in ``decode_batch``), and threads do not help: decoding a PCM file is mostly
Python, which holds the GIL (3,000 FSDD files: 0.13 s on one thread, 0.16 s on two). A fork
costs milliseconds and copies nothing (copy-on-write), where a LocalCluster costs ~3 s. They
are forked early because a fork is only safe while the driver has no other thread; the
codec trial and the kind probe start threads that are kept. Why not the driver's thread
beside them: it shares the GIL with the driver's loop (and the inventory sidecar's steps)
and faults in its segments during the run, where a forked decoder warms its own while the
driver discovers: its first batch of a 4,096-pair run took 36-42 ms against 10-17 ms for
the others, and the writer waited for it. Two forked decoders instead of the thread and
one: 0.349 s against 0.362 s (11 alternating rounds of 5 fresh-process runs); FSDD's whole
command unchanged (0.284 against 0.283 s).

A decoder is a worker without Dask: :func:`~.worker.decode_batch` creates its batch in
this process's own shared-memory segments (named with the run id, so the driver's clean-up
removes them), captures its decoders' warnings on its own fd 2, and keeps the decode
timeout. It closes every file descriptor it inherited but its pipe and the standard three
(:func:`h5batch.forking.close_inherited`, the rule of every forked helper: the output's
lock, the writer's pipes; the writer must see EOF on its lifeline when the driver dies),
ignores SIGINT (the driver decides, as for the writer) and ends when its pipe
closes: with the driver, whatever way the driver ends. A decoder that dies (a decoder
library that kills its process) has its batch decoded again on the driver's thread, and is
not used again: the run goes on as with one thread, and a file that kills the driver too is
found on processes by the resumed run (``inprocess.py``).
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import signal
from multiprocessing.connection import Connection
from typing import Any

from .. import faults, gcpause
from ..config import JobConfig
from ..forking import close_inherited
from ..transport.segments import drop_unused_segments, prewarm_segments
from ..writer.process import start_without_main
from . import direct_chunks
from .auto import TARGET_BATCH_BYTES
from .cluster import default_workers
from .writer_start import can_fork

# Segments a forked decoder makes and touches while the driver discovers the corpus, for
# batches of the in-process size (auto.TARGET_BATCH_BYTES): the 3 a decoder fills in a run
# of 4,096 pairs (2 in flight to the writer, 1 being decoded). It stops at its first batch,
# and unlinks those no batch took when it ends. The cost is memory on small jobs: a batch
# smaller than the segment leaves the rest of its touched pages unused until the run ends
# (the demo job, 15 MB of output: 60 MB of segments at the peak of its run).
PREWARM_SEGMENTS = 3
# None where the decoders will likely write the output's chunks themselves
# (direct_chunks.likely): there is no head start then, and the driver holds the batches
# back until the chunks are placed, so a segment carries only the rest of a batch after a
# reject. 4,096 pairs, 8 alternating CLI runs: 0.410 s against 0.414 s with one.
PREWARM_SEGMENTS_DIRECT = 0
MAX_DECODERS = 4  # forked decoders of an in-process run at most, cluster.workers unset
CLOSE_SECONDS = 5.0  # how long closing waits for a decoder to finish its batch and exit


def count(job: JobConfig) -> int:
    """Forked decoders ``job`` would use if it decodes in process: ``cluster.workers`` (or
    one per core, at most :data:`MAX_DECODERS`), and none where that is one (the driver's
    thread decodes alone); 0 for other kinds and where ``auto`` would start a LocalCluster
    whatever the work (``workers`` > 1)."""
    cfg = job.cluster
    if cfg.kind == "inprocess" or (cfg.kind == "auto" and cfg.workers in (None, 1)):
        n = cfg.workers or min(MAX_DECODERS, default_workers())
        return n if n > 1 else 0
    return 0


class SpareDecoder:
    """One forked decoder (see the module). :meth:`call` runs a function there."""

    def __init__(self, process: Any, conn: Connection):
        self.process, self.conn = process, conn
        self.alive = True

    @classmethod
    def start_all(cls, job: JobConfig, ctx: Any = None, run_id: str = "") -> list[SpareDecoder]:
        """:func:`count` decoders for ``job``: forked from this process now (``ctx`` None),
        where that is safe, or started from the writer's fork server (``ctx``: its
        context; a fork there costs milliseconds too); none otherwise, or where a start
        fails (the run then decodes on one thread). With ``run_id``, each first makes its
        shared-memory segments for that run while it waits for its first batch
        (:data:`PREWARM_SEGMENTS`)."""
        n = count(job)
        if not n:
            return []
        if ctx is None:
            if not can_fork():
                return []
            ctx = mp.get_context("fork")
            _import_decoders(job)
        elif ctx.get_start_method() != "forkserver":
            return []  # spawn: a fresh interpreter per decoder costs more than it saves here
        out = []
        ahead = PREWARM_SEGMENTS_DIRECT if direct_chunks.likely(job) else PREWARM_SEGMENTS
        for _ in range(n):
            ours, theirs = ctx.Pipe(duplex=True)
            prewarm = (run_id, TARGET_BATCH_BYTES, ahead) if run_id and ahead else None
            process = ctx.Process(target=_serve, args=(theirs, prewarm), name="h5batch-decoder", daemon=True)
            try:
                start_without_main(process, ctx)
            except OSError:
                ours.close()
                theirs.close()
                break
            theirs.close()
            out.append(cls(process, ours))
        return out

    def call(self, fn: Any, args: tuple) -> tuple[bool, Any]:
        """``fn(*args)`` in the decoder: ``(False, result)``, or ``(True, the exception it
        raised)``; raises :class:`EOFError` or :class:`OSError` when the decoder is gone (it
        is then marked dead). A call that cannot cross the pipe (its arguments or result
        do not pickle) leaves the pipe mid-message: the decoder is killed and the call
        raises :class:`OSError` too, so its caller hands it to the driver's own thread."""
        try:
            self.conn.send((fn, args))
            return self.conn.recv()
        except (EOFError, OSError):
            self.alive = False
            raise
        except Exception as e:  # noqa: BLE001 - pickling errors are TypeError, PicklingError, ...
            self.alive = False
            self.process.kill()
            raise OSError(f"forked decoder: the call could not cross the pipe ({e})") from e

    def tell(self) -> None:
        """Ask the decoder to end once its batch is done (a dead one needs no telling)."""
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass

    def reap(self, timeout: float = CLOSE_SECONDS) -> None:
        """Wait for the decoder told to end; killed when it has not within ``timeout``."""
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)
        self.conn.close()
        self.alive = False


def _import_decoders(job: JobConfig) -> None:
    """The job's decoder packages (soundfile, Pillow, PyAV...) imported before the fork, so
    every decoder has them: the driver imports them for the codec trial anyway (soundfile
    and ``PIL.Image`` ~30 ms), and each child would otherwise pay it on its first batch. A
    package that does not import is the pre-flight's to report."""
    from .preflight import needed_packages

    for name in sorted(needed_packages(job)):
        module = _DECODER_MODULES.get(name, name)
        if module:
            try:
                importlib.import_module(module)
            except ImportError:
                pass


# needed_packages' names that are not the module a decoder imports
_DECODER_MODULES = {"pillow": "PIL.Image", "python": "", "h5batch": "", "libsndfile": ""}


def close_all(spares: list[SpareDecoder]) -> None:
    """End every decoder of ``spares``: all are told first, then each is reaped (closing
    twice is harmless)."""
    for s in spares:
        s.tell()
    for s in spares:
        s.reap()


def _serve(conn: Connection, prewarm: tuple[str, int, int] | None = None) -> None:
    """The decoder's loop: ``(fn, args)`` in, ``(raised, value)`` out, until None or EOF.
    ``prewarm``: (run id, bytes, count) of the segments to make first (:data:`PREWARM_SEGMENTS`)."""
    faults.in_forked_decoder = True
    gcpause.resume()  # forked during the driver's set-up: collection on for the decoder's run
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    close_inherited(conn.fileno())
    if prewarm is not None:
        try:
            prewarm_segments(*prewarm, stop=conn.poll)
        except OSError:  # /dev/shm full or absent: the batches will say so, or go by the network
            pass
    try:
        _loop(conn)
    finally:
        drop_unused_segments()


def _loop(conn: Connection) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            reply: tuple[bool, Any] = (False, fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the driver like a worker's error
            reply = (True, e)
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return
