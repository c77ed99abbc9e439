"""Layout ``paired_folders``: ``root/<split>/<field folder>/<name>``.

One folder per field in each split (``fields.<name>.folder``, default the field name); the
files with the same path inside their field folder, suffix aside, form one sample
(``train/data/a/7.wav`` + ``train/label/a/7.wav``). Samples carry no class label. A file
with no partner in every other field folder is rejected, naming what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest import Reject
from .base import Builder, Layout, Walker, not_accepted, register, split_dirs, stem_ext

if TYPE_CHECKING:
    from ..config_types import SourceConfig


class PairedFolders(Layout):
    name = "paired_folders"

    def collect(self, root: Path, src: SourceConfig, b: Builder) -> list[str]:
        splits = split_dirs(root, src, b)
        folder_to_field = {(fc.folder or name): name for name, fc in b.job.fields.items()}
        walker = Walker(root)
        exts = b.exts
        for split in splits:
            files: list[tuple] = []  # (path, field, stem of the path inside the field folder, stats)
            for rel, size, mtime in walker.walk(split):
                # One split and one look at the name per file: this runs for every file.
                parts = rel.split("/", 2)
                fname = folder_to_field.get(parts[1]) if len(parts) == 3 else None
                if fname is None:
                    b.rejects.append(Reject(rel, "discover", f"not inside a field folder ({', '.join(folder_to_field)}) of split {split!r}"))
                    continue
                inner_stem, suffix = stem_ext(parts[2])
                if suffix not in exts[fname]:
                    b.rejects.append(Reject(rel, "discover", not_accepted(rel, b.accepted(fname), fname)))
                    continue
                files.append((rel, fname, inner_stem, (size, mtime)))
            # Keyed by the path inside the field folder, so data/a/1.wav pairs with label/a/1.wav.
            b.pair(split, files, None, lambda fname: f"the same name in field {fname!r}",
                   lambda key: f"named {key!r}")
        b.walked(walker)
        return splits


register(PairedFolders())
