"""Target ``files``: one WAV/PNG file per audio/image field of each sample, and
``DIR/labels.csv``, so that the export is itself a corpus h5batch converts again.

``<stem>`` is the sample's first source's file name less its suffix (a leading dot becomes
``_``; a stem already used in the folder gets ``-<row>``):

=====================================  ==================================================
labelled split                         ``DIR/<split>/<class>/<stem>.wav|png``
                                       (``class_folders`` layout)
labelled, two fields share an          ``DIR/<split>/<class>/<field>/<stem>.<ext>``
extension                              (``manifest`` layout)
unlabelled, one file field             ``DIR/<split>/<stem>.<ext>``
unlabelled, several file fields        ``DIR/<split>/<field>/<stem>.<ext>``
                                       (``paired_folders`` layout)
=====================================  ==================================================

Class folder names have ``/``, ``\\`` and a leading dot replaced by ``_`` (the ``label``
column keeps the real name); label -1 goes where an unlabelled sample would.

``labels.csv``, one row per sample in split then file order: ``path`` (first file, relative
to ``DIR``: the key ``source.tables`` matches), one column per file field when several,
``split``, ``label`` (class name or empty), ``source`` (original paths, ``;``-joined),
``row``, then one column per text / value field, and one per name of a K-column value or
multilabel field (0/1), named as the names are, so ``columns: [A, B]`` reads them back. A
column name met twice stops the export naming the field.
"""

from __future__ import annotations

import csv
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from .samples import ExportError, FieldSpec, Sample, SampleReader, data_value, encode

NAME = "files"
HELP = "a folder of wav/png files per split and class, plus labels.csv"
LABELS = "labels.csv"
FIXED_COLUMNS = ("path", "split", "label", "source", "row")


def _folder_name(text: str) -> str:
    text = text.replace("/", "_").replace("\\", "_")
    return "_" + text[1:] if text.startswith(".") else (text or "_")


def _columns(reader: SampleReader) -> list[str]:
    files = [fs.name for fs in reader.fields if fs.is_file]
    cols = ["path", *(files if len(files) > 1 else []), "split", "label", "source", "row"]
    cols += [c for fs in reader.fields if not fs.is_file for c in (fs.names or (fs.name,))]
    clash = [c for c, k in Counter(cols).items() if k > 1]
    if clash:
        owner = next((fs.name for fs in reader.fields if clash[0] == fs.name or clash[0] in fs.names), clash[0])
        raise ExportError(f"{reader.path}: field {owner!r} would write a second {clash[0]!r} column into "
                          f"{LABELS} (its columns: {', '.join(FIXED_COLUMNS)}, then one per field or "
                          "per name of a field of several columns): leave the field out with --fields")
    return cols


def _cells(fs: FieldSpec, v: Any) -> dict[str, Any]:
    value = data_value(fs, v)
    if isinstance(value, dict):
        return {k: _cell(x) for k, x in value.items()}
    return {fs.name: _cell(value)}


def _cell(x: Any) -> str:
    return repr(x) if isinstance(x, float) else str(x)


class _Placer:
    """Decides each sample's folder and stem (the table in the module docstring)."""

    def __init__(self, reader: SampleReader, split: str):
        self.reader, self.split = reader, split
        files = [fs for fs in reader.fields if fs.is_file]
        self.per_field = len(files) > 1 and (
            not reader.labelled.get(split) or len({fs.ext for fs in files}) < len(files))
        self.used: set[str] = set()

    def paths(self, s: Sample) -> dict[str, str]:
        parts = [self.split] + ([_folder_name(s.class_name)] if s.class_name is not None else [])
        first = self.reader.first_source(self.split, s)
        stem = Path(first).stem if first else f"{s.row:08d}"
        stem = _folder_name(stem)
        base = "/".join(parts)
        if f"{base}/{stem}" in self.used:
            stem = f"{stem}-{s.row}"
        self.used.add(f"{base}/{stem}")
        return {fs.name: (f"{base}/{fs.name}/{stem}.{fs.ext}" if self.per_field else f"{base}/{stem}.{fs.ext}")
                for fs in self.reader.fields if fs.is_file}


def write(reader: SampleReader, out: Path, splits: tuple[str, ...], *, overwrite: bool = False,
          **_unused: Any) -> dict[str, Any]:
    """Write the files of ``splits`` and ``labels.csv`` into ``out``; returns a summary."""
    reader.check_exportable(NAME)
    if not any(fs.is_file for fs in reader.fields):
        raise ExportError(f"{reader.path}: no audio or image field to write as files (fields: "
                          f"{', '.join(fs.name for fs in reader.fields)})")
    columns = _columns(reader)
    taken = [out / s for s in splits if (out / s).exists()] + ([out / LABELS] if (out / LABELS).exists() else [])
    if taken and not overwrite:
        raise ExportError(f"{taken[0]} already exists: export into another folder or pass --overwrite "
                          "(which replaces the folders of the exported splits and labels.csv)")
    for p in taken:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (LABELS + ".partial")
    counts: dict[str, int] = {}
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        table = csv.DictWriter(fh, fieldnames=columns)
        table.writeheader()
        for split in splits:
            placer, n = _Placer(reader, split), 0
            for s in reader.samples(split):
                paths = placer.paths(s)
                for fs in reader.fields:
                    if fs.is_file:
                        dest = out / paths[fs.name]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_bytes(encode(fs, s.data[fs.name], s.row))
                row = {"path": next(iter(paths.values())), "split": split, "label": s.class_name or "",
                       "source": ";".join(s.sources), "row": s.row}
                if len(paths) > 1:
                    row.update(paths)
                for fs in reader.fields:
                    if not fs.is_file:
                        row.update(_cells(fs, s.data[fs.name]))
                table.writerow(row)
                n += 1
            counts[split] = n
    os.replace(tmp, out / LABELS)
    return {"format": NAME, "source": reader.identity(), "splits": {s: {"samples": n} for s, n in counts.items()}}
