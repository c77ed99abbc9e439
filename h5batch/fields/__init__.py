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
import json
from typing import Any

import numpy as np

from ..errors import DecodeError
from . import encoded, features, transform
from .audio import AudioField, AudioKind
from .base import FieldKind, default_float_scale, settings
from .encoded import StoredDecoder, is_encoded
from .image import ImageField, ImageKind
from .multilabel import MultiLabelField, MultiLabelKind
from .text import TextField, TextKind
from .transform import has_transform
from .value import ValueField, ValueKind

#: Registered kinds by name (the job file's ``type``), in registration order.
KINDS: dict[str, FieldKind] = {}

#: The config classes of the kinds shipped with h5batch (for annotations).
FieldConfig = AudioField | ImageField | TextField | ValueField | MultiLabelField


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


register(AudioKind())
register(ImageKind())
register(TextKind())
register(ValueKind())
register(MultiLabelKind())


def kind_of(fc: Any) -> FieldKind:
    """The kind of a field config instance (``TypeError`` for an unregistered class)."""
    kind = KINDS.get(getattr(fc, "type", None))  # type: ignore[arg-type]
    if kind is None or not isinstance(fc, kind.config_class):
        raise TypeError(f"unknown field config {type(fc).__name__}")
    return kind


def kind_by_modality(modality: str) -> FieldKind | None:
    """The kind whose writer stored ``modality`` on a field; None for an unknown one (a
    file from a kind this installation lacks)."""
    return next((kind for kind in KINDS.values() if kind.modality == modality), None)


def reads_files(fc: Any) -> bool:
    """True when the field's samples are files (False: annotation values, no ``source``)."""
    return kind_of(fc).reads_files(fc)


def file_fields(fields: dict[str, Any]) -> list[str]:
    """Names of the fields whose samples are files, in field order (one ``source`` path each)."""
    return [name for name, fc in fields.items() if reads_files(fc)]


def value_fields(fields: dict[str, Any]) -> list[str]:
    """Names of the fields whose samples are annotation values, in field order."""
    return [name for name, fc in fields.items() if not reads_files(fc)]


def needs_every_value(fields: dict[str, Any]) -> str | None:
    """The first value field whose config discovery completes from every sample's value
    (:meth:`~.base.FieldKind.resolves_incrementally` False), or None: a sync rediscovers
    such a job in full."""
    return next((n for n in value_fields(fields) if not kind_of(fields[n]).resolves_incrementally(fields[n])), None)


def value_array(value: Any, fc: Any) -> np.ndarray:
    """The stored array of one annotation value (raises :class:`~h5batch.errors.DecodeError`)."""
    return kind_of(fc).from_value(value, fc)


def resolve_field(fc: Any, values: list[Any]) -> Any:
    """The field's config completed from every sample's value (see :meth:`FieldKind.resolve`)."""
    return kind_of(fc).resolve(fc, values)


def _runs_after_decode(fc: Any) -> bool:
    return getattr(fc, "features", None) is not None or has_transform(fc)


def decode_field(path: str, fc: Any) -> np.ndarray:
    """The stored sample of one file of the field (raises :class:`~h5batch.errors.DecodeError`):
    the kind's decode, then ``features`` and ``transform`` (:mod:`.transform`); with
    ``store: encoded`` the file's (or the transcode's) bytes, once the file decoded (:mod:`.encoded`).
    A fixed-shape field's sample of another shape or dtype is the file's fault, never a cast."""
    kind = kind_of(fc)
    if is_encoded(fc):
        return encoded.stored_bytes(kind, path, fc)
    fixed = fixed_sample_shape(fc)
    if _runs_after_decode(fc):
        return transform.after_decode(path, fc, kind.decode(path, fc), fixed)
    a = kind.decode(path, fc)
    if fixed is not None and (a.shape != fixed[0] or a.dtype != fixed[1]):
        raise DecodeError(path, f"decoded to {a.shape} {a.dtype}, the field stores {fixed[0]} {fixed[1]}")
    return a


def fixed_sample_shape(fc: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype every sample of a fixed-shape field has (None if variable). A field
    stored encoded is variable (its bytes); one with ``features`` has theirs; a transform
    keeps the kind's (:func:`h5batch.fields.transform.apply` checks it)."""
    if is_encoded(fc):
        return None
    if getattr(fc, "features", None) is not None:
        return features.fixed_shape(fc)
    return kind_of(fc).fixed_shape(fc)


def is_fixed_shape(fc: Any) -> bool:
    """True when every sample of the field has the same shape (stored as ``(N, *shape)``)."""
    return fixed_sample_shape(fc) is not None


def rows_per_chunk(shape: tuple[int, ...], dtype: np.dtype, chunk_bytes: int) -> int:
    """Samples per chunk of a fixed-shape field (the writer and the workers agree on it)."""
    row_bytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return max(1, chunk_bytes // row_bytes)


def field_attrs(fc: Any) -> dict[str, Any]:
    """The kind's HDF5 attributes of a field: ``modality`` first, then the kind's own, then
    what ``store: encoded``, ``features`` and ``transform`` add (docs/FORMAT.md)."""
    kind = kind_of(fc)
    attrs = {"modality": kind.modality, **kind.attrs(fc)}
    if is_encoded(fc):
        attrs.update(encoded.attrs(fc))
    if getattr(fc, "features", None) is not None:
        attrs.update(features=json.dumps(settings(features.settings(fc)), sort_keys=True), axes="frame,mel")
    if has_transform(fc):
        attrs["transform"] = fc.transform  # its source's hash is in the root's job_hash
    return attrs


def validate_field(fc: Any, file: str, key: str) -> None:
    """The kind's semantic checks, then those of ``store``/``transcode``, ``features`` and
    ``transform`` (the function must import now); raises :class:`~h5batch.errors.ConfigError`."""
    kind_of(fc).validate(fc, file, key)
    encoded.validate(fc, file, key)
    if getattr(fc, "features", None) is not None:
        features.validate(fc, file, key)
    transform.check_importable(fc, file, key)


def content_settings(fc: Any) -> dict[str, Any]:
    """The field's settings as the job hash counts them: :func:`~h5batch.fields.base.settings`,
    with a transform named by its source's hash too (a changed function is another job)."""
    out = settings(fc)
    if has_transform(fc):
        out["transform"] = transform.identity(fc.transform)
    return out


def format_version(fields: Any) -> int:
    """The ``h5batch_format`` a file of these field configs is written as: 1, or 2 when a
    field is stored encoded (a format-1 reader would hand its bytes back as pixels)."""
    return max([1, *(encoded.FORMAT_VERSION for fc in fields if is_encoded(fc))])


def stored_decoder(modality: str, attrs: Any) -> StoredDecoder | None:
    """For a field whose attributes say ``store: encoded``: what turns one sample's bytes
    into the array decoded storage holds (the reader calls it per sample); else None."""
    if attrs.get("store") != "encoded":
        return None
    kind = kind_by_modality(modality)
    if kind is None:
        raise ValueError(f"field stored encoded by a field kind this h5batch lacks (modality {modality!r})")
    return StoredDecoder(kind, encoded.reader_config(kind, attrs))


def needed_packages(fc: Any) -> set[str]:
    """Decoder packages the field needs on every worker."""
    return set(kind_of(fc).packages(fc)) | features.packages(fc)


def reader_hooks(modality: str, dtype: Any, ndim: int) -> tuple[float | None, tuple[int, ...] | None]:
    """``(as_float divisor, channels_first permutation)`` for a stored field: asked of the
    kind named by its ``modality`` attribute; a field of an unknown kind (or an older file)
    gets the divisor of its stored dtype (int16 / 32768, uint8 / 255) and keeps its axes."""
    kind = kind_by_modality(modality)
    if kind is None:
        return default_float_scale(dtype), None
    return kind.float_scale(np.dtype(dtype)), kind.channels_first_axes(ndim)


__all__ = [
    "KINDS", "AudioField", "FieldConfig", "FieldKind", "ImageField", "MultiLabelField", "TextField",
    "ValueField", "content_settings", "decode_field", "default_float_scale",
    "field_attrs", "file_fields", "fixed_sample_shape", "format_version", "stored_decoder", "validate_field", "is_fixed_shape", "kind_by_modality", "kind_of",
    "needed_packages", "reads_files", "reader_hooks", "register", "resolve_field", "rows_per_chunk",
    "value_array", "value_fields", "needs_every_value",
]
