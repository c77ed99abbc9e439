"""h5batch: turn large media corpora into fast, chunked, compressed HDF5 training data.

The public API, flat::

    from . import load_job, convert, ConvertOptions, ConvertError, ConvertSummary

    summary = convert(load_job("jobs/demo.yaml"))

The reader lives in :mod:`h5batch.torch` (``from h5batch.torch import H5Dataset``);
conversion needs no torch. Names are imported when first used, so ``import h5batch``
costs nothing (a Dask worker unpickling a task imports this package too).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    "load_job": "h5batch.config",
    "job_from_dict": "h5batch.config",
    "JobConfig": "h5batch.config",
    "convert": "h5batch.conversion.pipeline",
    "ConvertOptions": "h5batch.conversion.options",
    "ConvertSummary": "h5batch.conversion.options",
    "ConvertError": "h5batch.errors",
    "ConfigError": "h5batch.errors",
    "DecodeError": "h5batch.errors",
    "H5batchError": "h5batch.errors",
    "PreflightError": "h5batch.errors",
    "VerifyError": "h5batch.errors",
    "verify_file": "h5batch.tools.verify",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'h5batch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
