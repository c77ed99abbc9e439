"""The contract of a field kind: one object that knows everything about one kind of input.

Rule: code outside :mod:`h5batch.fields` never tests which kind a field is (no
``isinstance(fc, AudioField)``, no ``modality == "image"``); it asks the field's
:class:`FieldKind` through the functions of :mod:`h5batch.fields`. Reason: a kind was
spread over the config, the decoders, the writer's attributes, the pre-flight and the
reader, and adding one meant finding every chain of ``if``; now it is one module.

Kinds are stateless singletons: every method takes the field's config instance, so one
object serves every field of that kind in every process (the Dask workers and the
writer import the registry like the driver does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from ..errors import DecodeError

#: What ``H5Dataset(as_float=True)`` divides stored values by, per stored dtype, when no
#: kind says otherwise (a field whose ``modality`` attribute names no registered kind).
DEFAULT_FLOAT_SCALE: dict[np.dtype, float] = {np.dtype(np.int16): 32768.0, np.dtype(np.uint8): 255.0}


def default_float_scale(dtype: Any) -> float | None:
    """The divisor ``as_float`` applies to ``dtype`` by the stored dtype alone (None: as stored)."""
    return DEFAULT_FLOAT_SCALE.get(np.dtype(dtype))


def copy_into(path: str, a: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = a`` for a decoded sample and its fixed-shape row; a sample of another
    shape or dtype is the file's fault (a :class:`DecodeError`), never a silent cast."""
    if a.shape != out.shape or a.dtype != out.dtype:
        raise DecodeError(path, f"decoded to {a.shape} {a.dtype}, the field stores {out.shape} {out.dtype}")
    out[...] = a


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
    :meth:`decode_into`, :meth:`fixed_shape`, :meth:`attrs`, :meth:`packages`, and the
    reader's hooks ``modality``, :meth:`float_scale`, :meth:`channels_first_axes`.
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

    # ------------------------------------------------------------------ decoding

    @abstractmethod
    def decode(self, path: str, fc: Any) -> np.ndarray:
        """Read one file and apply the field's preprocessing (runs on Dask workers)."""

    def decode_into(self, path: str, fc: Any, out: np.ndarray) -> None:
        """Decode into ``out``, a row of a fixed-shape field (:meth:`fixed_shape`), e.g. in
        shared memory. Default: :meth:`decode`, then :func:`copy_into`."""
        copy_into(path, self.decode(path, fc), out)

    def fixed_shape(self, fc: Any) -> tuple[tuple[int, ...], np.dtype] | None:
        """``(shape, dtype)`` every sample of the field has, stored as ``(N, *shape)``; None
        when samples differ in shape (stored flat with offsets). Default: None."""
        return None

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
