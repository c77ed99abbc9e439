"""Moving decoded batches from Dask workers to the writer process.

A decoded batch is packed into one contiguous buffer: for each field, the samples' bytes
back to back (C order). Only a small :class:`Packed` descriptor (names, dtypes, shapes,
byte offsets) travels through Dask and the writer's queue.

Two ways for the bytes themselves:

``shm``      the worker writes the buffer into a POSIX shared-memory segment
             (``/dev/shm/h5b-<run id>-...``), the writer copies it into HDF5 and marks the
             segment free; the worker fills it again for a later batch. Only works when
             worker and writer share a host.
``network``  the buffer rides inside the Dask result (Dask's own comms), and the driver
             copies it into a segment for the writer, so the writer code is the same.

Ownership: the producing process (worker, or the driver for network payloads) creates and
reuses its segments; the writer only maps them and flips their state byte. The driver
unlinks every segment of its run when the job ends, whatever the outcome.
(``multiprocessing.shared_memory`` is not used: on CPython 3.11 its resource tracker
unlinks segments a process merely attached to, bpo-39959.) Segments of dead runs are found by their run id (which
embeds the driver's pid) and removed by :func:`remove_stale_segments`.
"""

from __future__ import annotations

import math
import mmap
import os
import secrets
import socket
from dataclasses import dataclass, field

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "h5b-"


@dataclass(frozen=True)
class Block:
    """One field of a packed batch: samples ``i`` live at
    ``buffer[offset + starts[i] : offset + starts[i] + nbytes(shapes[i])]``."""

    name: str
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ChunkSet:
    """Whole chunks of a fixed-shape field, compressed by the worker.

    The worker assumed the batch's first sample lands at row ``pred`` of the dataset: its
    first ``head`` samples complete the chunk in progress and travel raw, then come
    ``n_chunks`` compressed chunks of ``k`` rows (block ``<name>#chunks``), then the rest
    raw. When the writer finds the prediction wrong it decodes the chunks and appends rows.
    """

    name: str
    pred: int
    head: int
    n_chunks: int
    k: int
    row_shape: tuple[int, ...]
    dtype: str

    @property
    def block(self) -> str:
        return f"{self.name}#chunks"


@dataclass
class Packed:
    """Descriptor of a packed batch. Exactly one of ``shm_name`` / ``payload`` is set."""

    blocks: tuple[Block, ...]
    nbytes: int
    shm_name: str | None = None
    payload: np.ndarray | None = field(default=None, repr=False)
    host: str = ""
    chunks: tuple[ChunkSet, ...] = ()


def new_run_id() -> str:
    """``<driver pid hex>x<random>``: unique per run, and tells which process owns it."""
    return f"{os.getpid():x}x{secrets.token_hex(4)}"


def hostname() -> str:
    return socket.gethostname()


def _layout(arrays: dict[str, list[np.ndarray]]) -> tuple[tuple[Block, ...], int]:
    blocks = []
    offset = 0
    for name, samples in arrays.items():
        dtype = samples[0].dtype.str if samples else "|u1"
        nbytes = sum(a.nbytes for a in samples)
        blocks.append(Block(name, dtype, tuple(a.shape for a in samples), offset, nbytes))
        offset += nbytes
    return tuple(blocks), offset


def _fill(buf: memoryview | np.ndarray, arrays: dict[str, list[np.ndarray]], blocks: tuple[Block, ...]) -> None:
    flat = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    for b in blocks:
        pos = b.offset
        for a in arrays[b.name]:
            n = a.nbytes
            flat[pos:pos + n] = a.reshape(-1).view(np.uint8)
            pos += n


HEADER = 64  # bytes before the data: byte 0 is the slot state (FREE / BUSY)
FREE, BUSY = 0, 1


class Segment:
    """A POSIX shared-memory segment (a file in ``/dev/shm``, what ``shm_open`` uses),
    mapped into this process. Plain files and ``mmap`` rather than
    ``multiprocessing.shared_memory``: no resource tracker can unlink a segment behind the
    owner's back, and a mapping closes cleanly when its last numpy view goes away.

    Byte 0 says whether the segment holds a batch the writer has not stored yet (BUSY)
    or may be filled again (FREE): segments are reused, so their pages stay resident and
    a batch costs no page faults, no ``ftruncate`` and no ``mmap``."""

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        path = os.path.join(SHM_DIR, name)
        if size is None:
            fd = os.open(path, os.O_RDWR)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, HEADER + max(size, 1))
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            if size is not None:
                os.unlink(path)
            raise
        os.close(fd)
        self.flat = np.frombuffer(self.map, dtype=np.uint8)
        self.data = self.flat[HEADER:]

    @property
    def free(self) -> bool:
        return self.flat[0] == FREE

    def mark(self, state: int) -> None:
        self.flat[0] = state

    def unlink(self) -> None:
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass


def create_segment(run_id: str, nbytes: int) -> Segment:
    """A new segment named after the run; the caller hands it on by name."""
    return Segment(f"{PREFIX}{run_id}-{secrets.token_hex(6)}", nbytes)


class _Pool:
    """The segments this process filled for one run, reused once the writer frees them."""

    def __init__(self) -> None:
        self.run_id = ""
        self.segments: list[Segment] = []

    def take(self, run_id: str, nbytes: int) -> Segment:
        if run_id != self.run_id:  # a new job on a long-lived worker: let the old maps go
            self.run_id, self.segments = run_id, []
        pid = owner_pid(f"{PREFIX}{run_id}-")
        if pid is not None and not pid_alive(pid):
            # The driver died (kill -9): a worker finishing its queue must not leave new
            # segments behind after the next run has cleaned up the old ones.
            raise RuntimeError(f"driver of run {run_id} is gone; not creating shared memory for it")
        for seg in self.segments:
            if seg.free and seg.data.nbytes >= nbytes:
                seg.mark(BUSY)
                return seg
        # Room to grow, so a segment fits the next batches too (variable-length samples).
        seg = create_segment(run_id, max(nbytes + nbytes // 2, 1 << 20))
        seg.mark(BUSY)
        self.segments.append(seg)
        return seg


    def abandon(self, seg: Segment) -> None:
        """Never hand ``seg`` out again (a stuck decode thread may still write into it);
        the driver unlinks it with the rest of the run's segments."""
        if seg in self.segments:
            self.segments.remove(seg)


_pool = _Pool()


def take_segment(run_id: str, nbytes: int) -> Segment:
    """A free segment of this process with room for ``nbytes``, marked BUSY: the caller
    fills ``seg.data`` and hands it to the writer by name (or marks it FREE on failure)."""
    return _pool.take(run_id, nbytes)


def abandon_segment(seg: Segment) -> None:
    _pool.abandon(seg)


def pack(arrays: dict[str, list[np.ndarray]], mode: str, run_id: str,
         chunks: tuple[ChunkSet, ...] = ()) -> Packed:
    """Pack per-field sample lists. ``mode`` is ``shm`` or ``network``. Compressed chunks
    ride as uint8 "samples" of a ``<field>#chunks`` entry described by ``chunks``."""
    blocks, total = _layout(arrays)
    if mode == "network":
        payload = np.empty(total, dtype=np.uint8)
        _fill(payload, arrays, blocks)
        return Packed(blocks, total, payload=payload, host=hostname(), chunks=chunks)
    seg = _pool.take(run_id, total)
    try:
        _fill(seg.data, arrays, blocks)
    except BaseException:
        seg.mark(FREE)
        raise
    return Packed(blocks, total, shm_name=seg.name, host=hostname(), chunks=chunks)


def to_shm(packed: Packed, run_id: str) -> Packed:
    """Driver side of the network path: put a payload into a segment for the writer."""
    if packed.shm_name is not None:
        return packed
    assert packed.payload is not None
    seg = _pool.take(run_id, packed.nbytes)
    seg.data[: packed.nbytes] = packed.payload
    return Packed(packed.blocks, packed.nbytes, shm_name=seg.name, host=packed.host, chunks=packed.chunks)


class Attached:
    """Writer side: map a segment (mappings are cached), expose per-sample array views,
    and free the segment for reuse on release."""

    _maps: dict[str, Segment] = {}

    def __init__(self, packed: Packed):
        self.packed = packed
        self.seg: Segment | None = None
        if packed.shm_name:
            self.seg = self._maps.get(packed.shm_name)
            if self.seg is None:
                self.seg = self._maps[packed.shm_name] = Segment(packed.shm_name)
        self.flat = self.seg.data if self.seg else np.zeros(0, np.uint8)

    def field_bytes(self, block: Block) -> np.ndarray:
        """All samples of one field, as a flat uint8 view."""
        return self.flat[block.offset: block.offset + block.nbytes]

    def samples(self, block: Block) -> list[np.ndarray]:
        """Per-sample array views (valid until :meth:`release`)."""
        out = []
        pos = block.offset
        dt = np.dtype(block.dtype)
        for shape in block.shapes:
            n = math.prod(shape) * dt.itemsize  # np.prod costs ~3 us a call, per sample
            out.append(self.flat[pos:pos + n].view(dt).reshape(shape))
            pos += n
        return out

    def release(self) -> None:
        """Hand the segment back to its producer for the next batch."""
        if self.seg is not None:
            self.seg.mark(FREE)
        self.seg = None
        self.flat = np.zeros(0, np.uint8)


def discard(packed: Packed) -> None:
    """Free the segment of a result that will never be written."""
    if packed.shm_name:
        try:
            Segment(packed.shm_name).mark(FREE)
        except FileNotFoundError:
            pass


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_segments(run_id: str) -> int:
    """Unlink every segment of one run (end of a job, success or failure)."""
    n = 0
    if not os.path.isdir(SHM_DIR):
        return 0
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"{PREFIX}{run_id}-"):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                n += 1
            except FileNotFoundError:
                pass
    return n


def owner_pid(segment: str) -> int | None:
    """Pid of the driver whose run made ``segment`` (from the run id in its name)."""
    try:
        return int(segment[len(PREFIX):].split("-", 1)[0].split("x", 1)[0], 16)
    except ValueError:
        return None


def stale_segments() -> list[str]:
    """Segments of runs whose driver process is gone."""
    return [n for n in list_segments() if (pid := owner_pid(n)) is not None and not pid_alive(pid)]


def remove_stale_segments() -> list[str]:
    """Unlink segments left by runs whose driver process is gone (e.g. after ``kill -9``)."""
    removed = []
    for name in stale_segments():
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def list_segments(run_id: str | None = None) -> list[str]:
    """Names of h5batch segments present now (of one run, or all)."""
    if not os.path.isdir(SHM_DIR):
        return []
    pre = f"{PREFIX}{run_id}-" if run_id else PREFIX
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(pre))
