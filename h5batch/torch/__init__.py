"""PyTorch reader for h5batch files (needs the ``torch`` extra). See docs/reader.md.

>>> from torch.utils.data import DataLoader
>>> from h5batch.torch import H5Dataset, ChunkShuffleSampler, collate
>>> ds = H5Dataset("out/demo.h5", split="train")                    # doctest: +SKIP
>>> sampler = ChunkShuffleSampler(ds, seed=0)                        # doctest: +SKIP
>>> loader = DataLoader(ds, batch_size=64, sampler=sampler, collate_fn=collate,
...                     num_workers=2)                               # doctest: +SKIP
"""

from __future__ import annotations

from .batch import Batch, Ragged
from .collate import Collate, collate, pad
from .dataset import FieldInfo, H5Dataset
from .sampler import ChunkShuffleSampler

__all__ = [
    "Batch",
    "ChunkShuffleSampler",
    "Collate",
    "FieldInfo",
    "H5Dataset",
    "Ragged",
    "collate",
    "pad",
]
