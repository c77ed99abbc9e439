"""Decoding stored chunks in Python: the reader's fast path (``h5batch.torch.chunks``) and the
writer's re-chunking of a stored tail (``h5batch.writer``).

Rule: :class:`ChunkDecoder` knows no codec. It takes the decode step of each filter id from
the registry (:func:`h5batch.codecs.base.decode_steps`) and handles only HDF5's own shuffle
filter itself, as the final copy into the chunk buffer. Reason: a codec module that registers
a decode step is read in Python with no edit here; a filter without a step (lzf, or a plugin
from another tool) makes :meth:`ChunkDecoder.for_dataset` return None, and the dataset is read
through HDF5's filter pipeline instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .base import FILTER_SHUFFLE, DecodeStep, decode_steps, unshuffle_into

if TYPE_CHECKING:
    import h5py


class ChunkDecoder:
    """Python mirror of one dataset's HDF5 filter pipeline (decode direction only).

    Use :meth:`for_dataset`, which returns ``None`` when some filter has no Python decoder.
    """

    def __init__(self, filters: list[int], itemsize: int, steps: dict[int, DecodeStep] | None = None):
        self.filters = filters
        self.itemsize = itemsize
        self.steps = decode_steps() if steps is None else steps

    @classmethod
    def for_dataset(cls, ds: h5py.Dataset) -> ChunkDecoder | None:
        dcpl = ds.id.get_create_plist()
        filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
        registered = decode_steps()
        steps: dict[int, DecodeStep] = {}
        for f in filters:
            if f == FILTER_SHUFFLE:
                continue
            step = registered.get(f)
            if step is None or not step.available():
                return None
            steps[f] = step
        return cls(filters, ds.dtype.itemsize, steps)

    def decode(self, raw: Any, filter_mask: int, out: np.ndarray) -> str:
        """Decode stored chunk bytes ``raw`` into ``out`` (a C-contiguous chunk buffer).

        Filters run in reverse pipeline order; bit ``i`` of ``filter_mask`` set means filter
        ``i`` was skipped when the chunk was written. Returns the kind of encoding met (so the
        caller can check each kind against HDF5 once). Raises ``ValueError`` when the result
        does not have the chunk's size.
        """
        nbytes = out.nbytes
        data: Any = raw
        kind = f"mask{filter_mask}"
        unshuffle = False
        active = [f for i, f in enumerate(self.filters) if not filter_mask & (1 << i)]
        if len(active) == 1 and active[0] != FILTER_SHUFFLE:
            sub = self.steps[active[0]].decode_into(raw, out)
            if sub is not None:
                return f"{kind}-{sub}"  # the common case: decompressed straight into the buffer
        for pos in range(len(active) - 1, -1, -1):
            f = active[pos]
            if f == FILTER_SHUFFLE:
                if pos != 0:  # shuffle must be the first filter written (the last undone)
                    raise ValueError("shuffle filter in an unexpected pipeline position")
                unshuffle = self.itemsize > 1
                continue
            data, sub = self.steps[f].decode(data, nbytes)
            if sub:
                kind += "-" + sub
        src = np.frombuffer(data, dtype=np.uint8)
        if src.size != nbytes:
            raise ValueError(f"decoded chunk has {src.size} bytes, expected {nbytes}")
        dst = out.reshape(-1).view(np.uint8)
        if unshuffle:
            unshuffle_into(src, dst, self.itemsize)
        else:
            dst[...] = src
        return kind
