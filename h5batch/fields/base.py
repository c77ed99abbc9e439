"""The contract of a field kind: one object that knows everything about one kind of input.

Rule: code outside :mod:`h5batch.fields` never tests which kind a field is (no
``isinstance(fc, AudioField)``, no ``modality == "image"``); it asks the field's
:class:`FieldKind` through the functions of :mod:`h5batch.fields`. Reason: adding a kind
is then one module, not a hunt for every chain of ``if``.

Kinds are stateless singletons: every method takes the field's config instance, so one
object serves every field of that kind in every process (the Dask workers and the
writer import the registry like the driver does).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

#: What ``H5Dataset(as_float=True)`` divides stored values by, per stored dtype, when no
#: kind says otherwise (a field whose ``modality`` attribute names no registered kind).
DEFAULT_FLOAT_SCALE: dict[np.dtype, float] = {np.dtype(np.int16): 32768.0, np.dtype(np.uint8): 255.0}


def default_float_scale(dtype: Any) -> float | None:
    """The divisor ``as_float`` applies to ``dtype`` by the stored dtype alone (None: as stored)."""
    return DEFAULT_FLOAT_SCALE.get(np.dtype(dtype))


#: Metadata flag of a setting added to a shipped config class after outputs existed:
#: :func:`settings` leaves it out while it has its default, so the job hash and the
#: ``config`` attribute of jobs that do not use it are unchanged (older partial outputs still
#: resume). Every setting added to a shipped section or kind is declared with :func:`late`.
LATE = "h5batch_late"


def late(default: Any = None, *, factory: Any = None) -> Any:
    """A dataclass field for a late setting (see :data:`LATE`)."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={LATE: True})
    return dataclasses.field(default=default, metadata={LATE: True})


def settings(obj: Any) -> Any:
    """A config dataclass as plain data, late settings at their default left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.metadata.get(LATE):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                if v == default:
                    continue
            out[f.name] = settings(v)
        return out
    if isinstance(obj, dict):
        return {k: settings(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [settings(v) for v in obj]
    return obj


class FieldKind(ABC):
    """One kind of field (``type:`` in a job file). Subclass it, and register an instance
    in :mod:`h5batch.fields`.

    A subclass must define:

    * ``name`` (class attribute): the job file's ``type`` value, e.g. ``"audio"``;
    * ``config_class`` (class attribute): a frozen dataclass of the field's settings. It
      needs ``type: Literal[name] = name``, ``extensions: list[str]`` (with a default),
      ``folder: str | None = None`` and ``column: str | None = None`` (discovery reads
      them), and only types :mod:`h5batch.config` checks (bool, int, float, str,
      Literal, lists, dicts, ``X | None``). ``vars(fc)`` is stored in every output and the
      job hash is computed from its fields, so never rename a field or change a default
      of a shipped kind;
    * :meth:`decode`: ``path -> numpy array``, raising :class:`~h5batch.errors.DecodeError`
      with a reason a person can act on for every bad file.

    and may override (the defaults are said at each method): :meth:`validate`,
    :meth:`fixed_shape`, :meth:`attrs`, :meth:`packages`, the
    reader's hooks ``modality``, :meth:`float_scale`, :meth:`channels_first_axes`, and for
    ``store: encoded`` (:mod:`h5batch.fields.encoded`) :meth:`transcode` and
    :meth:`decode_stored`. ``transform`` and ``features`` settings, where a config class has
    them, are applied by the registry after :meth:`decode` (:mod:`h5batch.fields.transform`).
    """

    name: ClassVar[str]
    config_class: ClassVar[type]

    @property
    def modality(self) -> str:
        """The ``modality`` attribute the writer stores on the field, by which the reader
        finds this kind again (default: ``name``)."""
        return self.name

    # ------------------------------------------------------------------ config

    def validate(self, fc: Any, file: str, key: str) -> None:
        """Semantic checks of values that type-check but cannot work; raise
        :class:`~h5batch.errors.ConfigError` ``(file, f"{key}.<setting>", why)``.
        Default: nothing beyond the type checks and the common ``extensions`` check."""
        return None

    # ------------------------------------------------------------------ values

    def reads_files(self, fc: Any) -> bool:
        """True when each sample of the field is a file the layout finds (and ``decode``
        reads); False when it is a value from an annotation (a table column, a
        transcript line), given to :meth:`from_value`. A field that reads no files has no
        entry in the split's ``source`` dataset. Default: True."""
        return True

    def resolve(self, fc: Any, values: list[Any]) -> Any:
        """The field's config with what discovery learnt filled in (category names, target
        names), given every sample's value; it replaces the job's, so the output's stored
        job and hash say it. Default: ``fc`` unchanged."""
        return fc

    def resolves_incrementally(self, fc: Any) -> bool:
        """Whether :meth:`resolve` may be given only the new samples' values by an
        incremental sync (:mod:`h5batch.layouts.incremental`): True where what it learns,
        appended to what the output has, is what ``h5batch sync`` keeps. Default: True when
        :meth:`resolve` is not overridden, else False."""
        return type(self).resolve is FieldKind.resolve

    def from_value(self, value: Any, fc: Any) -> np.ndarray:
        """The stored array of one annotation value (only for fields that do not
        :meth:`reads_files`); raise :class:`~h5batch.errors.DecodeError` (path ``""``: the
        caller names the sample) for a value that does not fit."""
        raise NotImplementedError(f"field kind {self.name!r} reads files, not values")

    # ------------------------------------------------------------------ decoding

    @abstractmethod
    def decode(self, path: str, fc: Any) -> np.ndarray:
        """Read one file and apply the field's preprocessing (runs on Dask workers)."""

    def fixed_shape(self, fc: Any) -> tuple[tuple[int, ...], np.dtype] | None:
        """``(shape, dtype)`` every sample of the field has, stored as ``(N, *shape)``; None
        when samples differ in shape (stored flat with offsets). Default: None."""
        return None

    # ------------------------------------------------------------------ encoded storage

    def transcode(self, path: str, fc: Any) -> bytes:
        """The bytes ``store: encoded`` keeps for ``path`` with ``fc.transcode`` set: the file
        decoded (a :class:`~h5batch.errors.DecodeError` for a bad one) and re-encoded
        (:mod:`h5batch.fields.transcode`). Default: the kind has no ``transcode`` setting."""
        raise NotImplementedError(f"field kind {self.name!r} cannot transcode")

    def decode_stored(self, data: Any, fc: Any) -> np.ndarray:
        """The reader's decode of a sample stored encoded (``data``: its bytes, ``fc``: the
        field's ``decode`` settings): what decoded storage would hold. Default: :meth:`decode`
        of the bytes as an in-memory file (:func:`h5batch.fields.encoded.decode_bytes`)."""
        from .encoded import decode_bytes

        return decode_bytes(self, fc, data)

    # ------------------------------------------------------------------ output and workers

    def attrs(self, fc: Any) -> dict[str, Any]:
        """HDF5 attributes describing the stored arrays (after ``modality``, which the
        registry adds), in the order they are written. Default: none."""
        return {}

    def packages(self, fc: Any) -> set[str]:
        """Packages the decoder needs on every worker (names the pre-flight knows, see
        :data:`h5batch.conversion.preflight.DECISIVE`). Default: none beyond numpy."""
        return set()

    # ------------------------------------------------------------------ reader

    def float_scale(self, dtype: np.dtype) -> float | None:
        """What ``H5Dataset(as_float=True)`` divides stored ``dtype`` values by to give
        float32; None returns them as stored. Default: :func:`default_float_scale`."""
        return default_float_scale(dtype)

    def channels_first_axes(self, ndim: int) -> tuple[int, ...] | None:
        """The permutation of a sample's stored axes ``H5Dataset(channels_first=True)``
        returns (e.g. ``(2, 0, 1)``: HWC -> CHW); None leaves them. Default: None."""
        return None

    def __repr__(self) -> str:
        return f"<field kind {self.name!r}: {self.config_class.__name__}>"
