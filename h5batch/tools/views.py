"""Views: named subsets of a split's rows kept inside the output, without rewriting samples.

A view is ``/<split>/views/<name>``: a 1-D int64 dataset of row numbers of that split,
sorted ascending, each once, each in ``[0, num_samples)`` (docs/FORMAT.md).
``H5Dataset(path, split, view=name)`` reads exactly those rows, and its ``chunk_starts()``
groups them by chunk, so the chunk-aware samplers stay chunk-local.

Rule: the file is never modified in place; it is replaced whole by a checked copy, under
its lock (:mod:`h5batch.tools.replace` says why and how, as for ``h5batch compact``). The
copy is ``OUT.views-tmp`` (``os.copy_file_range``: a reflink where supported, else needs the
file's size in free space); after the edit it is reopened read-only and every view
(:func:`check_rows`) and the row counts are checked before it replaces ``OUT``.

``verify`` checks every view with :func:`check_rows`; the reader checks the view it opens.
A sharded output's views live in its joined file, as any output's (rows of the joined split;
h5batch/shards.py): the copy is of that small file only, the shards are never written.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from .. import shards
from ..errors import CorruptFileError, H5batchError
from .index import open_output
from .replace import replaced

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
TMP_SUFFIX = ".views-tmp"


class ViewError(H5batchError, ValueError):
    """A view cannot be made, read or removed as asked (exit code 2: bad arguments)."""

    exit_code = 2


# ------------------------------------------------------------------ checking, reading


def check_rows(rows: np.ndarray, n: int) -> str | None:
    """What is wrong with a view's rows for a split of ``n`` samples (None: nothing)."""
    if rows.ndim != 1:
        return f"has shape {rows.shape}, expected one dimension"
    if not np.issubdtype(rows.dtype, np.integer):
        return f"has dtype {rows.dtype}, expected integers"
    if not rows.size:
        return None
    bad = np.flatnonzero((rows < 0) | (rows >= n))
    if bad.size:
        return f"row {int(rows[bad[0]])} (entry {int(bad[0])}) is outside 0..{n - 1}"
    step = np.diff(rows)
    if step.size and step.min() <= 0:
        i = int(np.argmax(step <= 0))
        what = "repeats" if step[i] == 0 else "is not sorted"
        return f"{what}: entry {i + 1} is row {int(rows[i + 1])} after row {int(rows[i])}"
    return None


def num_samples(g: h5py.Group) -> int:
    if fmt.ATTR_NUM_SAMPLES in g.attrs:
        return int(g.attrs[fmt.ATTR_NUM_SAMPLES])
    return int(g[fmt.SOURCE].shape[0]) if fmt.SOURCE in g else 0


def names(g: h5py.Group) -> list[str]:
    """The views of a split group, sorted."""
    v = g.get(fmt.VIEWS)
    return sorted(v) if isinstance(v, h5py.Group) else []


def read_view(f: h5py.File, path: str, split: str, name: str, n: int) -> np.ndarray:
    """A view's rows as int64, checked; ``KeyError`` naming the views there are."""
    g = f[split]
    if name not in names(g):
        have = ", ".join(names(g)) or "none"
        raise KeyError(f"{path}: split {split!r} has no view {name!r} (views: {have})")
    ds = g[fmt.VIEWS][name]
    rows = np.asarray(ds[...])
    why = check_rows(rows, n)
    if why:
        raise CorruptFileError(path, f"/{split}/{fmt.VIEWS}/{name}", why)
    return rows.astype(np.int64, copy=False)


def _open(path: str) -> h5py.File:
    """The output ``path`` read-only; a sharded one once its shards are checked (its
    virtual datasets are read: a missing shard would read as fill values)."""
    f = open_output(path, ViewError, sharded=True)
    try:
        shards.check(path, f)
    except BaseException:
        f.close()
        raise
    return f


def list_views(path: str) -> dict[str, dict[str, int]]:
    """``{split: {view: rows}}`` of a file."""
    with _open(path) as f:
        splits = json.loads(f.attrs.get(fmt.ATTR_SPLITS, "[]"))
        return {s: {v: int(f[s][fmt.VIEWS][v].shape[0]) for v in names(f[s])} for s in splits if s in f}


# ------------------------------------------------------------------ selecting rows

# The operators an expression may use, each the numpy function that applies it to columns.
_OPS: dict[type, Callable[..., Any]] = {
    ast.Eq: np.equal, ast.NotEq: np.not_equal, ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater,
    ast.GtE: np.greater_equal, ast.In: np.isin, ast.NotIn: functools.partial(np.isin, invert=True),
    ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
    ast.FloorDiv: np.floor_divide, ast.Mod: np.mod, ast.BitAnd: np.bitwise_and, ast.BitOr: np.bitwise_or,
    ast.And: np.logical_and, ast.Or: np.logical_or, ast.Not: np.logical_not, ast.USub: np.negative,
    ast.Invert: np.invert}


class _Columns:
    """The per-sample values an expression may name, loaded on first use (never sample data
    of a big field: only labels, row numbers, scalar fields and variable fields' lengths)."""

    def __init__(self, f: h5py.File, path: str, split: str):
        self.f, self.path, self.split = f, path, split
        self.g = f[split]
        self.n = num_samples(self.g)
        self.class_names = list(f[fmt.CLASS_NAMES].asstr()[...]) if fmt.CLASS_NAMES in f else []

    def name(self, key: str) -> np.ndarray:
        if key == "index":
            return np.arange(self.n, dtype=np.int64)
        if key == fmt.LABEL:
            if fmt.LABEL not in self.g:
                raise ViewError(f"{self.path}: split {self.split!r} has no labels")
            return np.asarray(self.g[fmt.LABEL][...], dtype=np.int64)
        obj = self.g.get(key) if key not in fmt.RESERVED else None
        if isinstance(obj, h5py.Dataset) and int(np.prod(obj.shape[1:], dtype=np.int64)) == 1 \
                and (np.issubdtype(obj.dtype, np.number) or obj.dtype == np.bool_):
            return np.asarray(obj[...]).reshape(self.n)
        raise ViewError(f"{self.path}: --where names {key!r}, which is not index, label, a numeric "
                        f"scalar field or <variable field>.length of split {self.split!r}")

    def length(self, key: str) -> np.ndarray:
        obj = self.g.get(key)
        if not isinstance(obj, h5py.Group) or fmt.SHAPES not in obj:
            raise ViewError(f"{self.path}: {key}.length: {key!r} is not a variable-length field of "
                            f"split {self.split!r}")
        return np.asarray(obj[fmt.SHAPES][:, 0], dtype=np.int64)

    def label_code(self, value: Any) -> Any:
        """A class name compared with ``label`` becomes its integer label (in a list too)."""
        if isinstance(value, list):
            return [self.label_code(v) for v in value]
        if isinstance(value, str):
            if value not in self.class_names:
                raise ViewError(f"{self.path}: no class {value!r} (classes: {', '.join(self.class_names)})")
            return self.class_names.index(value)
        return value


def select_where(f: h5py.File, path: str, split: str, expr: str) -> np.ndarray:
    """Rows of ``split`` where ``expr`` is true: a small, safe expression language over
    ``index`` (the row number), ``label`` (class names allowed: ``label == "cat"``), numeric
    scalar fields, ``<field>.length`` (first axis of a variable field's samples), numbers,
    ``== != < <= > >=`` (chained), ``in [..]``, ``and or not``, ``+ - * / // %``.
    Example: ``index % 5 == 0`` (fold 0 of 5), ``label in ["cat", "dog"] and audio.length > 16000``."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ViewError(f"--where {expr!r}: not an expression ({e.msg})") from None
    cols = _Columns(f, path, split)
    value = _eval(tree.body, cols, expr)
    mask = np.broadcast_to(np.asarray(value), (cols.n,))
    if mask.dtype != np.bool_:
        raise ViewError(f"--where {expr!r}: gives {mask.dtype} values, not true/false")
    return np.flatnonzero(mask).astype(np.int64)


def _eval(node: ast.AST, cols: _Columns, expr: str) -> Any:
    def ev(n: ast.AST) -> Any:
        return _eval(n, cols, expr)

    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
        return node.value
    if isinstance(node, ast.Name):
        return cols.name(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "length" and isinstance(node.value, ast.Name):
        return cols.length(node.value.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [ev(e) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        return functools.reduce(_OPS[type(node.op)], [np.asarray(ev(v), dtype=bool) for v in node.values])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.Invert)):
        return _OPS[type(node.op)](np.asarray(ev(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](np.asarray(ev(node.left)), np.asarray(ev(node.right)))
    if isinstance(node, ast.Compare):
        return _compare(node, cols, ev)
    raise ViewError(f"--where {expr!r}: {ast.unparse(node)!r} is not allowed here (index, label, "
                    "scalar fields, <field>.length, numbers, strings, comparisons, in, and/or/not, arithmetic)")


def _compare(node: ast.Compare, cols: _Columns, ev: Callable[[ast.AST], Any]) -> Any:
    out: Any = True
    left_node, left = node.left, ev(node.left)
    for op, right_node in zip(node.ops, node.comparators, strict=True):
        right = ev(right_node)
        lv = cols.label_code(left) if _is_label(right_node) else left  # label == "cat": "cat" is a class
        rv = cols.label_code(right) if _is_label(left_node) else right
        if type(op) not in _OPS:
            raise ViewError(f"comparison {type(op).__name__} is not allowed")
        if isinstance(op, (ast.In, ast.NotIn)):
            if not isinstance(rv, list):
                raise ViewError("`in` needs a list, e.g. label in [1, 2]")
        elif isinstance(lv, str) or isinstance(rv, str):
            raise ViewError("strings compare only with label (class names)")
        out = np.logical_and(out, _OPS[type(op)](np.asarray(lv), np.asarray(rv)))
        left_node, left = right_node, right
    return out


def _is_label(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == fmt.LABEL


def rows_from_file(path: str) -> np.ndarray:
    """Row numbers from a text file (whitespace or comma separated; ``#`` comments) or a
    ``.npy`` file."""
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False).reshape(-1)
    with open(path) as fh:
        text = " ".join(line.split("#", 1)[0] for line in fh)
    try:
        return np.array([int(t) for t in text.replace(",", " ").split()], dtype=np.int64)
    except ValueError as e:
        raise ViewError(f"{path}: not a list of row numbers ({e})") from None


# ------------------------------------------------------------------ writing


def add_view(path: str, name: str, split: str, *, where: str | None = None,
             rows: Sequence[int] | np.ndarray | None = None, overwrite: bool = False) -> int:
    """Store view ``name`` of ``split`` (rows where ``where`` holds, or ``rows``, which are
    sorted and deduplicated); returns its number of rows. See the module docstring for how
    it is written."""
    if not NAME_RE.match(name or ""):
        raise ViewError(f"view name {name!r}: use letters, digits, _ . - (at most 128, not starting with . or -)")
    if (where is None) == (rows is None):
        raise ViewError("give exactly one of --where EXPR or --rows FILE")
    with _open(path) as f:
        _check_split(f, path, split)
        n = num_samples(f[split])
        if name in names(f[split]) and not overwrite:
            raise ViewError(f"{path}: split {split!r} already has a view {name!r} (--overwrite replaces it)")
        if where is not None:
            sel = select_where(f, path, split, where)
        else:
            sel = np.unique(np.asarray(rows, dtype=np.int64).reshape(-1))
            why = check_rows(sel, n)
            if why:
                raise ViewError(f"{path}: rows for view {name!r}: {why}")

    def change(g: h5py.Group) -> None:
        views = g.require_group(fmt.VIEWS)
        if name in views:
            del views[name]
        views.create_dataset(name, data=sel, dtype=np.int64)

    _rewrite(path, split, change)
    return int(sel.size)


def remove_view(path: str, name: str, split: str) -> None:
    """Delete view ``name`` of ``split`` (same safe rewrite as :func:`add_view`)."""
    with _open(path) as f:
        _check_split(f, path, split)
        if name not in names(f[split]):
            raise ViewError(f"{path}: split {split!r} has no view {name!r} (views: "
                            f"{', '.join(names(f[split])) or 'none'})")

    def change(g: h5py.Group) -> None:
        del g[fmt.VIEWS][name]
        if not len(g[fmt.VIEWS]):
            del g[fmt.VIEWS]

    _rewrite(path, split, change)


def _check_split(f: h5py.File, path: str, split: str) -> None:
    if not f.attrs.get(fmt.ATTR_COMPLETE, False):
        raise ViewError(f"{path}: not a complete h5batch file")
    splits = json.loads(f.attrs.get(fmt.ATTR_SPLITS, "[]"))
    if split not in splits or split not in f:
        raise ViewError(f"{path}: no split {split!r} (splits: {', '.join(splits)})")


def _rewrite(path: str, split: str, change: Callable[[h5py.Group], None]) -> None:
    """Apply ``change`` to the split group of a copy of ``path``, check it, rename it over
    (:func:`h5batch.tools.replace.replaced`)."""
    with replaced(path, TMP_SUFFIX, "view") as tmp:
        _copy(path, tmp)
        with h5py.File(tmp, "r+") as f:
            counts = {s: num_samples(f[s]) for s in json.loads(f.attrs[fmt.ATTR_SPLITS]) if s in f}
            change(f[split])
        with h5py.File(tmp, "r") as f:
            for s, n in counts.items():
                if num_samples(f[s]) != n:
                    raise ViewError(f"{tmp}: split {s!r} changed its row count while adding a view")
                for v in names(f[s]):
                    why = check_rows(np.asarray(f[s][fmt.VIEWS][v][...]), n)
                    if why:
                        raise ViewError(f"{tmp}: view {s}/{v} {why}")


def _copy(src: str, dst: str) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        done = 0
        try:
            while done < size and (step := os.copy_file_range(fi.fileno(), fo.fileno(), size - done)):
                done += step
        except OSError:
            done = -1
    if done != size:  # no copy_file_range between these file systems: an ordinary copy
        shutil.copyfile(src, dst)
    shutil.copymode(src, dst)
