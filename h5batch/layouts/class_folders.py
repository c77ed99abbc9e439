"""Layout ``class_folders``: ``root/<split>/<class>/<file>`` (ImageFolder style), or
``root/<class>/<file>`` with ``source.split_folders: false`` (torchvision's ImageFolder,
Hugging Face's imagefolder/audiofolder): then every sample is in ``split.default``
(``train``) unless a split rule (``source.split``: hash, lists, column) gives another.

The class folder is the label. With several fields, the files of one stem in one class
folder form a sample (``train/cat/1.wav`` + ``train/cat/1.png``), so each field needs its
own extensions (config checks that). Keys are ``<class>/<path inside the class folder
without suffix>``, so the same file name in two classes stays two samples.

Never a silent wrong reading: media files at varying depths below their class folders (a
nested corpus whose top folders are datasets, not classes), or more split folders than
classes, stop discovery with a :class:`ConfigError` saying what was found, unless the job
says it meant that: ``source.nested: true`` (the label is the first folder under the
split, whatever lies below it), ``source.splits`` (the split folders, named).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..fields import file_fields
from ..manifest import Reject
from ..walker import Files, Walker
from .base import Builder, Layout, ext, not_accepted, register, split_dirs

if TYPE_CHECKING:
    from ..config_types import JobConfig, SourceConfig


class ClassFolders(Layout):
    name = "class_folders"
    incremental = True  # with one field, a file's item depends on its own path (see below)

    def collect(self, root: Path, src: SourceConfig, b: Builder) -> list[str]:
        files, splits = self.walk(root, src, b)
        start = len(b.items)
        order = self.build(root, src, b, files, splits)
        classes = b.items.labels(start)
        # Only on a whole walk (a sync's build sees the new files only).
        if src.split_folders and not src.splits and splits and len(splits) > max(len(classes), 1):
            raise ConfigError(b.job.file, "source.splits",
                              f"{len(splits)} split folders ({', '.join(splits[:6])}{', ...' if len(splits) > 6 else ''}) "
                              f"but {len(classes)} class(es): if the top folders are the classes, set "
                              "source.split_folders: false; if they are splits, list them in source.splits")
        return order

    def walk(self, root: Path, src: SourceConfig, b: Builder) -> tuple[Files, list[str] | None]:
        if not src.split_folders:
            return super().walk(root, src, b)
        walker = Walker(root, b.ordered_walk)
        splits = split_dirs(root, src, b)
        files = Files()
        for split in splits:
            walker.walk(split, files)
        b.walked(walker)
        return files, splits

    def build(self, root: Path, src: SourceConfig, b: Builder, files: Sequence[tuple[str, int, int]],
              splits: list[str] | None) -> list[str]:
        top = 1 if src.split_folders else 0  # parts before the class folder
        where = "<split>/<class>/<file>" if top else "<class>/<file>"
        wanted = set(splits or ())
        # split -> class -> the indices of its files in ``files``: a walk's files are made one
        # at a time from its columns (h5batch.walker.Files), and let go once in an item.
        groups: dict[str, dict[str, array]] = {}
        depths: dict[int, str] = {}  # depth below the class folder -> first file met there
        for i, f in enumerate(files):
            rel = f[0]
            split = rel.partition("/")[0] if top else src.split.default
            if wanted and split not in wanted:
                continue
            parts = rel.split("/")
            if len(parts) < top + 2:
                b.rejects.append(Reject(rel, "discover", f"file is not inside a class folder ({where})"))
                continue
            fname = b.ext_to_field.get(ext(rel))
            if fname is None:
                b.rejects.append(Reject(rel, "discover", not_accepted(rel, ", ".join(sorted(b.ext_to_field)))))
                continue
            depths.setdefault(_depth(root, rel, top) if b.symlinks else len(parts) - top - 1, rel)
            groups.setdefault(split, {}).setdefault(parts[top], array("q")).append(i)
        for split in splits or sorted(groups):
            for cls, at in groups.get(split, {}).items():
                # Keys: class/stem-within-class, so the same stem in two classes stays distinct.
                b.group_by_stem(split, [files[i] for i in at], cls, cut=len(split) + 1 if top else 0)
        if len(depths) > 1 and not src.nested:
            found = ", ".join(f"{d} folder(s) down: {p}" for d, p in sorted(depths.items()))
            raise ConfigError(b.job.file, "source.layout",
                              f"media files sit at varying depths below their class folder ({found}), so the "
                              "folders are not <class>/<file>; if the first folder is the label, set "
                              "source.nested: true (--set source.nested=true), else use another layout")
        return list(splits or [])

    def cannot_sync_incrementally(self, job: JobConfig) -> str | None:
        if len(file_fields(job.fields)) != 1:
            return "class_folders with several fields pairs files by stem"
        return None


def _depth(root: Path, rel: str, top: int) -> int:
    """How far below its class folder a file met through a symlink really is: an alias reached
    through a folder link (``train/a/root -> ../..``) is one sample at its own depth, not a
    deeper one."""
    real = os.path.relpath(os.path.realpath(root / rel), os.path.realpath(root))
    return max(len(real.split(os.sep)), top + 2) - top - 1 if not real.startswith(os.pardir) else 1


register(ClassFolders())
