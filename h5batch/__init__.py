"""h5batch: turn large media corpora into fast, chunked, compressed HDF5 training data.

Conversion (``h5batch convert``) needs no torch; the reader lives in :mod:`h5batch.torch`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
