"""``h5batch compact``: give an output's dead space back, by copying every object into a new
file that is renamed over it.

Dead space: the writer disables HDF5's free-space tracking (``fs_strategy="none"``: no write
may land on bytes an earlier commit covers, which resume relies on), so freed space is never
reused; each sync leaves the old inventory, rejects, class names and tombstones behind
(~1 % of a 100,000-file output, docs/sync.md). Tombstoned samples are kept so no row changes
its number; ``convert --overwrite`` drops them.

The copy replaces the output all or nothing, under its lock (:mod:`h5batch.tools.replace`):
every root object is copied with ``Group.copy`` (``H5Ocopy``: chunks copied as stored) and
the root attributes into ``OUT.compact-tmp``, created with the writer's file settings; the
copy must have the same objects, shapes, dtypes, chunks, filters, attributes and stored
bytes, and (unless ``verify=False``) pass what ``h5batch verify`` checks. Needs the output's
size again in free space.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import h5py
import numpy as np

from .. import faults
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, ConvertError
from .index import check_complete, open_file
from .replace import replaced

__all__ = ["compact", "CompactReport", "TMP_SUFFIX", "dataset_bytes"]

TMP_SUFFIX = ".compact-tmp"


@dataclass
class CompactReport:
    path: str
    before: int  # file size in bytes
    after: int
    verified: bool

    @property
    def freed(self) -> int:
        return self.before - self.after


def dataset_bytes(f: h5py.File) -> int:
    """Bytes the file's datasets store (their chunks or contiguous data): what is left of
    the file is metadata and dead space."""
    total = 0

    def visit(_name: str, obj) -> None:
        nonlocal total
        if isinstance(obj, h5py.Dataset):
            total += obj.id.get_storage_size()

    f.visititems(visit)
    return total


def compact(path: str, verify: bool = True, say: Callable[[str], None] = lambda _t: None) -> CompactReport:
    """Compact the finished output ``path`` (see the module docstring). Raises
    :class:`~h5batch.errors.ConvertError` where the copy does not check out (``path`` is
    then as it was) or another process holds the output's lock, and what opening a file
    that is not a finished output raises."""
    import hdf5plugin  # noqa: F401 - the filters of compressed datasets, for the checks' reads

    final = os.path.abspath(path)
    if not os.path.isfile(final):
        raise ConvertError(f"{final} does not exist: there is nothing to compact", EXIT_BAD_INPUT)
    with replaced(final, TMP_SUFFIX, "compact", say) as tmp:  # an interrupted sync undone first
        before = os.path.getsize(final)
        try:
            _copy_objects(final, tmp)
        except OSError as e:  # not HDF5, unreadable, or no room for the copy
            raise ConvertError(f"{final}: cannot make its compacted copy {tmp} ({e}); the output is unchanged",
                               EXIT_BAD_INPUT if not os.path.exists(tmp) else EXIT_FAILED) from None
        faults.pause("compact", final)
        with open_file(final) as src, h5py.File(tmp, "r") as dst:
            why = _differences(src, dst)
        if why:
            raise ConvertError(f"{final}: its compacted copy differs ({why}); the output is unchanged")
        if verify:
            from .verify import verify_file

            report = verify_file(tmp)
            if not report.ok:
                raise ConvertError(f"{final}: its compacted copy fails verify ({report.problems[0]}); "
                                   f"the output is unchanged")
    return CompactReport(final, before, os.path.getsize(final), verify)


def _copy_objects(final: str, tmp: str) -> None:
    """Every object and root attribute of ``final`` into a new file ``tmp``."""
    with open_file(final) as src:
        check_complete(src, final)
        # The writer's settings (h5batch.writer.output): the same format, and no reuse of
        # freed space, so that a later sync or resume keeps its guarantees.
        with h5py.File(tmp, "w", libver=("earliest", "v110"), fs_strategy="none") as dst:
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            for name in src:
                src.copy(src[name], dst, name)
    os.chmod(tmp, os.stat(final).st_mode & 0o7777)


def _differences(a: h5py.File, b: h5py.File) -> str:
    """The first difference between the objects of ``a`` and ``b`` ("" where none): names,
    kinds, attributes; for datasets shape, dtype, chunks, filters and stored bytes."""
    names_a, names_b = ["/"], ["/"]
    a.visit(names_a.append)
    b.visit(names_b.append)
    if sorted(names_a) != sorted(names_b):
        missing = sorted(set(names_a) ^ set(names_b))
        return f"objects {missing[:3]} are in only one of them"
    for name in names_a:
        x, y = a[name], b[name]
        if type(x) is not type(y):
            return f"{name} is a {type(x).__name__} in one, a {type(y).__name__} in the other"
        why = _attrs_differ(x, y, name)
        if why:
            return why
        if isinstance(x, h5py.Dataset):
            for what in ("shape", "dtype", "maxshape", "chunks", "compression", "compression_opts", "shuffle"):
                if getattr(x, what) != getattr(y, what):
                    return f"{name}: {what} {getattr(x, what)} against {getattr(y, what)}"
            if x.id.get_create_plist().get_nfilters() != y.id.get_create_plist().get_nfilters():
                return f"{name}: its filters differ"
            if x.id.get_storage_size() != y.id.get_storage_size():
                return f"{name}: {x.id.get_storage_size()} stored bytes against {y.id.get_storage_size()}"
    return ""


def _attrs_differ(x, y, name: str) -> str:
    if sorted(x.attrs) != sorted(y.attrs):
        return f"{name}: attributes {sorted(set(x.attrs) ^ set(y.attrs))[:3]} are in only one of them"
    for key in x.attrs:
        u, v = x.attrs[key], y.attrs[key]
        same = np.array_equal(u, v) if isinstance(u, np.ndarray) or isinstance(v, np.ndarray) else u == v
        if not same:
            return f"{name}: attribute {key!r} differs"
    return ""
