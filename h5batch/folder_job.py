"""The job a folder implies: ``h5batch convert DIR``, ``sync DIR`` and ``init DIR``.

Rules (docs/jobs.md, "A folder without a job"), read from the files themselves:

* the field kind from the extensions found: audio, image, or both paired by stem when most
  stems have both; else the majority kind, the other excluded. Files of neither kind are
  excluded (``source.exclude``), so they are listed and counted, never lost;
* the label is the class folder: ``root/<class>/<file>`` or ``root/<split>/<class>/<file>``;
  the top folders are splits when every one is a split name (:data:`SPLIT_NAMES`, any
  case, the name kept), else there is one split, ``train``. Top folders that mix split
  names and other names are refused: no reading of them is safe;
* files directly in the root (or in the split folders) have no label;
* a ``metadata.csv`` / ``metadata.jsonl`` with a ``file_name`` column (Hugging Face's
  audiofolder and imagefolder) is joined as an annotation table: its numeric columns become
  ``value`` fields, its other columns ``text`` fields, ``label`` the label, ``split`` the
  split.

The job is a plain mapping that goes through :func:`h5batch.config.job_from_dict` like a
job file's, so ``--set`` overrides it and the output stores it like any other.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fields.ffmpeg import EXTENSIONS as FFMPEG_EXTENSIONS
from .layouts.table import read_rows

AUDIO = frozenset({".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff"} | set(FFMPEG_EXTENSIONS))
IMAGE = frozenset({".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"})
SPLIT_NAMES = frozenset({"train", "val", "valid", "validation", "test", "dev", "eval"})
METADATA = ("metadata.csv", "metadata.jsonl")


def _files(root: Path) -> list[str]:
    """Every non-hidden file under ``root``, root-relative with ``/``, sorted."""
    out = []
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(top, root).replace(os.sep, "/")
        out.extend(n if rel == "." else f"{rel}/{n}" for n in names if not n.startswith("."))
    return sorted(out)


def _suffix(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def _kinds(media: list[str]) -> tuple[list[str], list[str]]:
    """The field kinds to make (``audio``, ``image`` or both) and notes on the choice."""
    audio = [p for p in media if _suffix(p) in AUDIO]
    image = [p for p in media if _suffix(p) in IMAGE]
    if audio and image:
        stems_a = {os.path.splitext(p)[0] for p in audio}
        stems_i = {os.path.splitext(p)[0] for p in image}
        if len(stems_a & stems_i) * 2 > len(stems_a | stems_i):
            return ["audio", "image"], ["audio and image files share most stems: one sample is "
                                        "the audio and image of one stem"]
        kept, dropped = ("audio", "image") if len(audio) >= len(image) else ("image", "audio")
        n = len(image) if dropped == "image" else len(audio)
        return [kept], [f"{kept} files are the majority; the {n} {dropped} files are excluded"]
    return (["audio"] if audio else ["image"]), []


def _column_fields(rows: list[dict], taken: set[str]) -> dict[str, dict]:
    """A field per metadata column: ``value`` (int64 or float64) when every cell is a number,
    ``text`` otherwise."""
    fields: dict[str, dict] = {}
    for col in dict.fromkeys(k for r in rows for k in r):
        if col in ("file_name", "label", "split") or col in taken or not col.isidentifier():
            continue
        cells = [str(r.get(col, "")).strip() for r in rows]
        kind = "int64"
        for c in cells:
            try:
                int(c)
            except ValueError:
                try:
                    float(c)
                    kind = "float64"
                except ValueError:
                    kind = None
                    break
        fields[col] = {"type": "value", "column": col, "dtype": kind} if kind else {"type": "text", "column": col}
    return fields


def infer(folder: str, output: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The job for ``folder`` (a mapping, as a job file would give) and what was found, in
    words. :class:`ConfigError` (exit 2) when the folder has no media or cannot be read
    safely."""
    root = Path(folder)
    if not root.is_dir():
        raise ConfigError(folder, "", "is not a folder")
    name = root.resolve().name or "corpus"
    files = _files(root)
    meta = [p for p in files if p.rpartition("/")[2] in METADATA]
    media = [p for p in files if _suffix(p) in AUDIO | IMAGE]
    if not media:
        raise ConfigError(folder, "", f"no audio ({', '.join(sorted(AUDIO)[:6])}, ...) or image "
                                      f"({', '.join(sorted(IMAGE)[:6])}, ...) files found among {len(files)} files")
    kinds, notes = _kinds(media)
    wanted = AUDIO if kinds == ["audio"] else IMAGE if kinds == ["image"] else AUDIO | IMAGE
    used = [p for p in media if _suffix(p) in wanted]
    exts = Counter(_suffix(p) for p in used)
    others = sorted({_suffix(p) or p.rpartition("/")[2] for p in files if p not in meta and _suffix(p) not in wanted})
    exclude = [f"*{e}" for e in others]  # an extension, or a whole name (README, LICENSE)

    tops = sorted({p.split("/")[0] for p in used if "/" in p})
    is_split = [t for t in tops if t.lower() in SPLIT_NAMES]
    if is_split and len(is_split) != len(tops):
        other = [t for t in tops if t not in is_split]
        raise ConfigError(folder, "source.layout",
                          f"the top folders mix split names ({', '.join(is_split)}) and other names "
                          f"({', '.join(other[:6])}{', ...' if len(other) > 6 else ''}): write a job "
                          f"(h5batch init {folder} prints one to start from): source.splits lists the "
                          "splits to take, or exclude the other folders with source.exclude")
    split_folders = bool(is_split)
    below = [p for p in used if p.count("/") > int(split_folders)]  # files inside a class folder
    source: dict[str, Any] = {"root": str(root.resolve())}
    if below:
        source["layout"] = "class_folders"
        if not split_folders:
            source["split_folders"] = False
        n_classes = len({p.split("/")[int(split_folders)] for p in below})
        found = f"{len(used)} files in {n_classes} class folders"
    else:
        source["layout"] = "pattern"
        source["pattern"] = "(?P<split>[^/]+)/[^/]+" if split_folders else "[^/]+"
        found = f"{len(used)} files without class folders (no labels)"
    found += f", splits: {', '.join(is_split)}" if split_folders else ", one split (train)"
    fields: dict[str, dict] = {}
    for kind in kinds:
        fields[kind] = {"type": kind, "extensions": sorted(e for e in exts if e in (AUDIO if kind == "audio" else IMAGE))}
    if meta:
        rows = [r for m in meta for _, r in read_rows(root / m) if isinstance(r, dict)]
        if rows and "file_name" in rows[0]:
            source["tables"] = [{"path": meta if len(meta) > 1 else meta[0], "key": "file_name"}]
            fields.update(_column_fields(rows, set(fields)))
            if "label" in rows[0]:
                source["label_column"] = "label"
            if "split" in rows[0]:
                source["split"] = {"column": "split"}
            notes.append(f"{', '.join(meta)}: columns {', '.join(rows[0])} joined by file_name")
        else:
            exclude += meta
    if exclude:
        source["exclude"] = exclude
        notes.append(f"excluded (neither {' nor '.join(kinds)}): {', '.join(exclude)}")
    job = {"name": name, "source": source, "fields": fields,
           "output": {"path": output or f"{name}.h5"}}
    return job, [f"{folder}: {found}; fields: {', '.join(kinds)}", *notes]


def commented_yaml(job: dict[str, Any], notes: list[str]) -> str:
    """``job`` as a job file to save and edit: what was found, then the job, then the keys a
    user most often adds (docs/jobs.md lists them all)."""
    import yaml

    head = "".join(f"# {n}\n" for n in notes)
    body = yaml.safe_dump(job, sort_keys=False, default_flow_style=None)
    hints = ("# Often added (docs/jobs.md has every key):\n"
             "#   fields.<audio>.sample_rate: 16000     resample: true, length / max_length\n"
             "#   fields.<image>.size: [224, 224]       mode: L\n"
             "#   source.split: {hash: {val: 0.1}}     a split rule, when there are no split folders\n"
             "#   output.codec: auto | none | blosc2-lz4 | zstd | gzip\n")
    return f"# The job h5batch uses for {job['source']['root']} (h5batch convert THIS_FILE)\n{head}{body}{hints}"
