"""Layout ``class_folders``: ``root/<split>/<class>/<file>`` (ImageFolder style).

The class folder is the label. With several fields, the files of one stem in one class
folder form a sample (``train/cat/1.wav`` + ``train/cat/1.png``), so each field needs its
own extensions (config checks that). Keys are ``<class>/<path inside the class folder
without suffix>``, so the same file name in two classes stays two samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..fields import file_fields
from ..manifest import Item, Reject
from .base import Builder, Layout, Walker, ext, not_accepted, register, split_dirs

if TYPE_CHECKING:
    from ..config_types import JobConfig, SourceConfig


class ClassFolders(Layout):
    name = "class_folders"
    incremental = True  # with one field, a file's item depends on its own path (see below)

    def walk(self, root: Path, src: SourceConfig, b: Builder) -> tuple[list[tuple[str, int, int]], list[str]]:
        splits = split_dirs(root, src, b)
        walker = Walker(root, b.ordered_walk)
        files = [f for split in splits for f in walker.walk(split)]
        b.walked(walker)
        return files, splits

    def build(self, root: Path, src: SourceConfig, b: Builder, files: list[tuple[str, int, int]],
              splits: list[str] | None) -> list[str]:
        by_split: dict[str, list[tuple[str, int, int]]] = {}
        for f in files:
            by_split.setdefault(f[0].partition("/")[0], []).append(f)
        start = len(b.items)
        for split in splits or sorted(by_split):
            by_class: dict[str, list[str]] = {}
            field_of: dict[str, str] = {}
            for rel, size, mtime in by_split.get(split, ()):
                parts = rel.split("/")
                if len(parts) < 3:
                    b.rejects.append(Reject(rel, "discover", "file is not inside a class folder (<split>/<class>/<file>)"))
                    continue
                fname = b.ext_to_field.get(ext(rel))
                if fname is None:
                    b.rejects.append(Reject(rel, "discover", not_accepted(rel, ", ".join(sorted(b.ext_to_field)))))
                    continue
                b.stats[rel] = (size, mtime)
                field_of[rel] = fname
                by_class.setdefault(parts[1], []).append(rel)
            for cls, group in by_class.items():
                b.group_by_stem(split, group, cls, "", field_of)
        # Keys: class/stem-within-class, so the same stem in two classes stays distinct.
        b.items[start:] = [Item("/".join(it.paths[0].split("/")[1:]).rsplit(".", 1)[0], it.split, it.paths, it.label)
                           for it in b.items[start:]]
        return list(splits or [])

    def cannot_sync_incrementally(self, job: JobConfig) -> str | None:
        if len(file_fields(job.fields)) != 1:
            return "class_folders with several fields pairs files by stem"
        return None


register(ClassFolders())
