"""Orchestration of one conversion: manifest -> Dask decode -> shared memory -> writer.

The driver (this module) never touches pixel or sample data. It submits batches to Dask
with a bounded number in flight (backpressure: a batch counts until the writer has stored
it, so memory stays flat whatever the corpus size), forwards finished batches to the
writer process strictly in manifest order, isolates files that crash their worker by
splitting the batch, and reports progress.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..codecs import CodecSpec
from ..config import JobConfig
from ..discover import Manifest, Reject, discover
from ..errors import ConvertError
from ..transport.packing import Packed, to_shm
from ..transport.pipe import PipeQueue
from ..transport.segments import hostname, new_run_id, remove_segments, remove_stale_segments
from ..writer.output import WriterSpec, commit_path, remove_tail_files, writer_main
from .auto import resolve
from .cluster import connect, default_workers
from .progress import Progress
from .worker import BatchResult, BatchTask, decode_batch


def writer_context() -> Any:
    """The multiprocessing context the writer process is started with.

    ``forkserver`` with :mod:`h5batch.writer.output` preloaded where the platform has it: the first
    conversion in a process starts the fork server (as long as a spawn), and every later one
    forks the writer from it with h5py already imported, in ~10 ms instead of ~0.25 s (a
    quarter of converting 1,000 pairs on a warm cluster). Forking the driver itself is not
    safe: it runs Dask's threads. The fork server is single-threaded; it fixes its working
    directory, umask and environment when it starts, so the writer is sent the driver's
    current ones (:attr:`WriterSpec.cwd`, :attr:`WriterSpec.umask`). Elsewhere: ``spawn``.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Only effective before the (process-wide) fork server starts; '__main__' is the default.
    ctx.set_forkserver_preload(["__main__", "h5batch.writer.output"])
    return ctx


def current_umask() -> int | None:
    """This process's umask, read without changing it (Linux), else None."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return None



@dataclass
class ConvertOptions:
    """Run-time choices that do not change the output's content."""

    resume: bool = True  # continue a matching partial output
    restart: bool = False  # discard a partial output even if it does not match
    overwrite: bool = False
    progress: bool | None = None  # None: a bar on a terminal, log lines otherwise
    log: Any = None  # file object for messages (default stderr)
    fault_pause: str | None = None  # tests only: see WriterSpec.pause_at
    faults: tuple[tuple[str, str], ...] = ()  # tests only: see tasks.Faults


@dataclass
class ConvertSummary:
    """What a conversion did (figures for the summary line and for benchmarks)."""

    path: str
    counts: dict[str, int]
    rejects: int
    inputs: int
    seconds: float
    bytes_decoded: int
    output_bytes: int
    resumed_from: int = 0
    rejects_file: str = ""
    cluster: str = ""
    dashboard: str | None = None
    ok: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(self.counts.values())


def versions() -> dict[str, str]:
    """Versions of what shapes the bytes of the output (stored in the file)."""
    import dask
    import h5py
    import hdf5plugin
    import PIL
    import soundfile

    out = {"h5batch": __version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
           "numpy": np.__version__, "hdf5plugin": hdf5plugin.version, "soundfile": soundfile.__version__,
           "pillow": PIL.__version__, "dask": dask.__version__, "python": sys.version.split()[0]}
    try:
        import blosc2

        out["blosc2"] = blosc2.__version__
    except ImportError:
        pass
    return out


class TaskList(Sequence):
    """The batches of a job, built on demand: only the batch boundaries are kept, so the
    driver holds no per-file state beyond the manifest itself."""

    def __init__(self, job: JobConfig, manifest: Manifest, run_id: str, writer_host: str,
                 faults: tuple[tuple[str, str], ...], batch_size: int):
        self.job, self.manifest, self.run_id, self.writer_host, self.faults = job, manifest, run_id, writer_host, faults
        self.fields = tuple(job.fields.items())
        self.root = os.path.abspath(manifest.root)
        bs = batch_size
        starts = []
        items = manifest.items
        i = 0
        while i < len(items):  # batches of batch_size items, never across splits
            starts.append(i)
            split = items[i].split
            j = min(i + bs, len(items))
            while items[j - 1].split != split:
                j -= 1
            i = j
        self.starts = np.asarray(starts + [len(items)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def first_item(self, index: int) -> int:
        """Manifest position of the first item of batch ``index`` (``len`` for the end)."""
        return int(self.starts[index])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        lo, hi = int(self.starts[index]), int(self.starts[index + 1])
        m = self.manifest
        chunk = tuple((it.paths, m.label_index(it.label)) for it in m.items[lo:hi])
        return BatchTask(index, m.items[lo].split, lo, chunk, self.root, self.fields, self.run_id,
                         self.job.cluster.transport, self.writer_host, self.job.policy.decode_timeout, self.faults)


def make_tasks(job: JobConfig, manifest: Manifest, run_id: str, writer_host: str,
               faults: tuple[tuple[str, str], ...] = (), batch_size: int | None = None) -> TaskList:
    """Cut the manifest into batches of ``batch_size`` items (default: ``cluster.batch_size``,
    or :func:`h5batch.convert.auto.resolve`'s choice), never across splits."""
    if batch_size is None:
        batch_size = resolve(job, manifest).batch_size  # the job's integer, or auto's choice
    return TaskList(job, manifest, run_id, writer_host, faults, batch_size)


def _empty_result(task: BatchTask, rejects: list[Reject], nfields: int) -> BatchResult:
    return BatchResult(task.index, task.split, task.start, Packed((), 0), np.zeros(0, np.int64), [],
                       np.zeros((0, nfields), np.uint32), rejects, len(task.items))


def _generate(job: JobConfig, log) -> None:
    """Create a generated corpus (``source.generate``) when its root is missing or empty.
    A root holding anything else is a corpus already (say, the user's own, given with
    ``--set source.root=...`` to a job that generates by default): it is used as it is."""
    root = Path(job.source.root)
    if not job.source.generate or (root / ".h5batch-synth.json").exists():
        return
    if root.is_dir() and any(root.iterdir()):
        return
    from .. import synth

    makers = {"demo": synth.make_demo_corpus, "paired_audio": synth.make_paired_audio}
    if job.source.generate not in makers:
        raise ConvertError(f"{job.file}: source.generate: unknown corpus {job.source.generate!r} "
                           f"(known: {', '.join(makers)})", 2)
    print(f"generating the {job.source.generate} corpus into {root} ...", file=log)
    makers[job.source.generate](root)


class _Aligner:
    """Predicts the dataset row at which each batch's first sample will land, so workers
    can compress whole chunks of fixed-shape fields (see ``transport.ChunkSet``)."""

    def __init__(self, job: JobConfig, written: dict[str, int], codecs: dict[str, CodecSpec]):
        from ..codecs import self_check
        from ..decode import fixed_sample_shape, rows_per_chunk

        self.fields: list[tuple[str, int, CodecSpec]] = []
        where = job.cluster.compress_on
        if where == "writer" or (where == "auto" and job.cluster.kind == "local"):
            names: list[str] = []
        else:
            names = list(job.fields)
        for name, fc in ((n, job.fields[n]) for n in names):
            fixed = fixed_sample_shape(fc)
            codec = codecs[name]
            # Uncompressed chunks need no work anywhere: the writer stores the rows as they are.
            if fixed and codec.name != "none" and self_check(codec, fixed[1].str):
                self.fields.append((name, rows_per_chunk(fixed[0], fixed[1], job.output.chunk_bytes), codec))
        self.next_row = dict(written)

    def place(self, task: BatchTask) -> BatchTask:
        if not self.fields:
            return task
        row = self.next_row.get(task.split, 0)
        self.next_row[task.split] = row + len(task.items)
        return dataclasses.replace(task, align=tuple((n, row, k, c) for n, k, c in self.fields))

    def correct(self, task: BatchTask, written: int) -> None:
        """A batch is stored: its rejects shift every later batch of its split."""
        if self.fields:
            self.next_row[task.split] -= len(task.items) - written


@dataclass
class _Part:
    """Items ``[lo, hi)`` of a batch and, once decoded, their result."""

    lo: int
    hi: int
    result: BatchResult | None = None
    confirming: bool = False  # a single file that failed once is being tried again


class _Slot:
    """One manifest batch: its parts (a batch whose worker keeps dying is split in two,
    recursively, down to the crashing file) and their results."""

    def __init__(self, task: BatchTask):
        self.task = task
        self.parts: list[_Part] = [_Part(0, len(task.items))]
        self.acked = 0  # parts the writer has stored
        self.written = 0  # samples they held

    def complete(self) -> bool:
        return all(p.result is not None for p in self.parts)


class Converter:
    """One conversion run. Use :func:`convert`."""

    def __init__(self, job: JobConfig, opts: ConvertOptions):
        self.job = job
        self.opts = opts
        self.log = opts.log or sys.stderr
        self.final = os.path.abspath(job.output.path)
        self.partial = self.final + ".partial"
        self.run_id = new_run_id()
        self.events: queue.Queue = queue.Queue()

    def say(self, text: str) -> None:
        print(text, file=self.log, flush=True)

    # -- preparation ---------------------------------------------------------

    def _check_output(self) -> None:
        out_dir = os.path.dirname(self.final)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise ConvertError(f"output directory {out_dir} cannot be created: {e.strerror}", 2) from e
        if not os.access(out_dir, os.W_OK):
            raise ConvertError(f"output directory {out_dir} is not writable", 2)
        if os.path.exists(self.final) and not (self.opts.overwrite or self.job.output.overwrite):
            raise ConvertError(f"{self.final} already exists; pass --overwrite (or output.overwrite: true) to replace it", 2)

    def _already_done(self, manifest: Manifest) -> ConvertSummary | None:
        """The finished output of this very job and corpus, if it exists (e.g. a run killed
        between the final rename and its last message): nothing left to do."""
        if not os.path.exists(self.final) or self.opts.overwrite or self.job.output.overwrite:
            return None
        import h5py

        try:
            with h5py.File(self.final, "r") as f:
                same = (bool(f.attrs.get("complete")) and f.attrs.get("job_hash") == self.job.hash()
                        and f.attrs.get("manifest_hash") == manifest.hash)
                counts = {s: int(f[s].attrs.get("num_samples", 0)) for s in manifest.splits if s in f}
                n_rej = int(f["rejects/path"].shape[0]) if "rejects/path" in f else 0
        except OSError:
            return None
        if not same:
            return None
        self._discard_partial()
        return ConvertSummary(path=self.final, counts=counts, rejects=n_rej, inputs=0, seconds=0.0,
                              bytes_decoded=0, output_bytes=os.path.getsize(self.final),
                              extra={"already_complete": True})

    def _resume_record(self, manifest: Manifest) -> dict[str, Any] | None:
        """The commit record to continue from, or None to start afresh."""
        if not os.path.exists(self.partial):
            return None
        cpath = commit_path(self.partial)
        record = None
        if os.path.exists(cpath):
            try:
                record = json.loads(Path(cpath).read_text())
            except (OSError, ValueError):
                record = None
        if self.opts.restart or not self.opts.resume:
            self.say(f"discarding partial output {self.partial} (--restart)")
            return self._discard_partial()
        if record is None:
            self.say(f"partial output {self.partial} has no valid commit record and cannot be trusted; starting over")
            return self._discard_partial()
        if record.get("job_hash") != self.job.hash() or record.get("manifest_hash") != manifest.hash:
            what = "job file" if record.get("job_hash") != self.job.hash() else "corpus"
            raise ConvertError(
                f"{self.partial} was made from a different {what} than now; rerun with --restart to "
                f"discard it and start over", 2)
        from ..writer.resume import check_partial

        problem = check_partial(self.partial, record, tuple(self.job.fields))
        if problem:
            self.say(f"partial output {self.partial} cannot be trusted ({problem}); starting over")
            return self._discard_partial()
        return record

    def _discard_partial(self) -> None:
        for p in (self.partial, commit_path(self.partial)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        remove_tail_files(self.partial)
        return None

    # -- main loop -------------------------------------------------------------

    def run(self) -> ConvertSummary:
        t0 = time.perf_counter()
        stale = remove_stale_segments()
        if stale:
            self.say(f"removed {len(stale)} shared-memory segments left by dead runs")
        # The writer process starts first: importing h5py and the codecs takes it ~0.2 s,
        # which overlaps discovery, the codec trial and pre-flight. It waits for its spec.
        ctx = writer_context()
        inbox, outbox = PipeQueue.create(ctx), PipeQueue.create(ctx)
        lifeline, self._lifeline = ctx.Pipe(duplex=False)  # the writer's way to see us die
        writer = ctx.Process(target=writer_main, args=(inbox, outbox, lifeline), name="h5batch-writer",
                             daemon=True)
        writer.start()
        lifeline.close()
        self._writer_busy = False
        try:
            summary = self._run(writer, inbox, outbox)
        finally:
            if not self._writer_busy:  # never got a job: let it go
                inbox.put(("quit",))
                writer.join(timeout=10)
                if writer.is_alive():
                    writer.kill()
            self._lifeline.close()
        summary.seconds = time.perf_counter() - t0
        return summary

    def _run(self, writer, inbox, outbox) -> ConvertSummary:
        job = self.job
        _generate(job, self.log)
        manifest = discover(job)
        done = self._already_done(manifest)
        if done is not None:
            self.say(f"{self.final} is already complete for this job and corpus; nothing to do")
            return done
        self._check_output()
        if not manifest.items:
            detail = ""
            if manifest.rejects:
                rej_path = self.final.rsplit(".", 1)[0] + ".rejects.jsonl"
                os.makedirs(os.path.dirname(rej_path), exist_ok=True)
                with open(rej_path, "w") as fh:
                    for r in manifest.rejects:
                        fh.write(json.dumps({"path": r.path, "stage": r.stage, "reason": r.reason}) + "\n")
                first = manifest.rejects[0]
                detail = (f"; {len(manifest.rejects)} files rejected, e.g. {first.path}: {first.reason} "
                          f"(all listed in {rej_path})")
            raise ConvertError(f"no samples found under {job.source.root} (layout {job.source.layout}){detail}", 2)
        record = self._resume_record(manifest)
        auto = resolve(job, manifest, self.opts.faults)
        for line in auto.describe(job):
            self.say(line)
        self.codecs = {name: c.codec for name, c in auto.codecs.items()}
        codec_notes = {name: c.why() for name, c in auto.codecs.items()}
        recorded = {n: CodecSpec(*v) for n, v in record.get("codecs", {}).items()} if record else {}
        if recorded:
            # The partial file's datasets already have their filters: keep writing those
            # (and describe fields created from now on the way the first run did).
            if recorded != self.codecs:
                self.say("resuming with the interrupted run's codecs: "
                         + ", ".join(f"{n} {c.label()}" for n, c in recorded.items()))
            self.codecs = recorded
            codec_notes = dict(record.get("codec_notes", {}))
        batch_size = auto.batch_size
        if record and record.get("batch_size") and record["batch_size"] != batch_size:
            # Progress is recorded in batches: the rest must be cut the same way.
            batch_size = int(record["batch_size"])
            self.say(f"resuming with the interrupted run's batch size ({batch_size} items, not {auto.batch_size})")
        self.batch_bytes = batch_size * auto.item_bytes
        num_inputs = sum(len(it.paths) for it in manifest.items) + len(manifest.rejects)
        n_workers = job.cluster.workers or default_workers()
        spec = WriterSpec(
            partial_path=self.partial, final_path=self.final,
            job_json=json.dumps(job.public_dict(), sort_keys=True), job_hash=job.hash(),
            manifest_hash=manifest.hash, splits=manifest.splits, fields=tuple(job.fields.items()),
            class_names=manifest.class_names, labelled=job.labelled,
            codecs=self.codecs,
            chunk_bytes=job.output.chunk_bytes, cache_bytes=job.output.cache_bytes,
            discovery_rejects=manifest.rejects, num_inputs=num_inputs,
            commit_every=job.policy.commit_every, threads=max(2, min(4, n_workers)),
            resume=record, versions=versions(), pause_at=self.opts.fault_pause, batch_size=batch_size,
            codec_notes=codec_notes, cwd=os.getcwd(), umask=current_umask(),
        )
        tasks = make_tasks(job, manifest, self.run_id, hostname(), self.opts.faults, batch_size)
        inbox.put(("spec", spec))
        self._writer_busy = True
        try:
            # The commit record says where to start, so decoding begins while the writer
            # process is still importing h5py; batches queue in its pipe until it is ready.
            start = record["next_batch"] if record else 0
            written = {split: info["samples"] for split, info in record["splits"].items()} if record else {}
            if start:
                self.say(f"resuming {self.partial}: {start} of {len(tasks)} batches already committed")
            summary = self._convert(tasks, start, written, inbox, outbox, writer, manifest, num_inputs)
        except KeyboardInterrupt:
            self._abort(inbox, outbox, writer)
            raise ConvertError(f"interrupted; progress is committed in {self.partial}. "
                               f"Run the same command again to resume.", 130) from None
        except BaseException:
            self._abort(inbox, outbox, writer)
            raise
        finally:
            remove_segments(self.run_id)
        summary.resumed_from = start
        return summary

    def _abort(self, inbox, outbox, writer) -> None:
        """Commit what is written, stop the writer; cluster teardown happens in connect()."""
        if writer.is_alive():
            inbox.put(("abort",))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and writer.is_alive():
                try:
                    msg = outbox.get(timeout=0.5)
                    if msg[0] in ("aborted", "error"):
                        break
                except queue.Empty:
                    pass
            writer.join(timeout=10)
            if writer.is_alive():
                writer.kill()

    def _convert(self, tasks, start, written, inbox, outbox, writer, manifest, num_inputs) -> ConvertSummary:
        job = self.job
        n_batches = len(tasks)
        total_items = len(manifest.items)
        import dask
        import distributed  # noqa: F401  (its config defaults must exist before dask.config.set)

        # A task whose worker dies is re-run up to policy.retries more times before Dask
        # gives up (KilledWorker); then the batch is split to isolate the culprit.
        # worker-saturation 1.0 keeps queued tasks on the scheduler, so a worker that dies
        # takes only its running task down with it, not innocent tasks queued behind it.
        settings = {"distributed.scheduler.allowed-failures": job.policy.retries,
                    "distributed.scheduler.worker-saturation": 1.0}
        with dask.config.set(settings), connect(job.cluster) as conn:
            client = conn.client
            self.say(f"cluster: {conn.description}" + (f"; dashboard {conn.dashboard}" if conn.dashboard else ""))
            from .preflight import preflight  # late: preflight imports this module

            preflight(client, job, manifest, self.say)
            n_workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
            # Batches in flight: enough to keep every worker busy, at most ~1 GiB of
            # decoded samples waiting in shared memory.
            window = job.cluster.max_in_flight or max(4, min(3 * n_workers, (1 << 30) // max(1, self.batch_bytes)))
            slots: dict[int, _Slot] = {}
            futures: dict[Any, tuple[int, int]] = {}  # future -> (batch index, part position)
            next_submit = next_forward = acked = start
            done_items = tasks.first_item(start)
            rejects = 0
            bytes_decoded = 0
            prog = Progress(total_items, done_items, enabled=self.opts.progress, log=self.log)
            reader = threading.Thread(target=self._pump_writer, args=(outbox, writer), daemon=True)
            reader.start()

            # Worker-side compression: where each split's next batch will start, assuming the
            # batches in flight lose no samples (a wrong guess only costs the writer a decode).
            align = _Aligner(job, written, self.codecs)

            def submit(index: int, lo: int, hi: int) -> None:
                task = slots[index].task.sub(lo, hi) if (lo, hi) != (0, len(slots[index].task.items)) else slots[index].task
                fut = client.submit(decode_batch, task, pure=False, retries=0,
                                    key=f"h5batch-decode-{self.run_id}-{index}-{lo}-{hi}")
                futures[fut] = (index, lo)
                fut.add_done_callback(lambda f: self.events.put(("future", f)))

            while acked < n_batches:
                while next_submit < n_batches and next_submit - acked < window:
                    slots[next_submit] = _Slot(align.place(tasks[next_submit]))
                    submit(next_submit, 0, len(tasks[next_submit].items))
                    next_submit += 1
                kind, payload = self.events.get()
                if kind == "future":
                    self._on_future(payload, futures, slots, submit)
                    while next_forward in slots and slots[next_forward].complete():
                        slot = slots[next_forward]
                        for k, part in enumerate(slot.parts):
                            part.result.final_part = k == len(slot.parts) - 1
                            inbox.put(("batch", part.result))
                        next_forward += 1
                elif kind == "writer":
                    msg = payload
                    if msg[0] == "ack":
                        slot = slots[msg[1]]
                        slot.acked += 1
                        slot.written += msg[2]
                        if slot.acked == len(slot.parts):
                            align.correct(slot.task, slot.written)
                            rejects += sum(len(p.result.rejects) for p in slot.parts)
                            bytes_decoded += sum(p.result.packed.nbytes for p in slot.parts)
                            prog.update(len(slot.task.items), rejects=rejects, nbytes=bytes_decoded)
                            del slots[msg[1]]
                            acked += 1
                    elif msg[0] == "error":
                        raise ConvertError(f"writer failed: {msg[1]}")
                    elif msg[0] == "dead":
                        raise ConvertError(f"writer process died (exit code {msg[1]}); "
                                           f"rerun the same command to resume from the last commit")
            prog.close()
            # The writer counts every reject (discovery, decode, write, and those of batches
            # committed by an earlier run) and keeps the file partial when there are too many.
            inbox.put(("finish", job.policy.max_reject_fraction))
            s = self._wait_for(("done",))[1]
            summary = ConvertSummary(
                path=s["path"], counts=s["counts"], rejects=s["rejects"], inputs=num_inputs,
                seconds=0.0, bytes_decoded=s["bytes_decoded"], output_bytes=os.path.getsize(s["path"]),
                rejects_file=s["rejects_file"], cluster=conn.description, dashboard=conn.dashboard, ok=s["ok"],
                extra={"writer": s["stats"]})
            writer.join(timeout=30)
            if not s["ok"]:
                fraction = s["rejects"] / max(1, num_inputs)
                raise ConvertError(
                    f"{s['rejects']} of {num_inputs} input files rejected ({fraction:.1%}), above "
                    f"policy.max_reject_fraction {job.policy.max_reject_fraction:.1%}; output left as "
                    f"{self.partial}, reasons in {s['rejects_file']} (raise policy.max_reject_fraction "
                    f"and run again to accept it)", 1)
            return summary

    def _pump_writer(self, outbox, writer) -> None:
        """Forward writer messages to the event queue; report a dead writer."""
        while True:
            try:
                msg = outbox.get(timeout=1.0)
            except queue.Empty:
                if not writer.is_alive():
                    self.events.put(("writer", ("dead", writer.exitcode)))
                    return
                continue
            except (EOFError, OSError):
                return
            self.events.put(("writer", msg))
            if msg[0] in ("done", "error", "aborted"):
                return

    def _wait_for(self, kinds: tuple[str, ...]) -> tuple:
        while True:
            kind, msg = self.events.get()
            if kind != "writer":
                continue
            if msg[0] in kinds:
                return msg
            if msg[0] == "error":
                raise ConvertError(f"writer failed: {msg[1]}")
            if msg[0] == "dead":
                raise ConvertError(f"writer process died (exit code {msg[1]})")

    def _on_future(self, fut, futures, slots, submit) -> None:
        index, lo = futures.pop(fut)
        slot = slots[index]
        pos = next(i for i, p in enumerate(slot.parts) if p.lo == lo and p.result is None)
        part = slot.parts[pos]
        if fut.status == "finished":
            res: BatchResult = fut.result()
            if res.packed.shm_name is None and res.packed.payload is not None:
                res.packed = to_shm(res.packed, self.run_id)  # network transport
            if res.stuck and res.worker_address:
                self._restart_worker(fut.client, res.worker_address)
            part.result = res
            return
        if fut.status == "cancelled":
            return
        exc = fut.exception()
        lo_, hi_ = part.lo, part.hi
        if hi_ - lo_ > 1:
            # Isolate the file that takes its worker down: split the batch and retry both halves.
            mid = (lo_ + hi_) // 2
            slot.parts[pos:pos + 1] = [_Part(lo_, mid), _Part(mid, hi_)]
            submit(index, lo_, mid)
            submit(index, mid, hi_)
            return
        if not part.confirming:
            # A single file failed: confirm once on its own before blaming it (its worker
            # may have died of another task).
            part.confirming = True
            submit(index, lo_, hi_)
            return
        paths = slot.task.items[lo_][0]
        reason = f"worker failed while decoding this file: {type(exc).__name__}: {exc}"
        sub = slot.task.sub(lo_, hi_)
        part.result = _empty_result(sub, [Reject(p, "worker", reason) for p in paths], len(sub.fields))


    def _restart_worker(self, client, address: str) -> None:
        """Reclaim a worker whose decode thread is stuck on a hung file (in the background;
        workers without a nanny cannot be restarted and just keep the lost thread)."""
        self.say(f"restarting worker {address}: a decode there exceeded policy.decode_timeout")

        def restart() -> None:
            try:
                client.restart_workers([address], timeout=120, raise_for_error=False)
            except Exception as e:  # noqa: BLE001 - best effort; the job goes on either way
                self.say(f"could not restart worker {address}: {e}")

        threading.Thread(target=restart, daemon=True).start()


def convert(job: JobConfig, opts: ConvertOptions | None = None) -> ConvertSummary:
    """Convert the corpus of ``job`` into its HDF5 output. Raises :class:`ConvertError`."""
    return Converter(job, opts or ConvertOptions()).run()
