"""Field kind ``multilabel``: several binary targets per sample, stored ``(N, K)`` uint8
(0/1) with the target names in the ``names`` attribute.

* ``columns: [A, B, ...]``: one annotation column per target, each cell ``1``/``0``,
  ``1``/``-1`` (CelebA's ``list_attr_celeba.txt``), ``true``/``false`` or ``yes``/``no``;
  ``columns: ["*"]`` takes every column of the field's table but its key, in table order;
* ``column: NAME`` with ``sep: ","``: one cell listing the sample's labels (``dog,bark``);
  the names are ``names:`` when given (a label outside them is a reject), else every label
  met, in natural order.

The names are fixed at discovery and written into the job stored in the output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError
from ..manifest import natural_key
from .base import FieldKind

ALL = "*"
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "-1", "false", "no", "n", "f", ""}


@dataclass(frozen=True)
class MultiLabelField:
    type: Literal["multilabel"] = "multilabel"
    extensions: list[str] = field(default_factory=list)  # targets are not files: always empty
    folder: str | None = None
    column: str | None = None  # one cell listing the labels (with sep)
    sep: str = ","
    columns: list[str] = field(default_factory=list)  # one binary column per target, or ["*"]
    names: list[str] = field(default_factory=list)  # the targets (default: columns, or labels met)


class MultiLabelKind(FieldKind):
    name = "multilabel"
    config_class = MultiLabelField

    def validate(self, fc: MultiLabelField, file: str, key: str) -> None:
        if fc.extensions:
            raise ConfigError(file, f"{key}.extensions", "a multilabel field reads annotation columns, not files")
        if bool(fc.column) == bool(fc.columns):
            raise ConfigError(file, key, "give columns: [A, B] (one binary column per target) or "
                                         "column: NAME with sep (one cell listing the labels), not both")
        if ALL in fc.columns and fc.columns != [ALL]:
            raise ConfigError(file, f"{key}.columns", "'*' stands for every column and comes alone")
        if fc.columns and fc.names and fc.columns != [ALL] and len(fc.names) != len(fc.columns):
            raise ConfigError(file, f"{key}.names", "gives a name per column: as many names as columns")
        if fc.column and not fc.sep:
            raise ConfigError(file, f"{key}.sep", "must not be empty")

    def reads_files(self, fc: MultiLabelField) -> bool:
        return False

    def decode(self, path: str, fc: MultiLabelField) -> np.ndarray:
        raise DecodeError(path, "a multilabel field reads annotation columns, not files")

    def resolve(self, fc: MultiLabelField, values: list[Any]) -> MultiLabelField:
        if fc.names:
            return fc
        if fc.columns:
            return dataclasses.replace(fc, names=list(fc.columns))
        met = {lab for v in values for lab in _labels(v, fc.sep)}
        return dataclasses.replace(fc, names=sorted(met, key=natural_key))

    def resolves_incrementally(self, fc: MultiLabelField) -> bool:
        return bool(fc.names or fc.columns)  # target names from every sample otherwise

    def from_value(self, value: Any, fc: MultiLabelField) -> np.ndarray:
        out = np.zeros(len(fc.names), dtype=np.uint8)
        if fc.column:
            index = {n: i for i, n in enumerate(fc.names)}
            for lab in _labels(value, fc.sep):
                if lab not in index:
                    raise DecodeError("", f"label {lab!r} is not one of names: {fc.names[:8]}")
                out[index[lab]] = 1
            return out
        cells = list(value)
        if len(cells) != len(fc.names):
            raise DecodeError("", f"{len(cells)} target values, expected {len(fc.names)}")
        for i, cell in enumerate(cells):
            text = "" if cell is None else str(cell).strip().lower()
            if text in _TRUE:
                out[i] = 1
            elif text not in _FALSE:
                raise DecodeError("", f"target {fc.names[i]!r} is {cell!r}, not 1/0, 1/-1, true/false or yes/no")
        return out

    def fixed_shape(self, fc: MultiLabelField) -> tuple[tuple[int, ...], np.dtype]:
        return (len(fc.names),), np.dtype(np.uint8)

    def attrs(self, fc: MultiLabelField) -> dict[str, Any]:
        return {"names": list(fc.names)}

    def float_scale(self, dtype: np.dtype) -> float | None:
        return None  # 0/1 targets, not pixels


def _labels(value: Any, sep: str) -> list[str]:
    text = "" if value is None else str(value)
    return [t.strip() for t in text.split(sep) if t.strip()]
