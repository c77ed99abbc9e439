"""``ds[i]`` without the batch machinery: one sample of fixed-shape fields read straight from
its decoded chunk.

Why: a dataset that torch's fetcher reads sample by sample (inside a ``ConcatDataset``, with
``batch_size=None``, in a user's loop) pays, per sample, everything ``__getitems__`` does
for a batch: index arrays, sorting, grouping by chunk, a ``Batch``. For one sample of fixed
fields none of that is needed: the row is ``chunk[r % k]`` of one cached decoded chunk
(:class:`~h5batch.torch.chunks.ChunkStore`, shared with batch reads, so consecutive samples
of a chunk decode it once), copied and converted into the output in one pass.

The rule: :func:`read_one` returns exactly what ``__getitems__([i])`` would give as sample 0
(same dtypes, conversion, axes, label and source; in shared memory only with
``shared_memory=True``: a lone sample is stacked by a collate anyway), or ``None`` when the
dataset has something it does not handle (a ``transform``, a variable-length or encoded
field, an index out of range), and the caller takes the general path.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import format as fmt
from .batch import empty_columns, float_copy


def read_one(ds: Any, i: Any) -> dict[str, Any] | None:
    """Sample ``i`` of ``H5Dataset`` ``ds`` (see the module docstring), or None."""
    if ds.transform is not None or getattr(ds, "_encoded", None) or not all(fi.fixed for fi in ds.fields):
        return None
    n = len(ds)
    j = operator.index(i)
    j = j + n if j < 0 else j
    if not 0 <= j < n:
        return None  # the general path raises the error
    r = j if ds._rows is None else int(ds._rows[j])
    ds._ensure_open()
    # Samples are stacked by a collate (which allocates its own shared batch in a worker):
    # a sample in shared memory is a waste of a recycled slot, so only when asked for.
    shared = bool(ds.shared_memory)
    plan = ds.__dict__.get("_one_plan")
    if plan is None:  # per field: output shape, output dtype, converting copy, stored-axes order
        plan = ds._one_plan = [(ds._out_shape(fi, 1, None)[1:], *_copy_of(ds, fi), ds._axes(fi))
                               for fi in ds.fields]
    specs: list[tuple[Any, Any]] = [(shape, dtype) for shape, dtype, _, _ in plan]
    if ds.labelled:
        specs.append(((), np.int64))
    outs = empty_columns(specs, shared, ds._pool)
    sample: dict[str, Any] = {}
    for fi, (_, _, copy, axes), out in zip(ds.fields, plan, outs, strict=False):
        store = ds._store(fi)
        c, k = divmod(r, store.k)
        view = out.numpy()
        if axes != list(range(len(axes))):
            view = view.transpose(np.argsort(axes))  # write in stored axis order
        copy(view, store.get(c)[k])
        sample[fi.name] = out
    if ds.labelled:
        outs[-1].fill_(int(ds._index_array(fmt.LABEL)[r]))
        sample["label"] = outs[-1]
    if ds.with_source:
        sample["source"] = ds._read_sources(np.array([r], dtype=np.int64))[0]
    return sample


def _copy_of(ds: Any, fi: Any) -> tuple[Any, Any]:
    dtype, how = ds._convert(fi)
    return dtype, (float_copy(how) if how else np.copyto)


__all__ = ["read_one"]
