"""``h5batch sync``: bring a finished output up to date with its corpus, converting only
what changed (docs/sync.md).

The stages are :func:`h5batch.conversion.pipeline.convert`'s plus :mod:`.delta` between
discovery and planning; only new and changed items go to the workers. Discovery is
incremental where the layout can vouch for it (:mod:`h5batch.layouts.incremental`), else
full, and the log says why; either way the output ends as a fresh conversion's would.
Nothing past discovery is started unless there is something to write. The writer
(:class:`h5batch.writer.sync.SyncWriter`) appends through an undo journal, or to a copy when a
reader has the output open; removed and changed rows become tombstones. All or nothing: an
interrupted sync is undone by the next lock holder (:func:`recover`) and then redone whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

from .. import format as fmt
from .. import inventory, shards
from ..config import JobConfig
from ..errors import EXIT_BAD_INPUT, ConvertError
from ..layouts import discover, resolved_job
from ..manifest import Manifest
from ..transport import semaphores
from ..transport.segments import new_run_id, remove_segments, remove_stale_segments
from ..writer.journal import has_journal, readers_present, rollback
from . import delta as deltas
from . import signals
from .generate import generate_corpus
from .lock import OutputLock
from .options import ConvertOptions, Say

# The driver, the plan, the writer's start and its messages are imported when there is
# something to write: a sync that finds the output up to date does without them.

__all__ = ["sync", "SyncSummary", "compare", "Comparison", "recover", "COPY_SUFFIX"]

COPY_SUFFIX = ".sync-copy"  # the copy a sync works on while a reader has the output open


@dataclass
class SyncSummary:
    path: str
    new: int
    changed: int
    removed: int
    unchanged: int
    counts: dict[str, int]  # live samples per split after the sync
    rejects: int
    seconds: float
    in_place: bool = True
    up_to_date: bool = False
    discover_seconds: float = 0.0
    convert_seconds: float = 0.0
    output_bytes: int = 0
    dry_run: bool = False  # nothing was written: the counts (and paths) say what a sync would do
    paths: dict[str, list[str]] = field(default_factory=dict)  # (dry run) "new", "changed", "removed"


def recover(final: str, say) -> None:
    """Undo what an interrupted sync left (call with the output's lock held)."""
    if has_journal(final):
        rollback(final)
        say(f"{final}: undid an interrupted sync (the file is as it was before it)")
    copy = final + COPY_SUFFIX
    if os.path.exists(copy):
        os.unlink(copy)
        say(f"removed {copy}, left by an interrupted sync")
    for p in shards.strays(final):  # a join's temporary file, a shard a sync never joined
        os.unlink(p)
        say(f"removed {p}, left by an interrupted run")


def sync(job: JobConfig, opts: ConvertOptions | None = None, dry_run: bool = False) -> SyncSummary:
    """Sync the output of ``job`` with its corpus; raises
    :class:`~h5batch.errors.ConvertError` with the exit code. ``dry_run``: only say what a sync
    would do (nothing written, but an interrupted sync under the lock is still undone).
    """
    opts = opts or ConvertOptions()
    say = Say(opts.log or sys.stderr, verbose=True)  # a sync says its internals (pre-flight) too
    t0 = time.perf_counter()
    final = os.path.abspath(job.output.path)
    if not os.path.exists(final) and not has_journal(final):
        raise ConvertError(f"{final} does not exist: there is nothing to sync; run `h5batch convert` first",
                           EXIT_BAD_INPUT)
    with signals.graceful():
        run_id = new_run_id()
        lock = OutputLock.acquire(final, run_id, say)
        try:
            recover(final, say)
            remove_stale_segments()
            semaphores.remove_stale()
            with semaphores.tagged():
                s = _sync(job, opts, final, lock, run_id, say, dry_run)
        finally:
            lock.release()
    s.seconds = time.perf_counter() - t0
    return s


@dataclass
class _Found:
    """Discovery's answer for a sync: incremental (:mod:`h5batch.layouts.incremental`)
    where it can vouch for its result, else a full :func:`~h5batch.layouts.discover`."""

    manifest: Manifest  # incremental: only the new and changed items
    items: int  # items of the whole corpus
    num_inputs: int
    inventory: tuple | None  # the synced output's inventory arrays (None: from the full manifest)
    upgrade: bool = False  # the output's inventory predates incremental discovery: rewrite it
    rediscovery: object | None = None  # h5batch.layouts.incremental.Rediscovery, when incremental


def _discover(job: JobConfig, old, say, full: bool = True) -> _Found | None:
    """``full`` False: None where a full discovery would be needed."""
    from ..layouts.incremental import rediscover

    mem = old.memory()
    r = mem if isinstance(mem, str) else rediscover(job, mem, old.rejects)
    if isinstance(r, str) and not full:
        return None
    if isinstance(r, str):
        say(f"sync: full discovery ({r})")
        m = discover(job)
        return _Found(m, len(m.items), m.items.num_paths() + len(m.rejects), None, upgrade=isinstance(mem, str))
    return _Found(r.manifest, r.items, r.num_inputs, r.inventory, rediscovery=r)


@dataclass
class Comparison:
    """A finished output beside its corpus as it is now (:func:`compare`)."""

    old: deltas.OldOutput
    found: _Found
    job: JobConfig  # discovery's names resolved, the output's categories kept (_job_for)
    seconds: float  # what the comparison took

    @property
    def up_to_date(self) -> bool:
        return self.found.manifest.hash == self.old.manifest_hash and not self.found.upgrade

    def delta(self) -> deltas.Delta:
        r = self.found.rediscovery
        return deltas.from_rediscovery(self.old, r) if r is not None else deltas.compute(self.old, self.found.manifest)

    def live(self) -> dict[str, int]:
        """Samples per split that readers yield now (rows stored minus tombstoned)."""
        return _live(self.old, {})


def compare(job: JobConfig, final: str, say, full: bool = True) -> Comparison | None:
    """``job``'s finished output ``final`` compared with the corpus now: incrementally where
    the layout can vouch for it, else by full discovery. Call with the lock held. Raises
    :class:`~h5batch.errors.ConvertError` where another job made the output or it has no
    inventory. ``full`` False (``convert``'s check): None instead where a full discovery or an
    inventory is needed; the caller does its own.
    """
    from ..layouts.incremental import why_not_incremental

    t0 = time.perf_counter()
    generate_corpus(job, say)
    if not full and why_not_incremental(job):
        return None
    old = deltas.read_output(final)
    if not old.has_inventory:
        if not full:
            return None
        raise ConvertError(f"{final} was written by an h5batch that kept no inventory of its inputs, so a sync "
                           f"cannot tell what changed; convert it once more (--overwrite), later syncs are "
                           f"incremental", EXIT_BAD_INPUT)
    found = _discover(job, old, say, full)
    if found is None:
        return None
    return Comparison(old, found, _job_for(job, found.manifest, old), time.perf_counter() - t0)


def _sync(job: JobConfig, opts: ConvertOptions, final: str, lock: OutputLock, run_id: str, say,
          dry_run: bool = False) -> SyncSummary:
    files = _shard_files(final)  # before anything reads a sharded output's virtual datasets
    c = compare(job, final, say)
    assert c is not None  # full=True: a full discovery where an incremental one cannot vouch
    old, found, job, t_discover = c.old, c.found, c.job, c.seconds
    if c.up_to_date:
        if not dry_run:
            fmt.write_rejects(fmt.rejects_file(final), old.rejects)
        return SyncSummary(final, 0, 0, 0, found.items, c.live(), len(old.rejects), 0.0,
                           up_to_date=True, discover_seconds=t_discover, output_bytes=os.path.getsize(final),
                           dry_run=dry_run, paths={"new": [], "changed": [], "removed": []} if dry_run else {})
    d = c.delta()
    if dry_run:
        rows = dict(old.n_rows)
        for it in d.items:
            rows[it.split] = rows.get(it.split, 0) + 1
        return SyncSummary(final, d.new, d.changed, d.removed, d.unchanged, _live(old, d.tombstones, rows),
                           len(old.rejects), 0.0, discover_seconds=t_discover,
                           output_bytes=os.path.getsize(final), dry_run=True,
                           paths={"new": d.new_paths, "changed": d.changed_paths, "removed": d.removed_paths})
    from ..writer.process import WriterHandle
    from . import trial
    from .cluster import open_engine
    from .preflight import check_engine

    # The writer first: forked while this process has no other thread (the engine starts some).
    writer = WriterHandle.start(lock.fd)
    say(f"sync: {d.new} new, {d.changed} changed, {d.removed} removed, {d.unchanged} unchanged")
    # A sharded output gets a new shard (h5batch/shards.py): its shards are never written.
    added = shards.sync_shard_path(final, len(files)) if files else None
    in_place = added is None and not readers_present(final)
    partial = added + fmt.PARTIAL_SUFFIX if added else final if in_place else final + COPY_SUFFIX
    t1 = time.perf_counter()
    started = [False]  # set by _write once the writer has its Start
    try:
        if not in_place and not added:
            say(f"{final} is open in another process: syncing a copy, renamed over it at the end")
            shutil.copyfile(final, partial)
        with open_engine(job) if d.items else contextlib.nullcontext() as conn:
            if conn is not None:
                check_engine(conn, job, found.manifest, say)
            plan = _plan(job, found, old, d, added or final, partial, in_place, run_id,
                         trial.on_engine(conn, say) if conn is not None else None, len(files) if added else None)
            summary = _write(job, plan, d, found, added or final, writer, run_id, opts, say, conn, started)
    except BaseException:
        if not started[0]:
            inventory.remove_sidecar(added or final)
            writer.stop()
            writer.lifeline.close()
        raise
    finally:
        remove_segments(run_id)  # once the engine is closed (see conversion/pipeline.py)
    stored = summary.counts
    if added:  # the output is joined again with its new shard: the commit of this sync
        shards.join(final, [*files, added], found.num_inputs, d.tombstones)
        os.replace(fmt.rejects_file(added), fmt.rejects_file(final))
        stored = {s: old.n_rows.get(s, 0) + n for s, n in summary.counts.items()}
    counts = _live(old, d.tombstones, stored)
    return SyncSummary(final, d.new, d.changed, d.removed, d.unchanged, counts, summary.rejects, 0.0,
                       in_place=in_place or bool(added), discover_seconds=t_discover,
                       convert_seconds=time.perf_counter() - t1, output_bytes=os.path.getsize(final))


def _shard_files(final: str) -> list[str]:
    """The shard files of the sharded output ``final`` (checked: there, unchanged); [] for
    one file."""
    import h5py

    with h5py.File(final, "r") as f:
        return shards.check(final, f)


def _plan(job, found: _Found, old, d, final: str, partial: str, in_place: bool, run_id, run_trial=None,
          shard: int | None = None):
    """The writer's spec and the batches of new and changed items. ``shard``: they go into a
    new file, the ``shard``-th of a sharded output, with the corpus's rejects, names and
    inventory (h5batch/shards.py, :func:`~h5batch.shards.join` then joins it)."""
    from .plan import make_plan

    manifest = found.manifest
    splits = tuple(old.splits) + tuple(s for s in manifest.splits if s not in old.splits)
    work = Manifest(root=manifest.root, fields=manifest.fields, splits=splits, items=d.items,
                    class_names=d.class_names, hash=manifest.hash,
                    annotations=manifest.annotations)
    keep = _codecs(old)
    rates = {n: int(a.get("sample_rate", 0)) for n, a in old.fields.items()}  # a file keeps its rates
    plan = make_plan(job, work, None, final, partial, run_id, lambda _text: None, keep_codecs=keep,
                     new_file=shard is not None, run_trial=run_trial, known_rates=rates)
    spec = plan.spec
    spec.discovery_rejects = list(manifest.rejects)
    spec.num_inputs = found.num_inputs
    spec.commit_every = math.inf
    spec.inventory = inventory.sidecar(final)  # written by _write, once the writer has its Start
    from ..writer.messages import SyncSpec

    if shard is not None:  # a new file: the rejects of unchanged files carried over into it
        spec.discovery_rejects = list(d.kept_rejects) + spec.discovery_rejects
        spec.shard = {"index": shard, "of": shard + 1, "items": [0, len(d.items)]}
        return plan
    spec.sync = SyncSpec(in_place=in_place, tombstones=d.tombstones, kept_rejects=d.kept_rejects)
    return plan


def _write(job, plan, d, found: _Found, final: str, writer, run_id, opts, say, conn, started: list[bool]):
    """Run the writer (and the engine of ``conn`` for new and changed items) over the delta;
    ``started[0]`` is set once the writer has its ``Start``.

    The inventory sidecar is written (whole, then renamed) after ``Start`` and before the first
    ``Store`` or ``Finish``; only ``Finish`` reads it.
    """
    from ..writer.messages import Finish, Start
    from ..writer.process import WriterGone
    from .driver import Driver, abort

    spec = plan.spec
    started[0] = True
    try:
        try:
            writer.send(Start(spec))
            # The synced output's inventory, as the sidecar the writer folds into it at the end.
            if found.inventory is not None:
                inventory.write_arrays(final, *found.inventory)
            else:
                inventory.write_sidecar(final, found.manifest)
            if d.items:
                # Not waited for after Done, as a conversion's writer (conversion/pipeline.py).
                return Driver(job, opts, plan, writer, run_id, say, conn).run()
            writer.send(Finish(job.policy.max_reject_fraction))
            return _wait_done(writer)
        except WriterGone as e:
            raise ConvertError(f"{e}; {final} is as it was before the sync (the undo journal restores it "
                               f"when the same command runs again)") from None
        except KeyboardInterrupt as e:
            abort(writer)
            raise ConvertError(f"{signals.signal_name(e)}: the sync stopped; {final} is as it was before it. "
                               f"Run the same command again to sync.", signals.exit_code(e)) from None
        except BaseException:  # abort() returns at once for a writer that ended (too many rejects: undone)
            abort(writer)
            raise
    finally:
        writer.lifeline.close()
        inventory.remove_sidecar(final)


def _wait_done(writer):
    """The writer's summary when no batch was sent (a sync that only removes)."""
    from ..writer.messages import Done, Failed, WriterDied

    while True:
        msg = writer.outbox.get(timeout=600)
        if isinstance(msg, Done):
            if not msg.ok:
                writer.process.join(timeout=30)
                raise ConvertError("too many rejects (policy.max_reject_fraction); the sync is undone", 1)
            return msg
        if isinstance(msg, (Failed, WriterDied)):
            raise ConvertError(f"the writer failed: {getattr(msg, 'text', msg)}")


def _codecs(old) -> dict:
    """Each field's codec, as its datasets were created (read back from their labels)."""
    from ..codecs import CODECS, CodecSpec

    out = {}
    for name, attrs in old.fields.items():
        label = str(attrs.get("codec", ""))
        shuffle = label.endswith("+shuffle")
        base = label.removesuffix("+shuffle")
        codec = max((c for c in CODECS if base == c or base.startswith(c + "-")), key=len, default=None)
        if codec is None:
            continue
        rest = base[len(codec):].lstrip("-")
        out[name] = CodecSpec(codec, int(rest) if rest else None, shuffle)
    return out


def _job_for(job: JobConfig, manifest: Manifest, old) -> JobConfig:
    """The job with discovery's names resolved, categories kept in the output's order (new
    ones after), checked against the job that made the output."""
    resolved = resolved_job(job, manifest)
    now, then = dict(resolved.fields), dict(resolved.fields)
    for name, fc in resolved.fields.items():
        was = old.fields.get(name, {}).get("categories")
        if getattr(fc, "dtype", None) == "category" and was is not None:
            was = [str(c) for c in was]
            known = set(was)  # a set: a list's `in` made this quadratic in the categories
            then[name] = dataclasses.replace(fc, categories=was)  # the job as it was
            now[name] = dataclasses.replace(fc, categories=was + [c for c in fc.categories if c not in known])
    if dataclasses.replace(resolved, fields=then).hash() != old.job_hash:
        raise ConvertError(f"{old.path} was made by a different job (its fields, source or output settings "
                           f"differ from {job.file or 'this job'}); a sync only brings in changes of the corpus. "
                           f"Run `h5batch convert --overwrite` to rebuild it", EXIT_BAD_INPUT)
    return dataclasses.replace(resolved, fields=now)


def _live(old, tombstones: dict, stored: dict | None = None) -> dict[str, int]:
    """Live samples per split: rows stored minus rows tombstoned."""
    out = {}
    for s in set(old.n_rows) | set(stored or {}):
        n = (stored or {}).get(s, old.n_rows.get(s, 0))
        dead = set(old.dead[s].tolist() if s in old.dead else []) | set(tombstones.get(s, []))
        out[s] = n - len(dead)
    return {s: out[s] for s in (list(old.splits) + sorted(set(out) - set(old.splits))) if s in out}
