"""The whole pipeline of one conversion: :func:`convert` (the stages are listed in
:mod:`h5batch.conversion`; ``docs/architecture.md`` draws them)."""

from __future__ import annotations

import sys
import time

from .. import gcpause, inventory
from ..config import JobConfig
from ..errors import ConvertError
from ..layouts import discover, resolved_job
from ..transport import semaphores
from ..transport.segments import new_run_id, remove_segments, remove_stale_segments
from ..writer.messages import Start
from ..writer.process import WriterGone
from . import fence, inprocess, signals
from .driver import Driver, abort
from .generate import generate_corpus
from .head_start import HeadStart
from .lock import OutputLock
from .options import ConvertOptions, ConvertSummary
from .partial import OutputFiles
from .plan import make_plan
from .spares import SpareDecoder, close_all
from .sync import recover
from .writer_start import PendingWriter, codec_libraries

__all__ = ["convert"]


def convert(job: JobConfig, opts: ConvertOptions | None = None) -> ConvertSummary:
    """Convert the corpus of ``job`` into its HDF5 output.

    Raises :class:`~h5batch.errors.ConvertError` (with the exit code the command line
    gives it) when the run cannot start or finish. Ctrl-C, SIGTERM and SIGHUP commit what
    is stored and raise it with code 130, 143 or 129: the same call resumes.
    """
    opts = opts or ConvertOptions()
    log = opts.log or sys.stderr

    def say(text: str) -> None:
        print(text, file=log, flush=True)

    t0 = time.perf_counter()
    with signals.graceful(), gcpause.library_call():
        output = OutputFiles(job, opts, say)
        output.check_directory()
        run_id = new_run_id()
        # Nothing of the output is created, resumed or removed without its lock.
        lock = OutputLock.acquire(output.final, run_id, say)
        try:
            recover(output.final, say)  # an interrupted sync is undone first
            stale = remove_stale_segments()
            if stale:
                say(f"removed {len(stale)} shared-memory segments left by dead runs")
            sems = semaphores.remove_stale()
            if sems:
                say(f"removed {len(sems)} semaphores left in /dev/shm by dead runs")
            with semaphores.tagged():
                # An existing output is checked against the corpus before anything starts
                # (writer, decoders, a full discovery): a finished output of this job whose
                # corpus did not change is answered by a stat pass, as by `h5batch sync`.
                done = output.already_done_incrementally()
                if done is not None:
                    say(f"{output.final} is already complete for this job and corpus; nothing to do")
                    return _timed(done, t0)
                return _timed(_convert(job, opts, output, lock, run_id, say), t0)
        finally:
            lock.release()


def _convert(job: JobConfig, opts: ConvertOptions, output: OutputFiles, lock: OutputLock, run_id: str,
             say) -> ConvertSummary:
    # The writer process starts first, on a thread: its imports (h5py, the codecs) overlap
    # discovery, the codec trial and pre-flight. It waits for its spec, holding the lock with us.
    pending = PendingWriter(lock.inheritable(), codec_libraries(job))
    fence.retire_stale(output.partial)  # a killed run's decoders may still be writing (fence.py)
    # More decoders for an in-process run, forked while the driver has no thread (else the
    # driver starts them from the writer's fork server: spares.py).
    forked = SpareDecoder.start_all(job, run_id=run_id) if pending.forked else []
    started = finished = False
    head: HeadStart | None = None
    try:
        generate_corpus(job, say)
        manifest = discover(job)
        job = output.job = resolved_job(job, manifest)  # category / target names now known
        done = output.already_done(manifest)
        if done is not None:
            say(f"{output.final} is already complete for this job and corpus; nothing to do")
            return done
        output.check_not_there()
        output.require_samples(manifest)
        record = output.resume_record(manifest)
        # cluster.kind auto is settled before the plan: batch_size auto depends on it.
        choice = inprocess.choose_kind(job, manifest, len(manifest.items), resuming=record is not None)
        # The forked decoders start on the first batches while the plan is made (head_start.py).
        head = HeadStart.begin(job, manifest, choice, record, forked, run_id)
        plan = make_plan(job, manifest, record, output.final, output.partial, run_id, say,
                         measurer=pending.measure, kind=choice.kind, tasks=head and head.tasks,
                         known=choice.samples)
        choice.samples.clear()  # taken by the trial: no copy of a sample outlives the plan
        plan.spec.inventory = inventory.sidecar(output.partial)
        # Decoding may begin while the writer is still importing: batches queue in its pipe.
        writer = pending.get()
        try:
            writer.send(Start(plan.spec))
        except WriterGone as e:
            raise ConvertError(f"{e} before the job started; run the same command again") from None
        started = True
        if plan.start:
            say(f"resuming {output.partial}: {plan.start} of {len(plan.tasks)} batches already committed")
        try:
            # Only Finish reads the inventory sidecar: written in steps between the driver
            # loop's events (Driver._step_finish_work), not on the way to the writer's
            # Start (docs/benchmarks.md fifteenth round) nor to the first batch.
            summary = Driver(job, opts, plan, writer, run_id, say, forked, choice, head,
                             finish_work=inventory.sidecar_steps(output.partial, manifest)).run()
        except KeyboardInterrupt as e:
            abort(writer)
            why = "interrupted" if signals.signal_name(e) == "SIGINT" else f"stopped by {signals.signal_name(e)}"
            raise ConvertError(f"{why}; progress is committed in {output.partial}. "
                               f"Run the same command again to resume.", signals.exit_code(e)) from None
        except BaseException:
            abort(writer)
            raise
        finally:
            remove_segments(run_id)
        output.check_finished(summary)
        # The writer is not waited for: after Done its file is renamed and closed, and what
        # is left is its exit, ~20-25 ms of the kernel tearing down its mappings (4,096
        # pairs), which every run waited for at its very end. Its lock descriptor goes with
        # it, on a lock file the release below unlinks first, so a next run takes a new one
        # at once; multiprocessing reaps the process (the next start, or at exit).
        finished = True
        summary.resumed_from = plan.start
        return summary
    finally:
        if head is not None:
            head.close()  # where the driver's loop never took it over
        close_all(forked)
        writer = pending.get()
        if not started:  # never got a job: let it go
            writer.stop()
        writer.lifeline.close()
        if started and not finished:  # a run that failed after Done (the output's checks): the writer exits by itself
            writer.process.join(timeout=30)


def _timed(summary: ConvertSummary, t0: float) -> ConvertSummary:
    summary.seconds = time.perf_counter() - t0
    return summary
