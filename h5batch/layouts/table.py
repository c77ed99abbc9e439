"""Layout ``manifest`` (the job-file name; this module is ``table`` so that it is not
mistaken for :mod:`h5batch.manifest`, the data model): a CSV or JSONL table
(``source.manifest``) listing, per row, the path of each field, a ``label`` and a ``split``.

Paths are relative to ``root`` and must stay inside it. A field's path is read from the
column ``fields.<name>.column`` (default the field name; a one-field job also takes
``path``). A missing ``split`` is ``train``. A row that cannot be parsed or used becomes a
reject named ``<table file>:<line>``; see :func:`_row` for how one bad file takes its row's
other files with it.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest import Item, Reject
from .base import Builder, Layout, declared_then_found, not_accepted, register, stem

if TYPE_CHECKING:
    from ..config_types import SourceConfig


def read_rows(path: Path) -> list[tuple[int, dict | str]]:
    """``(line number, row)`` of a CSV or JSONL table; a row that cannot be parsed is
    returned as a string saying why (it becomes a reject, not a crash)."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return json_rows(path.read_text().splitlines())
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return [(reader.line_num, row) for row in reader]


def json_rows(lines: list[str], start: int = 0) -> list[tuple[int, dict | str]]:
    """``(line number, row)`` of JSONL ``lines`` (numbered from ``start + 1``), blank lines
    skipped; a line that is not a JSON object is returned as a string saying why."""
    rows: list[tuple[int, dict | str]] = []
    for n, line in enumerate(lines, start=start + 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            rows.append((n, f"not valid JSON: {e}"))
            continue
        rows.append((n, row if isinstance(row, dict) else f"not a JSON object: {line.strip()[:60]}"))
    return rows


class Table(Layout):
    """One item per table row. A file is one input: a row naming a file that an earlier row
    already named is rejected (under the row's ``manifest:line`` name, so the file is never
    both a sample and a reject), and when one file of a row is bad the row's other files are
    rejected with it."""

    name = "manifest"

    def collect(self, root: Path, src: SourceConfig, b: Builder) -> list[str]:
        mpath = Path(src.manifest or "")
        # The path column of each field of files; the other fields read their row's cells
        # in the annotation stage (the row travels as the item's columns).
        columns = {name: (fc.column or name) for name, fc in b.job.fields.items() if name in b.fields}
        claimed: dict[str, int] = {}  # path already named (sample or reject) -> its table line
        for line, row in read_rows(mpath):
            where = f"{mpath.name}:{line}"
            if isinstance(row, str):
                b.rejects.append(Reject(where, "discover", row))
            else:
                _row(root, b, columns, claimed, line, where, row)
        return declared_then_found(src, b)


def _row(root: Path, b: Builder, columns: dict[str, str], claimed: dict[str, int],
         line: int, where: str, row: dict) -> None:
    """Turn one table row into an item, or into rejects naming each of its paths once."""
    real_root = os.path.realpath(root)
    paths: list[str] = []
    stats: list[tuple[int, int]] = []
    row_problems: list[str] = []
    file_rejects: list[Reject] = []

    def bad_file(key: str, reason: str) -> None:
        # A path already named (by an earlier row, or this one) is reported under the row's
        # name instead, so no path is rejected twice.
        if key in claimed or key in paths or any(r.path == key for r in file_rejects):
            earlier = f"row {claimed[key]}" if key in claimed else "this row"
            row_problems.append(f"{key}: {reason} (also listed in {earlier})")
        else:
            file_rejects.append(Reject(key, "discover", reason))

    for fname, col in columns.items():
        value = row.get(col) or (row.get("path") if len(columns) == 1 else None)
        if not value:
            row_problems.append(f"row has no {col!r} value")
            continue
        value = str(value)
        full = os.path.realpath(root / value)
        if not (full == real_root or full.startswith(real_root + os.sep)):
            bad_file(value, f"manifest row {line} points outside the corpus root")
            continue
        rel = os.path.relpath(full, real_root).replace(os.sep, "/")
        if not os.path.isfile(full):
            bad_file(value, f"manifest row {line}: file does not exist")
            continue
        if rel in claimed or rel in paths:
            earlier = f"row {claimed[rel]}" if rel in claimed else "this row"
            row_problems.append(f"duplicate: {rel} is already listed in {earlier}")
            continue
        if not b.takes(fname, rel):
            bad_file(rel, not_accepted(rel, b.accepted(fname), fname))
            continue
        st = os.stat(full)
        stats.append((st.st_size, st.st_mtime_ns))
        paths.append(rel)
    if row_problems or file_rejects:
        first = file_rejects[0] if file_rejects else Reject(where, "discover", "; ".join(row_problems))
        if row_problems:
            b.rejects.append(Reject(where, "discover", "; ".join(row_problems)))
        b.rejects.extend(file_rejects)
        claimed.update((r.path, line) for r in file_rejects)
        for rel in paths:  # the row's good files go with it, each named once
            claimed[rel] = line
            b.rejects.append(Reject(rel, "discover", f"another file of manifest row {line} was rejected "
                                                     f"({first.path}: {first.reason})"))
        return
    for rel in paths:
        claimed[rel] = line
    label = row.get("label")
    split = row.get("split") or "train"
    cells = tuple((str(k), v) for k, v in row.items() if k is not None)
    b.items.append(Item(stem(paths[0]), str(split), tuple(paths), None if label in (None, "") else str(label),
                        columns=cells), tuple(stats))


register(Table())
