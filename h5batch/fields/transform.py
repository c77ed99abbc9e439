"""User transforms (``transform: package.module:function``) and built-in features, run on
the Dask workers after a field's file is decoded: what the output stores is their result.

Rules, and why:

* The order is fixed: the kind decodes (sample rate, channels, length, mode, size), then
  the built-in ``features`` (:mod:`h5batch.fields.features`) if the field asks for them,
  then the user's ``transform``: array in, array out. The registry
  (:func:`h5batch.fields.decode_field`) calls :func:`after_decode`, so every kind gets it.
* The function is named ``module:attribute`` (``attribute`` may be dotted) and must be
  importable wherever the job runs (the driver checks at job load, the Dask workers import
  it on first use; put its package on ``PYTHONPATH`` or install it). One that cannot be
  imported is a :class:`~h5batch.errors.ConfigError` naming the key, before any work.
* Its identity is its name plus a sha256 of the source of the module that defines it
  (:func:`identity`): it is part of the job hash, so resuming a partial output with a
  changed function (or a changed helper in its module) is refused, not silently mixed.
* Whatever goes wrong inside it is the sample's fault, never the job's: an exception, a
  result that is not a numeric array, or (for a fixed-shape field) another shape or dtype
  than the field stores becomes a reject naming the file, the function and the cause.
  BEWARE: a transform that fails on every file rejects the whole corpus, which
  ``policy.max_reject_fraction`` then stops.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError, DecodeError

#: dtypes a transform may return (those the reader turns into tensors).
DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.int16, np.int32, np.int64,
                                     np.float16, np.float32, np.float64))

_REF = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class TransformImportError(ValueError):
    """A ``transform`` reference that does not name an importable callable."""


def has_transform(fc: Any) -> bool:
    """True when the field names a user transform."""
    return bool(getattr(fc, "transform", None))


@functools.cache
def load(ref: str) -> Callable[[np.ndarray], Any]:
    """The callable ``module:attribute`` names (imported once per process)."""
    if not _REF.fullmatch(ref):
        raise TransformImportError(f"must be 'package.module:function', got {ref!r}")
    module_name, attr = ref.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module's own error at import time
        raise TransformImportError(f"cannot import module {module_name!r} ({type(e).__name__}: {e}); "
                                   f"is it on PYTHONPATH wherever the job runs?") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TransformImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TransformImportError(f"{ref} is a {type(obj).__name__}, not a function")
    return obj


@functools.cache
def identity(ref: str) -> str:
    """``ref`` plus the sha256 of its module's source, e.g. ``pkg.mod:fn sha256:1f2e...``
    (what the job hash holds). A module without a source file (a C extension) is hashed
    by its name and the callable's ``repr``."""
    fn = load(ref)
    module = inspect.getmodule(fn) or importlib.import_module(ref.split(":", 1)[0])
    try:
        src = inspect.getsource(module).encode()
    except (OSError, TypeError):
        src = f"{module.__name__} {fn!r}".encode()
    return f"{ref} sha256:{hashlib.sha256(src).hexdigest()}"


def check_importable(fc: Any, file: str, key: str) -> None:
    """Raise :class:`ConfigError` ``(file, f"{key}.transform", why)`` when the field's
    transform cannot be imported (called when the job is loaded)."""
    ref = getattr(fc, "transform", None)
    if not ref:
        return
    try:
        load(ref)
        identity(ref)
    except TransformImportError as e:
        raise ConfigError(file, f"{key}.transform", str(e)) from None


def apply(path: str, fc: Any, a: np.ndarray,
          expect: tuple[tuple[int, ...], np.dtype] | None) -> np.ndarray:
    """``fc.transform(a)``, checked: a numeric array of rank >= 1, of shape and dtype
    ``expect`` when the field is fixed-shape. Raises :class:`DecodeError` naming ``path``."""
    ref = fc.transform
    try:
        fn = load(ref)
    except TransformImportError as e:  # importable at job load, not on this worker
        raise DecodeError(path, f"transform {ref}: {e}") from None
    try:
        out = fn(a)
    except Exception as e:
        raise DecodeError(path, f"transform {ref} raised {type(e).__name__}: {e}") from e
    if not isinstance(out, np.ndarray):
        try:
            out = np.asarray(out)  # e.g. a CPU torch tensor
        except Exception as e:
            raise DecodeError(path, f"transform {ref} returned a {type(out).__name__}, not an array") from e
    if out.dtype not in DTYPES or out.ndim == 0:
        raise DecodeError(path, f"transform {ref} returned {out.dtype} of shape {out.shape}; it must return "
                                f"an array of rank >= 1 of {', '.join(str(d) for d in DTYPES)}")
    if expect is not None and (out.shape != expect[0] or out.dtype != expect[1]):
        raise DecodeError(path, f"transform {ref} returned {out.dtype} {out.shape}, but the field stores "
                                f"{expect[1]} {expect[0]} (a fixed-shape field's transform must keep its shape "
                                f"and dtype; without length/size the field stores any shape)")
    return np.ascontiguousarray(out)


def after_decode(path: str, fc: Any, a: np.ndarray,
                 expect: tuple[tuple[int, ...], np.dtype] | None) -> np.ndarray:
    """The stored sample of a decoded array: ``features`` then ``transform``, if any."""
    if getattr(fc, "features", None) is not None:
        from .features import compute

        a = compute(path, fc, a)
    if has_transform(fc):
        a = apply(path, fc, a, expect)
    return a
