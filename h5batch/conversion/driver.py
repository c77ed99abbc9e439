"""The driver loop: the engine decodes, the writer stores, in manifest order, with backpressure.

The driver never touches pixel or sample data. It submits batches to the engine (the local
decoder processes or Dask, :mod:`.cluster`) with a bounded
number in flight (a batch counts until the writer has stored it, so memory stays flat
whatever the corpus size), forwards finished batches to the writer process strictly in
manifest order, isolates files that crash their worker by splitting their batch in two,
recursively (:func:`after_failure`), and reports progress. Everything it waits for arrives on one
event queue: finished futures (from their callbacks) and writer messages (from a
pipe-reading thread), each dispatched through a handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import format as fmt
from ..batches import BatchResult, BatchTask
from ..config import JobConfig
from ..errors import ConvertError
from ..manifest import Reject
from ..transport.packing import Packed, to_shm
from ..writer.messages import (
    LAST,
    Abort,
    Aborted,
    Done,
    Failed,
    Finish,
    Store,
    Stored,
    WriterDied,
)
from ..writer.process import WriterGone, WriterHandle
from . import signals
from .cluster import Connection
from .cluster_watch import ClusterWatch
from .decoder_warnings import WarningLog
from .options import ConvertOptions, ConvertSummary, Progress
from .plan import Plan
from .worker import decode_batch
from .writer_hosts import Placement

WINDOW_BYTES = 1 << 30  # decoded bytes waiting in shared memory, at most (about)
ABORT_SECONDS = 60  # how long the writer may take to commit after an abort


# Seconds to fetch a finished batch's result from its worker before the part counts as
# failed (a result is descriptors and metadata: it takes milliseconds when the worker lives).
RESULT_TIMEOUT = 60.0


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
    the part is settled: its file is rejected and its result set.

    A part whose worker died is split in two and both halves are decoded again, recursively,
    until the file that takes its worker down stands alone; a lone file is tried once more
    on its own (its worker may have died of another task) and then becomes a reject (stage
    ``worker``) while the rest of the batch is stored.

    Rule: only a part that did not run to the end can be blamed. A task that finished on a
    worker which then died (of the next task in its queue) before its result was fetched
    reads ``lost`` or fails ``result()`` by the time the driver looks: none of its files took
    the worker down, so it is decoded again whole. Reason: near the end of crash isolation
    a good file's part and the culprit's often run one after the other on the same worker;
    counting the good one's lost result as its failure rejected it in the culprit's place."""
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
    sub = slot.task.sub(lo, hi)  # a result of no samples, only the file's rejects
    part.result = BatchResult(sub.index, sub.split, sub.start, Packed((), 0), np.zeros(0, np.int64), [],
                              np.zeros((0, len(sub.fields)), np.uint32),
                              [Reject(p, "worker", reason) for p in slot.task.items[lo][0]])
    return []


@dataclass
class Lane:
    """One writer and its batches ``[start, hi)`` (a sharded output has one per shard
    still to write, h5batch/shards.py): submitted, forwarded in order, and stored."""

    writer: WriterHandle
    start: int
    hi: int
    name: str = "writer"  # in messages: the writer, or the shard it writes
    lo: int = 0  # its first batch (batches before start were committed by an earlier run)
    spec: Any = None  # the WriterSpec it was started with
    where: Placement | None = None  # a writer on its workers' host (h5batch/conversion/writer_hosts.py)

    def __post_init__(self) -> None:
        self.next_submit = self.next_forward = self.acked = self.start


class Driver:
    """Runs a :class:`~.plan.Plan` on an engine's :class:`~.cluster.Connection`, feeding the
    writer (or each shard's writer: ``lanes``). Use :meth:`run`."""

    def __init__(self, job: JobConfig, opts: ConvertOptions, plan: Plan, writer: WriterHandle | None, run_id: str,
                 say, conn: Connection, lanes: list[Lane] | None = None):
        self.job, self.opts, self.plan, self.run_id, self.say = job, opts, plan, run_id, say
        self.sharded = lanes is not None  # the summary's path and counts then come from the join
        self.lanes = lanes or [Lane(writer, plan.start, len(plan.tasks))]
        self.conn, self.client = conn, conn.client
        self.events: queue.Queue = queue.Queue()
        self.slots: dict[int, Slot] = {}
        self.futures: dict[Any, tuple[int, int]] = {}  # future -> (batch index, part position)
        self.watch: ClusterWatch | None = None  # started at the first wait on a LocalCluster
        self.submissions = 0
        self.rejects = 0
        self.bytes_decoded = 0
        self.progress: Progress | None = None
        if job.cluster.compress_on == "workers":
            say("cluster.compress_on: workers is ignored: chunks are compressed in the writer")
        # Decoder warnings of the stored batches, in a log beside the output (not the console).
        self.warning_log = WarningLog(fmt.warnings_file(plan.spec.final_path), resume=plan.start > 0)

    # -- the loop --------------------------------------------------------------------------

    def _next_event(self) -> tuple[str, Any]:
        """The next future or writer event. On a LocalCluster the run started, a thread looks
        at its workers meanwhile (:mod:`.cluster_watch`) and may stop the run through here."""
        cluster = self.conn.cluster if self.job.cluster.kind == "local" else None
        if cluster is not None and self.watch is None:
            spec = self.plan.spec
            then = ("the sync is undone; run the same command again" if spec.sync is not None else
                    f"progress is committed in {spec.partial_path}; run the same command again to resume")
            self.watch = ClusterWatch(self.client, cluster, self.job.policy, self.say, self.events, then,
                                      spec.final_path).start()
        kind, payload = self.events.get()
        if kind == "watch":
            raise payload
        return kind, payload

    def run(self) -> ConvertSummary:
        """Decode and store every batch from ``plan.start`` on, then finish the file.
        Returns once the writer has said it is done (the file is renamed and closed),
        without waiting for the writer's exit: the callers decide (a conversion does not
        wait at all, :mod:`.pipeline`)."""
        job, tasks, conn = self.job, self.plan.tasks, self.conn
        with ExitStack() as stack:
            stack.callback(lambda: self.watch and self.watch.stop())  # before the cluster closes
            n_workers = max(1, len(self.client.scheduler_info(n_workers=-1)["workers"]))
            # Batches in flight: enough to keep every worker busy (two each: one decoding,
            # one waiting for the writer), and not more decoded samples waiting in shared
            # memory than WINDOW_BYTES.
            window = job.cluster.max_in_flight or max(4, min(2 * n_workers, WINDOW_BYTES // max(1, self.plan.batch_bytes)))
            if len(self.lanes) > 1:  # several writers share it, each fed in turn: all of them work
                window = max(2, -(-window // len(self.lanes)))
            starts = tasks.starts
            done_items = len(tasks.manifest.items) - sum(int(starts[ln.hi] - starts[ln.start]) for ln in self.lanes)
            self.progress = Progress(len(tasks.manifest.items), done_items, mode=self.opts.progress, log=self.opts.log)
            for lane in self.lanes:
                threading.Thread(target=self._pump_writer, args=(lane,), daemon=True).start()
            while any(ln.acked < ln.hi for ln in self.lanes):
                signals.raise_pending()
                for lane in self.lanes:
                    while lane.next_submit < lane.hi and lane.next_submit - lane.acked < window:
                        i = lane.next_submit
                        self.slots[i] = Slot(tasks[i])
                        self._submit(i, 0, len(tasks[i].items))
                        lane.next_submit += 1
                kind, payload = self._next_event()
                if kind == "future":
                    self._on_future(payload)
                    for lane in self.lanes:
                        while (lane.next_forward < lane.hi and lane.next_forward in self.slots
                               and self.slots[lane.next_forward].complete()):
                            slot = self.slots[lane.next_forward]
                            for k, part in enumerate(slot.parts):
                                part.result.final_part = k == len(slot.parts) - 1
                                self._send(lane, Store(part.result))
                            lane.next_forward += 1
                else:
                    self._on_writer(payload)
            signals.raise_pending()
            self.progress.close()
            # The writer counts every reject (discovery, decode, write, and those of batches
            # committed by an earlier run) and keeps the file partial when there are too many.
            # Shards are judged together once joined (h5batch/shards.py): each is finished.
            for lane in self.lanes:
                self._send(lane, Finish(1.0 if self.sharded else job.policy.max_reject_fraction))
            dones = [self._wait_for(Done) for _ in self.lanes]
            s = dones[0]
            if self.warning_log.files:
                self.say(f"{self.warning_log.files} files gave decoder warnings, see {self.warning_log.path}")
            excluded = sum(1 for r in self.plan.spec.discovery_rejects if r.stage == fmt.STAGE_EXCLUDED)
            if self.sharded:  # the shards' files; the pipeline joins them and tells the output's
                return ConvertSummary(
                    path=self.plan.spec.final_path, counts={}, rejects=0, excluded=excluded, inputs=self.plan.num_inputs,
                    seconds=0.0, bytes_decoded=sum(d.bytes_decoded for d in dones), output_bytes=0, rejects_file="",
                    cluster=conn.description, dashboard=conn.dashboard, ok=True, warnings=self.warning_log.files,
                    warnings_file=self.warning_log.path if self.warning_log.files else "")
            summary = ConvertSummary(
                path=s.path, counts=s.counts, rejects=s.rejects, excluded=excluded, inputs=self.plan.num_inputs, seconds=0.0,
                bytes_decoded=s.bytes_decoded, output_bytes=os.path.getsize(s.path), rejects_file=s.rejects_file,
                cluster=conn.description, dashboard=conn.dashboard, ok=s.ok,
                warnings=self.warning_log.files, warnings_file=self.warning_log.path if self.warning_log.files else "")
            if not s.ok:
                self.lanes[0].writer.process.join(timeout=30)
                # against every input of the corpus, as the writer judged it (a sync decodes fewer)
                n, bad = self.plan.spec.num_inputs - excluded, s.rejects - excluded
                # A sync undoes itself (writer/sync.py); a conversion keeps its partial.
                kept = (f"the sync is undone, {self.plan.spec.final_path} is as it was" if self.plan.spec.sync
                        else f"output left as {self.plan.spec.partial_path}")
                raise too_many_rejects(bad, n, job.policy.max_reject_fraction, kept, s.rejects_file)
            return summary

    def _submit(self, index: int, lo: int, hi: int) -> None:
        whole = self.slots[index].task
        task = whole if (lo, hi) == (0, len(whole.items)) else whole.sub(lo, hi)
        # A writer on its workers' host: the batch goes to a worker there, into segments
        # of the writer's run id (h5batch/writer/remote.py).
        where = self._lane(index).where
        only = {}
        if where is not None:
            task = dataclasses.replace(task, run_id=where.run_id, writer_host=where.hostname)
            only = {"workers": [where.host], "allow_other_workers": False}
        # A new key per submission: a part submitted again (to confirm a failure) must run
        # again, not return the first attempt's error from the scheduler's memory.
        self.submissions += 1
        fut = self.client.submit(decode_batch, task, pure=False, retries=0,
                                 key=f"h5batch-decode-{self.run_id}-{index}-{lo}-{hi}-{self.submissions}", **only)
        self.futures[fut] = (index, lo)
        # The status when it fired goes with it: a task that finished and whose worker died
        # before its result was fetched reads "lost" or fails result() by the time the loop
        # gets to it, and must not count as one that took its worker down (_on_future).
        fut.add_done_callback(lambda f: self.events.put(("future", (f, f.status))))

    # -- writer messages -----------------------------------------------------------------

    def _pump_writer(self, lane: Lane) -> None:
        """Forward a writer's messages to the event queue; report a writer that died."""
        outbox, process = lane.writer.outbox, lane.writer.process
        while True:
            try:
                msg = outbox.get(timeout=1.0)
            except queue.Empty:
                if not process.is_alive():
                    self.events.put(("writer", WriterDied(process.exitcode, lane.name)))
                    return
                continue
            except (EOFError, OSError):
                return
            self.events.put(("writer", msg))
            if isinstance(msg, LAST):
                return

    def _on_writer(self, msg: Any) -> None:
        handler = _WRITER_HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, msg)

    def _on_stored(self, msg: Stored) -> None:
        slot = self.slots[msg.index]
        slot.acked += 1
        slot.written += msg.samples
        if slot.acked == len(slot.parts):
            self.rejects += sum(len(p.result.rejects) for p in slot.parts)
            self.bytes_decoded += sum(p.result.packed.nbytes for p in slot.parts)
            self.warning_log.add(w for p in slot.parts for w in p.result.warnings)
            self.progress.update(len(slot.task.items), rejects=self.rejects, nbytes=self.bytes_decoded)
            del self.slots[msg.index]
            self._lane(msg.index).acked += 1

    def _on_failed(self, msg: Failed) -> None:
        raise ConvertError(f"writer failed: {msg.text}")

    def _lane(self, index: int) -> Lane:
        return next(ln for ln in self.lanes if ln.start <= index < ln.hi)

    def _send(self, lane: Lane, msg: Any) -> None:
        try:
            lane.writer.send(msg)
        except WriterGone as e:
            self._on_died(WriterDied(e.exit_code, lane.name))

    def _on_died(self, msg: WriterDied) -> None:
        raise ConvertError(f"{msg.name} process died (exit code {msg.exit_code}); "
                           f"rerun the same command to resume from the last commit")

    def _wait_for(self, kind: type) -> Any:
        while True:
            source, msg = self.events.get()
            if source != "writer":
                continue
            if isinstance(msg, kind):
                return msg
            if isinstance(msg, (Failed, WriterDied)):
                self._on_writer(msg)

    # -- decoded batches -----------------------------------------------------------------

    def _on_future(self, event: tuple[Any, str]) -> None:
        fut, fired_as = event
        index, lo = self.futures.pop(fut)
        slot = self.slots[index]
        pos = next(i for i, p in enumerate(slot.parts) if p.lo == lo and p.result is None)
        part = slot.parts[pos]
        exc: BaseException | None = None
        if fut.status == "finished":
            try:
                # A worker can die between finishing and handing the result over; Dask then
                # recomputes or raises KilledWorker and result() could wait forever. Past the
                # timeout it is a failed part like any other.
                res: BatchResult = fut.result(timeout=RESULT_TIMEOUT)
            except Exception as e:  # noqa: BLE001  (TimeoutError, KilledWorker, CommClosedError...)
                exc = e
            else:
                if res.packed.shm_name is None and res.packed.payload is not None and self._lane(index).where is None:
                    res.packed = to_shm(res.packed, self.run_id)  # network transport (a remote writer: inline)
                if res.stuck and res.worker_address:
                    self._restart_worker(res.worker_address)
                part.result = res
                return
        elif fut.status == "cancelled":
            return
        if exc is None and fut.status == "error":
            try:
                exc = fut.exception(timeout=RESULT_TIMEOUT)
            except Exception as e:  # noqa: BLE001  (TimeoutError, CommClosedError...)
                exc = e
        if exc is None:
            # Done when its callback fired, pending or lost by now: its worker died and Dask
            # recomputes it, which can take a minute; the part is failed and resubmitted
            # below instead.
            exc = RuntimeError(f"the task's worker died (status {fut.status!r})")
            fut.cancel()
        for lo_, hi_ in after_failure(slot, pos, fired_as, exc):
            self._submit(index, lo_, hi_)

    def _restart_worker(self, address: str) -> None:
        """Reclaim a worker whose decode thread is stuck on a hung file (in the background;
        workers without a nanny cannot be restarted and just keep the lost thread)."""
        self.say(f"restarting worker {address}: a decode there exceeded policy.decode_timeout")
        client = self.client

        def restart() -> None:
            try:
                client.restart_workers([address], timeout=120, raise_for_error=False)
            except Exception as e:  # noqa: BLE001 - best effort; the job goes on either way
                self.say(f"could not restart worker {address}: {e}")

        threading.Thread(target=restart, daemon=True).start()


_WRITER_HANDLERS = {
    Stored: Driver._on_stored,
    Failed: Driver._on_failed,
    WriterDied: Driver._on_died,
}


def too_many_rejects(bad: int, n: int, frac: float, kept: str, rejects_file: str) -> ConvertError:
    """The error of a run whose ``bad`` rejects of ``n`` inputs are above ``frac``; ``kept``:
    what became of the output."""
    return ConvertError(f"{bad} of {n} input files rejected ({bad / max(1, n):.1%}), above "
                        f"policy.max_reject_fraction {frac:.1%}; {kept}, reasons in {rejects_file} "
                        f"(raise policy.max_reject_fraction and run again to accept it)", 1)


def abort(writer: WriterHandle) -> None:
    """Have the writer commit what it stored and stop; the cluster's teardown happens in
    :func:`~.cluster.connect`."""
    process = writer.process
    if not process.is_alive():
        return
    try:
        writer.send(Abort())
    except WriterGone:
        return
    deadline = time.monotonic() + ABORT_SECONDS
    while time.monotonic() < deadline and process.is_alive():
        with contextlib.suppress(queue.Empty):
            msg = writer.outbox.get(timeout=0.5)
            if isinstance(msg, (Aborted, Failed)):
                break
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
