"""Versions of what shapes the bytes of an output file (its ``versions`` attribute).

Rule: read once per process, by the driver's plan (:func:`h5batch.conversion.plan.make_plan`),
from the installed distributions' metadata, not by importing the packages. Reason: importing
dask and blosc2 is slow, and a small local conversion needs neither. The strings are the same
as the packages' ``__version__``.
"""

from __future__ import annotations

import sys
from functools import cache


def versions() -> dict[str, str]:
    """``{package: version}`` for h5batch, h5py, HDF5, numpy, hdf5plugin, soundfile, pillow,
    dask, Python, and blosc2 where installed (a copy: callers may change it)."""
    return dict(_read())


@cache
def _read() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import h5py  # the HDF5 library's version is known only to h5py's extension
    import numpy as np

    from .. import __version__

    out = {"h5batch": __version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
           "numpy": np.__version__}
    for key, dist in (("hdf5plugin", "hdf5plugin"), ("soundfile", "soundfile"), ("pillow", "pillow"),
                      ("dask", "dask")):
        out[key] = installed(dist)
    out["python"] = sys.version.split()[0]
    try:
        out["blosc2"] = installed("blosc2")
    except PackageNotFoundError:
        pass
    return out
