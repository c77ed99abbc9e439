"""The two measurements ``codec: auto`` weighs (``h5batch/conversion/auto.py``): how much
Blosc2-LZ4 shrinks the trial samples, and how fast it decodes them against a memory copy.

Rule: the ratio is what the output would store, the samples written through HDF5's own
Blosc2 filter (hdf5plugin) into a file in memory; the speeds, measured only where the ratio
makes compression worth weighing, use the ``blosc2`` package as the reader does. So a corpus
that does not compress (most decoded media) never imports ``blosc2`` in the driver.
"""

from __future__ import annotations

import math
import time

import numpy as np

TIMING_ROUNDS = 5  # interleaved rounds of decode and copy timing; the best of each is kept
TIMING_BYTES = 1 << 20  # trial bytes timed per field: the same share of every trial sample
PIECE = 1 << 20  # bytes per compressed piece, for the ratio and the timing (the default chunk size)


def lz4_chunks(flat: np.ndarray, level: int | None, shuffle: bool, piece: int) -> list[bytes]:
    """``flat`` compressed as ``blosc2-lz4``'s encoder compresses a chunk (Blosc2, LZ4, byte
    shuffle for items wider than a byte, one thread), in pieces of ``piece`` bytes."""
    itemsize = flat.dtype.itemsize
    raw = flat.view(np.uint8)
    clevel = 5 if level is None else level
    import blosc2
    filt = blosc2.Filter.SHUFFLE if shuffle and itemsize > 1 else blosc2.Filter.NOFILTER
    return [blosc2.compress2(raw[pos: pos + piece], typesize=itemsize, clevel=clevel,
                             codec=blosc2.Codec.LZ4, filters=[filt], nthreads=1)
            for pos in range(0, raw.size, piece)]


def ratio(flat: np.ndarray, level: int | None, shuffle: bool) -> float:
    """Blosc2-LZ4 compression ratio of ``flat`` as stored in chunks of 1 MiB."""
    import h5py

    from . import get

    kwargs = get("blosc2-lz4").dataset_kwargs(5 if level is None else level, shuffle, flat.dtype.itemsize)
    with h5py.File("trial", "w", driver="core", backing_store=False) as f:
        ds = f.create_dataset("x", data=flat.reshape(-1), chunks=(min(flat.size, max(1, PIECE // flat.itemsize)),),
                              **kwargs)
        stored = sum(ds.id.get_chunk_info(i).size for i in range(ds.id.get_num_chunks()))
    return flat.nbytes / max(1, stored)


def speeds(arrays: list[np.ndarray], level: int | None, shuffle: bool) -> tuple[float, float]:
    """``(decode GB/s, copy GB/s)`` on up to :data:`TIMING_BYTES` of ``arrays`` (the start of
    each, concatenated: every sample has its share): Blosc2-LZ4 chunks of
    :data:`PIECE` bytes decompressed into a buffer on one thread (the call the reader
    makes for each stored chunk, ``h5batch/codecs/_blosc2.py``), and ``numpy.copyto`` of the
    same bytes; both timed in :data:`TIMING_ROUNDS` interleaved rounds, the best of each kept.
    Blosc2's global settings are left alone."""
    import blosc2

    share = max(1, TIMING_BYTES // max(1, len(arrays)) // arrays[0].itemsize)
    flat = np.ascontiguousarray(np.concatenate([a.reshape(-1)[:share] for a in arrays]))
    out = np.empty_like(flat)
    dst = out.view(np.uint8)
    chunks = lz4_chunks(flat, level, shuffle, PIECE)
    spans = [(pos, min(pos + PIECE, dst.size)) for pos in range(0, dst.size, PIECE)]
    best_decode = best_copy = math.inf
    for _ in range(TIMING_ROUNDS):
        t0 = time.perf_counter()
        for (a, b), chunk in zip(spans, chunks):
            blosc2.decompress2(chunk, dst=dst[a:b], nthreads=1)
        t1 = time.perf_counter()
        np.copyto(out, flat)
        t2 = time.perf_counter()
        best_decode, best_copy = min(best_decode, t1 - t0), min(best_copy, t2 - t1)
    return flat.nbytes / max(best_decode, 1e-9) / 1e9, flat.nbytes / max(best_copy, 1e-9) / 1e9


Figures = tuple[float, "float | None", "float | None"]  # ratio, decode GB/s, copy GB/s


def measure(fields: dict[str, tuple[np.ndarray, list[np.ndarray]]], level: int | None, shuffle: bool,
            min_ratio: float) -> dict[str, Figures]:
    """Per field, from ``(flat, arrays)`` (the samples concatenated for the ratio, and the
    samples): the ratio, and the two speeds where the ratio reaches ``min_ratio`` (else
    ``None``: no timing is worth doing)."""
    out: dict[str, Figures] = {}
    for name, (flat, arrays) in fields.items():
        r = ratio(flat, level, shuffle)
        out[name] = (r, *speeds(arrays, level, shuffle)) if r >= min_ratio else (r, None, None)
    return out
