"""Text fields in the reader: a batch column of UTF-8 bytes becomes a ``list`` of ``str``.

Rule: a field whose ``modality`` is ``text`` (h5batch/fields/text.py) is read like any
variable-length uint8 field, then :func:`to_strings` replaces its column by the strings, so
``ds[i]["transcript"]`` is a ``str``, a :class:`~h5batch.torch.batch.Batch` column and
a collated batch are lists of them (what a tokenizer takes). Reason: bytes in a padded
tensor are no use to a training script, and a ``str`` costs nothing to send between
DataLoader processes at these sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .batch import Ragged

TEXT = "text"  # the modality the text kind writes


def text_fields(fields: Sequence[Any]) -> tuple[str, ...]:
    """Names of the text fields among a dataset's ``FieldInfo``s."""
    return tuple(fi.name for fi in fields if fi.modality == TEXT)


def to_strings(columns: dict[str, Any], names: Sequence[str]) -> None:
    """Replace each named column (a :class:`Ragged` of uint8) by its list of ``str``, in place."""
    for name in names:
        col = columns[name]
        if isinstance(col, Ragged):
            columns[name] = [bytes(np.ascontiguousarray(t.numpy())).decode("utf-8") for t in col.items()]
