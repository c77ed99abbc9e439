"""The output's life cycle as the driver sees it, before any sample is decoded.

An output ``X.h5`` is written as ``X.h5.partial`` with a commit record and tail files beside
it (:mod:`h5batch.writer.commit`), and renamed to ``X.h5`` by the writer at the end. Here the
driver decides, from what is on disk, what this run does: nothing (``X.h5`` is already the
finished output of this job and corpus), refuse (``X.h5`` exists and overwriting was not
asked for; the folder is not writable; a partial of another job or corpus), resume from a
commit record it can trust, or start afresh after removing a partial it cannot trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
from collections.abc import Callable

from .. import format as fmt
from .. import inventory, shards
from ..config import JobConfig
from ..errors import EXIT_BAD_INPUT, ConvertError
from ..manifest import Manifest
from ..writer.commit import CommitRecord, check_partial, remove_commit_files
from .options import ConvertOptions, ConvertSummary


class OutputFiles:
    """The final path of a job's output, its partial, and what may be done with them."""

    def __init__(self, job: JobConfig, opts: ConvertOptions, say: Callable[[str], None]):
        self.job, self.opts, self.say = job, opts, say
        self.final = os.path.abspath(job.output.path)
        self.partial = self.final + fmt.PARTIAL_SUFFIX

    @property
    def overwrite(self) -> bool:
        return self.opts.overwrite or self.job.output.overwrite

    def check_directory(self) -> None:
        """The output folder exists (made if need be) and is writable."""
        out_dir = os.path.dirname(self.final)
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as e:
            raise ConvertError(f"output directory {out_dir} cannot be created: {e.strerror}", EXIT_BAD_INPUT) from e
        if not os.access(out_dir, os.W_OK):
            raise ConvertError(f"output directory {out_dir} is not writable", EXIT_BAD_INPUT)

    def _exists_message(self, change: str | None) -> str:
        """The output is there and is not replaced. ``change``: None where another job made
        it, else what changed in the corpus since (may be empty): ``h5batch sync`` brings
        that in."""
        hint = "" if change is None else (f"; it was made by this job from an earlier state of the corpus{change}: "
                                          f"`h5batch sync {self.job.file or 'JOB'}` converts only what changed")
        return f"{self.final} already exists{hint}; pass --overwrite (or output.overwrite: true) to replace it"

    def check_finished(self, summary: ConvertSummary) -> None:
        """After the writer's rename, before any success line: the file is there, complete,
        holds what the writer said, and its index passes the reader's checks
        (:mod:`h5batch.tools.index`: offsets, shapes, labels, row counts; no sample data is
        read). An exit code of 0 promises all of that."""
        from ..errors import CorruptFileError
        from ..tools.index import check_complete, open_file, read_index

        try:
            with open_file(summary.path) as f:
                check_complete(f, summary.path)
                fields = json.loads(f.attrs[fmt.ATTR_FIELDS])
                counts = {s: read_index(f, summary.path, s, fields)[0] for s in summary.counts}
        except (OSError, KeyError, ValueError, CorruptFileError) as e:
            raise ConvertError(f"{summary.path}: the finished output does not pass its checks ({e}); "
                               f"the run did not succeed") from e
        if counts != summary.counts:
            raise ConvertError(f"{summary.path}: the finished output holds {counts} samples, the writer "
                               f"stored {summary.counts}; the run did not succeed")

    def already_done(self, manifest: Manifest) -> ConvertSummary | None:
        """The finished output of this very job and corpus, if it exists (e.g. a run killed
        between the final rename and its last message): nothing left to do. Any other output
        there is refused unless overwriting was asked for; when it is the output of this very
        job and only the corpus changed, the message says that ``h5batch sync`` converts just
        the change."""
        if not os.path.exists(self.final) or self.overwrite:
            return None
        import h5py

        try:
            with h5py.File(self.final, "r") as f:
                same_job = f.attrs.get(fmt.ATTR_JOB_HASH) == self.job.hash()
                same = (bool(f.attrs.get(fmt.ATTR_COMPLETE)) and same_job
                        and f.attrs.get(fmt.ATTR_MANIFEST_HASH) == manifest.hash)
                counts = _live_counts(f, self.final, manifest.splits)
                n_rej = int(f[f"{fmt.REJECTS}/path"].shape[0]) if f"{fmt.REJECTS}/path" in f else 0
        except OSError:
            same_job = same = False
        if not same:
            raise ConvertError(self._exists_message("" if same_job else None), EXIT_BAD_INPUT)
        self.discard_partial()
        return self._complete(counts, n_rej, "discovery")

    def already_done_incrementally(self) -> ConvertSummary | None:
        """:meth:`already_done` without a full discovery, answered the way ``h5batch sync``
        finds an output up to date (:func:`h5batch.conversion.sync.compare`: a stat pass of
        the corpus against the output's inventory). Reason: a script that runs ``convert``
        before each training paid a full discovery to hear that nothing changed; the stat
        pass costs a fraction of it.

        A corpus that changed since is answered here too: the output exists and is not
        overwritten, so the run stops either way, and the message says what a sync would
        bring in. None: no answer this way (no output, overwriting, a partial beside it, no
        inventory, a layout whose discovery cannot be incremental, another job, a file
        that is not complete); :meth:`already_done` decides, after the full discovery."""
        if self.overwrite or not os.path.exists(self.final) or os.path.exists(self.partial):
            return None
        from ..errors import H5batchError
        from .sync import compare

        try:
            c = compare(self.job, self.final, self.say, full=False)
        except (H5batchError, OSError, KeyError, ValueError):
            return None  # another job (compare says which), a damaged file: the full path says what is wrong
        if c is None:
            return None
        if not c.up_to_date:
            d = c.delta()
            what = ", ".join(f"{n} {w}" for n, w in ((d.new, "new"), (d.changed, "changed"), (d.removed, "removed")) if n)
            raise ConvertError(self._exists_message(f" ({what} files)" if what else ""), EXIT_BAD_INPUT)
        return self._complete(c.live(), len(c.old.rejects), "inventory")  # what the comparison read already

    def _complete(self, counts: dict[str, int], n_rejects: int, checked: str) -> ConvertSummary:
        """The summary of a run that found its output already complete; ``checked``: how
        (``inventory``: the stat pass against the output's inventory; ``discovery``: a full
        discovery's manifest hash)."""
        self.say(f"{self.final} is already complete for this job and corpus; nothing to do")
        rejects_file = fmt.rejects_file(self.final)
        return ConvertSummary(path=self.final, counts=counts, rejects=n_rejects, inputs=0, seconds=0.0,
                              bytes_decoded=0, output_bytes=os.path.getsize(self.final),
                              rejects_file=rejects_file if os.path.exists(rejects_file) else "",
                              extra={"already_complete": True, "checked": checked})

    def require_samples(self, manifest: Manifest) -> None:
        """A corpus without a single sample is an error; its rejects are listed beside the
        output, so that every input file is accounted for even then."""
        if manifest.items:
            return
        detail = ""
        if manifest.rejects:
            rej_path = fmt.rejects_file(self.final)
            os.makedirs(os.path.dirname(rej_path), exist_ok=True)
            fmt.write_rejects(rej_path, manifest.rejects)
            first = manifest.rejects[0]
            detail = (f"; {len(manifest.rejects)} files rejected, e.g. {first.path}: {first.reason} "
                      f"(all listed in {rej_path})")
        src = self.job.source
        raise ConvertError(f"no samples found under {src.root} (layout {src.layout}){detail}", EXIT_BAD_INPUT)

    def resume_record(self, manifest: Manifest) -> CommitRecord | None:
        """The commit record to continue from, or None to start afresh."""
        if not os.path.exists(self.partial):
            return None
        record = CommitRecord.read(self.partial)
        if self.opts.restart or not self.opts.resume:
            self.say(f"discarding partial output {self.partial} (--restart)")
            return self.discard_partial()
        if record is None:
            self.say(f"partial output {self.partial} has no valid commit record and cannot be trusted; starting over")
            return self.discard_partial()
        if record.job_hash != self.job.hash() or record.manifest_hash != manifest.hash:
            what = "job file" if record.job_hash != self.job.hash() else "corpus"
            raise ConvertError(
                f"{self.partial} was made from a different {what} than now; rerun with --restart to "
                f"discard it and start over", EXIT_BAD_INPUT)
        problem = check_partial(self.partial, record, tuple(self.job.fields))
        if problem:
            self.say(f"partial output {self.partial} cannot be trusted ({problem}); starting over")
            return self.discard_partial()
        if self.overwrite:  # --overwrite is about the finished output, not the same job's interrupted run
            self.say(f"--overwrite replaces {self.final} when this run ends; the interrupted run of the same "
                     f"job and corpus ({self.partial}) is resumed first, not redone (--restart redoes it)")
        return record

    def check_writers(self) -> None:
        """Refuse to resume an interrupted run made with another ``output.writers`` (its
        partial, or its shard files without the joined output); with ``--restart`` they are
        discarded. Shard files of another number beside a finished output this run replaces
        are removed."""
        n = self.job.output.writers
        others: dict[int, list[str]] = {}
        if n > 1 and os.path.exists(self.partial):
            others[1] = [self.partial]
        stem, ext = os.path.splitext(self.final)
        for p in glob.glob(glob.escape(stem) + ".shard-*-of-*" + ext + "*"):
            m = re.fullmatch(re.escape(stem) + r"\.shard-\d+-of-(\d+)" + re.escape(ext) + r".*", p)
            if m and int(m.group(1)) != n:
                others.setdefault(int(m.group(1)), []).append(p)
        for m, files in sorted(others.items()):
            if self.opts.restart or (m > 1 and os.path.exists(self.final)):
                self.say(f"removing {len(files)} files of a run with output.writers {m}")
                for p in files:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
                if m == 1:
                    self.discard_partial()
                continue
            raise ConvertError(
                f"{files[0]} is left by an interrupted run with output.writers {m}; this job has output.writers "
                f"{n}: run it with output.writers {m} to resume that run, or pass --restart to discard it",
                EXIT_BAD_INPUT)

    def shard(self, k: int) -> OutputFiles:
        """The output files of shard ``k`` (h5batch/shards.py) as an output of their own."""
        path = shards.shard_path(self.final, k, self.job.output.writers)
        job = dataclasses.replace(self.job, output=dataclasses.replace(self.job.output, path=path))
        return OutputFiles(job, self.opts, self.say)

    def shard_done(self, manifest: Manifest) -> bool:
        """This output (a shard) is complete, of this job and corpus; else any file of that
        name is removed."""
        if not os.path.exists(self.final):
            return False
        import h5py

        try:
            with h5py.File(self.final, "r") as f:
                a = f.attrs
                ok = (bool(a.get(fmt.ATTR_COMPLETE)) and a.get(fmt.ATTR_JOB_HASH) == self.job.hash()
                      and a.get(fmt.ATTR_MANIFEST_HASH) == manifest.hash)
        except OSError:
            ok = False
        if not ok:
            os.unlink(self.final)
        return ok

    def discard_partial(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.partial)
        remove_commit_files(self.partial)
        inventory.remove_sidecar(self.partial)
        return None


def _live_counts(f, path: str, splits) -> dict[str, int]:
    """Samples per split that readers yield: the rows stored minus those a sync tombstoned
    (the ``num_samples`` attribute counts rows). For a full discovery's check; the
    incremental one has them from its comparison (:meth:`~.sync.Comparison.live`)."""
    from ..tools.index import tombstones

    out = {}
    for s in splits:
        if s in f:
            n = int(f[s].attrs.get(fmt.ATTR_NUM_SAMPLES, 0))
            out[s] = n - len(tombstones(f, path, s, n))
    return out
