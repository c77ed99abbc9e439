"""A head start: the first batches of an in-process run decode while the plan is made.

Between discovery and the first batch the driver runs the codec trial (32 files decoded,
their compression measured by the writer), writes the inventory sidecar and fills the
writer's spec: 45-65 ms of a 4,096-pair conversion in which the forked decoders had nothing
to do. :meth:`HeadStart.begin` hands them the first batches at once; the driver's loop
(:meth:`~.driver.Driver.run`) takes the client and its futures over and forwards the results
to the writer once it has its ``Start``. Until then they wait in shared memory.

Rule: only where nothing the plan decides changes a task, so the batches are those the
plan would have cut:

* ``cluster.kind`` resolved to ``inprocess`` with forked decoders (:mod:`.spares`);
* a fresh run: a resumed one cuts its batches as the interrupted run did (the commit record
  says how), and does not run in process anyway;
* the items per batch known without the trial (:func:`.auto.batch_size_without_trial`:
  every field of a fixed shape, or a numeric ``cluster.batch_size``);
* compression on the writer (``compress_on: workers`` would give each task the rows its
  chunks start at, which depend on the codecs the trial picks);
* not where the decoders may write the output's chunks themselves
  (:func:`.direct_chunks.likely`): a batch decoded before the writer placed the chunks
  travels through shared memory, and that costs more than the head start saves (4,096
  pairs, 10 alternating CLI runs: 0.414 s without it against 0.433 s with it; 0.451 against
  0.508 s in 8 more). A job whose ``codec: auto`` then compresses goes without it too.

Only the forked decoders take the head start's batches, not the driver's own decode thread:
that one shares fd 2 and Python's warning filters with the trial's :func:`silenced`
(:mod:`.decoder_warnings`), and the GIL with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import JobConfig
from ..manifest import Manifest
from ..transport.segments import hostname, remove_segments
from ..writer.commit import CommitRecord
from .auto import batch_size_without_trial
from .direct_chunks import likely
from .inprocess import InProcessClient, KindChoice
from .plan import TaskList
from .spares import SpareDecoder
from .worker import decode_batch

AHEAD_PER_DECODER = 2  # batches queued per forked decoder (the plan takes ~1-2 batches' time)


@dataclass
class HeadStart:
    """The batches submitted before the plan (see the module): the driver takes them over."""

    tasks: TaskList
    client: InProcessClient
    run_id: str
    futures: dict[int, Any] = field(default_factory=dict)  # batch index -> future
    taken: bool = False  # the driver's loop owns the client now

    @classmethod
    def begin(cls, job: JobConfig, manifest: Manifest, choice: KindChoice, record: CommitRecord | None,
              spares: list[SpareDecoder], run_id: str) -> HeadStart | None:
        """Submit the first batches to ``spares`` where the module's rule allows; else None."""
        if choice.kind != "inprocess" or record is not None or not spares:
            return None
        if job.cluster.compress_on not in ("auto", "writer") or likely(job):
            return None
        bs = batch_size_without_trial(job, manifest, choice.kind)
        if bs is None:
            return None
        tasks = TaskList(job, manifest, run_id, hostname(), bs)
        head = cls(tasks, InProcessClient(spares, own_thread=False, thread_allowed=False), run_id)
        for i in range(min(len(tasks), AHEAD_PER_DECODER * len(spares))):
            head.futures[i] = head.client.submit(decode_batch, tasks[i])
        return head

    def take(self) -> InProcessClient:
        """The client, for the driver's loop (which closes it at the end of the run)."""
        self.taken = True
        return self.client

    def close(self) -> None:
        """Where the run ended before its loop took over: stop the decoders' feeds (a batch
        being decoded is waited for) and remove the segments its batches made."""
        if not self.taken:
            self.taken = True
            self.client.close()
            remove_segments(self.run_id)
