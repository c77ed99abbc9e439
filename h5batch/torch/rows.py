"""``BatchRow``: the per-sample views of a :class:`~h5batch.torch.batch.Batch` that torch's
``default_collate`` stacks back into the batch without copying it.

Why: most scripts keep torch's ``default_collate``, which would ``torch.stack`` every field
of the :class:`Batch` from ``H5Dataset.__getitems__`` again: one more copy of the batch, in a
worker into *fresh* shared memory whose every page is faulted in (the cost
:mod:`h5batch.torch.recycle` removes).

Rule: a ``Batch``'s samples are :class:`BatchRow` tensors (a marker subclass; every
operation on one behaves as on a plain tensor and returns plain tensors). When torch's own
``collate_tensor_fn`` (and nothing else: the caller's code object is checked) calls
``torch.stack`` on ``B`` rows that are, in order, the ``B`` equally spaced dense rows of one
storage (what one column of a ``Batch`` is), the result is that column viewed as
``(B, *row)``: the same values ``torch.stack`` would write, without writing them.
``collate_tensor_fn`` returns the stack's result and drops its ``out=`` buffer, so nothing
but memory is saved; the column (in a worker, in recycled shared memory) goes to the main
process as ``collate_fn=collate`` would send it.

BEWARE: the collated tensors *are* the ``Batch``'s columns. That is unobservable on the
DataLoader path (the fetcher drops the ``Batch``); a custom ``collate_fn`` that calls
``default_collate(batch)`` and also keeps ``batch`` sees the two share memory.

Rows of a variable-length field (views of different lengths into a padded column) cannot
be stacked; there the collate raises an error that names the way out (``collate_fn=
h5batch.torch.collate``) instead of torch's "stack expects each tensor to be equal size".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data._utils.collate import collate_tensor_fn

_COLLATE_TENSOR_CODE = collate_tensor_fn.__code__
# The out= buffer is skipped only while torch's collate_tensor_fn still builds it the way
# this module expects (``elem._typed_storage()._new_shared(n)``, ``elem.new(s).resize_``).
_SKIP_OUT = {"_typed_storage", "_new_shared", "new", "resize_", "stack"} <= set(_COLLATE_TENSOR_CODE.co_names)


class VariableLengthCollateError(RuntimeError):
    """torch's ``default_collate`` met a variable-length h5batch field."""


class BatchRow(torch.Tensor):
    """One sample's view of a batch column (see the module docstring)."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        # Everything below sees plain tensors: no Python dispatch per attribute access.
        with torch._C.DisableTorchFunctionSubclass():
            if sys._getframe(1).f_code is _COLLATE_TENSOR_CODE:
                if func is torch.stack:
                    column = _whole_column(args[0] if args else kwargs.get("tensors"),
                                           args[1] if len(args) > 1 else kwargs.get("dim", 0))
                    if column is not None:
                        return column
                elif func is _TENSOR_NEW and len(args) > 1 and args[1] is _NO_COPY:
                    return torch.empty(0, dtype=args[0].dtype)  # the out= that stack ignores
            return func(*args, **kwargs)

    def _typed_storage(self) -> Any:
        # In a worker, collate_tensor_fn first asks for a fresh shared storage to stack
        # into (``_typed_storage()._new_shared(numel)``): torch allocates all its pages
        # there and then, for every batch. None is needed when the stack is the column.
        frame = sys._getframe(1)
        if frame.f_code is _COLLATE_TENSOR_CODE and _SKIP_OUT:
            with torch._C.DisableTorchFunctionSubclass():
                if _whole_column(frame.f_locals.get("batch"), 0) is not None:
                    return _NO_COPY
        return super()._typed_storage()

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        # A copy of the sample alone (torch's deepcopy of a view would copy its whole batch).
        with torch._C.DisableTorchFunctionSubclass():
            out = memo[id(self)] = self.as_subclass(torch.Tensor).clone()
        return out

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickled (sent to another process) as the plain tensor it views, so torch's
        # multiprocessing reducers, recycling's lease included, handle it as any tensor.
        return _identity, (self.as_subclass(torch.Tensor),)


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def rows(items: Sequence[torch.Tensor]) -> tuple[BatchRow, ...]:
    """The samples' views of one column (``column.unbind(0)``, or :meth:`Ragged.items`) as
    :class:`BatchRow`."""
    return tuple(t.as_subclass(BatchRow) for t in items)


class _NoCopy:
    """What ``collate_tensor_fn`` gets for its shared ``out=`` storage when no copy is made:
    ``_new_shared`` returns it again, and ``elem.new(it)`` an empty tensor."""

    def _new_shared(self, size: int, *, device: Any = None) -> _NoCopy:
        return self


_NO_COPY = _NoCopy()
_TENSOR_NEW = torch.Tensor.new


def _whole_column(tensors: Any, dim: Any) -> torch.Tensor | None:
    """The ``(B, *row)`` view of one storage that ``torch.stack(tensors, dim)`` would copy
    out, when the tensors are ``B`` dense rows of one storage spaced one row apart; else None
    (then ``torch.stack`` runs as usual). Raises for rows of different shapes. Called with
    subclass dispatch disabled."""
    if dim != 0 or not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    first = tensors[0]
    if not all(type(t) is BatchRow for t in tensors):
        return None
    shape = first.shape
    if any(t.shape != shape for t in tensors):
        sizes = sorted({tuple(t.shape) for t in tensors})
        raise VariableLengthCollateError(
            f"torch's default_collate cannot stack samples of different shapes ({sizes[0]} .. "
            f"{sizes[-1]}): this is a variable-length h5batch field. Pass "
            "collate_fn=h5batch.torch.collate (zero-padded, with <field>_lengths) or use "
            "ds.loader(...), which sets it")
    if not first.is_contiguous():
        return None
    storage = first.untyped_storage()
    base = first.storage_offset()
    step = first.numel()
    ptr = storage.data_ptr()
    for j, t in enumerate(tensors):
        if (t.storage_offset() != base + j * step or t.dtype != first.dtype
                or not t.is_contiguous() or t.untyped_storage().data_ptr() != ptr):
            return None
    out = torch.empty(0, dtype=first.dtype, device=first.device)
    return out.set_(storage, base, (len(tensors), *shape))
