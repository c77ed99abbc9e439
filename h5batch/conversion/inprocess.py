"""Decoding in the driver process (``cluster.kind: inprocess``), and how ``cluster.kind:
auto`` chooses between it and a LocalCluster.

Rule: a small job decodes in the driver process's decoders forked at the start
(:mod:`.spares`, where forking is safe), or on one thread of it where there are none, with the same
:func:`~.worker.decode_batch` a Dask worker runs, into the same shared memory, for the same
writer process; a large one gets a LocalCluster. Reason: starting, checking and stopping a
LocalCluster costs ~3 s on a 2-core machine (importing ``distributed``, the worker
processes, the pre-flight round trip, the teardown), while a small corpus decodes in a
fraction of that (FSDD's 3,000 wav files in ~0.25 s on one thread). The output is the same
file either way: the same decode, batches and writer.

What ``auto`` picks (:func:`choose_kind`, one line in the log says which and why):

* ``local`` whenever ``H5BATCH_FAULTS`` is set (the failure tests inject crashes that only a
  process cluster survives), and for a resumed run: a decoder that kills its process on the
  in-process path takes the driver down with it; the writer then commits what it stored (its
  lifeline), and the same command, now a resume, runs on processes, where the batch is split
  until the culprit stands alone and becomes a reject;
* ``inprocess`` when the estimated decode time of the job on one thread is at most
  :data:`INPROCESS_SECONDS`: :data:`PROBE_ITEMS` items spread over the manifest (a subset of
  the codec trial's, which runs after: the kind sizes the batches), and more between them
  while the probe is quick (:data:`PROBE_MORE`, :data:`PROBE_BUDGET`), are decoded as the
  batches decode them (:func:`~.direct.file_decoders`) and timed (a quick one by the faster
  of two decodes: :func:`probe_seconds`), the median scaled to the whole job;
* ``local`` otherwise (and when the probe itself runs past that budget).

``inprocess`` keeps the decode timeout (``policy.decode_timeout``: ``decode_batch`` abandons
a hung file's thread, the file becomes a ``timeout`` reject) and turns a decoder's exception
into a reject as a worker does; only a decoder that kills its process is not survived.

BEWARE: one decode thread in the driver, not a pool: the shared-memory segment pool of a
process and the decoder-warning capture (fd 2 and Python's warning filters,
:mod:`.decoder_warnings`) are per process, and a worker process decodes one batch at a time
too; more decoders are processes (:mod:`.spares`), each with its own. While a batch decodes,
fd 2 of the driver points at the capture file, so the driver's progress goes to a duplicate
of the real stderr taken before decoding starts (:func:`console`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .. import faults
from ..config import ClusterConfig, JobConfig
from ..errors import DecodeError, PreflightError
from ..fields import file_fields
from ..manifest import Manifest
from .cluster import Connection
from .decoder_warnings import silenced
from .direct import file_decoders
from .spares import SpareDecoder, close_all
from .trial import TRIAL_BYTES, Decoded, trial_picks

INPROCESS_SECONDS = 3.0  # estimated one-thread decode time up to which auto decodes in-process
PROBE_ITEMS = 8  # items timed by auto at least (a subset of the codec trial's, spread over the manifest)
PROBE_MORE = 64  # items timed at most: more, spread between those, while within PROBE_BUDGET
PROBE_BUDGET = 0.005  # seconds of probing after which no item is added past PROBE_ITEMS
TIMINGS = 2  # decodes of each probe item; the fastest counts (probe_seconds says why)
REPEAT_BELOW = 0.02  # seconds: a probe item whose decode took longer is not decoded again
CLOSE_SECONDS = 5.0  # how long closing waits for the batch being decoded


@dataclass(frozen=True)
class KindChoice:
    """The cluster kind a run uses and, for ``auto``, why; ``samples``: the codec trial's
    items the probe decoded (:func:`probe_seconds`), for the trial to take."""

    kind: str
    why: str = ""
    samples: Decoded = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def describe(self) -> str:
        return f"cluster auto: {self.kind} ({self.why})"


def choose_kind(job: JobConfig, manifest: Manifest, items_left: int, resuming: bool) -> KindChoice:
    """``cfg.kind`` itself unless it is ``auto``; then ``inprocess`` or ``local`` (see the module)."""
    cfg = job.cluster
    if cfg.kind != "auto":
        return KindChoice(cfg.kind)
    if faults.active():
        return KindChoice("local", "H5BATCH_FAULTS is set: injected crashes need worker processes")
    if resuming:
        return KindChoice("local", "resuming: worker processes isolate a file that may have crashed the last run")
    if cfg.security:
        return KindChoice("local", "cluster.security is set: TLS is for the cluster's connections")
    if cfg.workers is not None and cfg.workers > 1:
        return KindChoice("local", f"cluster.workers asks for {cfg.workers} worker processes")
    budget = INPROCESS_SECONDS
    samples: Decoded = {}
    per_item = probe_seconds(job, manifest, timeout=budget, keep=samples)
    if per_item is None:
        return KindChoice("local", f"decoding {PROBE_ITEMS} probe items took over {budget:g} s")
    estimate = per_item * items_left
    if estimate <= budget:
        return KindChoice("inprocess", f"{items_left} items, ~{estimate:.2f} s to decode on one thread, "
                                       f"within {budget:g} s: no worker processes to start", samples)
    return KindChoice("local", f"{items_left} items, ~{estimate:.1f} s to decode on one thread, "
                               f"over {budget:g} s: worker processes on every core", samples)


def probe_seconds(job: JobConfig, manifest: Manifest, timeout: float, keep: Decoded | None = None) -> float | None:
    """Median seconds to decode one item of ``manifest`` (every file of it), from
    :data:`PROBE_ITEMS` items spread over it (more while they are quick: see below), each
    decoded up to :data:`TIMINGS` times and timed by its fastest; None past ``timeout``
    seconds in all (the probe thread is then abandoned, as the codec trial abandons a stuck
    file).

    Reason for the fastest: the probe runs just after the writer and the decoders are
    forked, and everything that slows a decode then is a one-off (copy-on-write faults of
    the driver's pages, the decoder library's first calls, the first read of a file whose
    pages are not cached), while the estimate is of the decoding itself. Timed once, the
    same 16,384-pair job was estimated at 1.3-5.3 s from one ``h5batch convert`` to the next,
    so ``auto`` took a LocalCluster (~6 s) in 2 runs of 20 and ``inprocess`` (~2.2 s) in the
    others; timed by the fastest of two, 0.7-1.8 s and ``inprocess`` in 18 of 18. An item
    that took :data:`REPEAT_BELOW` or more is not decoded again: next to a long decode the
    one-off costs (milliseconds) are noise, and the probe is on the run's critical path (a
    ten-minute 44.1 kHz recording resampled to 16 kHz decodes in ~0.19 s: 8 of them twice
    would have cost 1.5 s more).

    Reason for more items where they are quick: a file of a few microseconds is timed
    within the machine's state of that millisecond, and a median of 8 moved with it: the
    same 100,000-file FSDD-like job (~0.9 s of decoding on one thread) was estimated at
    0.94-2.97 s from one ``h5batch convert`` to the next, next to the 3 s threshold; with
    up to :data:`PROBE_MORE` items in :data:`PROBE_BUDGET`, 0.81-1.37 s (12 runs each,
    alternating). The budget bounds what the probe adds to a run's critical path.

    ``keep``, when given, receives a copy of each sample of the codec trial's items
    (:func:`~.trial.trial_picks`: the first :data:`~.trial.TRIAL_ITEMS` of :func:`spread`'s
    order) as the probe's first decode of it made it, while they fit in
    :data:`~.trial.TRIAL_BYTES` per field (a long recording is never copied: the trial
    decodes it itself, as before), for the trial to take instead of decoding them again
    (:class:`~.trial.Trial`); it is filled only when the probe finished in time."""
    n = len(manifest.items)
    if n == 0:
        return 0.0
    picks = spread(n, PROBE_MORE)
    root = os.path.abspath(manifest.root)
    names = file_fields(job.fields)
    # As the batches decode: a plain 16-bit WAV through the direct paths (direct.file_decoders).
    decoders = file_decoders(tuple((name, job.fields[name]) for name in names))
    wanted = set(trial_picks(n)) if keep is not None else set()
    kept: Decoded = {}
    kept_bytes = dict.fromkeys(names, 0)
    times: list[float] = []
    done = threading.Event()

    def run() -> None:
        start = time.perf_counter()
        for i in picks:
            if len(times) >= PROBE_ITEMS and time.perf_counter() - start >= PROBE_BUDGET:
                break
            best = math.inf
            for timing in range(TIMINGS):
                took = 0.0
                for k, decode in enumerate(decoders):
                    t = time.perf_counter()
                    try:
                        a = decode(os.path.join(root, manifest.items[i].paths[k]))
                    except DecodeError:
                        a = None  # a bad file costs what it took; the job rejects it later
                    took += time.perf_counter() - t
                    # Outside the timing: the decoder's row is reused, the trial needs its own.
                    if (timing == 0 and a is not None and i in wanted
                            and kept_bytes[names[k]] + a.nbytes <= TRIAL_BYTES):
                        kept.setdefault(i, {})[names[k]] = a.copy()
                        kept_bytes[names[k]] += a.nbytes
                best = min(best, took)
                if took >= REPEAT_BELOW:
                    break
            times.append(best)
        done.set()

    with silenced():  # the job decodes these files again and logs their warnings
        threading.Thread(target=run, name="h5batch-probe", daemon=True).start()
        finished = done.wait(timeout)
    if finished and keep is not None:
        keep.update(kept)
    return statistics.median(times) if finished and times else None


def spread(n: int, count: int) -> list[int]:
    """Up to ``count`` indices of ``range(n)``, spread over it coarse to fine: the
    :data:`PROBE_ITEMS` evenly spaced ones first (the probe's picks before it took more),
    then those halfway between, and so on."""
    out: list[int] = []
    seen: set[int] = set()
    level = PROBE_ITEMS
    while len(out) < min(n, count):
        for i in range(level):
            j = i * n // level
            if j not in seen:
                seen.add(j)
                out.append(j)
                if len(out) == count:
                    return out
        level *= 2
    return out


# ---------------------------------------------------------------------------
# The in-process "client"
# ---------------------------------------------------------------------------


class InProcessFuture(Future):
    """A :class:`concurrent.futures.Future` with the ``status`` a Dask future has."""

    @property
    def status(self) -> str:
        if self.cancelled():
            return "cancelled"
        if not self.done():
            return "pending"
        return "error" if self.exception() is not None else "finished"


class InProcessClient:
    """The part of :class:`distributed.Client` the driver uses: :meth:`submit` queues a call
    for the decoders, :meth:`scheduler_info` names one worker per decoder. The decoders are
    a daemon thread of this process and the forked ones of :mod:`.spares`, each fed from the
    one queue by a daemon thread of its own. Daemon, so a decode stuck in a C library never
    keeps the process from exiting."""

    WORKER = "inprocess://driver"

    def __init__(self, spares: list[SpareDecoder] | tuple = (), own_thread: bool = True,
                 thread_allowed: bool = True) -> None:
        """``own_thread`` False: only the forked decoders take calls, until
        :meth:`add_own_thread`, or until one dies (:meth:`_serve`). ``thread_allowed``
        False (a head start, ``conversion/head_start.py``): not even then, until
        :meth:`allow_thread`. Reason: before the driver's loop takes the client over, the
        driver runs the codec trial and prints its lines through fd 2, which a decode on
        this process's thread points at the decoder-warning capture."""
        # (future, fn, args, started): started when a decoder that died had begun it
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.closing = False
        self.spares = list(spares)
        self.served = {"thread": 0, "forked": 0, "died": 0}  # calls run by each kind of decoder; decoders lost
        self.count_lock = threading.Lock()
        self.thread_allowed = thread_allowed
        self.thread_wanted = False  # a forked decoder died before the thread was allowed
        self.threads = [threading.Thread(target=self._serve, args=(s,), name="h5batch-decoder-feed", daemon=True)
                        for s in self.spares]
        for t in self.threads:
            t.start()
        if own_thread or not self.spares:
            self.add_own_thread()

    def add_own_thread(self) -> None:
        """Start the decode thread of this process (once)."""
        with self.count_lock:
            self._start_thread()

    def allow_thread(self) -> None:
        """The driver's loop owns the client now: the thread may decode, and starts at once
        where a forked decoder died before."""
        with self.count_lock:
            self.thread_allowed = True
            if self.thread_wanted:
                self._start_thread()

    def _start_thread(self) -> None:  # with count_lock held
        if self.closing or any(t.name == "h5batch-inprocess" for t in self.threads):
            return
        t = threading.Thread(target=self._serve, args=(None,), name="h5batch-inprocess", daemon=True)
        self.threads.append(t)
        t.start()

    def submit(self, fn: Callable[..., Any], *args: Any, key: str = "", pure: bool = False,
               retries: int = 0) -> InProcessFuture:
        """Run ``fn(*args)`` on a decoder (``key``, ``pure``, ``retries``: as Dask's, unused)."""
        fut = InProcessFuture()
        self.queue.put((fut, fn, args, False))
        return fut

    def scheduler_info(self, n_workers: int = -1) -> dict[str, Any]:
        workers = {self.WORKER: {"nthreads": 1}}
        workers.update({f"inprocess://decoder-{s.process.pid}": {"nthreads": 1} for s in self.spares if s.alive})
        return {"workers": workers}

    def _serve(self, spare: SpareDecoder | None) -> None:
        """Take calls from the queue and run them on this thread (``spare`` None) or in the
        forked decoder ``spare``. A call whose decoder dies goes back to the queue, started,
        for the others; this thread is the last one left to take it."""
        while True:
            job = self.queue.get()
            if job is None:
                return
            fut, fn, args, started = job
            if not started and (self.closing or not fut.set_running_or_notify_cancel()):
                fut.cancel()
                continue
            if spare is None:
                self._count("thread")
                try:
                    result = fn(*args)
                except BaseException as e:  # noqa: BLE001 - handed to the driver like a worker's error
                    fut.set_exception(e)
                else:
                    fut.set_result(result)
                continue
            try:
                raised, value = spare.call(fn, args)
            except (EOFError, OSError):
                self._count("died")
                self.queue.put((fut, fn, args, True))
                # The driver's thread joins in, so a batch is never left without a decoder
                # (the last forked one may be gone, or every one may fail the same call);
                # after a head start, once the loop has the client (allow_thread).
                with self.count_lock:
                    if self.thread_allowed:
                        self._start_thread()
                    else:
                        self.thread_wanted = True
                return
            self._count("forked")
            if raised:
                fut.set_exception(value)
            else:
                fut.set_result(value)

    def _count(self, what: str) -> None:
        with self.count_lock:
            self.served[what] += 1

    def report(self, ahead: int = 0, direct: int = 0) -> str:
        """One line for the log: which decoders ran the batches (``ahead``: submitted by a
        head start, before the plan; ``direct``: samples the decoders wrote into the
        output's chunks themselves, conversion/direct_chunks.py)."""
        s = self.served
        died = (f"; {s['died']} forked decoder{'s' if s['died'] > 1 else ''} died, "
                f"{'their batches' if s['died'] > 1 else 'its batch'} decoded again") if s["died"] else ""
        early = f"; the first {ahead} submitted before the plan" if ahead else ""
        wrote = f"; {direct} samples written into the output by the decoders" if direct else ""
        return (f"in-process decoding: {s['thread']} batches on the driver's thread, {s['forked']} in forked "
                f"decoders{died}{early}{wrote}")

    def release(self) -> None:
        """Tell the forked decoders to end now, without waiting (every batch is decoded:
        the driver calls this while the writer still stores the last ones). Reason: a
        decoder's exit takes ~10 ms here (its interpreter's teardown and its mappings),
        which :meth:`close` then waited for after the writer's; told early, it exits
        while the writer works. A call that would still come (none is expected) finds the
        decoder gone and runs on the driver's thread, as for a decoder that died."""
        for s in self.spares:
            s.tell()

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Drop the queued calls and wait (up to ``timeout``) for the running ones, so no
        batch creates shared memory after the driver removed the run's segments; then the
        forked decoders are let go."""
        with self.count_lock:  # no decode thread starts after this (add_own_thread)
            self.closing = True
            threads = list(self.threads)
        for _ in threads:
            self.queue.put(None)
        for t in threads:
            t.join(timeout)
        close_all(self.spares)


def check_packages(job: JobConfig) -> str:
    """The pre-flight of an in-process run: the decoder packages the job needs import here
    (the corpus and ``/dev/shm`` are the driver's own). One line for the log; raises
    :class:`~h5batch.errors.PreflightError` naming a package that does not import."""
    from .preflight import collect_versions, needed_packages

    # Not python nor h5batch: this process runs both, and h5batch's version hashes every
    # source file (~20 ms on the way to the first batch), for a comparison with workers
    # that an in-process run does not have.
    versions, errors = collect_versions(sorted(needed_packages(job) - {"python", "h5batch"}))
    if errors:
        raise PreflightError([f"driver: cannot import {name}: {why}" for name, why in sorted(errors.items())], 1, 1)
    shown = ", ".join(f"{k} {versions[k]}" for k in ("numpy", "soundfile", "libsndfile", "pillow") if k in versions)
    return f"preflight: in-process decoding, decoder packages import ({shown})"


@contextmanager
def connect(cfg: ClusterConfig, forked: list[SpareDecoder] | tuple = (),
            client: InProcessClient | None = None) -> Iterator[Connection]:
    """An :class:`InProcessClient` for the length of the run (``cfg``: the job's cluster
    section; ``forked``: the decoders forked for it, :mod:`.spares`, which then decode alone;
    ``client``: one a head start made already), closed at the end."""
    if client is None:
        client = InProcessClient(forked, own_thread=not forked)
    else:
        client.allow_thread()
        if not forked:
            client.add_own_thread()
    decoders = f"{len(forked)} forked decoder{'s' if len(forked) > 1 else ''}" if forked else "1 decode thread"
    try:
        yield Connection(client, f"in-process, {decoders} (no worker processes)", None)
    finally:
        client.close()


@contextmanager
def console(log: Any) -> Iterator[Any]:
    """Where the driver's progress goes while batches decode in this process: ``log`` when
    the caller gave one, else a duplicate of fd 2 taken now (decoding points fd 2 at the
    decoder-warning capture), closed at the end."""
    if log is not None:
        yield log
        return
    import sys

    sys.stderr.flush()
    stream = os.fdopen(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                       errors="backslashreplace")
    try:
        yield stream
    finally:
        stream.close()


def resolved(job: JobConfig, kind: str) -> JobConfig:
    """``job`` with the kind chosen for ``auto``; ``compress_on: auto`` of an in-process run
    means the writer, as on a LocalCluster (one host: the writer's cores are the spare ones)."""
    cfg = job.cluster
    if kind == cfg.kind and kind != "inprocess":
        return job
    compress_on = "writer" if kind == "inprocess" and cfg.compress_on == "auto" else cfg.compress_on
    return dataclasses.replace(job, cluster=dataclasses.replace(cfg, kind=kind, compress_on=compress_on))
