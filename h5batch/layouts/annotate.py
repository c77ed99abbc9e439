"""Annotation tables (``source.tables``) joined to the samples a layout found, and what
discovery takes from the columns: the values of fields that read no files (text, value,
multilabel), ``source.label_column``, and the columns split rules read.

A sample's columns are its layout's own (a ``manifest`` row, the ``pattern`` layout's
named groups) and then, table by table, the row whose ``key`` names the sample: its
root-relative path, the path relative to the table's folder, its file name, its stem or its
key, tried in that order (LibriSpeech's ``84-121123-0000`` is a stem, ESC-50's
``1-100032-A-0.wav`` a file name, Speech Commands' ``right/x.wav`` a path). A column already
set is kept (the first source wins).

Rule: problems are named precisely and nothing is lost. A column the job asks for that no
table has is a :class:`~h5batch.errors.ConfigError` naming the job key and the columns
there are; a sample with no row, or with a value its field cannot store, is a reject
naming the table and the column; table files are inputs too, recorded in the output
(``annotations`` attribute; :meth:`~.base.Builder.finish` drops the layout's rejects of them
as unknown files).
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, DecodeError
from ..fields import reads_files, resolve_field, value_array
from ..fields.multilabel import ALL
from ..manifest import Item, Items, Reject
from . import exclude
from .base import stem
from .table import json_rows

if TYPE_CHECKING:
    from ..config_types import JobConfig, TableSpec
    from .base import Builder

TABLE_COLUMN = "_table"  # every table row's column naming its file's stem
_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "whitespace"}


@dataclasses.dataclass
class Table:
    """The rows of one ``source.tables`` entry, indexed by key."""

    where: str  # "source.tables[i]"
    files: list[str]  # root-relative
    columns: list[str]
    key: str
    rows: dict[str, dict[str, Any]]
    unlisted: str
    folders: list[str]  # root-relative folders of the table's files (keys may be relative to them)

    def row_of(self, path: str, key: str) -> dict[str, Any] | None:
        """The row naming the sample whose first file is ``path`` (see the module doc)."""
        name = path.rpartition("/")[2]
        relative = [path[len(f) + 1:] for f in self.folders if f and path.startswith(f + "/")]
        for k in (path, *relative, name, stem(name), key):
            if k in self.rows:
                return self.rows[k]
        return None


def read_table(root: Path, spec: TableSpec, where: str, job_file: str) -> Table:
    patterns = [spec.path] if isinstance(spec.path, str) else list(spec.path)
    files: list[str] = []
    for pat in patterns:
        hits = sorted(glob.glob(pat, root_dir=root, recursive=True)) if glob.has_magic(pat) else (
            [pat] if (root / pat).is_file() else [])
        if not hits:
            raise ConfigError(job_file, f"{where}.path", f"no file {pat!r} under {str(root)!r}")
        files += [h.replace(os.sep, "/") for h in hits if h not in files]
    columns: list[str] = []
    rows: dict[str, dict[str, Any]] = {}
    key_col = spec.key
    for rel in files:
        fmt = spec.format if spec.format != "auto" else _FORMATS.get(Path(rel).suffix.lower(), "csv")
        cols, parsed = _parse(root / rel, fmt, spec, f"{rel}")
        for c in cols:
            if c not in columns:
                columns.append(c)
        if key_col is None:
            key_col = cols[0] if cols else "id"
        if cols and key_col not in cols:
            raise ConfigError(job_file, f"{where}.key", f"{rel} has no column {key_col!r} (columns: {', '.join(cols[:12])})")
        for line, row in parsed:
            k = str(row.get(key_col) or "").strip().replace("\\", "/")
            if not k:
                continue
            if k in rows:
                raise ConfigError(job_file, f"{where}", f"{rel}:{line}: key {k!r} is already in a row of "
                                                        f"{rows[k][TABLE_COLUMN + '_file']}")
            row[TABLE_COLUMN] = Path(rel).stem
            row[TABLE_COLUMN + "_file"] = f"{rel}:{line}"
            rows[k] = row
    if TABLE_COLUMN not in columns:
        columns.append(TABLE_COLUMN)
    folders = sorted({f.rpartition("/")[0] for f in files})
    return Table(where, files, columns, key_col or "id", rows, spec.unlisted, folders)


def _parse(path: Path, fmt: str, spec: TableSpec, name: str) -> tuple[list[str], list[tuple[int, dict]]]:
    """(columns, [(line number, row)]) of one table file."""
    text = path.read_text(encoding="utf-8-sig", errors="strict")
    lines = text.splitlines()
    start = spec.skip
    out: list[tuple[int, dict]] = []
    if fmt == "jsonl":
        for n, row in json_rows(lines[start:], start):
            if isinstance(row, str):
                raise ValueError(f"{name}:{n}: {row}")
            out.append((n, row))
        return list(dict.fromkeys(c for _, row in out for c in row)), out
    if fmt == "transcript":
        for n, line in enumerate(lines[start:], start=start + 1):
            if line.strip():
                ident, _, rest = line.strip().partition(" ")
                out.append((n, {"id": ident, "text": rest.strip()}))
        return ["id", "text"], out
    if fmt == "whitespace":
        split = [(n, line.split()) for n, line in enumerate(lines[start:], start=start + 1) if line.strip()]
    else:
        delim = "\t" if fmt == "tsv" else ","
        quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
        reader = csv.reader(lines[start:], delimiter=delim, quoting=quoting)
        split = [(start + i + 1, r) for i, r in enumerate(reader) if r]
    if spec.header:
        if not split:
            return list(spec.columns), []
        cols = list(split[0][1])
        split = split[1:]
        # CelebA's list_attr_celeba.txt: the header names every column but the first.
        if split and len(cols) == len(split[0][1]) - 1:
            cols = ["_key", *cols]
    else:
        cols = list(spec.columns)
    for n, cells in split:
        if len(cells) != len(cols):
            raise ValueError(f"{name}:{n}: {len(cells)} cells, the header names {len(cols)} columns")
        out.append((n, dict(zip(cols, cells))))
    return cols, out


def join(root: Path, job: JobConfig, b: Builder) -> list[dict[str, Any]]:
    """Join the tables to ``b.items``; fill each item's values and, with
    ``source.label_column``, its label; complete the field configs (``b.resolved``).
    Returns each kept item's columns (aligned with ``b.items``) for the split rules."""
    src = job.source
    tables = []
    for i, spec in enumerate(src.tables):
        where = f"source.tables[{i}]"
        try:
            tables.append(read_table(root, spec, where, job.file))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ConfigError(job.file, where, f"cannot read the table: {e}") from None
    files = [f for t in tables for f in t.files]
    b.annotations.extend(f for f in files if f not in b.annotations)
    if not tables and not b.wants_columns:  # no row to join, no column read: items stay as they are
        cols: list[dict[str, Any]] = [{}] * len(b.items)  # one dict, read only
        _fill(job, dict(job.fields), b, cols)
        return cols
    cols = []
    kept = Items()
    for it in b.items:
        c: dict[str, Any] = dict(it.columns)
        missing = None
        for t in tables:
            row = t.row_of(it.paths[0], it.key)
            if row is None:
                missing = t
                break
            for k, v in row.items():
                c.setdefault(k, v)
        if missing is not None:
            stage = exclude.STAGE if missing.unlisted == "exclude" else "discover"
            b.rejects.extend(Reject(p, stage, f"no row for this sample in {', '.join(missing.files)} "
                                              f"({missing.where}, key column {missing.key!r})") for p in it.paths)
            continue
        kept.append(it)
        cols.append(c)
    b.items = kept
    known = _known_columns(tables, cols)
    fields = _expand_all(job, tables)
    if kept or tables:  # no item and no table (a sync's discovery of no new file): no column to check
        _check_columns(job, fields, known)
    _fill(job, fields, b, cols)
    return cols


def _known_columns(tables: list[Table], cols: list[dict[str, Any]]) -> list[str]:
    known: list[str] = []
    for c in cols[:1000]:  # the layout's own columns (a manifest's header, a pattern's groups)
        known += [k for k in c if k not in known]
    for t in tables:
        known += [k for k in t.columns if k not in known]
    return known


def _expand_all(job: JobConfig, tables: list[Table]) -> dict[str, Any]:
    """The job's fields with ``columns: ["*"]`` replaced by the first table's columns."""
    out = dict(job.fields)
    for name, fc in job.fields.items():
        if getattr(fc, "columns", None) == [ALL]:
            if not tables:
                raise ConfigError(job.file, f"fields.{name}.columns", "'*' takes the columns of the first of "
                                                                      "source.tables, and there is none")
            t = tables[0]
            out[name] = dataclasses.replace(fc, columns=[c for c in t.columns if c not in (t.key, TABLE_COLUMN)])
    return out


def _check_columns(job: JobConfig, fields: dict[str, Any], known: list[str]) -> None:
    s = job.source
    wanted = [(key, col) for key, col in (("source.label_column", s.label_column),
                                          ("source.split.column", s.split.column),
                                          ("source.split.hash_key", s.split.hash_key)) if col]
    for name, fc in fields.items():
        if reads_files(fc):
            continue
        if getattr(fc, "column", None):
            wanted.append((f"fields.{name}.column", fc.column))
        wanted += [(f"fields.{name}.columns", c) for c in getattr(fc, "columns", [])]
    for key, col in wanted:
        if col not in known:
            raise ConfigError(job.file, key, f"no column {col!r} in the annotations (columns: {', '.join(known[:16]) or 'none'})")


def _fill(job: JobConfig, fields: dict[str, Any], b: Builder, cols: list[dict[str, Any]]) -> None:
    """Set each item's values and label; reject a sample whose value its field cannot store."""
    vnames = [n for n, fc in fields.items() if not reads_files(fc)]

    def raw(c: dict[str, Any], fc: Any) -> Any:
        if getattr(fc, "columns", None):
            return tuple(c.get(k) for k in fc.columns)
        return c.get(fc.column)

    values = [[raw(c, fields[n]) for n in vnames] for c in cols] if vnames else [()] * len(cols)
    for j, n in enumerate(vnames):
        fields[n] = resolve_field(fields[n], [v[j] for v in values])
    b.resolved.update({n: fields[n] for n in fields if fields[n] is not job.fields[n]})
    label_col = job.source.label_column
    if not vnames and not label_col and not b.items.has_extras():
        # Nothing to set or drop: each item is already what the loop below would build, so
        # skip a pass over the whole corpus.
        return
    kept, kept_cols = Items(), []
    for it, c, vals in zip(b.items, cols, values):
        why = None
        for n, v in zip(vnames, vals):
            try:
                value_array(v, fields[n])
            except DecodeError as e:
                why = f"field {n!r}: {e.reason} ({_where(c)})"
                break
        label = it.label
        if why is None and label_col:
            label = str(c.get(label_col) or "").strip() or None
            if label is None:
                why = f"empty label in column {label_col!r} ({_where(c)})"
        if why is not None:
            b.rejects.extend(Reject(p, "discover", why) for p in it.paths)
            continue
        # The constructor, not dataclasses.replace: this runs once per file of the corpus.
        kept.append(Item(it.key, it.split, it.paths, label, tuple(vals), (), it.stats))
        kept_cols.append(c)
    b.items = kept
    cols[:] = kept_cols


def _where(c: dict[str, Any]) -> str:
    return str(c.get(TABLE_COLUMN + "_file") or "the layout's columns")


__all__ = ["TABLE_COLUMN", "Table", "join", "read_table"]
