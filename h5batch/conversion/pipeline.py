"""The whole pipeline of one conversion: :func:`convert` (the stages are listed in
:mod:`h5batch.conversion`; ``docs/architecture.md`` draws them)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time

from .. import format as fmt
from .. import inventory, shards
from ..config import JobConfig
from ..errors import ConvertError
from ..layouts import discover, resolved_job
from ..remote.upload import ObjectOutput
from ..transport import semaphores
from ..transport.segments import new_run_id, remove_segments, remove_stale_segments
from ..writer.messages import Start
from ..writer.process import WriterGone, WriterHandle
from . import signals, trial, writer_hosts
from .cluster import open_engine
from .driver import Driver, Lane, abort, too_many_rejects
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
    output.check_writers()
    n = job.output.writers
    # Per writer: its output files, and None (done: a complete shard), or the commit record
    # to resume from (None inside: start afresh).
    outs = [output] if n == 1 else [output.shard(k) for k in range(n)]
    # --overwrite of a finished output redoes every shard (its complete shards are that output's);
    # the complete shards of an interrupted run are kept, as one writer's partial is.
    fresh = opts.restart or not opts.resume or (output.overwrite and os.path.exists(output.final))
    todo = {k: o.resume_record(manifest) for k, o in enumerate(outs) if n == 1 or fresh or not o.shard_done(manifest)}
    if not todo:  # every shard is written: only the join was left
        summary = _joined(job, output, outs, manifest, None, say)
        output.check_finished(summary)
        return summary
    record = next((r for r in todo.values() if r is not None), None)
    # The writers first: forked while this process has no other thread (the engine
    # starts threads); they hold the output's lock with us.
    writers = {k: WriterHandle.start(lock.fd) for k in todo}
    started: set[int] = set()
    finished = False
    where = output.partial if n == 1 else "the shard files " + shards.shard_path(output.final, "K", n)
    try:
        with open_engine(job) as conn:
            say(f"decoding on {conn.description}" + (f"; dashboard {conn.dashboard}" if conn.dashboard else ""))
            check_engine(conn, job, manifest, say)
            placed = writer_hosts.place(conn.client, job, {k: outs[k].final for k in todo}, writers, lock,
                                        run_id, say)
            plan = make_plan(job, manifest, record, output.final, output.partial, run_id, say,
                             run_trial=trial.on_engine(conn, say))
            lanes = _lanes(plan, outs, todo, writers, manifest, placed)
            try:
                for lane in lanes:
                    lane.writer.send(Start(lane.spec))
                    started.add(next(k for k, w in writers.items() if w is lane.writer))
            except WriterGone as e:
                raise ConvertError(f"{e} before the job started; run the same command again") from None
            resumed = len(plan.tasks) - sum(ln.hi - ln.start for ln in lanes)
            if resumed:
                say(f"resuming {where}: {resumed} of {len(plan.tasks)} batches already committed")
            try:
                # Said here, inside: a stop from now on is a committed one (the message below).
                say.detail(f"plan: {len(plan.tasks)} batches of up to {plan.tasks.batch_size} items"
                           + (f", {n} writers" if n > 1 else ""))
                # In place (written whole, then renamed) before the first Store; the writer
                # (of the last shard) folds it into the file at Finish.
                for lane in lanes:
                    if lane.spec.inventory:
                        inventory.write_sidecar(lane.spec.partial_path, manifest)
                summary = Driver(job, opts, plan, lanes[0].writer, run_id, say, conn, lanes if n > 1 else None).run()
            except KeyboardInterrupt as e:
                for w in writers.values():
                    abort(w)
                why = "interrupted" if signals.signal_name(e) == "SIGINT" else f"stopped by {signals.signal_name(e)}"
                raise ConvertError(f"{why}; progress is committed in {where}. "
                                   f"Run the same command again to resume.", signals.exit_code(e)) from None
            except BaseException:
                for w in writers.values():
                    abort(w)
                raise
        if n > 1:
            summary = _joined(job, output, outs, manifest, summary, say)
        output.check_finished(summary)
        finished = True
        summary.resumed_from = resumed
        return summary
    finally:
        # Once the engine is closed: a late copy of a task (Dask may run one twice) cannot
        # make a segment of this run after this.
        remove_segments(run_id)
        for k, w in writers.items():
            if k not in started:  # never got a job: let it go
                w.stop()
            w.lifeline.close()
            if k in started and not finished:  # a run that failed after Done (the output's checks): it exits by itself
                w.process.join(timeout=30)


def _lanes(plan, outs: list[OutputFiles], todo: dict, writers: dict, manifest, placed: dict) -> list[Lane]:
    """A :class:`~.driver.Lane` per writer with work: its batches and its writer's spec (one
    writer: the plan's own; several: the plan's for a shard, h5batch/shards.py), and where
    a writer runs on its workers' host, that placement (:mod:`.writer_hosts`)."""
    n = len(outs)
    if n == 1:
        spec = plan.spec
        spec.inventory = inventory.sidecar(spec.partial_path)
        return [Lane(writers[0], plan.start, len(plan.tasks), spec=spec)]
    starts, items = plan.tasks.starts, manifest.items
    lanes = []
    for k, (lo, hi) in enumerate(shards.ranges(len(plan.tasks), n)):
        if k not in todo:  # complete: made of the items this run would give it?
            shards.check_items(outs[k].final, int(starts[lo]), int(starts[hi]), plan.tasks.batch_size)
            continue
        last = k == n - 1
        record = todo[k]
        where = placed.get(k)
        # A writer on another host keeps its own working directory: its paths are absolute,
        # and the driver's folder need not exist there.
        spec = dataclasses.replace(
            plan.spec, partial_path=outs[k].partial, final_path=outs[k].final, resume=record,
            cwd="" if where else plan.spec.cwd,
            shard={"index": k, "of": n, "items": [int(starts[lo]), int(starts[hi])]},
            discovery_rejects=plan.spec.discovery_rejects if last else [],
            num_inputs=items.num_paths(int(starts[lo]), int(starts[hi])) + (len(plan.spec.discovery_rejects) if last else 0),
            inventory=inventory.sidecar(outs[k].partial) if last else "")
        name = f"writer of {outs[k].final}" + (f" on host {where.host}" if where else "")
        lanes.append(Lane(writers[k], record.next_batch if record else lo, hi, name, lo, spec, where))
    return lanes


def _joined(job: JobConfig, output: OutputFiles, outs: list[OutputFiles], manifest, summary: ConvertSummary | None,
            say) -> ConvertSummary:
    """Join the complete shards into the output (h5batch/shards.py) unless more than
    ``policy.max_reject_fraction`` of the inputs were rejected; the run's summary."""
    import h5py

    from ..writer.output import read_rejects

    files = [o.final for o in outs]
    rejects, counts = [], {}
    for p in files:
        with h5py.File(p, "r") as f:
            rejects += read_rejects(f)
            for s in manifest.splits:
                counts[s] = counts.get(s, 0) + int(f[s].attrs[fmt.ATTR_NUM_SAMPLES])
    num_inputs = manifest.items.num_paths() + len(manifest.rejects)
    excluded = sum(1 for r in rejects if r.stage == fmt.STAGE_EXCLUDED)
    bad = len(rejects) - excluded
    frac = job.policy.max_reject_fraction
    rejects_file = fmt.rejects_file(output.final)
    fmt.write_rejects(rejects_file, rejects)
    if bad > frac * max(1, num_inputs - excluded):
        raise too_many_rejects(bad, num_inputs - excluded, frac, f"the shards are kept, not joined into {output.final}",
                               rejects_file)
    shards.join(output.final, files, num_inputs)
    for p in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fmt.rejects_file(p))
    say.detail(f"joined {len(files)} shards into {output.final}")
    if summary is None:
        summary = ConvertSummary(path=output.final, counts={}, rejects=0, inputs=num_inputs, seconds=0.0,
                                 bytes_decoded=0, output_bytes=0, rejects_file="")
    summary.path, summary.counts, summary.rejects, summary.excluded = output.final, counts, len(rejects), excluded
    summary.output_bytes = sum(os.path.getsize(p) for p in [output.final, *files])
    summary.rejects_file = rejects_file
    return summary

