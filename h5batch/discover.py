"""Corpus discovery: a job's ``source`` section -> a stable, sorted :class:`Manifest`.

Four layouts (``source.layout``):

``class_folders``   ``root/<split>/<class>/<file>`` (ImageFolder style). With several
                    fields, files of one stem form a sample (``x/cat/1.wav`` + ``x/cat/1.png``).
``paired_folders``  ``root/<split>/<field folder>/<name>``: files of the same stem in each
                    field folder form one sample (``data/7.wav`` + ``label/7.wav``).
``pattern``         a regex with named groups (``label``, split group) matched against each
                    file's path relative to ``root``.
``manifest``        a CSV or JSONL listing the path of each field, ``label`` and ``split``.

Whatever the file system's listing order, the manifest is sorted (split order, then a
natural sort of the key) so outputs are identical from run to run. Hidden files and
folders (``.name``) are skipped. Every other file found ends up either in an item or in
the rejects list with its reason: nothing is silently dropped.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .config import JobConfig, SourceConfig


@dataclass(frozen=True, slots=True)
class Item:
    """One sample to decode: ``paths`` holds one path per field (relative to the corpus
    root, POSIX separators), in the job's field order."""

    key: str
    split: str
    paths: tuple[str, ...]
    label: str | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """An input that did not become a sample. ``stage`` is where it failed
    (``discover``, ``decode``, ``worker``, ``timeout``)."""

    path: str
    stage: str
    reason: str


@dataclass
class Manifest:
    """The items of a job in output order, the rejects of discovery, the class names
    (index = integer label) and a hash identifying this exact corpus state."""

    root: str
    fields: tuple[str, ...]
    splits: tuple[str, ...]
    items: list[Item]
    rejects: list[Reject] = field(default_factory=list)
    class_names: tuple[str, ...] = ()
    hash: str = ""

    def label_index(self, label: str | None) -> int:
        """Integer label of a class name (-1 when the corpus has no labels)."""
        if label is None:
            return -1
        return self._index[label]

    def __post_init__(self) -> None:
        self._index = {name: i for i, name in enumerate(self.class_names)}

    def counts(self) -> dict[str, int]:
        """Number of items per split."""
        out = {s: 0 for s in self.splits}
        for it in self.items:
            out[it.split] += 1
        return out


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """Sort key that orders ``2`` before ``10`` (digit runs compared as numbers)."""
    # isdecimal, not isdigit: '²' is a digit to str.isdigit but neither \d nor int() takes it.
    return tuple((0, int(t), "") if t.isdecimal() else (1, 0, t) for t in _DIGITS.split(text) if t)


class _Walker:
    """Lists regular files under a root, following symlinks only when they stay inside it.

    ``files`` receives ``(relative posix path, size, mtime_ns)``; problems go to ``rejects``.
    """

    def __init__(self, root: Path):
        self.root = root
        self.real_root = os.path.realpath(root)
        self.rejects: list[Reject] = []

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root + os.sep)

    def walk(self, rel: str = "", _stack: frozenset[str] = frozenset()) -> list[tuple[str, int, int]]:
        out: list[tuple[str, int, int]] = []
        base = self.root / rel if rel else self.root
        _stack = _stack | {os.path.realpath(base)}  # real paths of the folders being walked
        try:
            entries = sorted(os.scandir(base), key=lambda e: e.name)
        except OSError as e:
            self.rejects.append(Reject(rel or ".", "discover", f"cannot list folder: {e.strerror}"))
            return out
        for entry in entries:
            if entry.name.startswith("."):
                continue
            relpath = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                if not os.path.exists(entry.path):
                    self.rejects.append(Reject(relpath, "discover", "broken symlink"))
                    continue
                if not self._inside(entry.path):
                    self.rejects.append(Reject(relpath, "discover", "symlink points outside the corpus root"))
                    continue
            try:
                if entry.is_dir():
                    if entry.is_symlink() and os.path.realpath(entry.path) in _stack:
                        self.rejects.append(Reject(relpath, "discover", "symlink loop: points to a folder that contains it"))
                        continue
                    out.extend(self.walk(relpath, _stack))
                    continue
                st = entry.stat()
            except OSError as e:
                self.rejects.append(Reject(relpath, "discover", f"cannot stat: {e.strerror}"))
                continue
            if not entry.is_file():
                self.rejects.append(Reject(relpath, "discover", "not a regular file"))
                continue
            out.append((relpath, st.st_size, st.st_mtime_ns))
        return out


def _suffix_at(name: str) -> int:
    """Where the suffix of a file name starts (``len(name)`` for none), as pathlib says:
    the last dot, not leading and not trailing. String work, not ``PurePosixPath``: this
    runs for every file of the corpus (pathlib cost 0.25 s per 16k files)."""
    i = name.rfind(".")
    return i if 0 < i < len(name) - 1 else len(name)


def _ext(path: str) -> str:
    name = path.rpartition("/")[2]
    return name[_suffix_at(name):].lower()


def _stem(path: str) -> str:
    name = path.rpartition("/")[2]
    return path[: len(path) - len(name) + _suffix_at(name)]


class _Builder:
    """Collects items and rejects for one job and turns them into a Manifest."""

    def __init__(self, job: JobConfig):
        self.job = job
        self.fields = tuple(job.fields)
        self.ext_to_field: dict[str, str] = {}
        for name, fc in job.fields.items():
            for e in fc.extensions:
                self.ext_to_field.setdefault(e.lower(), name)
        self.items: list[Item] = []
        self.rejects: list[Reject] = []
        self.stats: dict[str, tuple[int, int]] = {}

    def accepted(self, field_name: str) -> str:
        return ", ".join(self.job.fields[field_name].extensions)

    def group_by_stem(self, split: str, files: list[str], label: str | None, key_prefix: str,
                      field_of: dict[str, str]) -> None:
        """Group ``files`` (relative paths) by stem; ``field_of[path]`` says its field."""
        groups: dict[str, dict[str, str]] = {}
        for path in files:
            stem = _stem(path)
            fname = field_of[path]
            slot = groups.setdefault(stem, {})
            if fname in slot:
                self.rejects.append(Reject(path, "discover", f"duplicate key: {slot[fname]} has the same stem and field"))
                continue
            slot[fname] = path
        for stem, slot in groups.items():
            missing = [f for f in self.fields if f not in slot]
            if missing:
                for path in slot.values():
                    self.rejects.append(Reject(path, "discover",
                                               f"paired sample incomplete: no {'/'.join(missing)} file for stem {PurePosixPath(stem).name!r}"))
                continue
            key = f"{key_prefix}{PurePosixPath(stem).name}" if key_prefix else stem
            self.items.append(Item(key, split, tuple(slot[f] for f in self.fields), label))

    def finish(self, root: str, splits: list[str]) -> Manifest:
        order = {s: i for i, s in enumerate(splits)}
        seen: dict[tuple[str, str], Item] = {}
        unique: list[Item] = []
        for it in sorted(self.items, key=lambda it: (order.get(it.split, len(order)), it.split, natural_key(it.key))):
            if (it.split, it.key) in seen:
                other = seen[(it.split, it.key)].paths[0]
                self.rejects.extend(Reject(p, "discover", f"duplicate key {it.key!r} in split {it.split!r} "
                                                          f"(already taken by {other})") for p in it.paths)
                continue
            seen[(it.split, it.key)] = it
            unique.append(it)
        all_splits = list(splits) + sorted({it.split for it in unique} - set(splits))
        labels = sorted({it.label for it in unique if it.label is not None}, key=natural_key)
        h = hashlib.sha256()
        for it in unique:
            h.update(json.dumps([it.split, it.key, it.paths, it.label]).encode())
            for p in it.paths:
                h.update(repr(self.stats.get(p)).encode())
        rejects = sorted(self.rejects, key=lambda r: natural_key(r.path))
        for r in rejects:
            h.update(json.dumps([r.path, r.stage, r.reason]).encode())
        return Manifest(root=root, fields=self.fields, splits=tuple(s for s in all_splits if any(it.split == s for it in unique)) or tuple(splits),
                        items=unique, rejects=rejects, class_names=tuple(labels), hash=h.hexdigest())


def _split_dirs(root: Path, src: SourceConfig, b: _Builder) -> list[str]:
    """The split folders to walk. Entries at the top of the corpus that cannot be a split
    are rejected when they matter: broken or escaping symlinks, and media files (of an
    accepted extension) lying outside any split folder. Other top-level files (README,
    LICENSE) and, when ``source.splits`` is given, unlisted folders are not part of the
    corpus."""
    walker = _Walker(root)
    found: list[str] = []
    for e in sorted(os.scandir(root), key=lambda e: e.name):
        if e.name.startswith("."):
            continue
        if src.splits and e.name not in src.splits and (e.is_symlink() or e.is_dir()):
            continue  # not one of the listed splits: not part of this job
        if e.is_symlink() and not os.path.exists(e.path):
            b.rejects.append(Reject(e.name, "discover", "broken symlink"))
        elif e.is_symlink() and not walker._inside(e.path):
            b.rejects.append(Reject(e.name, "discover", "symlink points outside the corpus root"))
        elif e.is_dir():
            found.append(e.name)
        elif _ext(e.name) in b.ext_to_field:
            b.rejects.append(Reject(e.name, "discover", "media file is not inside a split folder (<split>/...)"))
    if src.splits:
        for s in src.splits:
            if s not in found and not any(r.path == s for r in b.rejects):
                b.rejects.append(Reject(s, "discover", f"split folder {s!r} listed in source.splits is missing"))
        return [s for s in src.splits if s in found]
    return sorted(found, key=natural_key)


def _discover_class_folders(root: Path, src: SourceConfig, b: _Builder) -> list[str]:
    splits = _split_dirs(root, src, b)
    walker = _Walker(root)
    for split in splits:
        by_class: dict[str, list[str]] = {}
        field_of: dict[str, str] = {}
        for rel, size, mtime in walker.walk(split):
            parts = rel.split("/")
            if len(parts) < 3:
                b.rejects.append(Reject(rel, "discover", "file is not inside a class folder (<split>/<class>/<file>)"))
                continue
            fname = b.ext_to_field.get(_ext(rel))
            if fname is None:
                accepted = ", ".join(sorted(b.ext_to_field))
                b.rejects.append(Reject(rel, "discover", f"extension {_ext(rel) or '(none)'!r} is not accepted (accepted: {accepted})"))
                continue
            b.stats[rel] = (size, mtime)
            field_of[rel] = fname
            by_class.setdefault(parts[1], []).append(rel)
        for cls, files in by_class.items():
            b.group_by_stem(split, files, cls, "", field_of)
    b.rejects.extend(walker.rejects)
    # Keys: class/stem-within-class, so the same stem in two classes stays distinct.
    b.items = [Item("/".join(it.paths[0].split("/")[1:]).rsplit(".", 1)[0], it.split, it.paths, it.label) for it in b.items]
    return splits


def _discover_paired(root: Path, src: SourceConfig, b: _Builder) -> list[str]:
    splits = _split_dirs(root, src, b)
    folder_to_field = {(fc.folder or name): name for name, fc in b.job.fields.items()}
    walker = _Walker(root)
    for split in splits:
        files: list[str] = []
        field_of: dict[str, str] = {}
        for rel, size, mtime in walker.walk(split):
            parts = rel.split("/")
            fname = folder_to_field.get(parts[1]) if len(parts) >= 3 else None
            if fname is None:
                b.rejects.append(Reject(rel, "discover", f"not inside a field folder ({', '.join(folder_to_field)}) of split {split!r}"))
                continue
            if _ext(rel) not in [e.lower() for e in b.job.fields[fname].extensions]:
                b.rejects.append(Reject(rel, "discover", f"extension {_ext(rel) or '(none)'!r} is not accepted for field {fname!r} (accepted: {b.accepted(fname)})"))
                continue
            b.stats[rel] = (size, mtime)
            field_of[rel] = fname
            files.append(rel)
        # Group by the path inside the field folder, so data/a/1.wav pairs with label/a/1.wav.
        inner = {rel: "/".join(rel.split("/")[2:]) for rel in files}
        groups: dict[str, dict[str, str]] = {}
        for rel in files:
            slot = groups.setdefault(_stem(inner[rel]), {})
            fname = field_of[rel]
            if fname in slot:
                b.rejects.append(Reject(rel, "discover", f"duplicate key: {slot[fname]} has the same name in field {fname!r}"))
                continue
            slot[fname] = rel
        for stem, slot in groups.items():
            missing = [f for f in b.fields if f not in slot]
            if missing:
                for rel in slot.values():
                    b.rejects.append(Reject(rel, "discover", f"paired sample incomplete: no {'/'.join(missing)} file named {stem!r}"))
                continue
            b.items.append(Item(stem, split, tuple(slot[f] for f in b.fields), None))
    b.rejects.extend(walker.rejects)
    return splits


def _discover_pattern(root: Path, src: SourceConfig, b: _Builder) -> list[str]:
    rx = re.compile(src.pattern or "")
    walker = _Walker(root)
    fname = b.fields[0]
    exts = [e.lower() for e in b.job.fields[fname].extensions]
    for rel, size, mtime in walker.walk():
        if _ext(rel) not in exts:
            b.rejects.append(Reject(rel, "discover", f"extension {_ext(rel) or '(none)'!r} is not accepted (accepted: {b.accepted(fname)})"))
            continue
        m = rx.fullmatch(rel)
        if m is None:
            b.rejects.append(Reject(rel, "discover", "path does not match source.pattern"))
            continue
        groups = m.groupdict()
        label = groups.get(src.label_group)
        rule = src.split
        if rule.ranges:
            raw = groups.get(rule.group)
            try:
                value = int(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                b.rejects.append(Reject(rel, "discover", f"split group {rule.group!r} is not an integer: {raw!r}"))
                continue
            split = next((s for s, (lo, hi) in rule.ranges.items() if lo <= value <= hi), rule.default)
        else:
            split = groups.get(rule.group) or rule.default
        b.stats[rel] = (size, mtime)
        b.items.append(Item(_stem(rel), split, (rel,), label))
    b.rejects.extend(walker.rejects)
    declared = list(src.splits or [])
    return declared + sorted({it.split for it in b.items} - set(declared), key=natural_key)


def _read_manifest_rows(path: Path) -> list[tuple[int, dict | str]]:
    """``(line number, row)`` of a CSV or JSONL manifest; a row that cannot be parsed is
    returned as a string saying why (it becomes a reject, not a crash)."""
    rows: list[tuple[int, dict | str]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                rows.append((n, f"not valid JSON: {e}"))
                continue
            rows.append((n, row if isinstance(row, dict) else f"not a JSON object: {line.strip()[:60]}"))
        return rows
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            rows.append((reader.line_num, row))
    return rows


def _discover_manifest(root: Path, src: SourceConfig, b: _Builder) -> list[str]:
    """One item per manifest row. A file is one input: a row naming a file that an earlier
    row already named is rejected (under the row's ``manifest:line`` name, so the file is
    never both a sample and a reject), and when one file of a row is bad the row's other
    files are rejected with it."""
    mpath = Path(src.manifest or "")
    columns = {name: (fc.column or name) for name, fc in b.job.fields.items()}
    claimed: dict[str, int] = {}  # path already named (sample or reject) -> its manifest line
    for line, row in _read_manifest_rows(mpath):
        where = f"{mpath.name}:{line}"
        if isinstance(row, str):
            b.rejects.append(Reject(where, "discover", row))
        else:
            _manifest_row(root, b, columns, claimed, line, where, row)
    declared = list(src.splits or [])
    return declared + sorted({it.split for it in b.items} - set(declared), key=natural_key)


def _manifest_row(root: Path, b: _Builder, columns: dict[str, str], claimed: dict[str, int],
                  line: int, where: str, row: dict) -> None:
    """Turn one manifest row into an item, or into rejects naming each of its paths once."""
    real_root = os.path.realpath(root)
    paths: list[str] = []
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
        if _ext(rel) not in [e.lower() for e in b.job.fields[fname].extensions]:
            bad_file(rel, f"extension {_ext(rel) or '(none)'!r} is not accepted for field {fname!r} (accepted: {b.accepted(fname)})")
            continue
        st = os.stat(full)
        b.stats[rel] = (st.st_size, st.st_mtime_ns)
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
    b.items.append(Item(_stem(paths[0]), str(split), tuple(paths), None if label in (None, "") else str(label)))


_LAYOUTS = {
    "class_folders": _discover_class_folders,
    "paired_folders": _discover_paired,
    "pattern": _discover_pattern,
    "manifest": _discover_manifest,
}


def discover(job: JobConfig) -> Manifest:
    """Walk the corpus of ``job`` and return its manifest (items in output order)."""
    root = Path(job.source.root)
    b = _Builder(job)
    splits = _LAYOUTS[job.source.layout](root, job.source, b)
    return b.finish(str(root), splits)
