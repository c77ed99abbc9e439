"""``h5batch export``: an output written back out in another tool's format, one module per
target, registered in :data:`TARGETS`.

Every target module defines ``NAME`` (the ``--to`` value), ``HELP`` (one line for
``h5batch export --help``) and ``write(reader, out, splits, *, overwrite, **options) ->
dict``, which writes the samples of ``splits`` that a
:class:`~h5batch.export.samples.SampleReader` yields into the folder ``out`` and returns a
summary (samples per split, what was written). The samples, the checks of what can be
exported and the WAV/PNG encoders they share are in :mod:`h5batch.export.samples`, so a
target is only its layout.

To add a target ``--to frob``: write ``h5batch/export/frob.py`` with those three names,
import it below and add it to :data:`TARGETS`; docs/interop.md gets a section.

Reading needs the reader (``pip install h5batch[torch]``): samples come from
:class:`h5batch.torch.H5Dataset`, so only live rows are exported (see
:mod:`h5batch.export.samples` for why).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from . import files, webdataset
from .samples import ExportError, SampleReader

__all__ = ["TARGETS", "ExportError", "export"]

TARGETS: dict[str, ModuleType] = {m.NAME: m for m in (webdataset, files)}


def export(path: str | os.PathLike[str], target: str, out: str | os.PathLike[str],
           splits: Sequence[str] | None = None, fields: Sequence[str] | None = None, *,
           overwrite: bool = False, **options: Any) -> dict[str, Any]:
    """Write the output ``path`` into the folder ``out`` in the format ``target``.

    Parameters
    ----------
    path : str or PathLike
        A complete h5batch output.
    target : str
        A key of :data:`TARGETS` (``webdataset``, ``files``).
    out : str or PathLike
        Folder to write into (created when missing).
    splits, fields : sequence of str, optional
        What to export; default every split and every field.
    overwrite : bool
        Replace what an earlier export of the same splits left in ``out``.
    **options
        The target's own settings (``shard_size`` for ``webdataset``).

    Returns
    -------
    dict
        The target's summary: ``splits`` maps each split to its ``samples`` (and shards).
    """
    module = TARGETS.get(target)
    if module is None:
        raise ExportError(f"unknown export target {target!r} (targets: {', '.join(TARGETS)})")
    reader = SampleReader(path, fields)
    chosen = reader.select_splits(splits)
    return module.write(reader, Path(out), chosen, overwrite=overwrite, **options)
