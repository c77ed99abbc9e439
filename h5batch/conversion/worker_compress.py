"""Compression in the workers: the whole chunks of a batch's aligned fixed-shape fields are
encoded where the batch was decoded, so the writer only stores bytes.

Rule: a batch whose task carries ``align`` (the driver predicted the dataset row of its
first sample, ``BatchTask.align``) has its rows from the first chunk boundary on encoded
chunk by chunk; the head and tail rows travel raw and the writer's appender completes
their chunks. Reason: HDF5 runs filters in one thread, and so does the Blosc2 frame
encoder; on a cluster the workers' cores encode in parallel.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..batches import BatchTask
from ..codecs import CodecSpec, make_encoder, self_check
from ..transport.packing import ChunkSet


@cache
def _encoder(codec: CodecSpec, dtype: str):
    if codec.name.startswith("blosc2"):
        import blosc2

        # One compression thread per worker process: the workers already fill the cores.
        blosc2.set_nthreads(1)
    return make_encoder(codec, np.dtype(dtype)) if self_check(codec, dtype) else None


def compress_chunks(task: BatchTask, arrays: dict[str, list[np.ndarray]]) -> tuple[ChunkSet, ...]:
    """Compress the whole chunks of each aligned field here, in parallel across workers,
    so the writer only stores bytes (HDF5 runs filters in one thread, and so does the
    Blosc2 frame encoder). Replaces those samples in ``arrays`` by the head and tail rows
    and adds a ``<field>#chunks`` entry."""
    out = []
    for name, pred, k, codec in task.align:
        samples = arrays[name]
        n = len(samples)
        head = min((-pred) % k, n)
        n_chunks = (n - head) // k
        if n_chunks == 0 or any(a.shape != samples[0].shape or a.dtype != samples[0].dtype for a in samples):
            continue
        enc = _encoder(codec, samples[0].dtype.str)
        if enc is None:
            continue
        rows = np.stack(samples[head: head + n_chunks * k])
        encoded = [np.frombuffer(enc(rows[i * k:(i + 1) * k]), dtype=np.uint8) for i in range(n_chunks)]
        arrays[name] = samples[:head] + samples[head + n_chunks * k:]
        arrays[f"{name}#chunks"] = encoded
        out.append(ChunkSet(name, pred, head, n_chunks, k, tuple(samples[0].shape), samples[0].dtype.str))
    return tuple(out)
