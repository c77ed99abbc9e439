"""Codec ``none``: chunks stored as they are, no HDF5 filter.

Every HDF5 tool reads it, and it is the fastest to write and read: the writer stores rows
straight from shared memory and the h5batch reader maps stored chunks in place (it sees an
empty filter list and skips :class:`~h5batch.codecs.chunks.ChunkDecoder` altogether).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Codec, Encoder, register


class NoneCodec(Codec):
    name = "none"
    uses_shuffle = False  # nothing to shuffle for: the label never says +shuffle

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        return {}

    def encoder(self, level: int | None, shuffle: bool, dtype: np.dtype) -> Encoder | None:
        return lambda a: a.tobytes()


register(NoneCodec())
