"""Codecs: the values of ``output.codec``, one module each, and the registry that lists them.

Rule: a codec is one module of this package (``none.py``, ``gzip.py``, ...) defining a
:class:`~h5batch.codecs.base.Codec` subclass and registering an instance; this file only
imports those modules (which fixes the registry's order) and re-exports the API. Reason:
the job-file check (``h5batch.config``), the writer, the reader's fast path
(:class:`ChunkDecoder`) and the benchmark all read :data:`CODECS`, so none of them repeats a
list of codec names. See "Adding a codec" in docs/jobs.md.

Portability (who can read the file):

=============  =========================================  ==================================
codec          filters                                    readable by
=============  =========================================  ==================================
none           -                                          any HDF5 tool
gzip           shuffle + deflate (filter 2, 1)            any HDF5 tool (h5py, MATLAB, h5dump)
lzf            shuffle + lzf (2, 32000)                   h5py only (built in)
zstd           shuffle + Zstd plugin (32015)              ``import hdf5plugin`` / HDF5_PLUGIN_PATH
blosc2-lz4     Blosc2 plugin (32026), LZ4 + byte shuffle  ``import hdf5plugin`` / HDF5_PLUGIN_PATH
blosc2-zstd    Blosc2 plugin (32026), Zstd + byte shuffle ``import hdf5plugin`` / HDF5_PLUGIN_PATH
=============  =========================================  ==================================
"""

from __future__ import annotations

from collections.abc import Sequence

# The codec modules register themselves when imported; their order here is the registry's,
# which job-file errors, ``h5batch bench`` and the docs list.
# isort: off
from . import none, gzip, lzf, zstd, blosc2  # noqa: F401
# isort: on
from .base import (
    CODECS,
    FILTER_SHUFFLE,
    Codec,
    CodecSpec,
    DecodeStep,
    Encoder,
    get,
    make_encoder,
    names,
    register,
    self_check,
)
from .chunks import ChunkDecoder

# ``output.codec: auto`` is not a codec but a choice made per field by a trial
# (h5batch/conversion/auto.py): this codec where the trial shows compression pays, else none.
AUTO = "auto"
AUTO_CODEC = "blosc2-lz4"


def choices() -> tuple[str, ...]:
    """Every value ``output.codec`` accepts: ``auto`` first, then the registered codecs."""
    return (AUTO, *names())


def for_filters(filters: Sequence[int]) -> tuple[str, ...]:
    """The registered codecs that store this filter pipeline (with or without their shuffle
    filter): how ``h5batch inspect`` names the codec of a dataset without a ``codec``
    attribute. Several can match (the Blosc2 codecs differ only in filter parameters)."""
    stored = tuple(filters)
    return tuple(c.name for c in CODECS.values()
                 if stored in (c.filter_ids, tuple(f for f in c.filter_ids if f != FILTER_SHUFFLE)))


__all__ = [
    "AUTO", "AUTO_CODEC", "CODECS", "ChunkDecoder", "Codec", "CodecSpec", "DecodeStep", "Encoder",
    "choices", "for_filters", "get", "make_encoder", "names", "register", "self_check",
]
