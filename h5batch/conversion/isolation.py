"""Crash isolation: the parts of a batch, and what a part whose decode failed becomes.

A batch whose worker dies (a decoder library that kills its process, a file that hangs it)
is split in two and both halves are decoded again, recursively, until the file that takes
its worker down stands alone; a lone file is tried once more on its own (its worker may
have died of another task) and then becomes a reject (stage ``worker``) while the rest of
the batch is stored. :class:`Slot` holds one manifest batch's parts; :func:`after_failure`
says what to decode next; the driver (:mod:`.driver`) submits it.

Rule: only a part that did not run to the end can be blamed. A task that finished on a
worker which then died (of the next task in its queue) before its result was fetched
reads ``lost`` or fails ``result()`` by the time the driver looks: none of its files took
the worker down, so it is decoded again whole. Reason: near the end of crash isolation
a good file's part and the culprit's often run one after the other on the same worker;
counting the good one's lost result as its failure, twice, rejected it in the culprit's
place (1 run in 3 of tests/test_worker_failures.py's crash test).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..batches import BatchResult, BatchTask
from ..manifest import Reject
from ..transport.packing import Packed

# Times a part may finish and lose its result with its worker before it counts as failed:
# each time, crash isolation gets closer to the file that kills workers, which then no
# longer runs.
MAX_LOST = 4


@dataclass
class Part:
    """Items ``[lo, hi)`` of a batch and, once decoded, their result."""

    lo: int
    hi: int
    result: BatchResult | None = None
    confirming: bool = False  # a single file that failed once is being tried again
    lost: int = 0  # times it ran to the end and its result was lost with its worker after


class Slot:
    """One manifest batch: its parts (a batch whose worker keeps dying is split in two,
    recursively, down to the crashing file) and their results."""

    def __init__(self, task: BatchTask):
        self.task = task
        self.parts: list[Part] = [Part(0, len(task.items))]
        self.acked = 0  # parts the writer has stored
        self.written = 0  # samples they held

    def complete(self) -> bool:
        return all(p.result is not None for p in self.parts)


def after_failure(slot: Slot, pos: int, fired_as: str, exc: BaseException) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` ranges of ``slot`` to decode again now that its part ``pos`` failed
    with ``exc`` (its future's done callback fired with status ``fired_as``); ``[]`` when
    the part is settled: its file is rejected and its result set (see the module)."""
    part = slot.parts[pos]
    lo, hi = part.lo, part.hi
    if fired_as == "finished" and part.lost < MAX_LOST:
        part.lost += 1
        return [(lo, hi)]
    if hi - lo > 1:
        mid = (lo + hi) // 2
        slot.parts[pos:pos + 1] = [Part(lo, mid), Part(mid, hi)]
        return [(lo, mid), (mid, hi)]
    if not part.confirming:
        part.confirming = True
        return [(lo, hi)]
    reason = f"worker failed while decoding this file: {type(exc).__name__}: {exc}"
    sub = slot.task.sub(lo, hi)
    part.result = empty_result(sub, [Reject(p, "worker", reason) for p in slot.task.items[lo][0]], len(sub.fields))
    return []


def empty_result(task: BatchTask, rejects: list[Reject], nfields: int) -> BatchResult:
    """A batch result of no samples, only ``rejects``."""
    return BatchResult(task.index, task.split, task.start, Packed((), 0), np.zeros(0, np.int64), [],
                       np.zeros((0, nfields), np.uint32), rejects)
