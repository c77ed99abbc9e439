"""The driver loop: Dask decodes, the writer stores, in manifest order, with backpressure.

The driver never touches pixel or sample data. It submits batches to Dask with a bounded
number in flight (a batch counts until the writer has stored it, so memory stays flat
whatever the corpus size), forwards finished batches to the writer process strictly in
manifest order, isolates files that crash their worker by splitting their batch in two,
recursively (:mod:`.isolation`), and reports progress. Everything it waits for arrives on one event queue:
finished futures (from Dask's callbacks) and writer messages (from a pipe-reading thread),
each dispatched through a handler.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, nullcontext
from typing import Any

from .. import format as fmt
from .. import gcpause
from ..batches import BatchResult
from ..config import JobConfig
from ..errors import ConvertError
from ..transport.packing import to_shm
from ..writer.messages import (
    LAST,
    Abort,
    Aborted,
    Committed,
    Done,
    Failed,
    Finish,
    Layout,
    Ready,
    Store,
    Stored,
    WriterDied,
)
from ..writer.process import WriterGone, WriterHandle, writer_context
from . import inprocess, signals
from .cluster import connect
from .cluster_watch import ClusterWatch
from .decoder_warnings import WarningLog
from .direct_chunks import ChunkPlacer
from .fence import Fence
from .head_start import HeadStart
from .isolation import Slot, after_failure
from .options import ConvertOptions, ConvertSummary
from .plan import Plan, RowPredictor
from .preflight import preflight
from .progress import Progress
from .spares import SpareDecoder, close_all
from .worker import decode_batch

WINDOW_BYTES = 1 << 30  # decoded bytes waiting in shared memory, at most (about)
ABORT_SECONDS = 60  # how long the writer may take to commit after an abort


# Seconds to fetch a finished batch's result from its worker before the part counts as
# failed (a result is descriptors and metadata: it takes milliseconds when the worker lives).
RESULT_TIMEOUT = 60.0


class Driver:
    """Runs a :class:`~.plan.Plan` on a cluster, feeding the writer. Use :meth:`run`."""

    def __init__(self, job: JobConfig, opts: ConvertOptions, plan: Plan, writer: WriterHandle, run_id: str,
                 say, spares: list[SpareDecoder] | None = None, choice: inprocess.KindChoice | None = None,
                 head: HeadStart | None = None, finish_work: Iterator[Any] | None = None):
        """``head``: batches submitted before the plan (``conversion/head_start.py``), taken over.
        ``finish_work``: what the writer's ``Finish`` needs (the inventory sidecar), in steps
        the loop takes between its events (:meth:`_step_finish_work`)."""
        self.opts, self.plan, self.writer, self.run_id, self.say = opts, plan, writer, run_id, say
        self.head = head
        self.finish_work = finish_work
        # cluster.kind auto: in-process for a small fresh job, a LocalCluster otherwise
        # (``choice``: made already, before the plan sized the batches for it).
        m = plan.tasks.manifest
        self.choice = choice or inprocess.choose_kind(job, m, len(m.items) - plan.tasks.first_item(plan.start),
                                                      resuming=plan.start > 0 or plan.spec.resume is not None)
        self.job = job = inprocess.resolved(job, self.choice.kind)
        # Decoders forked at the start (spares.py) serve an in-process run only; where the
        # writer came from the fork server, an in-process run starts them from it itself.
        self.spares = spares or []
        if self.spares and job.cluster.kind != "inprocess":
            close_all(self.spares)
            self.spares = []
        self.events: queue.Queue = queue.Queue()
        self.slots: dict[int, Slot] = {}
        self.futures: dict[Any, tuple[int, int]] = {}  # future -> (batch index, part position)
        self.watch: ClusterWatch | None = None  # started at the first wait on a LocalCluster
        self.acked = plan.start
        self.submissions = 0
        self.rejects = 0
        self.bytes_decoded = 0
        self.direct_samples = 0  # stored by the decoders into the output's chunks (direct_chunks.py)
        self.client: Any = None
        self.progress: Progress | None = None
        # Worker-side compression: where each split's next batch will start, assuming the
        # batches in flight lose no samples (a wrong guess only costs the writer a decode).
        self.rows = RowPredictor(job, plan.written, plan.spec.codecs)
        # Decoders that write chunks themselves (direct_chunks.py): where each batch lands.
        self.placer = ChunkPlacer(plan.spec.partial_path, plan.written)
        self.fence: Fence | None = None  # made in run() where batches may be placed
        # Decoder warnings of the stored batches, in a log beside the output (not the console).
        self.warning_log = WarningLog(fmt.warnings_file(plan.spec.final_path), resume=plan.start > 0)

    # -- the loop --------------------------------------------------------------------------

    def _next_event(self, conn: Any) -> tuple[str, Any]:
        """The next future or writer event. On a LocalCluster the run started, a thread looks
        at its workers meanwhile (:mod:`.cluster_watch`) and may stop the run through here."""
        cluster = getattr(conn, "cluster", None) if self.job.cluster.kind == "local" else None
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
        job, tasks = self.job, self.plan.tasks
        in_proc = job.cluster.kind == "inprocess"
        with ExitStack() as stack:
            stack.enter_context(nullcontext() if in_proc else _dask_settings(job))
            if self.plan.spec.direct:  # decoders may write chunks: their fence, let go at the end
                self.fence = Fence.create(self.plan.spec.partial_path, len(tasks))
                stack.callback(lambda: self.fence and self.fence.retire())
            if in_proc and not self.spares and not self.writer.forked:
                self.spares = SpareDecoder.start_all(job, writer_context())
            # In-process decoding points fd 2 at the decoder-warning capture while a batch
            # decodes, and the driver's own decode thread starts in connect() (at once on a
            # head start's queued batches): a line written to fd 2 meanwhile would be taken
            # for a file's decoder warning. Progress and the driver's lines go around it,
            # through a duplicate of fd 2 taken before that thread starts.
            log = stack.enter_context(inprocess.console(self.opts.log)) if in_proc else self.opts.log
            if in_proc and self.opts.log is None:
                stack.callback(setattr, self, "say", self.say)
                self.say = lambda text: print(text, file=log, flush=True)
            head = self.head if in_proc else None
            conn = stack.enter_context(inprocess.connect(job.cluster, self.spares, head and head.take())
                                       if in_proc else connect(job.cluster))
            self.client = conn.client
            stack.callback(lambda: self.watch and self.watch.stop())  # before the cluster closes
            if self.choice.why:
                self.say(self.choice.describe())
            self.say(f"cluster: {conn.description}" + (f"; dashboard {conn.dashboard}" if conn.dashboard else ""))
            if in_proc:
                self.say(inprocess.check_packages(job))
            else:
                preflight(self.client, job, tasks.manifest, self.say)
            n_workers = max(1, len(self.client.scheduler_info(n_workers=-1)["workers"]))
            # Batches in flight: enough to keep every worker busy, and not more decoded
            # samples waiting in shared memory than WINDOW_BYTES. Two per worker, not
            # three: each batch in flight may hold a segment of its own, and a segment's
            # first touch costs ~1.1 ms of CPU per MB here (page faults on a fresh
            # mapping); 4,096 pairs on 2 cores, alternating: 4 in flight took 0.05-0.12
            # CPU-s less than 6, in process and on a LocalCluster, at the same wall time.
            window = job.cluster.max_in_flight or max(4, min(2 * n_workers, WINDOW_BYTES // max(1, self.plan.batch_bytes)))
            self.progress = Progress(len(tasks.manifest.items), tasks.first_item(self.plan.start),
                                     mode=self.opts.progress, log=log)
            threading.Thread(target=self._pump_writer, daemon=True).start()
            gcpause.resume()  # the set-up is done: collection on again for the run
            next_submit = next_forward = self.plan.start
            for index, fut in (head.futures.items() if head else ()):  # decoding since before the plan
                self.slots[index] = Slot(tasks[index])
                self.placer.place(tasks[index])  # (no layout yet: only the row count moves on)
                self._track(fut, index, 0)
                next_submit = max(next_submit, index + 1)
            released = False
            while self.acked < len(tasks):
                signals.raise_pending()
                while next_submit < len(tasks) and next_submit - self.acked < window and not self._awaiting_layout():
                    self.slots[next_submit] = Slot(self.placer.place(self.rows.place(tasks[next_submit])))
                    self._submit(next_submit, 0, len(tasks[next_submit].items))
                    next_submit += 1
                kind, payload = self._next_event(conn)
                if kind == "future":
                    self._on_future(payload)
                    if in_proc and not released and not self.futures and next_submit == len(tasks):
                        self.client.release()  # all decoded: the forked decoders exit while the writer stores
                        released = True
                    while next_forward in self.slots and self.slots[next_forward].complete():
                        slot = self.slots[next_forward]
                        if slot.task.direct:  # its late copies write no more (fence.py)
                            self.fence.close(next_forward)
                        for k, part in enumerate(slot.parts):
                            part.result.final_part = k == len(slot.parts) - 1
                            self._send(Store(part.result))
                        next_forward += 1
                else:
                    self._on_writer(payload)
                self._step_finish_work()
            signals.raise_pending()
            self._step_finish_work(to_the_end=True)
            self.progress.close()
            if in_proc and self.spares:
                self.say(self.client.report(len(head.futures) if head else 0, self.direct_samples))
            elif self.direct_samples:
                self.say(f"{self.direct_samples} samples written into the output by the workers")
            # The writer counts every reject (discovery, decode, write, and those of batches
            # committed by an earlier run) and keeps the file partial when there are too many.
            self._send(Finish(job.policy.max_reject_fraction))
            s = self._wait_for(Done).summary
            if self.warning_log.files:
                self.say(f"{self.warning_log.files} files gave decoder warnings, see {self.warning_log.path}")
            excluded = sum(1 for r in self.plan.spec.discovery_rejects if r.stage == fmt.STAGE_EXCLUDED)
            summary = ConvertSummary(
                path=s.path, counts=s.counts, rejects=s.rejects, excluded=excluded, inputs=self.plan.num_inputs, seconds=0.0,
                bytes_decoded=s.bytes_decoded, output_bytes=os.path.getsize(s.path), rejects_file=s.rejects_file,
                cluster=conn.description, dashboard=conn.dashboard, ok=s.ok, extra={"writer": s.stats},
                warnings=self.warning_log.files, warnings_file=self.warning_log.path if self.warning_log.files else "")
            if not s.ok:
                self.writer.process.join(timeout=30)
                n, bad = self.plan.num_inputs - excluded, s.rejects - excluded
                # A sync undoes itself (writer/sync.py); a conversion keeps its partial.
                kept = (f"the sync is undone, {self.plan.spec.final_path} is as it was" if self.plan.spec.sync
                        else f"output left as {self.plan.spec.partial_path}")
                raise ConvertError(
                    f"{bad} of {n} input files rejected ({bad / max(1, n):.1%}), above "
                    f"policy.max_reject_fraction {job.policy.max_reject_fraction:.1%}; {kept}, reasons in "
                    f"{s.rejects_file} (raise policy.max_reject_fraction and run again to accept it)", 1)
            return summary

    def _step_finish_work(self, to_the_end: bool = False) -> None:
        """One step of ``finish_work`` (all of it with ``to_the_end``, before ``Finish``).
        Reason: the inventory sidecar of 4,096 pairs costs ~12 ms, mostly stamps. Written
        before the loop it held back the driver's decode thread and the head start's first
        ``Store``; written after the last decode it held back ``Finish`` (the writer
        drains its last batches in ~5 ms). In steps of ~1 ms between events it costs
        neither: the loop's thread waits for events most of the run."""
        if self.finish_work is None:
            return
        for _ in self.finish_work:
            if not to_the_end:
                return
        self.finish_work = None

    def _submit(self, index: int, lo: int, hi: int) -> None:
        whole = self.slots[index].task
        task = whole if (lo, hi) == (0, len(whole.items)) else whole.sub(lo, hi)
        # A new key per submission: a part submitted again (to confirm a failure) must run
        # again, not return the first attempt's error from the scheduler's memory.
        self.submissions += 1
        fut = self.client.submit(decode_batch, task, pure=False, retries=0,
                                 key=f"h5batch-decode-{self.run_id}-{index}-{lo}-{hi}-{self.submissions}")
        self._track(fut, index, lo)

    def _track(self, fut: Any, index: int, lo: int) -> None:
        """Wait for ``fut``, the part of batch ``index`` that starts at item ``lo``."""
        self.futures[fut] = (index, lo)
        # The status when it fired goes with it: a task that finished and whose worker died
        # before its result was fetched reads "lost" or fails result() by the time the loop
        # gets to it, and must not count as one that took its worker down (_on_future).
        fut.add_done_callback(lambda f: self.events.put(("future", (f, f.status))))

    # -- writer messages -----------------------------------------------------------------

    def _pump_writer(self) -> None:
        """Forward writer messages to the event queue; report a writer that died."""
        outbox, process = self.writer.outbox, self.writer.process
        while True:
            try:
                msg = outbox.get(timeout=1.0)
            except queue.Empty:
                if not process.is_alive():
                    self.events.put(("writer", WriterDied(process.exitcode)))
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
            self.rows.correct(slot.task, slot.written)
            self.placer.correct(slot.task, slot.written)
            self.rejects += sum(len(p.result.rejects) for p in slot.parts)
            self.bytes_decoded += sum(p.result.packed.nbytes + p.result.packed.direct_bytes for p in slot.parts)
            self.direct_samples += sum(p.result.packed.direct_rows for p in slot.parts)
            self.warning_log.add(w for p in slot.parts for w in p.result.warnings)
            self.progress.update(len(slot.task.items), rejects=self.rejects, nbytes=self.bytes_decoded)
            del self.slots[msg.index]
            self.acked += 1

    def _awaiting_layout(self) -> bool:
        """True while the writer is placing the chunks the decoders will write into
        (``direct_chunks``): a batch submitted before its :class:`Layout` would travel
        through shared memory. The forked decoders meanwhile decode the head start's
        batches; the writer sends the layout right after ``Ready``."""
        return self.fence is not None and not self.placer.offsets

    def _on_layout(self, msg: Layout) -> None:
        # (Only a run direct_chunks.planned_rows admits asks for one; none is used where
        # the file system gave no fence.)
        if self.fence is not None:
            self.placer.layout(msg.offsets, msg.k)

    def _on_failed(self, msg: Failed) -> None:
        raise ConvertError(f"writer failed: {msg.text}")

    def _send(self, msg: Any) -> None:
        try:
            self.writer.send(msg)
        except WriterGone as e:
            self._on_died(WriterDied(e.exit_code))

    def _on_died(self, msg: WriterDied) -> None:
        raise ConvertError(f"writer process died (exit code {msg.exit_code}); "
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
                # A worker can die between finishing and handing the result over (the next
                # file of its queue crashed it): Dask then recomputes the task or raises
                # KilledWorker, and result() waited forever on it (seen 1 run in 4 of
                # test_worker_failures). Past the timeout it is a failed part like any other.
                res: BatchResult = fut.result(timeout=RESULT_TIMEOUT)
            except Exception as e:  # noqa: BLE001  (TimeoutError, KilledWorker, CommClosedError...)
                exc = e
            else:
                if res.packed.shm_name is None and res.packed.payload is not None:
                    res.packed = to_shm(res.packed, self.run_id)  # network transport
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
            # Done when its callback fired, pending or lost by now: the worker holding it died
            # and Dask recomputes it. Waiting for that took up to a minute per part under
            # crash isolation (test runs timed out); the part is failed and resubmitted
            # below instead, and this future is let go.
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


def _dask_settings(job: JobConfig):
    """Dask's configuration for a run on worker processes."""
    import dask
    import distributed  # noqa: F401  (its config defaults must exist before dask.config.set)

    # A task whose worker dies is re-run up to policy.retries more times before Dask
    # gives up (KilledWorker); then the batch is split to isolate the culprit.
    # worker-saturation 1.0 keeps queued tasks on the scheduler, so a worker that dies
    # takes only its running task down with it, not innocent tasks queued behind it.
    settings: dict[str, Any] = {"distributed.scheduler.allowed-failures": job.policy.retries,
                                "distributed.scheduler.worker-saturation": 1.0}
    # A cluster this run starts (its nannies hand the settings to the worker processes):
    # the event-loop health tick every 20 ms and each worker's stack sampler every 10 ms
    # are what an idle 2-worker LocalCluster spends its 0.14 CPU-s per second on (0.045
    # with these two changed), and a conversion pays it on cores its decoding needs. The
    # sampler feeds only the dashboard's profile page: kept when there is a dashboard.
    settings["distributed.admin.tick.interval"] = "500ms"
    if not job.cluster.dashboard:
        settings["distributed.worker.profile.enabled"] = False
    return dask.config.set(settings)


_WRITER_HANDLERS = {
    Stored: Driver._on_stored,
    Failed: Driver._on_failed,
    WriterDied: Driver._on_died,
    Ready: lambda self, msg: None,  # the plan already knows where the file goes on
    Layout: Driver._on_layout,
    Committed: lambda self, msg: None,  # progress is counted from Stored
}


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
        try:
            msg = writer.outbox.get(timeout=0.5)
            if isinstance(msg, (Aborted, Failed)):
                break
        except queue.Empty:
            pass
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
