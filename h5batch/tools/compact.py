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

A sharded output (h5batch/shards.py) compacts into one ordinary file, the format of its
shards, laid out as one writer's: each virtual dataset becomes a real one with its first
shard's creation properties (chunks, filters), as do the other datasets the join made
(rebased ``offsets``, the rejects, an empty split's); the copies it holds (class names,
inventory) and its own (views, tombstones) are copied as above. A chunk of
the output that is one whole chunk of one shard (the shard's rows start on the output's
chunk grid) is copied as stored (``read_direct_chunk`` / ``write_direct_chunk``: nothing
decoded); a chunk across two shards, or off the grid, is read and written (HDF5
compresses it again). The copy must have the same objects, shapes, dtypes and attributes
(but the format and the shard list). Once it replaced the output the shard files are
removed; a crash in between leaves them beside an ordinary output, which never reads
them (remove them). Sample ``i`` of a split and every value are the same for any number
of writers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import h5py
import numpy as np

from .. import faults, shards
from .. import format as fmt
from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, ConvertError, MissingShardError
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
    parts: list[str] = []  # a sharded output's shard files, removed once it is one file
    with replaced(final, TMP_SUFFIX, "compact", say) as tmp:  # an interrupted sync undone first
        before = os.path.getsize(final)
        try:
            parts = _copy_objects(final, tmp)
            before += sum(os.path.getsize(p) for p in parts)
        except OSError as e:  # not HDF5, unreadable, or no room for the copy
            if isinstance(e, MissingShardError):
                raise
            raise ConvertError(f"{final}: cannot make its compacted copy {tmp} ({e}); the output is unchanged",
                               EXIT_BAD_INPUT if not os.path.exists(tmp) else EXIT_FAILED) from None
        faults.pause("compact", final)
        with open_file(final) as src, h5py.File(tmp, "r") as dst:
            why = _differences(src, dst, layout=not parts)
        if why:
            raise ConvertError(f"{final}: its compacted copy differs ({why}); the output is unchanged")
        if verify:
            from .verify import verify_file

            report = verify_file(tmp)
            if not report.ok:
                raise ConvertError(f"{final}: its compacted copy fails verify ({report.problems[0]}); "
                                   f"the output is unchanged")
    for p in parts:
        os.unlink(p)
    return CompactReport(final, before, os.path.getsize(final), verify)


def _copy_objects(final: str, tmp: str) -> list[str]:
    """Every object and root attribute of ``final`` into a new file ``tmp``; a sharded
    output's as one file (module docstring), returning its shard files."""
    with open_file(final) as src:
        check_complete(src, final)
        files = shards.check(final, src)
        # The writer's settings (h5batch.writer.output): the same format, and no reuse of
        # freed space, so that a later sync or resume keeps its guarantees.
        with h5py.File(tmp, "w", libver=("earliest", "v110"), fs_strategy="none") as dst:
            for key, value in src.attrs.items():
                if key != fmt.ATTR_SHARDS:
                    dst.attrs[key] = value
            if files:
                with h5py.File(files[0], "r") as first:
                    dst.attrs[fmt.ATTR_FORMAT] = first.attrs[fmt.ATTR_FORMAT]
                _join_objects(src, dst, files)
            else:
                for name in src:
                    src.copy(src[name], dst, name)
    os.chmod(tmp, os.stat(final).st_mode & 0o7777)
    return files


def _join_objects(src: h5py.File, dst: h5py.File, files: list[str]) -> None:
    """The objects of the joined output ``src`` into ``dst`` as one writer's file."""
    parts = [h5py.File(p, "r", rdcc_nbytes=64 << 20, rdcc_w0=1.0) for p in files]
    try:
        def visit(name: str, obj: h5py.Group | h5py.Dataset) -> None:
            if isinstance(obj, h5py.Group):
                g = dst.create_group(name)
                for key, value in obj.attrs.items():
                    g.attrs[key] = value
                return
            if obj.is_virtual:
                srcs = _sources(obj, parts, files)
                _fill(_like(dst, name, obj, srcs), srcs)
            elif name.split("/", 1)[0] in (fmt.CLASS_NAMES, "inventory") or not any(name in p for p in parts):
                src.copy(obj, dst, name)  # the shards' copies, and the joined file's own (views, tombstones)
            else:  # made by the join (rebased offsets, rejects, an empty split's): a shard's layout
                out = _like(dst, name, obj, [(0, 0, next(p[name] for p in parts if name in p))])
                out[...] = obj[...]

        src.visititems(visit)
    finally:
        for p in parts:
            p.close()


def _sources(vds: h5py.Dataset, parts: list[h5py.File], files: list[str]) -> list[tuple[int, int, h5py.Dataset]]:
    """``(first row, end row, shard dataset)`` of each source of a virtual dataset, in order."""
    names = [os.path.basename(p) for p in files]
    out = []
    for m in vds.virtual_sources():
        lo, hi = m.vspace.get_select_bounds()
        out.append((lo[0], hi[0] + 1, parts[names.index(os.path.basename(m.file_name))][m.dset_name]))
    return sorted(out, key=lambda t: t[0])


def _like(dst: h5py.File, name: str, like: h5py.Dataset, srcs: list[tuple[int, int, h5py.Dataset]]) -> h5py.Dataset:
    """``dst[name]``: shape and attributes of ``like``, creation properties (chunks, filters,
    fill value, maximum shape) of the first source's dataset."""
    first = srcs[0][2]
    space = h5py.h5s.create_simple(like.shape, tuple(h5py.h5s.UNLIMITED if m is None else m for m in first.maxshape))
    dsid = h5py.h5d.create(dst.id, name.encode(), first.id.get_type(), space, first.id.get_create_plist())
    out = h5py.Dataset(dsid)
    for key, value in like.attrs.items():
        out.attrs[key] = value
    return out


def _fill(out: h5py.Dataset, srcs: list[tuple[int, int, h5py.Dataset]]) -> None:
    """Every chunk of ``out`` from its sources: as stored where it is one whole chunk of one
    source (fixed-size values only: a variable-length one points into its own file's heap),
    else read and written."""
    n, step = out.shape[0], (out.chunks or out.shape)[0]
    raw = out.chunks is not None and out.chunks[1:] == out.shape[1:] and out.dtype.kind != "O"
    tail = (0,) * (out.ndim - 1)
    for c in range(0, n, step):
        e = min(c + step, n)
        pieces = [(lo, hi, d) for lo, hi, d in srcs if lo < e and hi > c]
        lo, _, d = pieces[0]
        if raw and len(pieces) == 1 and (c - lo) % step == 0 and d.chunks == out.chunks:
            mask, data = d.id.read_direct_chunk((c - lo, *tail))
            out.id.write_direct_chunk((c, *tail), data, mask)
            continue
        buf = np.empty((e - c, *out.shape[1:]), out.dtype)
        for lo, hi, d in pieces:
            a, b = max(lo, c), min(hi, e)
            buf[a - c:b - c] = d[a - lo:b - lo]
        out[c:e] = buf


def _differences(a: h5py.File, b: h5py.File, layout: bool = True) -> str:
    """The first difference between the objects of ``a`` and ``b`` ("" where none): names,
    kinds, attributes; for datasets shape, dtype and (``layout``) chunks, filters and stored
    bytes. Not ``layout``: ``b`` is the sharded output ``a`` as one file (root attributes
    but the format and the shard list the same)."""
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
        why = _attrs_differ(x, y, name, () if layout or name != "/" else (fmt.ATTR_FORMAT, fmt.ATTR_SHARDS))
        if why:
            return why
        if isinstance(x, h5py.Dataset) and (x.shape, x.dtype) != (y.shape, y.dtype):
            return f"{name}: shape and dtype {x.shape} {x.dtype} against {y.shape} {y.dtype}"
        if isinstance(x, h5py.Dataset) and layout:
            for what in ("maxshape", "chunks", "compression", "compression_opts", "shuffle"):
                if getattr(x, what) != getattr(y, what):
                    return f"{name}: {what} {getattr(x, what)} against {getattr(y, what)}"
            if x.id.get_create_plist().get_nfilters() != y.id.get_create_plist().get_nfilters():
                return f"{name}: its filters differ"
            if x.id.get_storage_size() != y.id.get_storage_size():
                return f"{name}: {x.id.get_storage_size()} stored bytes against {y.id.get_storage_size()}"
    return ""


def _attrs_differ(x, y, name: str, skip: tuple[str, ...] = ()) -> str:
    if sorted(set(x.attrs) - set(skip)) != sorted(set(y.attrs) - set(skip)):
        return f"{name}: attributes {sorted(set(x.attrs) ^ set(y.attrs))[:3]} are in only one of them"
    for key in set(x.attrs) - set(skip):
        u, v = x.attrs[key], y.attrs[key]
        same = np.array_equal(u, v) if isinstance(u, np.ndarray) or isinstance(v, np.ndarray) else u == v
        if not same:
            return f"{name}: attribute {key!r} differs"
    return ""
