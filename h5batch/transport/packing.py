"""Packing a decoded batch into one buffer, and reading it back on the writer's side.

A decoded batch is packed into one contiguous buffer: for each field, the samples' bytes
back to back (C order). Only a small :class:`Packed` descriptor (names, dtypes, shapes,
byte offsets) travels through Dask and the writer's pipe. The bytes go one of two ways:

``shm``      the worker writes the buffer into a shared-memory segment (:mod:`.segments`),
             the writer copies it into HDF5 and marks the segment free; the worker fills
             it again for a later batch. Only works when worker and writer share a host.
``network``  the buffer rides inside the Dask result (Dask's own comms), and the driver
             copies it into a segment for the writer (:func:`to_shm`), so the writer code
             is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .segments import FREE, Segment, take_segment


@dataclass(frozen=True)
class Block:
    """One field of a packed batch: samples ``i`` live at
    ``buffer[offset + starts[i] : offset + starts[i] + nbytes(shapes[i])]``."""

    name: str
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    offset: int
    nbytes: int


@dataclass
class Packed:
    """Descriptor of a packed batch. Exactly one of ``shm_name`` / ``payload`` is set
    (neither for a batch with no sample)."""

    blocks: tuple[Block, ...]
    nbytes: int
    shm_name: str | None = None
    payload: np.ndarray | None = field(default=None, repr=False)


def layout(arrays: dict[str, list[np.ndarray]]) -> tuple[tuple[Block, ...], int]:
    """Each field's samples back to back, in ``arrays``' order: the blocks and the bytes."""
    blocks = []
    offset = 0
    for name, samples in arrays.items():
        dtype = samples[0].dtype.str if samples else "|u1"
        nbytes = sum(a.nbytes for a in samples)
        blocks.append(Block(name, dtype, tuple(a.shape for a in samples), offset, nbytes))
        offset += nbytes
    return tuple(blocks), offset


def fill(buf: memoryview | np.ndarray, arrays: dict[str, list[np.ndarray]], blocks: tuple[Block, ...]) -> None:
    flat = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    for b in blocks:
        samples = arrays[b.name]
        if samples and all(a.ndim == 1 and a.dtype == b.dtype for a in samples):
            # One numpy call for the block: a loop of slice assignments pays a Python step
            # per sample, a sizeable share of packing short clips.
            np.concatenate(samples, out=flat[b.offset:b.offset + b.nbytes].view(b.dtype))
            continue
        pos = b.offset
        for a in samples:
            n = a.nbytes
            flat[pos:pos + n] = a.reshape(-1).view(np.uint8)
            pos += n


def pack(arrays: dict[str, list[np.ndarray]], mode: str, run_id: str) -> Packed:
    """Pack per-field sample lists. ``mode`` is ``shm`` or ``network``."""
    blocks, total = layout(arrays)
    if mode == "network":
        payload = np.empty(total, dtype=np.uint8)
        fill(payload, arrays, blocks)
        return Packed(blocks, total, payload=payload)
    seg = take_segment(run_id, total)
    try:
        fill(seg.data, arrays, blocks)
    except BaseException:
        seg.mark(FREE)
        raise
    seg.drop_pages(total)  # a big batch: the writer's mapping is the one that counts now
    return Packed(blocks, total, shm_name=seg.name)


def to_shm(packed: Packed, run_id: str) -> Packed:
    """Driver side of the network path: put a payload into a segment for the writer."""
    seg = take_segment(run_id, packed.nbytes)
    seg.data[: packed.nbytes] = packed.payload
    return Packed(packed.blocks, packed.nbytes, shm_name=seg.name)


class Attached:
    """Writer side: map a segment (mappings are cached), expose per-sample array views,
    and free the segment for reuse on release."""

    _maps: dict[str, Segment] = {}

    def __init__(self, packed: Packed):
        self.packed = packed
        self.seg: Segment | None = None
        # The bytes of the segment's data the blocks reach (they need not be adjacent).
        self.extent = max((b.offset + b.nbytes for b in packed.blocks), default=0)
        if packed.shm_name:
            self.seg = self._maps.get(packed.shm_name)
            if self.seg is None or self.seg.data.nbytes < self.extent:  # new, or grown since mapped
                self.seg = self._maps[packed.shm_name] = Segment(packed.shm_name)
        # No segment: the payload came inline (a writer on another host than the driver's,
        # h5batch/writer/remote.py, is sent a network payload as it is).
        self.flat = self.seg.data if self.seg else packed.payload if packed.payload is not None else np.zeros(0, np.uint8)

    def field_bytes(self, block: Block) -> np.ndarray:
        """All samples of one field, as a flat uint8 view."""
        return self.flat[block.offset: block.offset + block.nbytes]

    def samples(self, block: Block) -> list[np.ndarray]:
        """Per-sample array views (valid until :meth:`release`)."""
        dt = np.dtype(block.dtype)
        shapes = block.shapes
        if shapes and shapes[0] and all(s == shapes[0] for s in shapes):
            # One shape (a fixed field): the rows of one view, made in C. Not for scalar
            # samples, whose rows would be numpy scalars instead of 0-d views.
            n = len(shapes) * math.prod(shapes[0]) * dt.itemsize
            return list(self.flat[block.offset: block.offset + n].view(dt).reshape(len(shapes), *shapes[0]))
        out = []
        pos = block.offset
        for shape in block.shapes:
            n = math.prod(shape) * dt.itemsize  # math.prod: np.prod's call overhead, per sample, is not
            out.append(self.flat[pos:pos + n].view(dt).reshape(shape))
            pos += n
        return out

    def release(self) -> None:
        """Hand the segment back to its producer for the next batch."""
        if self.seg is not None:
            self.seg.mark(FREE)
            self.seg.drop_pages(self.extent)  # a long recording's pages leave this RSS
        self.seg = None
        self.flat = np.zeros(0, np.uint8)

