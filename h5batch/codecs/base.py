"""What a codec is: the :class:`Codec` base class, the registry it joins, :class:`CodecSpec`
(a codec with its settings), :func:`make_encoder`, :func:`self_check` and the shuffle helper.

Rule: this module names no codec. Everything about one codec (its HDF5 filters, its Python
encoder, its decode step, its levels) lives in that codec's own module, as a :class:`Codec`
subclass passed to :func:`register`. Reason: adding a codec is then one new module (plus its
line in the docs); the job-file check, writer, reader and benchmark take their lists from
the registry. The registry is here, not in the package ``__init__``, so codec modules import
a module that is already complete.

Python encoders because HDF5 runs filters in one thread under its global lock (h5py#591):
an :meth:`Codec.encoder` producing *exactly the bytes the filter pipeline would store*, with
a library that releases the GIL, lets the writer compress in a thread pool and store with
``write_direct_chunk``. Every encoder is checked once per process against HDF5
(:func:`self_check`); one that fails falls back to HDF5's pipeline, so a library upgrade can
slow a run but never corrupt a file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar

import numpy as np

from ..registry import Registry

Encoder = Callable[[np.ndarray], bytes]  # C-contiguous chunk array -> stored chunk bytes

# HDF5's byte-shuffle filter (h5py.h5z.FILTER_SHUFFLE): a pre-filter, not a codec. Its decode
# is ChunkDecoder's final copy into the chunk buffer (:func:`unshuffle_into`), no extra pass.
FILTER_SHUFFLE = 2


def uses_shuffle(shuffle: bool, itemsize: int) -> bool:
    """Whether the shuffle filter goes into the pipeline: shuffling 1-byte elements changes
    nothing, so it is left out for them (and the stored bytes are the same either way)."""
    return shuffle and itemsize > 1


def shuffle_bytes(a: np.ndarray) -> np.ndarray:
    """HDF5's shuffle filter: byte k of every element together (a byte transpose)."""
    if a.itemsize == 1:
        return a.reshape(-1).view(np.uint8)
    return np.ascontiguousarray(a.reshape(-1).view(np.uint8).reshape(-1, a.itemsize).T)


def unshuffle_into(src: np.ndarray, dst: np.ndarray, itemsize: int) -> None:
    """Undo :func:`shuffle_bytes`: ``src`` and ``dst`` are flat uint8 arrays of one size."""
    n = dst.size // itemsize
    dst.reshape(n, itemsize)[...] = src.reshape(itemsize, n).T


class DecodeStep:
    """Undoes one HDF5 filter in Python, for
    :class:`~h5batch.codecs.chunks.ChunkDecoder`.

    A subclass sets ``filter_id`` and ``library`` (the module its decoder imports) and
    defines :meth:`decode`; when :meth:`available` is false the filter is read through HDF5.
    :meth:`decode_into` may decompress straight into the chunk buffer when this is the
    chunk's only filter.
    """

    filter_id: ClassVar[int]
    library: ClassVar[str | None] = None  # a module the decoder needs beyond the standard library

    def available(self) -> bool:
        if self.library is None:
            return True
        try:
            importlib.import_module(self.library)
        except ImportError:
            return False
        return True

    def decode(self, raw: Any, nbytes: int) -> tuple[Any, str]:
        """``(decoded bytes-like, kind)`` for stored bytes ``raw`` whose fully decoded chunk
        has ``nbytes`` bytes. ``kind`` is ``""`` or a word naming the encoding met, appended
        to :meth:`ChunkDecoder.decode`'s result (its caller checks each kind against HDF5
        once)."""
        raise NotImplementedError

    def decode_into(self, raw: Any, out: np.ndarray) -> str | None:
        """Decode ``raw`` into the C-contiguous buffer ``out`` and return the kind, or None
        (nothing written) when this chunk cannot be done that way."""
        return None


class Codec:
    """One value of ``output.codec``. A subclass defines:

    ``name``
        the job-file name (``output.codec``), stored in every output's ``codec`` label.
    ``default_level``
        the level used when the job gives none (None: the codec has no levels).
    ``levels``
        the allowed levels, a ``range`` (None: no levels; ``output.level`` is then ignored).
        :meth:`parse_level` checks a level against it.
    ``filter_ids``
        the HDF5 filter ids its datasets may carry, in pipeline order (the shuffle filter
        included when the codec uses it).
    ``uses_shuffle``
        whether ``output.shuffle`` applies (the label then says ``+shuffle``).
    :meth:`dataset_kwargs`
        the ``create_dataset`` keyword arguments that set up HDF5's filter pipeline.
    :meth:`encoder`
        a Python function producing the bytes that pipeline would store for a chunk, or None
        when only HDF5 can encode (lzf).
    ``steps``
        the :class:`DecodeStep` of each filter it can undo in Python (the shuffle filter
        needs none).

    Register an instance with :func:`register` in the codec's module, and import that module
    in ``h5batch/codecs/__init__.py``.
    """

    name: ClassVar[str]
    default_level: ClassVar[int | None] = None
    levels: ClassVar[range | None] = None
    filter_ids: ClassVar[tuple[int, ...]] = ()
    uses_shuffle: ClassVar[bool] = True
    steps: ClassVar[tuple[DecodeStep, ...]] = ()

    def parse_level(self, level: int | None) -> int | None:
        """``level`` if this codec takes it; ``ValueError`` naming the range otherwise."""
        if level is None or self.levels is None:
            return level
        if level not in self.levels:
            lo, hi = self.levels[0], self.levels[-1]
            raise ValueError(f"{self.name} levels are {lo}..{hi}, got {level}")
        return level

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        """Keyword arguments for ``h5py.Group.create_dataset`` (the filter pipeline)."""
        raise NotImplementedError

    def encoder(self, level: int | None, shuffle: bool, dtype: np.dtype) -> Encoder | None:
        """``chunk array -> stored chunk bytes``, or None when only HDF5 can encode."""
        return None

    def decode_steps(self) -> dict[int, DecodeStep]:
        """Python decoders of this codec's filters, by filter id."""
        return {step.filter_id: step for step in self.steps}

    def __repr__(self) -> str:
        return f"<codec {self.name}>"


# ---------------------------------------------------------------------------
# The registry (re-exported by the package)
# ---------------------------------------------------------------------------

CODECS: Registry[Codec] = Registry("codec")  # name -> codec, in registration order
register = CODECS.register
names = CODECS.names
get = CODECS.lookup


def decode_steps() -> dict[int, DecodeStep]:
    """Every registered Python decode step, by filter id (codecs sharing a filter, such as the
    two Blosc2 codecs, give the same step; the first registered wins)."""
    steps: dict[int, DecodeStep] = {}
    for codec in CODECS.values():
        for fid, step in codec.decode_steps().items():
            steps.setdefault(fid, step)
    return steps


# ---------------------------------------------------------------------------
# A codec with its settings
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CodecSpec:
    """A codec with its level and shuffle setting (what one field is stored with).

    Its :meth:`label` and :meth:`dataset_kwargs` are stored in output files: they must not
    change for a given spec.
    """

    name: str
    level: int | None = None
    shuffle: bool = True

    @property
    def codec(self) -> Codec:
        return get(self.name)

    @property
    def effective_level(self) -> int | None:
        return self.codec.default_level if self.level is None else self.level

    def dataset_kwargs(self, itemsize: int) -> dict[str, Any]:
        """Keyword arguments for ``h5py.Group.create_dataset`` (filter pipeline)."""
        return self.codec.dataset_kwargs(self.effective_level, self.shuffle, itemsize)

    def label(self) -> str:
        lvl = self.effective_level
        return (self.name + (f"-{lvl}" if lvl is not None else "")
                + ("+shuffle" if self.shuffle and self.codec.uses_shuffle else ""))


def make_encoder(spec: CodecSpec, dtype: np.dtype) -> Encoder | None:
    """A function ``chunk array -> stored chunk bytes``, or None when only HDF5 can encode."""
    return spec.codec.encoder(spec.effective_level, spec.shuffle, np.dtype(dtype))


@cache
def self_check(spec: CodecSpec, dtype_str: str) -> bool:
    """Encode a test chunk in Python, store it with ``write_direct_chunk`` in an in-memory
    HDF5 file, read it back through HDF5's filter pipeline and compare."""
    import h5py

    dtype = np.dtype(dtype_str)
    enc = make_encoder(spec, dtype)
    if enc is None:
        return False
    # A varied but compressible pattern; no numpy.random, whose import would cost every
    # freshly forked writer a noticeable start-up delay.
    test = ((np.arange(4000).reshape(4, 1000) * 7919 % 50).cumsum(axis=1) % 251).astype(dtype)
    try:
        with h5py.File(f"selfcheck-{id(spec)}.h5", "w", driver="core", backing_store=False) as f:
            ds = f.create_dataset("x", shape=test.shape, chunks=test.shape, dtype=dtype,
                                  **spec.dataset_kwargs(dtype.itemsize))
            ds.id.write_direct_chunk((0, 0), enc(test))
            return bool(np.array_equal(ds[...], test))
    except Exception:
        return False
