"""Field kind ``value``: numbers or a category per sample, from annotation columns
(speaker, chapter, fold, duration, age; a regression target).

* ``column: NAME``: one value per sample, stored ``(N,)``;
* ``columns: [A, B, ...]``: a vector per sample, stored ``(N, K)`` with the column names
  in the ``names`` attribute.

``dtype`` ``int64`` / ``float32`` / ``float64`` parse the cell; ``category`` stores an
int32 code per sample whose names are the ``categories`` attribute (code = index). The
categories are ``categories:`` when the job lists them (then a value outside the list is
a reject), else every value met, in natural order, fixed at discovery and written into the
job stored in the output (so a corpus that gains a category is a changed job, never
re-coded silently). An empty cell is a reject unless ``missing`` gives its value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError
from ..manifest import natural_key
from .base import FieldKind

_DTYPES = {"int64": np.int64, "float32": np.float32, "float64": np.float64, "category": np.int32}


@dataclass(frozen=True)
class ValueField:
    type: Literal["value"] = "value"
    extensions: list[str] = field(default_factory=list)  # values are not files: always empty
    folder: str | None = None
    column: str | None = None  # one annotation column: a scalar per sample
    columns: list[str] = field(default_factory=list)  # several: a vector per sample
    dtype: Literal["int64", "float32", "float64", "category"] = "int64"
    categories: list[str] = field(default_factory=list)  # category names (default: the values met)
    missing: str | None = None  # the value of an empty cell (default: the sample is rejected)


def _cells(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


class ValueKind(FieldKind):
    name = "value"
    config_class = ValueField

    def validate(self, fc: ValueField, file: str, key: str) -> None:
        if fc.extensions:
            raise ConfigError(file, f"{key}.extensions", "a value field reads annotation columns, not files")
        if bool(fc.column) == bool(fc.columns):
            raise ConfigError(file, key, "give column: NAME (one value per sample) or columns: [A, B] (a vector), not both")
        if fc.categories and fc.dtype != "category":
            raise ConfigError(file, f"{key}.categories", "is only for dtype: category")
        if len(set(fc.categories)) != len(fc.categories):
            raise ConfigError(file, f"{key}.categories", "lists a category twice")
        if fc.missing is not None and fc.dtype != "category":
            try:
                _parse(fc.missing, fc)
            except DecodeError as e:
                raise ConfigError(file, f"{key}.missing", e.reason) from None

    def reads_files(self, fc: ValueField) -> bool:
        return False

    def decode(self, path: str, fc: ValueField) -> np.ndarray:
        raise DecodeError(path, "a value field reads annotation columns, not files")

    def resolve(self, fc: ValueField, values: list[Any]) -> ValueField:
        """Fix the category names from every value met (unless the job lists them)."""
        if fc.dtype != "category" or fc.categories:
            return fc
        met = {str(c) for v in values for c in _cells(v) if c not in (None, "")}
        if fc.missing is not None:
            met.add(fc.missing)
        return dataclasses.replace(fc, categories=sorted(met, key=natural_key))

    def resolves_incrementally(self, fc: ValueField) -> bool:
        return True  # categories: a sync keeps the output's and appends the new ones

    def from_value(self, value: Any, fc: ValueField) -> np.ndarray:
        cells = [_parse(c, fc) for c in _cells(value)]
        a = np.asarray(cells, dtype=_DTYPES[fc.dtype])
        return a if fc.columns else a.reshape(())

    def fixed_shape(self, fc: ValueField) -> tuple[tuple[int, ...], np.dtype]:
        return ((len(fc.columns),) if fc.columns else ()), np.dtype(_DTYPES[fc.dtype])

    def attrs(self, fc: ValueField) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if fc.columns:
            out["names"] = list(fc.columns)
        if fc.dtype == "category":
            out["categories"] = list(fc.categories)
        return out

    def float_scale(self, dtype: np.dtype) -> float | None:
        return None  # numbers are returned as stored


_CODES: dict[int, tuple[list, dict[str, int]]] = {}  # id(categories) -> (that list, name -> code)


def _codes(categories: list[str]) -> dict[str, int]:
    """Each category name's code (its first index), made once per categories list. Reason:
    ``list.index`` per sample is a linear search, and a field may have thousands of
    categories (Speech Commands' 2,600 speakers). Field configs are frozen: their lists are
    not changed in place."""
    hit = _CODES.get(id(categories))
    if hit is None or hit[0] is not categories:
        if len(_CODES) > 64:
            _CODES.clear()
        codes: dict[str, int] = {}
        for i, c in enumerate(categories):
            codes.setdefault(c, i)
        hit = _CODES[id(categories)] = (categories, codes)
    return hit[1]


def _parse(cell: Any, fc: ValueField) -> Any:
    text = "" if cell is None else str(cell).strip()
    if text == "":
        if fc.missing is None:
            raise DecodeError("", "empty value (give missing: to accept empty cells)")
        text = fc.missing
    if fc.dtype == "category":
        code = _codes(fc.categories).get(text)
        if code is None:
            raise DecodeError("", f"category {text!r} is not one of categories: {fc.categories[:8]}")
        return code
    if fc.dtype == "int64":
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not f.is_integer():
                raise DecodeError("", f"not an integer: {text!r}") from None
            return int(f)
    try:
        return float(text)
    except ValueError:
        raise DecodeError("", f"not a number: {text!r}") from None
