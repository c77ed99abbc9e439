"""The whole pipeline of one conversion: :func:`convert` (the stages are listed in
:mod:`h5batch.conversion`; ``docs/architecture.md`` draws them)."""

from __future__ import annotations

import sys
import time

from .. import inventory
from ..config import JobConfig
from ..errors import ConvertError
from ..layouts import discover, resolved_job
from ..remote.upload import ObjectOutput
from ..transport import semaphores
from ..transport.segments import new_run_id, remove_segments, remove_stale_segments
from ..writer.messages import Start
from ..writer.process import WriterGone, WriterHandle
from . import signals, trial
from .cluster import open_engine
from .driver import Driver, abort
from .generate import generate_corpus
from .lock import OutputLock
from .options import ConvertOptions, ConvertSummary, Say
from .partial import OutputFiles
from .plan import make_plan
from .preflight import check_engine
from .sync import recover

__all__ = ["convert"]


def convert(job: JobConfig, opts: ConvertOptions | None = None) -> ConvertSummary:
    """Convert the corpus of ``job`` into its HDF5 output.

    Raises :class:`~h5batch.errors.ConvertError` (with the exit code the command line
    gives it) when the run cannot start or finish. Ctrl-C, SIGTERM and SIGHUP commit what
    is stored and raise it with code 130, 143 or 129: the same call resumes.
    """
    opts = opts or ConvertOptions()
    say = Say(opts.log or sys.stderr, opts.verbose)

    # An s3:// output is built in its local staging folder, then uploaded (remote/upload.py).
    remote = ObjectOutput.of(job, opts.overwrite, say)
    if remote is not None:
        remote.check_not_there()
        job = remote.local_job

    t0 = time.perf_counter()
    with signals.graceful():
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
                summary = done if done is not None else _convert(job, opts, output, lock, run_id, say)
                if remote is not None:  # the last stage: the finished file becomes the object
                    summary = remote.publish(summary)
                summary.seconds = time.perf_counter() - t0
                return summary
        finally:
            lock.release()


def _convert(job: JobConfig, opts: ConvertOptions, output: OutputFiles, lock: OutputLock, run_id: str,
             say) -> ConvertSummary:
    generate_corpus(job, say)
    manifest = discover(job)
    say(manifest.found())
    job = output.job = resolved_job(job, manifest)  # category / target names now known
    done = output.already_done(manifest)
    if done is not None:
        return done
    output.require_samples(manifest)
    record = output.resume_record(manifest)
    # The writer first: it is forked while this process has no other thread (the engine
    # starts threads), and holds the output's lock with us.
    writer = WriterHandle.start(lock.fd)
    started = finished = False
    try:
        with open_engine(job) as conn:
            say(f"decoding on {conn.description}" + (f"; dashboard {conn.dashboard}" if conn.dashboard else ""))
            check_engine(conn, job, manifest, say)
            plan = make_plan(job, manifest, record, output.final, output.partial, run_id, say,
                             run_trial=trial.on_engine(conn, say))
            plan.spec.inventory = inventory.sidecar(output.partial)
            try:
                writer.send(Start(plan.spec))
            except WriterGone as e:
                raise ConvertError(f"{e} before the job started; run the same command again") from None
            started = True
            if plan.start:
                say(f"resuming {output.partial}: {plan.start} of {len(plan.tasks)} batches already committed")
            try:
                # Said here, inside: a stop from now on is a committed one (the message below).
                say.detail(f"plan: {len(plan.tasks)} batches of up to {plan.tasks.batch_size} items")
                # In place (written whole, then renamed) before the first Store; the writer
                # folds it into the file at Finish.
                inventory.write_sidecar(output.partial, manifest)
                summary = Driver(job, opts, plan, writer, run_id, say, conn).run()
            except KeyboardInterrupt as e:
                abort(writer)
                why = "interrupted" if signals.signal_name(e) == "SIGINT" else f"stopped by {signals.signal_name(e)}"
                raise ConvertError(f"{why}; progress is committed in {output.partial}. "
                                   f"Run the same command again to resume.", signals.exit_code(e)) from None
            except BaseException:
                abort(writer)
                raise
        output.check_finished(summary)
        finished = True
        summary.resumed_from = plan.start
        return summary
    finally:
        # Once the engine is closed: a late copy of a task (Dask may run one twice) cannot
        # make a segment of this run after this.
        remove_segments(run_id)
        if not started:  # never got a job: let it go
            writer.stop()
        writer.lifeline.close()
        if started and not finished:  # a run that failed after Done (the output's checks): the writer exits by itself
            writer.process.join(timeout=30)

