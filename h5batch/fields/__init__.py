"""The registry of field kinds, and the functions the rest of h5batch calls about a field.

Rule: everything about one kind of field (``type:`` in a job file) lives in one module of
this package: its config dataclass, its decoder, its semantic checks, the HDF5 attributes
it writes, the packages its workers need and how the reader presents it. The rest of the
code reads :data:`KINDS` or calls the functions below; it never tests which kind a field
is. Reason: a kind used to be spread over isinstance chains in five modules.

Adding a field kind:

1. one module ``h5batch/fields/<name>.py`` with the config dataclass and a
   :class:`~h5batch.fields.base.FieldKind` subclass (its docstring says what to define;
   ``audio.py`` and ``image.py`` are the examples); shared file helpers (opening,
   :func:`~h5batch.fields.files.sniff`) are in :mod:`h5batch.fields.files`;
2. register it below (``register(TextKind())``) and add its config class to
   :data:`FieldConfig`; registering at import time here is what makes the Dask workers and
   the writer process, which import this package, know the kind too;
3. tests: decoding good and bad files, and a small job through the converter;
4. docs: its settings in ``docs/jobs.md``, its attributes in ``docs/FORMAT.md``.

Nothing else changes: the job-file checks, the workers, the writer, the pre-flight and the
reader all go through this registry. (A decoder package that decides the output's bytes
and the pre-flight does not yet know goes in ``h5batch.conversion.preflight.DECISIVE``.)

This package imports numpy and :mod:`h5batch.errors` only; decoder libraries (soundfile,
soxr, Pillow) are imported on first use, and :mod:`h5batch.config` imports this package,
never the other way round.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .audio import AudioField, AudioKind
from .base import FieldKind, default_float_scale
from .image import ImageField, ImageKind

#: Registered kinds by name (the job file's ``type``), in registration order.
KINDS: dict[str, FieldKind] = {}

#: The config classes of the kinds shipped with h5batch (for annotations).
FieldConfig = AudioField | ImageField


def register(kind: FieldKind) -> FieldKind:
    """Add ``kind`` to :data:`KINDS` (its ``name`` and ``modality`` must be new)."""
    if not isinstance(kind, FieldKind):
        raise TypeError(f"a field kind must be a FieldKind instance, got {kind!r}")
    cls = getattr(kind, "config_class", None)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    if not isinstance(getattr(kind, "name", None), str) or defaults.get("type") != kind.name:
        raise TypeError(f"{type(kind).__name__}: needs a name and a config_class dataclass whose "
                        f"'type' field defaults to that name (kind_of looks kinds up by it)")
    for other in KINDS.values():
        if kind.name == other.name or kind.modality == other.modality:
            raise ValueError(f"field kind {kind.name!r} (modality {kind.modality!r}) clashes with {other!r}")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a kind (tests that register a throwaway one)."""
    KINDS.pop(name, None)


register(AudioKind())
register(ImageKind())


def kind_of(fc: Any) -> FieldKind:
    """The kind of a field config instance (``TypeError`` for an unregistered class)."""
    kind = KINDS.get(getattr(fc, "type", None))  # type: ignore[arg-type]
    if kind is None or not isinstance(fc, kind.config_class):
        raise TypeError(f"unknown field config {type(fc).__name__}")
    return kind


def kind_by_modality(modality: str) -> FieldKind | None:
    """The kind whose writer stored ``modality`` on a field; None for an unknown one (a
    file from a kind this installation lacks)."""
    for kind in KINDS.values():
        if kind.modality == modality:
            return kind
    return None


def decode_field(path: str, fc: Any) -> np.ndarray:
    """Decode one file of the field (raises :class:`~h5batch.errors.DecodeError`)."""
    return kind_of(fc).decode(path, fc)


def decode_field_into(path: str, fc: Any, out: np.ndarray) -> None:
    """Decode into ``out``, a row of a fixed-shape field (:func:`fixed_sample_shape`)."""
    kind_of(fc).decode_into(path, fc, out)


def fixed_sample_shape(fc: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype every sample of a fixed-shape field has (None if variable)."""
    return kind_of(fc).fixed_shape(fc)


def is_fixed_shape(fc: Any) -> bool:
    """True when every sample of the field has the same shape (stored as ``(N, *shape)``)."""
    return fixed_sample_shape(fc) is not None


def rows_per_chunk(shape: tuple[int, ...], dtype: np.dtype, chunk_bytes: int) -> int:
    """Samples per chunk of a fixed-shape field (the writer and the workers agree on it)."""
    row_bytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return max(1, chunk_bytes // row_bytes)


def field_attrs(fc: Any) -> dict[str, Any]:
    """The kind's HDF5 attributes of a field: ``modality`` first, then the kind's own."""
    kind = kind_of(fc)
    return {"modality": kind.modality, **kind.attrs(fc)}


def needed_packages(fc: Any) -> set[str]:
    """Decoder packages the field needs on every worker."""
    return set(kind_of(fc).packages(fc))


def reader_hooks(modality: str, dtype: Any, ndim: int) -> tuple[float | None, tuple[int, ...] | None]:
    """``(as_float divisor, channels_first permutation)`` for a stored field: asked of the
    kind named by its ``modality`` attribute; a field of an unknown kind (or an older file)
    gets the divisor of its stored dtype (int16 / 32768, uint8 / 255) and keeps its axes."""
    kind = kind_by_modality(modality)
    if kind is None:
        return default_float_scale(dtype), None
    return kind.float_scale(np.dtype(dtype)), kind.channels_first_axes(ndim)


__all__ = [
    "KINDS", "AudioField", "FieldConfig", "FieldKind", "ImageField", "decode_field", "decode_field_into",
    "default_float_scale",
    "field_attrs", "fixed_sample_shape", "is_fixed_shape", "kind_by_modality", "kind_of", "needed_packages",
    "reader_hooks", "register", "rows_per_chunk", "unregister",
]
