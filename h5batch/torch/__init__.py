"""PyTorch reader for h5batch files (needs the ``torch`` extra). See docs/reader.md.

>>> from h5batch.torch import H5Dataset
>>> ds = H5Dataset("out/demo.h5", split="train")                    # doctest: +SKIP
>>> loader = ds.loader(batch_size=64, shuffle=True, num_workers=2)   # doctest: +SKIP
"""

from __future__ import annotations

from .batch import Batch, Ragged
from .bucketing import BucketingBatchSampler
from .collate import Collate, collate, pad
from .dataset import FieldInfo, H5Dataset
from .global_batches import GlobalBatchSampler
from .loader import H5DataLoader
from .mixing import MixedDataset, MixingSampler
from .sampler import ChunkShuffleSampler
from .state import sampler_state

__all__ = [
    "Batch",
    "BucketingBatchSampler",
    "ChunkShuffleSampler",
    "Collate",
    "FieldInfo",
    "GlobalBatchSampler",
    "H5DataLoader",
    "H5Dataset",
    "MixedDataset",
    "MixingSampler",
    "Ragged",
    "collate",
    "pad",
    "sampler_state",
]
