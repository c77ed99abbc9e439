"""The trial behind ``auto`` settings: samples of the corpus decoded in the driver.

:class:`Trial` decodes :data:`TRIAL_ITEMS` items spread evenly over the manifest
(:func:`trial_picks`; at most :data:`TRIAL_BYTES` per field), as the batches decode them
(:func:`~.direct.sample_decoders`), a few at a time on threads that give up on a file past
``policy.decode_timeout``. Where ``cluster.kind: auto``'s probe decoded some of them already
(:func:`~.inprocess.probe_seconds`), it takes those. What the samples decide (the codec, the
batch size) is :mod:`.auto`'s.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import faults
from ..config import JobConfig
from ..errors import DecodeError
from ..fields import file_fields, value_array, value_fields
from ..manifest import Manifest
from .direct import sample_decoders

TRIAL_ITEMS = 32  # items decoded at most, spread over the manifest
TRIAL_BYTES = 4 << 20  # decoded bytes per field at most
TRIAL_WAVE = 4  # trial files decoded at once (at most the driver's cores)


def trial_picks(n: int) -> list[int]:
    """The manifest indices of the trial's items, in order: :data:`TRIAL_ITEMS` spread evenly
    over ``n`` items (all of them when there are fewer)."""
    return sorted({i * n // TRIAL_ITEMS for i in range(TRIAL_ITEMS)}) if n else []


Decoded = dict[int, dict[str, np.ndarray]]  # manifest index -> field -> its decoded sample


@dataclass
class Trial:
    """Decoded trial samples per field (only fields that needed decoding)."""

    arrays: dict[str, list[np.ndarray]]

    @classmethod
    def run(cls, job: JobConfig, manifest: Manifest, fields: list[str], known: Decoded | None = None) -> Trial:
        """Decode the trial items of ``fields``. A file that fails, or takes longer than
        ``policy.decode_timeout`` (its thread is abandoned), is left out: the job itself
        rejects it later with its reason. ``known``: samples of trial items decoded already
        (``cluster.kind: auto``'s probe, :func:`h5batch.conversion.inprocess.probe_seconds`),
        taken as they are. Reason: the trial runs on the serial path to the writer's start
        while the forked decoders already decode the first batches on both cores, and its
        threads waited for the CPU: 20-34 ms for the 4,096-pair bench job's 64 files, which
        the probe had just decoded."""
        root = os.path.abspath(manifest.root)
        guard = _Deadline(job.policy.decode_timeout)
        out: dict[str, list[np.ndarray]] = {}
        picks = trial_picks(len(manifest.items))
        known = known or {}
        # Decoded a few at a time, in parallel: the workers wait for this trial, and a photo
        # takes long enough that a serial trial would show in a small conversion's time.
        # The arrays kept are exactly those a serial loop would keep; a wave may decode a
        # few items past TRIAL_BYTES, which are dropped.
        wave = max(1, min(TRIAL_WAVE, os.cpu_count() or 1))
        files, vals = file_fields(job.fields), value_fields(job.fields)
        try:
            for name in fields:
                fc = job.fields[name]
                if name in vals:  # annotation values: nothing to decode (discovery checked them)
                    j = vals.index(name)
                    out[name] = [value_array(manifest.items[i].values[j], fc) for i in picks]
                    continue
                k = files.index(name)
                decode = sample_decoders(((name, fc),))[0]  # as the batches decode (direct.py)
                arrays: list[np.ndarray] = []
                nbytes = 0
                start = 0
                while start < len(picks) and nbytes < TRIAL_BYTES:
                    # The next wave: the known samples in front of it, then up to `wave` to decode.
                    got: list[np.ndarray | None] = []
                    while start < len(picks) and name in known.get(picks[start], {}):
                        got.append(known[picks[start]][name])
                        start += 1
                    todo = []
                    while start < len(picks) and len(todo) < wave and name not in known.get(picks[start], {}):
                        todo.append(os.path.join(root, manifest.items[picks[start]].paths[k]))
                        start += 1
                    got += guard.decode_all(todo, decode) if todo else []
                    for a in got:
                        if a is None or nbytes >= TRIAL_BYTES:
                            continue
                        arrays.append(a)
                        nbytes += a.nbytes
                out[name] = arrays
        finally:
            _THREADS.stop()  # see _TrialThreads
        return cls(out)


class _TrialThreads:
    """Daemon threads that decode trial files, kept for one trial (:meth:`stop`).

    Daemon threads, not an executor: one stuck on a stalled mount or a decoder in a loop is
    abandoned (and replaced) and must not keep the process from exiting. Kept for the whole
    trial, not started per file: a thread start waits for the new thread to get the GIL, up
    to the GIL's switch interval while Dask's event loop is busy, and the trial decodes up to
    64 files. Stopped after it: a process with a thread besides its main one may not fork
    (:func:`h5batch.forking.can_fork`), and kept for the process's life they cost every
    later conversion or sync in it (a notebook's) the forked writer, decoders and stat pass:
    a no-change sync of a 100,000-file output after a conversion in the same process took
    0.59-0.87 s with its walk on a thread, 0.21-0.27 s forked.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def run(self, jobs: list[Callable[[], None]], timeout: float) -> None:
        """Run ``jobs`` on up to :data:`TRIAL_WAVE` threads; return once all are done or
        ``timeout`` seconds have passed (the late ones are abandoned)."""
        with self.lock:
            if self.pid != os.getpid():  # threads do not survive a fork
                self.pid, self.queue, self.alive, self.threads = os.getpid(), queue.SimpleQueue(), 0, []
            while self.alive < min(len(jobs), TRIAL_WAVE):
                t = threading.Thread(target=self._serve, args=(self.queue,), name="h5batch-trial", daemon=True)
                t.start()
                self.threads.append(t)
                self.alive += 1
            q = self.queue
        events = []
        for job in jobs:
            ev = threading.Event()
            q.put((job, ev))
            events.append(ev)
        deadline = time.monotonic() + timeout
        late = sum(not ev.wait(max(0.0, deadline - time.monotonic())) for ev in events)
        if late:
            with self.lock:  # their threads may be stuck for good: start others next time
                self.alive = max(0, self.alive - late)

    def stop(self, timeout: float = 1.0) -> None:
        """End the idle threads (one stuck in a file is left to finish it, then ends too);
        the next :meth:`run` starts new ones."""
        with self.lock:
            if self.pid != os.getpid() or not self.threads:
                return
            q, threads = self.queue, self.threads
            for _ in threads:
                q.put(None)
            self.pid, self.threads, self.alive = None, [], 0  # a new queue next time
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _serve(q: queue.SimpleQueue) -> None:
        while True:
            got = q.get()
            if got is None:  # stop()
                return
            job, ev = got
            try:
                job()
            except BaseException:  # noqa: S110  (a failed file is simply left out of the trial)
                pass
            finally:
                ev.set()
                # Drop the last job now: it holds its decoded array, which for a long
                # recording is the size of the largest sample, for the rest of the run.
                job = ev = None


_THREADS = _TrialThreads()


class _Deadline:
    """Decodes trial files on :class:`_TrialThreads` and gives up on a file after
    ``timeout`` seconds: a stalled network mount or a decoder stuck in a loop must not hang
    the job here, before the workers' own watchdog is in play."""

    def __init__(self, timeout: float):
        self.timeout = timeout

    def decode_all(self, paths: list[str], decode: Callable[[str], np.ndarray]) -> list[np.ndarray | None]:
        """Decode ``paths`` in parallel with ``decode`` (:func:`~.direct.sample_decoders`);
        None for a file that failed or ran out of time (each has ``timeout`` seconds from
        the start of the call)."""
        boxes: list[list[Any]] = [[] for _ in paths]

        def work(path: str, box: list[Any]) -> None:
            try:
                faults.before_decode(path)
                box.append(decode(path))
            except DecodeError:
                box.append(None)

        _THREADS.run([lambda p=p, b=b: work(p, b) for p, b in zip(paths, boxes)], self.timeout)
        return [b[0] if b else None for b in boxes]
