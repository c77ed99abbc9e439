"""Target ``webdataset``: tar shards ``DIR/<split>-000000.tar``, ``-000001.tar``, ... as the
WebDataset convention has them, plus ``DIR/export.json`` (the shards of each split).

Each sample is a run of consecutive tar members ``<key>.<ext>`` (WebDataset groups members
by the basename up to its first dot):

* ``<key>.wav`` per audio field (16-bit PCM for int16, 32-bit float for float32, at the
  field's sample rate), ``<key>.png`` per image field. When two exported fields would share
  an extension (two audio fields of a paired corpus), each member is ``<key>.<field>.<ext>``
  instead (``sample["data.wav"]``, ``sample["target.wav"]``);
* ``<key>.cls``: the integer label as ASCII text (labelled samples only);
* ``<key>.json``: the class name (``label``), ``split``, file ``row``, ``source`` path(s)
  and every text / value / multilabel field (:func:`h5batch.export.samples.metadata`).

Keys are ``<split>_<row>`` (the file row, 8 digits), with any character but letters,
digits, ``_`` and ``-`` replaced: unique within an output, stable across syncs (a row never
moves), and free of dots. Members are written in key order, GNU tar format, with a fixed mtime (the output
file's), owner 0 and mode 0644, so the same output gives byte-identical shards. A shard is
written as ``NAME.tar.partial`` and renamed when complete: a killed export leaves no
half shard under a shard's name.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

from .samples import ExportError, SampleReader, encode, metadata, safe_name

NAME = "webdataset"
HELP = "tar shards <split>-000000.tar ... (members <key>.wav|png|cls|json)"
DEFAULT_SHARD_SIZE = 1000  # samples per shard: ~64 MB of 2 s 16 kHz int16 audio
PARTIAL = ".partial"


def member_names(reader: SampleReader) -> dict[str, str]:
    """``field -> member extension`` of every exported audio/image field."""
    exts = Counter(fs.ext for fs in reader.fields if fs.is_file)
    return {fs.name: fs.ext if exts[fs.ext] == 1 else f"{fs.name}.{fs.ext}"
            for fs in reader.fields if fs.is_file}


def shard_name(split: str, i: int) -> str:
    return f"{split}-{i:06d}.tar"


def _existing(out: Path, split: str) -> list[Path]:
    return sorted(p for p in out.glob(f"{split}-*.tar*") if p.name[len(split) + 1:].split(".")[0].isdigit())


def write(reader: SampleReader, out: Path, splits: tuple[str, ...], *, shard_size: int = DEFAULT_SHARD_SIZE,
          overwrite: bool = False) -> dict[str, Any]:
    """Write the shards of ``splits`` into ``out``; returns the summary written to export.json."""
    if int(shard_size) < 1:
        raise ExportError(f"--shard-size must be at least 1, got {shard_size}")
    reader.check_exportable(NAME)
    out.mkdir(parents=True, exist_ok=True)
    for split in splits:
        old = _existing(out, split)
        if old and not overwrite:
            raise ExportError(f"{out}: already holds shards of split {split!r} ({old[0].name}, ...): "
                              "export into another folder or pass --overwrite")
        for p in old:
            p.unlink()
    exts = member_names(reader)
    mtime = int(os.stat(reader.path).st_mtime)
    summary: dict[str, Any] = {"format": NAME, "source": reader.identity(), "class_names": list(reader.class_names),
                               "members": {**{f: f".{e}" for f, e in exts.items()}, "label": ".cls", "metadata": ".json"},
                               "splits": {}}
    for split in splits:
        shards, n = [], 0
        tar: tarfile.TarFile | None = None
        try:
            for s in reader.samples(split):
                if n % shard_size == 0:
                    if tar is not None:
                        _close(tar, out / shards[-1])
                    shards.append(shard_name(split, len(shards)))
                    tar = tarfile.open(out / (shards[-1] + PARTIAL), "w", format=tarfile.GNU_FORMAT)
                key = f"{safe_name(split)}_{s.row:08d}"
                for fs in reader.fields:
                    if fs.is_file:
                        _add(tar, f"{key}.{exts[fs.name]}", encode(fs, s.data[fs.name], s.row), mtime)
                if s.label is not None:
                    _add(tar, f"{key}.cls", str(s.label).encode(), mtime)
                meta = {"key": key, **metadata(reader, s)}
                _add(tar, f"{key}.json", json.dumps(meta, ensure_ascii=False, sort_keys=True).encode("utf-8"), mtime)
                n += 1
        except BaseException:
            if tar is not None:
                tar.close()
            raise
        if tar is not None:
            _close(tar, out / shards[-1])
        last = len(shards) - 1
        summary["splits"][split] = {"samples": n, "shards": shards,
                                    "pattern": f"{split}-{{000000..{last:06d}}}.tar" if shards else None}
    _write_json(out / "export.json", summary)
    return summary


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _close(tar: tarfile.TarFile, final: Path) -> None:
    tar.close()
    os.replace(str(final) + PARTIAL, final)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + PARTIAL)
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
