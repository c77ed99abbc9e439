"""``h5batch verify``: check a finished output against its own checksums, its invariants
and, optionally, the source files it was made from.

What is checked (each failure is a :class:`Problem` naming the split, field, sample index
and source file):

* **data**: every sample of every field is re-read and its crc32 compared with
  ``/<split>/checksum``, read in big chunk-aligned slices, never per sample. A chunk that
  cannot be read back is reported as corrupt, naming every sample it covers;
* **structure**: what the reader checks (:mod:`h5batch.tools.index`, the same rules) over
  every field, with offsets ending exactly at ``len(values)``; every per-sample dataset of a
  split has the same length; labels index ``/class_names`` (``-1`` = no label); the
  ``complete`` attribute is true; every view (``/<split>/views/<name>``) holds rows in range,
  sorted, each once;
* **nothing lost**: source paths + rejects = the ``num_inputs`` root attribute, no path
  is both a sample's file and a reject, no file is the source of two samples, and
  ``OUT.rejects.jsonl`` (when present beside the file) lists the same rejects;
* **sources** (``sources=True``): every sample's files are decoded again with
  :func:`h5batch.fields.decode_field` and the field settings stored in the file, and must
  match the stored arrays exactly (dtype, shape and bytes).

``h5batch verify`` (:mod:`h5batch.commands.verify`) prints the report.

Size: one verifier whose checks share its open file, its report and the sources it has
read; split into modules they would pass all three around.
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from .. import shards
from ..errors import CorruptFileError, VerifyError
from . import index, views

STAGES = {"discover", "decode", "worker", "timeout", "write", fmt.STAGE_EXCLUDED}
MAX_NAMED = 8  # samples named in one corrupt-chunk problem before "... and N more"



@dataclass(frozen=True)
class Problem:
    """One thing wrong. ``where`` is ``split/field[index]``, ``split/field`` or ``/``."""

    where: str
    what: str
    source: str = ""

    def __str__(self) -> str:
        return f"{self.where}" + (f" ({self.source})" if self.source else "") + f": {self.what}"


@dataclass
class VerifyReport:
    """What :func:`verify_file` found."""

    path: str
    counts: dict[str, int] = field(default_factory=dict)
    fields: list[str] = field(default_factory=list)
    rejects: int = 0  # every row of /rejects, the excluded ones included
    excluded: int = 0
    inputs: int = 0
    bytes_checked: int = 0
    sources_compared: int = 0
    samples_files: int = 0  # source paths over all splits (samples x files per sample)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def samples(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        text = (f"{self.samples} samples ({counts}) in {len(self.fields)} fields, "
                f"{fmt.rejects_words(self.rejects - self.excluded, self.excluded)}, "
                f"{self.samples_files + self.rejects} of {self.inputs} inputs accounted for; "
                f"{self.bytes_checked / 1e6:.1f} MB checksummed")
        if self.sources_compared:
            text += f"; {self.sources_compared} samples re-decoded from their sources"
        return text


# ---------------------------------------------------------------------------
# Reading helpers
# ---------------------------------------------------------------------------


def _strings(ds: h5py.Dataset) -> np.ndarray:
    if ds.shape[0] == 0:
        return np.zeros(ds.shape, dtype=object)
    return ds.asstr()[...]


def _windows(offsets: np.ndarray, unit_chunk: int, budget: int) -> Iterator[tuple[int, int]]:
    """Runs of samples ``[i, j)`` whose units (rows or elements) span about ``budget``.

    Runs of fixed fields (``offsets == arange(N + 1)``) start and end on chunk boundaries,
    so each chunk is decompressed exactly once.
    """
    n = len(offsets) - 1
    budget = max(unit_chunk, budget // unit_chunk * unit_chunk)
    i = 0
    while i < n:
        target = int(offsets[i]) + budget
        j = int(np.searchsorted(offsets, target, side="right")) - 1
        j = min(n, max(j, i + 1))
        yield i, j
        i = j


class _FieldData:
    """One field of one split seen as units (rows of a fixed dataset, elements of a
    variable one) with per-sample offsets into them (``shapes`` None: a fixed field)."""

    def __init__(self, ds: h5py.Dataset, offsets: np.ndarray, shapes: np.ndarray | None = None):
        self.ds, self.offsets, self.shapes = ds, offsets, shapes
        self.fixed = shapes is None
        self.chunk = int(ds.chunks[0]) if ds.chunks else max(1, ds.shape[0])
        self.unit_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize

    def sample(self, data: np.ndarray, lo: int, s: int) -> np.ndarray:
        """Sample ``s`` out of ``data`` (units ``lo..``), in its stored shape."""
        a, b = int(self.offsets[s]) - lo, int(self.offsets[s + 1]) - lo
        if self.fixed:
            return data[a]
        return data[a:b].reshape(tuple(int(x) for x in self.shapes[s]))

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, list[tuple[int, int, int, str]]]:
        """Units ``[lo, hi)`` in one call; on failure chunk by chunk, returning the chunks
        that cannot be read as ``(chunk index, lo, hi, error)``."""
        try:
            return self.ds[lo:hi], []
        except Exception:  # a filter failure surfaces as OSError; be broad, we report it
            pass
        out = np.zeros((hi - lo, *self.ds.shape[1:]), dtype=self.ds.dtype)
        bad = []
        for c in range(lo // self.chunk, -(-hi // self.chunk)):
            a, b = max(lo, c * self.chunk), min(hi, (c + 1) * self.chunk)
            try:
                out[a - lo:b - lo] = self.ds[a:b]
            except Exception as e:
                bad.append((c, a, b, f"{type(e).__name__}: {e}"))
        return out, bad


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


class _Verifier:
    def __init__(self, f: h5py.File, report: VerifyReport, read_bytes: int, decode: Any):
        self.f = f
        self.report = report
        self.read_bytes = read_bytes
        self.decode = decode  # None, or (root, {field: FieldConfig}, thread pool)
        self.dead: dict[str, np.ndarray] = {}  # split -> tombstoned rows

    def problem(self, where: str, what: str, source: str = "") -> None:
        self.report.problems.append(Problem(where, what, source))

    # -- structure ------------------------------------------------------------

    def check_root(self) -> tuple[list[str], list[str], int]:
        a = self.f.attrs
        if not bool(a.get(fmt.ATTR_COMPLETE, False)):
            self.problem("/", "attribute complete is not true: the conversion did not finish")
        splits = json.loads(a.get(fmt.ATTR_SPLITS, "[]"))
        fields = json.loads(a.get(fmt.ATTR_FIELDS, "[]"))
        n_classes = self.f[fmt.CLASS_NAMES].shape[0] if fmt.CLASS_NAMES in self.f else 0
        return splits, fields, n_classes

    def corrupt(self, e: CorruptFileError) -> None:
        """A check of the reader's (:mod:`.index`) failed on a whole dataset."""
        self.problem(e.where, e.what if e.row is None else f"row {e.row}: {e.what}")

    def samples_ok(self, split: str, name: str, src: np.ndarray, bad: Iterator[tuple[int, str]],
                   limit: int | None = MAX_NAMED) -> bool:
        """Report what one of the reader's rules (:mod:`.index`) finds sample by sample, each
        fault naming its sample and source (the first ``limit``); True when none."""
        found = list(itertools.islice(bad, limit))
        for row, what in found:
            self.problem(f"{split}/{name}[{row}]", what, _join(src[row]) if row < len(src) else "")
        return not found

    def check_split(self, split: str, fields: list[str], n_classes: int) -> np.ndarray | None:
        """Structure of one split; returns its sources as (N, F) strings."""
        if split not in self.f:
            self.problem(split, "split listed in the root attribute 'splits' is missing")
            return None
        g = self.f[split]
        if fmt.SOURCE not in g or fmt.CHECKSUM not in g:
            self.problem(split, "source or checksum dataset missing")
            return None
        src = _strings(g[fmt.SOURCE])
        n = src.shape[0]
        src = src.reshape(n, int(np.prod(src.shape[1:], dtype=np.int64)))  # (N, F)
        files = self.file_fields(split, fields)
        if src.shape[1] != len(files):
            self.problem(f"{split}/{fmt.SOURCE}", f"has {src.shape[1]} paths per sample, expected {len(files)} "
                                                  f"(one per field of files: {', '.join(files)})")
        if int(g.attrs.get(fmt.ATTR_NUM_SAMPLES, n)) != n:
            self.problem(split, f"attribute num_samples is {g.attrs[fmt.ATTR_NUM_SAMPLES]}, source has {n} rows")
        if g[fmt.CHECKSUM].shape != (n, len(fields)):
            self.problem(f"{split}/{fmt.CHECKSUM}", f"shape {g[fmt.CHECKSUM].shape}, expected {(n, len(fields))}")
        if fmt.LABEL in g:
            labels = g[fmt.LABEL][...]
            if labels.shape != (n,):
                self.problem(f"{split}/{fmt.LABEL}", f"shape {labels.shape}, expected {(n,)}")
            else:
                self.samples_ok(split, fmt.LABEL, src, index.label_faults(labels.astype(np.int64), n_classes), None)
        elif n_classes:
            self.problem(split, "labelled file (it has /class_names) but the split has no label dataset")
        for name in views.names(g):  # rows in range, sorted, each once (tools/views.py)
            if why := views.check_rows(np.asarray(g[fmt.VIEWS][name][...]), n):
                self.problem(f"{split}/{fmt.VIEWS}/{name}", f"view {why}")
        # Rows a sync removed (sorted, unique, in range): no longer samples, so their
        # files are not counted as inputs and their sources are not compared.
        try:
            self.dead[split] = index.tombstones(self.f, "", split, n)
        except CorruptFileError as e:
            self.corrupt(e)
            self.dead[split] = np.zeros(0, dtype=np.int64)
        self.report.counts[split] = n - len(self.dead[split])
        return src

    def file_fields(self, split: str, fields: list[str]) -> list[str]:
        """The fields with a source path, as the split's ``source`` attribute lists them
        (fields of annotation values have none; files before them list every field)."""
        try:
            listed = json.loads(self.f[split][fmt.SOURCE].attrs.get("fields", "null"))
        except (ValueError, TypeError):
            listed = None
        return [f for f in listed if f in fields] if isinstance(listed, list) else list(fields)

    def field_data(self, split: str, name: str, n: int, src: np.ndarray) -> _FieldData | None:
        """Open one field of a split, its index checked as the reader checks it, and its
        offsets ending at the end of ``values``."""
        g = self.f[split]
        where = f"{split}/{name}"
        if name not in g:
            if n:
                self.problem(where, f"field missing although the split has {n} samples")
            return None
        node = g[name]
        if isinstance(node, h5py.Dataset):
            if node.shape[0] != n:
                self.problem(where, f"has {node.shape[0]} samples, source has {n}")
                return None
            return _FieldData(node, np.arange(n + 1, dtype=np.int64))
        try:
            values, offs, shapes = index.variable_field("", where, node, n, f"source has {n} rows")
        except CorruptFileError as e:
            self.corrupt(e)
            return None
        total = int(values.shape[0])
        ok = self.samples_ok(split, name, src, index.offset_faults(offs, total))
        if offs[-1] != total:
            self.problem(f"{where}/offsets", f"offsets[-1] is {offs[-1]} but values holds {total} elements")
            ok = False
        ok = self.samples_ok(split, name, src, index.shape_faults(shapes, offs)) and ok
        return _FieldData(values, offs, shapes) if ok else None

    # -- data -------------------------------------------------------------------

    def check_data(self, split: str, k: int, name: str, fd: _FieldData, sums: np.ndarray, src: np.ndarray,
                   col: int | None = None) -> None:
        """crc32 of every sample (and, with sources, its re-decoded array: fields of files,
        ``col`` being the field's column of ``src``)."""
        where = f"{split}/{name}"
        budget = max(1, self.read_bytes // max(1, fd.unit_bytes))
        for i, j in _windows(fd.offsets, fd.chunk, budget):
            lo, hi = int(fd.offsets[i]), int(fd.offsets[j])
            data, bad_chunks = fd.read(lo, hi)
            self.report.bytes_checked += (hi - lo) * fd.unit_bytes
            broken: set[int] = set()
            for c, a, b, err in bad_chunks:
                hit = [s for s in range(i, j) if fd.offsets[s] < b and fd.offsets[s + 1] > a]
                broken.update(hit)
                named = ", ".join(f"[{s}] {_join(src[s])}" for s in hit[:MAX_NAMED])
                more = f" and {len(hit) - MAX_NAMED} more" if len(hit) > MAX_NAMED else ""
                self.problem(f"{where} chunk {c}", f"corrupt chunk (cannot be read back: {err}); "
                                                   f"it holds samples {named}{more}")
            samples = {s: fd.sample(data, lo, s) for s in range(i, j) if s not in broken}
            for s, arr in samples.items():
                crc = zlib.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
                if crc != int(sums[s, k]):
                    self.problem(f"{where}[{s}]", f"checksum mismatch: stored crc32 {int(sums[s, k]):08x}, "
                                                  f"data has {crc:08x}", src[s, 0 if col is None else col])
            if self.decode is not None and col is not None:
                self.compare_sources(where, name, samples, src[:, col])

    def compare_sources(self, where: str, name: str, samples: dict[int, np.ndarray], paths: np.ndarray) -> None:
        from ..errors import DecodeError
        from ..fields import decode_field

        root, configs, pool = self.decode
        fc = configs[name]

        def one(s: int) -> str | None:
            try:
                fresh = decode_field(os.path.join(root, str(paths[s])), fc)
            except DecodeError as e:
                return f"source no longer decodes: {e.reason}"
            stored = samples[s]
            if fresh.dtype != stored.dtype or fresh.shape != stored.shape:
                return (f"differs from its source: source decodes to {fresh.dtype}{tuple(fresh.shape)}, "
                        f"stored {stored.dtype}{tuple(stored.shape)}")
            if not np.array_equal(fresh, stored):
                n_diff = int(np.count_nonzero(fresh != stored))
                return f"differs from its source: {n_diff} of {fresh.size} values differ"
            return None

        dead = set(self.dead.get(where.split("/")[0], np.zeros(0)).tolist())
        order = [s for s in sorted(samples) if s not in dead]  # a removed row's file is gone or changed
        for s, why in zip(order, pool.map(one, order), strict=True):
            self.report.sources_compared += 1
            if why:
                self.problem(f"{where}[{s}]", why, str(paths[s]))

    # -- accounting -------------------------------------------------------------

    def check_accounting(self, sources: dict[str, np.ndarray], path: str) -> None:
        rej = self.f.get(fmt.REJECTS)
        cols = {k: _strings(rej[k]) if rej is not None and k in rej else np.zeros(0, dtype=object)
                for k in ("path", "stage", "reason")}
        if len({len(v) for v in cols.values()}) != 1:
            self.problem(f"/{fmt.REJECTS}", "path, stage and reason have different lengths: "
                         + ", ".join(f"{k} {len(v)}" for k, v in cols.items()))
        rejects = list(zip(cols["path"], cols["stage"], cols["reason"], strict=False))
        self.report.rejects = len(cols["path"])
        self.report.excluded = int(sum(1 for s in cols["stage"] if s == fmt.STAGE_EXCLUDED))
        for p, stage, _ in rejects:
            if stage not in STAGES:
                self.problem(f"/{fmt.REJECTS}", f"unknown stage {stage!r}", p)
        where_is: dict[str, list[str]] = {}
        for split, src in sources.items():
            for i, row in enumerate(src):
                for p in row:
                    where_is.setdefault(str(p), []).append(f"{split}[{i}]")
        self.report.samples_files = sum(src.size for src in sources.values())
        for p, places in where_is.items():
            if len(places) > 1:
                self.problem("/", f"file is the source of {len(places)} samples: {', '.join(places[:MAX_NAMED])}", p)
        for p, n in Counter(str(p) for p in cols["path"]).items():
            if n > 1:
                self.problem(f"/{fmt.REJECTS}", f"path rejected {n} times", p)
        for p, stage, reason in rejects:
            if str(p) in where_is:
                self.problem("/", f"both a sample's file ({', '.join(where_is[str(p)])}) and a reject "
                                  f"([{stage}] {reason})", str(p))
        inputs = int(self.f.attrs.get(fmt.ATTR_INPUTS, -1))
        self.report.inputs = inputs
        found = self.report.samples_files + self.report.rejects
        if found != inputs:
            self.problem("/", f"{self.report.samples_files} source files + {self.report.rejects} rejects = {found}, "
                              f"but num_inputs is {inputs}: {inputs - found} inputs unaccounted for")
        jsonl = path.rsplit(".", 1)[0] + ".rejects.jsonl"
        if os.path.exists(jsonl):
            with open(jsonl) as fh:
                listed = [tuple(json.loads(line)[k] for k in ("path", "stage", "reason")) for line in fh if line.strip()]
            if listed != [(str(p), str(s), str(r)) for p, s, r in rejects]:
                self.problem("/", f"{os.path.basename(jsonl)} lists {len(listed)} rejects that differ from the "
                                  f"file's /{fmt.REJECTS} ({len(rejects)})")


def _join(row: Any) -> str:
    if isinstance(row, np.ndarray):
        return " + ".join(str(p) for p in row.reshape(-1))
    return str(row)


def _field_configs(f: h5py.File, path: str, root: str | None) -> tuple[str, dict[str, Any]]:
    from ..config import job_from_dict
    from ..errors import ConfigError

    try:
        job = job_from_dict(json.loads(f.attrs[fmt.ATTR_JOB]), f"{path}:job", check_paths=False)
    except (KeyError, ValueError, ConfigError) as e:
        raise VerifyError(f"{path}: the stored job cannot be read back ({e}); cannot re-decode sources") from e
    root = root or job.source.root
    if not os.path.isdir(root):
        raise VerifyError(f"{path}: corpus root {root!r} not found (pass --root)")
    return root, dict(job.fields)


def verify_file(path: str, sources: bool = False, root: str | None = None,
                read_bytes: int = 32 << 20, threads: int | None = None) -> VerifyReport:
    """Verify an h5batch output; see the module docstring for what is checked.

    Parameters
    ----------
    path : the output file.
    sources : also re-decode every sample's source files and compare exactly.
    root : corpus root for ``sources`` (default: ``source.root`` of the stored job,
        relative to the current directory, as at conversion time).
    read_bytes : uncompressed bytes read per h5py call (rounded to whole chunks).
    threads : decoding threads for ``sources`` (default: CPU count).

    Returns
    -------
    VerifyReport, whose ``problems`` is empty when the file is sound.

    Raises :class:`VerifyError` when the file is missing or not an h5batch file.
    """
    import hdf5plugin  # noqa: F401  (plugin filters for reading)

    f = index.open_output(path, VerifyError, sharded=True, rdcc_nbytes=2 * read_bytes,
                          rdcc_nslots=fmt.next_prime(10007))
    report = VerifyReport(path)
    pool = None
    with f:
        if shards.is_sharded(f):
            # Every shard there with its recorded size and sha256 before anything is read
            # through the virtual datasets (a missing source would read as fill values).
            try:
                shards.check(path, f, digest=True)
            except (OSError, CorruptFileError) as e:
                report.problems.append(Problem("/", str(e)))
                return report
        decode = None
        if sources:
            r, configs = _field_configs(f, path, root)
            pool = ThreadPoolExecutor(max_workers=threads or os.cpu_count() or 1, thread_name_prefix="h5batch-verify")
            decode = (r, configs, pool)
        try:
            v = _Verifier(f, report, read_bytes, decode)
            splits, fields, n_classes = v.check_root()
            report.fields = fields
            all_sources: dict[str, np.ndarray] = {}
            for split in splits:
                src = v.check_split(split, fields, n_classes)
                if src is None:
                    continue
                all_sources[split] = np.delete(src, v.dead[split], axis=0)  # tombstoned rows are no samples
                n = src.shape[0]
                ds = f[split][fmt.CHECKSUM]
                sums = ds[...] if ds.shape == (n, len(fields)) else None  # else reported above
                files = v.file_fields(split, fields)
                for k, name in enumerate(fields):
                    fd = v.field_data(split, name, n, src)
                    if fd is not None and sums is not None and src.shape[1] == len(files):
                        # A value field's samples are named by their sample's first file.
                        col = files.index(name) if name in files else None
                        v.check_data(split, k, name, fd, sums, src, col)
            v.check_accounting(all_sources, path)
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
    return report
