"""What ``H5Dataset.__getitems__`` returns: a whole batch, already in tensors.

:class:`Batch` holds one column per field in the order the indices were requested; it is
also a sequence of per-sample dicts (views into those columns), so torch's
``default_collate`` and any per-sample code keep working. ``h5batch.torch.collate`` takes
the columns as they are instead of stacking samples again.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .recycle import PrivatePool, SharedBatchPool
from .rows import rows


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def _scaling(divisor: float) -> tuple[np.ufunc, np.float32]:
    """``(ufunc, factor)`` that scale by ``1 / divisor``: a power-of-two divisor (int16's
    32768) multiplies by its reciprocal, which is exact in float32 (the same values as the
    division, faster); any other (uint8's 255) divides, correctly rounded by numpy."""
    if math.frexp(divisor)[0] == 0.5:
        return np.multiply, np.float32(1.0 / divisor)
    return np.divide, np.float32(divisor)


def _cast_scale(dst: np.ndarray, src: np.ndarray, op: np.ufunc, factor: np.float32) -> None:
    np.copyto(dst, src, casting="unsafe")
    op(dst, factor, out=dst)


def float_copy(divisor: float) -> Copy:
    """The converting copy ``dst[...] = src / divisor`` (``divisor`` a field kind's
    ``float_scale``: int16 audio to float32 in [-1, 1), uint8 pixels to [0, 1]).

    Cast, then scale ``dst`` in place: the row is still in cache and two plain loops beat
    numpy's buffered mixed-type one (the cast is exact, so values are the same). The scaling
    is chosen once here, not per row (a batch calls the copy once per row)."""
    op, factor = _scaling(divisor)
    return functools.partial(_cast_scale, op=op, factor=factor)


def divide_in_place(a: np.ndarray, divisor: float) -> None:
    """Scale float32 ``a``, already cast from stored values, as :func:`float_copy` does."""
    op, factor = _scaling(divisor)
    op(a, factor, out=a)


Copy = Callable[[np.ndarray, np.ndarray], None]

#: bytes each copy thread gets at least: below 2x this a batch is filled by one thread
#: (handing work to a thread costs more than copying a small batch)
PARALLEL_MIN_BYTES = 1 << 20
#: threads past this add hand-over cost and no bandwidth
MAX_COPY_THREADS = 8
_executor: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, threads, pool)


def _pool(threads: int) -> ThreadPoolExecutor:
    global _executor
    pid = os.getpid()
    if _executor is None or _executor[0] != pid or _executor[1] != threads:
        # A new pool after fork (the parent's threads are not in the child) or resize.
        _executor = (pid, threads, ThreadPoolExecutor(threads - 1, thread_name_prefix="h5batch-copy"))
    return _executor[2]


def copy_all(tasks: Sequence[tuple[np.ndarray, np.ndarray]], copy: Copy | None = None) -> None:
    """``copy(dst, src)`` (default ``np.copyto``) for every ``(dst, src)`` pair, on up to
    ``torch.get_num_threads()`` threads (at most 8, and at least 1 MiB each).

    Threads because filling a batch is bound by memory bandwidth, which one core does not
    saturate, and numpy releases the GIL while copying. DataLoader workers get one torch
    thread and stay single-threaded; in the main process ``torch.set_num_threads`` decides.
    """
    copy = copy or np.copyto
    total = sum(d.nbytes for d, _ in tasks)
    threads = min(torch.get_num_threads(), MAX_COPY_THREADS, len(tasks), total // PARALLEL_MIN_BYTES)
    if threads < 2:
        for d, s in tasks:
            copy(d, s)
        return
    # Contiguous runs of about equal bytes, one per thread; this thread takes the first.
    parts: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(threads)]
    share, acc, p = total / threads, 0, 0
    for d, s in tasks:
        if acc >= share * (p + 1) and p < threads - 1:
            p += 1
        parts[p].append((d, s))
        acc += d.nbytes

    def run(part: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for d, s in part:
            copy(d, s)

    futures = [_pool(threads).submit(run, part) for part in parts[1:] if part]
    try:
        run(parts[0])
    finally:
        for f in futures:
            f.result()


COLUMN_ALIGN = 64  # bytes: each column of a shared batch starts on a cache line


def empty_columns(specs: Sequence[tuple[Sequence[int], Any]], shared: bool,
                  pool: SharedBatchPool | None = None,
                  private: PrivatePool | None = None) -> list[torch.Tensor]:
    """Uninitialised tensors for the columns of one batch, ``specs = [(shape, dtype), ...]``.

    ``shared`` allocates in shared memory, saving the copy a DataLoader worker would make
    before sending; a new shared storage, because ``share_memory_()`` allocates privately
    and copies. The columns are views of **one** storage (each 64-byte aligned), so a worker
    sends one file descriptor per batch, not one round trip per column. With a ``pool``, a
    worker reuses storages the main process has released (:mod:`h5batch.torch.recycle`).
    Not ``shared``, with a ``private`` pool, the columns are views of one private storage
    that is reused once the caller has dropped every tensor on it (:mod:`h5batch.torch.recycle`).
    """
    sizes = [tuple(int(n) for n in shape) for shape, _ in specs]
    dtypes = [np.dtype(dtype) for _, dtype in specs]
    offsets, total = [], 0
    for size, dt in zip(sizes, dtypes, strict=True):
        total = -(-total // COLUMN_ALIGN) * COLUMN_ALIGN
        offsets.append(total)
        total += math.prod(size) * dt.itemsize
    if total == 0 or not (shared or private is not None):
        return [torch.empty(size, dtype=torch_dtype(dt)) for size, dt in zip(sizes, dtypes, strict=True)]
    if not shared:
        storage = private.storage(total)
    else:
        storage = pool.storage(total) if pool is not None else torch.UntypedStorage._new_shared(total)
    return [torch.empty(0, dtype=torch_dtype(dt)).set_(storage, offset // dt.itemsize, size)
            for size, dt, offset in zip(sizes, dtypes, offsets, strict=True)]


def stored_axes(view: np.ndarray, perm: list[int]) -> np.ndarray:
    """A ``(B, *output axes)`` batch viewed in the stored axis order of its samples."""
    if perm == list(range(len(perm))):
        return view
    return view.transpose(0, *(1 + int(a) for a in np.argsort(perm)))


class Ragged:
    """A variable-shape field of a batch, zero-padded to the batch's largest sample.

    ``padded`` is ``(B, *max_shape)``; sample ``j`` is the view
    ``padded[j, :shapes[j, 0], :shapes[j, 1], ...]``. Both are in the output layout: with
    ``channels_first`` an image field is ``(B, C, H, W)`` and its shapes are ``(C, H, W)``.
    Reading straight into this layout makes padding free for the collate.
    """

    def __init__(self, padded: torch.Tensor, shapes: np.ndarray):
        self.padded = padded
        self.shapes = shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def item(self, j: int) -> torch.Tensor:
        return self.padded[(j, *(slice(0, int(n)) for n in self.shapes[j]))]

    def items(self) -> list[torch.Tensor]:
        return [self.item(j) for j in range(len(self))]

    def strings(self) -> list[str]:
        """Each sample's bytes decoded as UTF-8: the column of a ``text`` field. Rule: a text
        field is read like any variable-length uint8 field, then its column becomes this
        list of ``str`` (``ds[i]["transcript"]`` is a ``str``, a batch column a list: what a
        tokenizer takes; bytes in a padded tensor are no use to a training script)."""
        return [bytes(np.ascontiguousarray(t.numpy())).decode("utf-8") for t in self.items()]

    def lengths(self) -> torch.Tensor:
        """``(B,)`` first-axis lengths for 1-D samples, else the ``(B, ndim)`` shapes."""
        s = self.shapes[:, 0] if self.shapes.shape[1] == 1 else self.shapes
        return torch.from_numpy(np.ascontiguousarray(s, dtype=np.int64))


class Batch(Sequence):
    """A batch of samples, column by column, in the order they were requested.

    Attributes
    ----------
    columns : dict[str, Tensor | Ragged]
        Fixed-shape fields as ``(B, *shape)`` tensors, variable ones as :class:`Ragged`.
    label : Tensor or None
        ``(B,)`` int64 when the split is labelled.
    source : list or None
        Per sample a ``str`` (one file) or a tuple of ``str`` (one per field), when asked for.
    """

    def __init__(self, columns: dict[str, torch.Tensor | Ragged], label: torch.Tensor | None,
                 source: list[Any] | None, size: int):
        self.columns = columns
        self.label = label
        self.source = source
        self.size = size
        self._rows: dict[str, tuple[torch.Tensor, ...]] | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, j: int) -> dict[str, Any]:  # type: ignore[override]
        """Sample ``j`` as a dict of :class:`~h5batch.torch.rows.BatchRow` views (which
        torch's ``default_collate`` stacks back into the columns without a copy)."""
        if not -self.size <= j < self.size:
            raise IndexError(f"sample {j} of a batch of {self.size}")
        j %= self.size
        if self._rows is None:
            # Every sample's views at once: one unbind per column, not B indexing calls.
            self._rows = {name: rows(col.items()) if isinstance(col, Ragged)
                          else col if isinstance(col, list) else rows(col.unbind(0))  # a list: text (Ragged.strings)
                          for name, col in self.columns.items()}
            if self.label is not None:
                self._rows["label"] = rows(self.label.unbind(0))
        sample = {name: r[j] for name, r in self._rows.items()}
        if self.source is not None:
            sample["source"] = self.source[j]
        return sample

    def sample(self, j: int) -> dict[str, Any]:
        """Sample ``j`` as a dict of plain tensor views (what ``ds[i]`` and a ``transform``
        get)."""
        if not -self.size <= j < self.size:
            raise IndexError(f"sample {j} of a batch of {self.size}")
        out: dict[str, Any] = {name: col.item(j) if isinstance(col, Ragged) else col[j]
                               for name, col in self.columns.items()}
        if self.label is not None:
            out["label"] = self.label[j]
        if self.source is not None:
            out["source"] = self.source[j]
        return out

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}={'ragged' if isinstance(v, Ragged) else 'str' if isinstance(v, list) else tuple(v.shape)}"
                         for k, v in self.columns.items())
        return f"Batch({self.size} samples: {cols})"
