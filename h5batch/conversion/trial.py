"""The trial behind ``auto`` settings: samples of the corpus decoded in the driver.

:class:`Trial` decodes :data:`TRIAL_ITEMS` items spread evenly over the manifest
(:func:`trial_picks`; at most :data:`TRIAL_BYTES` per field), as the batches decode them
(:func:`~h5batch.fields.decode_field`), a few at a time on threads that give up on a file past
``policy.decode_timeout``. What the samples decide (the codec, the batch size) is
:mod:`.auto`'s.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .. import faults
from ..config import JobConfig
from ..fields import decode_field, file_fields, value_array, value_fields
from ..fields.audio import native_rate, rate_unknown
from ..manifest import Manifest
from . import decoder_warnings

TRIAL_ITEMS = 32  # items decoded at most, spread over the manifest
TRIAL_BYTES = 4 << 20  # decoded bytes per field at most
TRIAL_WAVE = 4  # trial files decoded at once (at most the driver's cores)


def trial_picks(n: int) -> list[int]:
    """The manifest indices of the trial's items, in order: :data:`TRIAL_ITEMS` spread evenly
    over ``n`` items (all of them when there are fewer)."""
    return sorted({i * n // TRIAL_ITEMS for i in range(TRIAL_ITEMS)}) if n else []


@dataclass
class Trial:
    """Decoded trial samples per field (only fields that needed decoding), and the native
    sample rates of the trial files of audio fields that set none (:func:`rate_unknown`)."""

    arrays: dict[str, list[np.ndarray]]
    rates: dict[str, list[int]] = field(default_factory=dict)

    @staticmethod
    def items(manifest: Manifest) -> list:
        """The manifest items the trial decodes (:func:`trial_picks`)."""
        return [manifest.items[i] for i in trial_picks(len(manifest.items))]

    @classmethod
    def run(cls, job: JobConfig, root: str, items: list, fields: list[str]) -> Trial:
        """Decode ``fields`` of the trial ``items`` (:meth:`items`; ``root``: the corpus's,
        absolute). A file that fails, or takes longer than ``policy.decode_timeout`` (its
        thread is abandoned), is left out: the job itself rejects it later with its reason.
        Runs on a worker of the run (:func:`~.auto.resolve`), where a file that kills its
        decoder takes no driver down."""
        timeout = job.policy.decode_timeout
        out: dict[str, list[np.ndarray]] = {}
        rates: dict[str, list[int]] = {}
        # Decoded in parallel waves because the workers wait for the trial. The arrays kept
        # are exactly a serial loop's; items a wave decodes past TRIAL_BYTES are dropped.
        wave = max(1, min(TRIAL_WAVE, os.cpu_count() or 1))
        files, vals = file_fields(job.fields), value_fields(job.fields)
        for name in fields:
            fc = job.fields[name]
            if name in vals:  # annotation values: nothing to decode (discovery checked them)
                j = vals.index(name)
                out[name] = [value_array(item.values[j], fc) for item in items]
                continue
            k = files.index(name)
            if rate_unknown(fc):  # every trial file's header: a rate seldom met must show
                paths = [os.path.join(root, item.paths[k]) for item in items]
                rates[name] = [r for r in _decode_all(paths, native_rate, timeout) if r]
            decode = partial(decode_field, fc=fc)
            arrays: list[np.ndarray] = []
            nbytes = 0
            for start in range(0, len(items), wave):
                if nbytes >= TRIAL_BYTES:
                    break
                todo = [os.path.join(root, item.paths[k]) for item in items[start:start + wave]]
                for a in _decode_all(todo, decode, timeout):
                    if a is None or nbytes >= TRIAL_BYTES:
                        continue
                    arrays.append(a)
                    nbytes += a.nbytes
            out[name] = arrays
        return cls(out, rates)


def _decode_all(paths: list[str], decode: Callable[[str], Any], timeout: float) -> list[Any]:
    """``decode`` of each of ``paths``, in parallel, one daemon thread each; None for a file
    that failed or ran out of time (each has ``timeout`` seconds from the start of the call).
    Rule: a stalled network mount or a decoder stuck in a loop must not hang the job here,
    before the workers' own watchdog is in play. Daemon threads, not an executor: one stuck
    is abandoned and must not keep the process from exiting."""
    boxes: list[list[Any]] = [[] for _ in paths]

    def work(path: str, box: list[Any]) -> None:
        try:
            faults.before_decode(path)
            box.append(decode(path))
        except Exception:  # noqa: BLE001 - a failed file is left out of the trial
            box.append(None)

    threads = [threading.Thread(target=work, args=(p, b), name="h5batch-trial", daemon=True)
               for p, b in zip(paths, boxes)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [b[0] if b else None for b in boxes]


TrialRunner = Callable[[JobConfig, str, list, list[str]], Trial]


def run_here(job: JobConfig, root: str, items: list, fields: list[str]) -> Trial:
    """:meth:`Trial.run` in this process, its decoders' warnings dropped (the batches decode
    these files again and log them). One watch for the whole trial, whose threads decode in
    parallel: ``catch_warnings`` nested in parallel threads would restore each other's
    filters in the wrong order."""
    with decoder_warnings.batch():
        try:
            with decoder_warnings.watch("<trial>"):
                return Trial.run(job, root, items, fields)
        finally:
            decoder_warnings.take(["<trial>"])


def on_engine(conn, say: Callable[[str], None]) -> TrialRunner:
    """A runner of the trial as one task of the run's engine (``conn``: a
    :class:`~.cluster.Connection`), so a trial file that kills its decoder takes a worker
    down, not the driver. A trial whose worker died, or that failed, decides on no samples
    (a warning says so); the batches then reject that file with its reason."""
    def run(job: JobConfig, root: str, items: list, fields: list[str]) -> Trial:
        try:
            return conn.client.submit(run_here, job, root, items, fields, pure=False).result()
        except Exception as e:  # noqa: BLE001 - the trial only informs the choice
            say(f"warning: the codec trial failed on a worker ({type(e).__name__}: {e}); "
                f"choosing without its samples")
            return Trial({})

    return run
