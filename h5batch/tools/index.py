"""What the reader checks when it opens a file, before it reads or allocates anything.

:func:`open_file` opens a file read-only and says in words what a file that cannot be read
yet is: a partial still being written (or interrupted), or a file another process holds
locked for writing. :func:`check_complete` refuses a file whose ``complete`` root attribute
is false. :func:`read_index` loads the small per-sample arrays the reader relies on
(``label``, and ``offsets``/``shapes`` of the variable fields it reads) and checks them and
the row count of every per-sample dataset against each other, with vectorised numpy only;
sample data is never read. A failure raises :class:`~h5batch.errors.CorruptFileError`
naming the file, the dataset and the first bad row. ``h5batch verify`` runs the same checks:
:func:`variable_field`, and the rules :func:`offset_faults`, :func:`shape_faults` and
:func:`label_faults`, which list every fault (the reader raises the first, verify reports
them). :func:`open_output` opens a file for the commands that look into one, refusing what
is not an h5batch output.

The rules (docs/FORMAT.md; ``h5batch verify`` checks these and more, over every field):

* every per-sample dataset (``source``, ``checksum``, ``label``, each fixed field, each
  variable field's ``shapes``) has ``N`` rows and each variable field's ``offsets`` ``N + 1``,
  where ``N`` is the split's ``num_samples`` attribute (else the rows of ``source``);
* offsets of a field the reader reads start at 0, never decrease, and end at or before
  ``len(values)``; its ``shapes`` hold no negative size and the product of each row equals
  the sample's offset difference (a product that would overflow int64 is computed in
  float64, so it cannot wrap round to a match);
* labels lie in ``[0, len(class_names))`` when the file has ``/class_names``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from ..errors import CorruptFileError
from ..writer.journal import has_journal


def offsets_key(field: str) -> str:
    """Key of a field's offsets in the dict :func:`read_index` returns."""
    return f"{field}/{fmt.OFFSETS}"


def shapes_key(field: str) -> str:
    """Key of a field's stored shapes (rank > 1 only) in the dict :func:`read_index` returns."""
    return f"{field}/{fmt.SHAPES}"


# ------------------------------------------------------------------------ opening


def partial_message(path: str) -> str:
    final = path[: -len(fmt.PARTIAL_SUFFIX)]
    return f"{path} is still being written (or was interrupted); the finished file will be {final}"


def open_file(path: str, **kw: Any) -> h5py.File:
    """``h5py.File(path, "r", **kw)``, refusing files that are not finished outputs.

    Raises
    ------
    FileNotFoundError
        ``X.h5.partial`` (whatever its state), or ``X.h5`` when only ``X.h5.partial`` exists:
        the finished output does not exist yet. It is the error opening ``X.h5`` gives a
        moment before the writer renames the partial, so code that waits for an output
        handles both alike.
    BlockingIOError
        Another process holds the file open for writing (HDF5's lock is taken, ``EAGAIN``).
        That is what the operating system calls this condition, and it is temporary: code
        that retries on it, or catches ``OSError`` as it did h5py's error, keeps working;
        only the message is ours.
    """
    partial = path.endswith(fmt.PARTIAL_SUFFIX)
    if partial and os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, partial_message(path))
    if has_journal(path):  # a sync changes it in place (h5batch/writer/journal.py)
        raise BlockingIOError(
            errno.EAGAIN, f"{path} is being synced, or a sync of it was interrupted; open it once the sync "
            f"has finished (an interrupted one is undone by running `h5batch sync` again)")
    try:
        return h5py.File(path, "r", **kw)
    except FileNotFoundError:
        if not partial and os.path.exists(path + fmt.PARTIAL_SUFFIX):
            raise FileNotFoundError(errno.ENOENT, f"{path} does not exist yet: "
                                    f"{partial_message(path + fmt.PARTIAL_SUFFIX)}") from None
        raise
    except OSError as exc:
        if not _locked(exc):
            raise
        raise BlockingIOError(
            errno.EAGAIN, f"{path} is being written by another process (HDF5 reports it locked "
            f"for writing); open it once that process has finished. If nothing is writing it "
            f"(a file system that keeps stale locks), pass locking=False") from exc


def _locked(exc: OSError) -> bool:
    return (isinstance(exc, BlockingIOError) or exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
            or "unable to lock file" in str(exc))


def open_output(path: str, error: type[Exception], sharded: bool = False, **kw: Any) -> h5py.File:
    """``h5py.File(path, "r", **kw)`` of an h5batch output for the commands that look into
    one (inspect --sample, preview, verify, view): a missing file, one that is not HDF5 or
    one without a readable format raises ``error`` saying which. ``sharded``: the caller
    also reads a sharded output (h5batch/shards.py)."""
    if not os.path.isfile(path):
        raise error(f"{path}: no such file")
    try:
        f = h5py.File(path, "r", **kw)
    except OSError as e:
        raise error(f"{path}: not an h5batch file (cannot open as HDF5: {e})") from e
    version = f.attrs.get(fmt.ATTR_FORMAT)
    if version not in fmt.READABLE_FORMATS and not (sharded and version == fmt.SHARDED_FORMAT):
        f.close()
        raise error(f"{path}: not an h5batch file (root attribute {fmt.ATTR_FORMAT}={version!r}, "
                    f"expected one of {fmt.READABLE_FORMATS})")
    return f


def check_complete(f: h5py.File, path: str) -> None:
    """Refuse a file whose ``complete`` root attribute is not true."""
    if not f.attrs.get(fmt.ATTR_COMPLETE, False):
        raise CorruptFileError(
            path, f"root attribute {fmt.ATTR_COMPLETE}",
            "the file is not complete: its conversion did not finish (when too many inputs are "
            f"rejected the writer keeps the output as {path}{fmt.PARTIAL_SUFFIX}, not renamed; this "
            "file is such a one, renamed or copied)")


# -------------------------------------------------------------------------- index


def read_index(f: h5py.File, path: str, split: str, fields: Sequence[str]) -> tuple[int, dict[str, np.ndarray]]:
    """Check a split's index; return its number of samples and the arrays the reader uses.

    ``fields`` are the fields the reader reads: their offsets and shapes are loaded and
    checked in full; every other per-sample dataset of the split only has its row count
    checked (metadata). The arrays come back as int64 in a dict keyed ``label``,
    :func:`offsets_key` and :func:`shapes_key` (shapes only for variable fields of rank > 1;
    a 1-D sample's shape is its offset difference).
    """
    g = f[split]
    n, counted = _num_samples(g)
    out: dict[str, np.ndarray] = {}
    samples = f"the split has {n} samples: {counted}"
    for name in (fmt.SOURCE, fmt.CHECKSUM, fmt.LABEL):
        if name in g:
            _rows(path, f"/{split}/{name}", g[name], n, samples)
    stored = json.loads(f.attrs.get(fmt.ATTR_FIELDS, "[]"))
    for name in dict.fromkeys([*stored, *fields]):
        obj = _member(path, f"/{split}", g, name)
        where = f"/{split}/{name}"
        if isinstance(obj, h5py.Dataset):
            _rows(path, where, obj, n, samples)
            continue
        values, offs, shp = variable_field(path, where, obj, n, samples, load=name in fields)
        if offs is None:  # a field the reader does not read: row counts only
            continue
        check(path, f"{where}/{fmt.OFFSETS}", offset_faults(offs, int(values.shape[0])))
        check(path, f"{where}/{fmt.SHAPES}", shape_faults(shp, offs))
        out[offsets_key(name)] = offs
        if shp.shape[1] != 1:
            out[shapes_key(name)] = shp
    if fmt.LABEL in g:
        labels = np.asarray(g[fmt.LABEL][...], dtype=np.int64)
        if fmt.CLASS_NAMES in f:
            check(path, f"/{split}/{fmt.LABEL}", label_faults(labels, int(f[fmt.CLASS_NAMES].shape[0])))
        out[fmt.LABEL] = labels
    return n, out


def variable_field(path: str, where: str, node: h5py.Group, n: int, samples: str, load: bool = True
                   ) -> tuple[h5py.Dataset, np.ndarray | None, np.ndarray | None]:
    """A variable field's ``values`` dataset and, when ``load``, its offsets and shapes as
    int64, checked as whole datasets: its members are there, ``offsets`` has ``n + 1`` rows
    and ``shapes`` ``n`` (``samples`` says where ``n`` comes from), and when loaded both are
    integers and ``shapes`` has one column per dimension (the ``ndim`` attribute). The rules
    sample by sample are :func:`offset_faults` and :func:`shape_faults`."""
    values, offsets, shapes = (_member(path, where, node, k) for k in (fmt.VALUES, fmt.OFFSETS, fmt.SHAPES))
    _rows(path, f"{where}/{fmt.OFFSETS}", offsets, n + 1, f"samples + 1; {samples}")
    _rows(path, f"{where}/{fmt.SHAPES}", shapes, n, samples)
    if not load:
        return values, None, None
    ndim = int(node.attrs.get("ndim", shapes.shape[1] if shapes.ndim == 2 else 1))
    if shapes.ndim != 2 or shapes.shape[1] != ndim:
        raise CorruptFileError(path, f"{where}/{fmt.SHAPES}",
                               f"has shape {shapes.shape}, expected {(n, ndim)} (ndim attribute {ndim})")
    for ds in (offsets, shapes):
        if not np.issubdtype(ds.dtype, np.integer):
            raise CorruptFileError(path, f"{where}/{ds.name.rsplit('/', 1)[-1]}",
                                   f"has dtype {ds.dtype}, expected integers")
    return values, np.asarray(offsets[...], dtype=np.int64), np.asarray(shapes[...], dtype=np.int64)


def _rows(path: str, where: str, ds: h5py.Dataset, expected: int, what: str) -> None:
    got = ds.shape[0] if ds.ndim else 0
    if got != expected:
        raise CorruptFileError(path, where, f"has {got} rows, expected {expected} ({what})", row=min(got, expected))


def _member(path: str, where: str, parent: h5py.Group, name: str) -> Any:
    if name not in parent:
        raise CorruptFileError(path, f"{where}/{name}", "is missing")
    return parent[name]


def tombstones(f: h5py.File, path: str, split: str, n: int) -> np.ndarray:
    """The split's rows removed by ``h5batch sync`` (sorted int64; empty when none), checked:
    sorted, unique, each in ``[0, n)``."""
    g = f[split]
    if fmt.TOMBSTONES not in g:
        return np.zeros(0, dtype=np.int64)
    rows = np.asarray(g[fmt.TOMBSTONES][...], dtype=np.int64)
    where = f"{split}/{fmt.TOMBSTONES}"
    bad = _first(np.diff(rows) <= 0) if len(rows) > 1 else None
    if bad is not None:
        raise CorruptFileError(path, where, "rows are not sorted and unique", bad + 1)
    if len(rows) and (rows[0] < 0 or rows[-1] >= n):
        bad = 0 if rows[0] < 0 else len(rows) - 1
        raise CorruptFileError(path, where, f"row {int(rows[bad])} is outside [0, {n})", bad)
    return rows


def live_rows(f: h5py.File, path: str, split: str, n: int) -> np.ndarray | None:
    """The rows of a split that readers yield, in file order: None when every row is (no
    tombstones), else the sorted rows that are not tombstoned."""
    dead = tombstones(f, path, split, n)
    if not len(dead):
        return None
    keep = np.ones(n, dtype=bool)
    keep[dead] = False
    return np.flatnonzero(keep).astype(np.int64)


def _num_samples(g: h5py.Group) -> tuple[int, str]:
    """The split's number of samples, and where it comes from."""
    if fmt.ATTR_NUM_SAMPLES in g.attrs:
        return int(g.attrs[fmt.ATTR_NUM_SAMPLES]), f"its {fmt.ATTR_NUM_SAMPLES} attribute"
    for name in (fmt.SOURCE, fmt.LABEL, fmt.CHECKSUM):  # files from before the attribute
        if name in g and g[name].ndim:
            return int(g[name].shape[0]), f"rows of {g.name}/{name}"
    return 0, "it has no per-sample dataset"


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True (``argmax`` stops there), or None."""
    if not mask.size:
        return None
    i = int(mask.argmax())
    return i if mask[i] else None


def check(path: str, where: str, bad: Iterator[tuple[int, str]]) -> None:
    """The reader's way with what a rule finds (``bad``): :class:`CorruptFileError` naming the first."""
    for row, what in bad:
        raise CorruptFileError(path, where, what, row=row)


def offset_faults(offs: np.ndarray, num_values: int) -> Iterator[tuple[int, str]]:
    """``(row, what)`` of each fault of ``offs`` (N + 1 int64), the first first: it starts at 0,
    never decreases and ends at or before ``num_values``. The row is the bad sample ``i``
    (whose elements are ``offs[i]:offs[i + 1]``)."""
    if offs.size and offs[0] != 0:
        yield 0, f"offsets[0] is {offs[0]}, expected 0"
    down = np.flatnonzero(offs[1:] < offs[:-1])
    for i in down:
        yield int(i), f"offsets decrease: sample {i} would end at element {offs[i + 1]} before it starts at {offs[i]}"
    if not down.size and offs.size and offs[-1] > num_values:
        i = int(np.searchsorted(offs, num_values, side="right")) - 1  # offs is sorted
        yield i, f"sample {i} ends at element {offs[i + 1]}, past the end of values ({num_values} elements)"


def shape_faults(shapes: np.ndarray, offs: np.ndarray) -> Iterator[tuple[int, str]]:
    """``(row, what)`` of each stored shape (one row of ``shapes``) that has a negative size or
    does not hold exactly the sample's ``offs[i + 1] - offs[i]`` elements (``offs`` already
    checked)."""
    counts = offs[1:] - offs[:-1]
    ndim = shapes.shape[1]
    if ndim == 1:  # counts are >= 0, so a matching size is too
        sizes = shapes[:, 0]
    else:
        if shapes.size and shapes.min() < 0:  # min() first: cheap where nothing is negative
            for i in np.flatnonzero((shapes < 0).any(axis=1)):
                yield int(i), f"stored shape {tuple(shapes[i].tolist())} has a negative size"
            return
        # The product must not wrap round to a match: int64 when it cannot overflow, else
        # float64 (exact below 2**53, far above any count when it overflows int64).
        exact = not shapes.size or int(shapes.max()) ** ndim < 2**63
        sizes = shapes[:, 0].astype(np.int64 if exact else np.float64)
        for k in range(1, ndim):
            np.multiply(sizes, shapes[:, k], out=sizes)
    for i in np.flatnonzero(sizes != counts):
        yield int(i), (f"stored shape {tuple(shapes[i].tolist())} does not hold the {counts[i]} elements the "
                       f"offsets give sample {i}")


def label_faults(labels: np.ndarray, n_classes: int) -> Iterator[tuple[int, str]]:
    """``(row, what)`` of each label that indexes no name of ``/class_names`` and is not -1 (no
    label), as ``verify`` has it."""
    if not labels.size or (labels.min() >= -1 and labels.max() < n_classes):  # the cheap test first
        return
    for i in np.flatnonzero((labels < -1) | (labels >= n_classes)):
        yield int(i), f"label {labels[i]} is outside -1..{n_classes - 1} ({n_classes} names in /{fmt.CLASS_NAMES})"
