"""``collate``: turn what ``H5Dataset`` returns into one dict of batch tensors.

Given a :class:`~h5batch.torch.batch.Batch` (the default path: torch's map-style fetcher
hands the result of ``__getitems__`` straight to ``collate_fn``), fixed-shape fields are
already ``(B, *shape)`` tensors and are returned as they are. Variable-length fields are
padded to the longest sample (``<field>`` plus ``<field>_lengths``) or returned as a list of
tensors. Given a list of sample dicts (a ``transform`` was set, or samples came from
elsewhere) the same output is built by stacking.

Output keys: every field; ``<field>_lengths`` for padded variable fields (``(B,)`` int64
for 1-D samples, ``(B, ndim)`` shapes otherwise); ``label`` ``(B,)`` int64; ``source`` a list
of ``str`` / tuples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate, get_worker_info

from .batch import Batch, Ragged, empty_columns, numpy_dtype


class Collate:
    """A ``collate_fn`` for :class:`~h5batch.torch.H5Dataset` (picklable: workers may spawn).

    Parameters
    ----------
    variable : {"pad", "list"}
        Variable-length fields: zero-padded to the longest sample of the batch with
        ``<field>_lengths``, or a list of per-sample tensors (views of one buffer).
    pad_value : float
        Value of padding elements.
    shared_memory : bool, optional
        Allocate new batch tensors in shared memory; default: inside DataLoader workers.
    """

    def __init__(self, variable: str = "pad", pad_value: float = 0.0,
                 shared_memory: bool | None = None):
        if variable not in ("pad", "list"):
            raise ValueError(f"variable must be 'pad' or 'list', got {variable!r}")
        self.variable = variable
        self.pad_value = pad_value
        self.shared_memory = shared_memory

    def __repr__(self) -> str:
        return f"Collate(variable={self.variable!r}, pad_value={self.pad_value!r})"

    def _shared(self) -> bool:
        return get_worker_info() is not None if self.shared_memory is None else self.shared_memory

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, Batch):
            return self._from_batch(batch)
        if isinstance(batch, Sequence) and len(batch) and isinstance(batch[0], Mapping):
            return self._from_samples(batch)
        return default_collate(batch)

    def _from_batch(self, batch: Batch) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, col in batch.columns.items():
            if isinstance(col, Ragged):
                if self.variable == "pad" and (self.pad_value == 0 or col.shapes.shape[1] == 1):
                    out[name] = _refill(col, self.pad_value)  # already padded with zeros
                    out[name + "_lengths"] = col.lengths()
                else:
                    self._ragged(out, name, col.items(), col.lengths())
            else:
                out[name] = col
        if batch.label is not None:
            out["label"] = batch.label
        if batch.source is not None:
            out["source"] = list(batch.source)
        return out

    def _from_samples(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in samples[0]:
            values = [s[key] for s in samples]
            first = values[0]
            if isinstance(first, str) or (isinstance(first, tuple) and first and isinstance(first[0], str)):
                out[key] = values
            elif isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
                if all(v.shape == first.shape for v in values):
                    spec = ((len(values), *first.shape), numpy_dtype(first.dtype))
                    dst = empty_columns([spec], self._shared())[0]
                    out[key] = torch.stack(values, out=dst)
                else:
                    lengths = torch.tensor([list(v.shape) for v in values], dtype=torch.int64)
                    self._ragged(out, key, values, lengths[:, 0] if first.dim() == 1 else lengths)
            else:
                out[key] = default_collate(values)
        return out

    def _ragged(self, out: dict[str, Any], name: str, items: list[torch.Tensor],
                lengths: torch.Tensor) -> None:
        if self.variable == "list":
            out[name] = items
            return
        out[name] = pad(items, self.pad_value, self._shared())
        out[name + "_lengths"] = lengths


def _refill(col: Ragged, value: float) -> torch.Tensor:
    if value != 0:  # 1-D samples: overwrite each row's tail
        for j, n in enumerate(col.shapes[:, 0].tolist()):
            col.padded[j, n:] = value
    return col.padded


def pad(items: Sequence[torch.Tensor], value: float = 0.0, shared: bool = False) -> torch.Tensor:
    """Stack tensors of equal rank into ``(B, *max_shape)``, filling the rest with ``value``."""
    if not items:
        return torch.empty(0)
    ndim = items[0].dim()
    if any(t.dim() != ndim for t in items):
        raise ValueError("cannot pad tensors of different ranks: "
                         f"{sorted({t.dim() for t in items})}")
    shape = [max(t.shape[d] for t in items) for d in range(ndim)]
    out = empty_columns([((len(items), *shape), numpy_dtype(items[0].dtype))], shared)[0]
    if ndim == 1:
        for j, t in enumerate(items):
            n = t.shape[0]
            out[j, :n] = t
            out[j, n:] = value
        return out
    out.fill_(value)
    for j, t in enumerate(items):
        out[(j, *(slice(0, s) for s in t.shape))] = t
    return out


collate = Collate()
"""The default ``collate_fn``: variable fields padded, with ``<field>_lengths``."""
