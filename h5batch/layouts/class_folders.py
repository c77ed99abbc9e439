"""Layout ``class_folders``: ``root/<split>/<class>/<file>`` (ImageFolder style).

The class folder is the label. With several fields, the files of one stem in one class
folder form a sample (``train/cat/1.wav`` + ``train/cat/1.png``), so each field needs its
own extensions (config checks that). Keys are ``<class>/<path inside the class folder
without suffix>``, so the same file name in two classes stays two samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest import Item, Reject
from .base import Builder, Layout, Walker, ext, not_accepted, register, split_dirs

if TYPE_CHECKING:
    from ..config import SourceConfig


class ClassFolders(Layout):
    name = "class_folders"

    def collect(self, root: Path, src: SourceConfig, b: Builder) -> list[str]:
        splits = split_dirs(root, src, b)
        walker = Walker(root)
        for split in splits:
            by_class: dict[str, list[str]] = {}
            field_of: dict[str, str] = {}
            for rel, size, mtime in walker.walk(split):
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
            for cls, files in by_class.items():
                b.group_by_stem(split, files, cls, "", field_of)
        b.walked(walker)
        # Keys: class/stem-within-class, so the same stem in two classes stays distinct.
        b.items = [Item("/".join(it.paths[0].split("/")[1:]).rsplit(".", 1)[0], it.split, it.paths, it.label)
                   for it in b.items]
        return splits


register(ClassFolders())
