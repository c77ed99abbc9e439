"""Codecs ``blosc2-lz4`` and ``blosc2-zstd``: the Blosc2 plugin filter (32026) with LZ4 or
Zstd and byte shuffle, the frame the filter stores per chunk, and its decode step.

Rule: both codecs live here, as two :class:`Blosc2Codec` instances naming their inner
compressor. Reason: both store the same filter id (the compressor is a filter parameter), so
they must share one decode step, and the registry gives each filter id one step.

``blosc2-lz4`` is the training-input default (what ``auto`` picks when a trial shows
compression pays): fast to write and to read. ``blosc2-zstd`` makes smaller files at some
write cost; its levels are Blosc2's 0..9 (Blosc2 maps them onto Zstd's own levels; the plugin
refuses anything above 9). Both are readable by tools that load the HDF5 plugin (``import
hdf5plugin``).

Decoding (the reader's hot path): the filter stores each HDF5 chunk as a one-chunk
super-chunk frame (a header of ~100 bytes, the Blosc2 chunk, an index, a trailer). Building a
``blosc2.SChunk`` from that frame to decompress its one chunk costs a new context, often a
new thread pool, per HDF5 chunk: a sizeable share of decoding the chunk.
:func:`frame_chunk` finds the Blosc2 chunk in the frame's header instead (offsets from c-blosc2's
``frame.h``) and :meth:`Blosc2Step.decode_into` hands it to ``blosc2.decompress``, straight
into the chunk buffer, with blosc2's kept global context (``blosc2.nthreads`` threads). A
frame that does not look exactly like that (another layout, a ``b2nd`` array, an all-zero
chunk stored as a special value) goes through ``SChunk``; either way the reader
compares the first chunk of each dataset with HDF5's own read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Codec, DecodeStep, Encoder, register, uses_shuffle

FILTER_BLOSC2 = 32026  # registered HDF5 filter id of Blosc2

# Contiguous-frame header (msgpack; integers big endian): the magic string, then type markers
# and values at fixed offsets (c-blosc2 frame.h: FRAME_HEADER_LEN, FRAME_NBYTES, FRAME_CBYTES).
_MAGIC = b"\xa8b2frame\x00"  # at offset 1, after the fixarray marker
_HEADER_LEN, _NBYTES, _CBYTES = 11, 30, 39  # value offsets; markers d2, d3, d3 just before
_CHUNK_HEADER = 32  # a Blosc2 chunk's extended header (nbytes at +4, cbytes at +12, little endian)


def frame_chunk(raw: Any, nbytes: int) -> memoryview | None:
    """The Blosc2 chunk stored in the one-chunk frame ``raw`` whose decoded size is ``nbytes``
    (a view, no copy), or None when the frame is anything else."""
    mv = memoryview(raw).cast("B")
    if len(mv) < 64 or mv[1:10] != _MAGIC or mv[10] != 0xD2 or mv[29] != 0xD3 or mv[38] != 0xD3:
        return None
    start = int.from_bytes(mv[_HEADER_LEN:_HEADER_LEN + 4], "big")
    size = int.from_bytes(mv[_CBYTES:_CBYTES + 8], "big")
    if (int.from_bytes(mv[_NBYTES:_NBYTES + 8], "big") != nbytes or size < _CHUNK_HEADER
            or start < 64 or start + size > len(mv)):
        return None
    chunk = mv[start:start + size]
    if (int.from_bytes(chunk[4:8], "little") != nbytes or int.from_bytes(chunk[12:16], "little") != size
            or b"b2nd" in bytes(mv[:start])):
        return None
    return chunk


class Blosc2Step(DecodeStep):
    filter_id = FILTER_BLOSC2

    library = "blosc2"

    def decode(self, raw: Any, nbytes: int) -> tuple[Any, str]:
        import blosc2

        s = blosc2.schunk_from_cframe(raw, copy=False)
        if "b2nd" in s.meta.keys():
            # Written by HDF5's own Blosc2 filter: an n-d array frame whose blocks are padded,
            # so the raw chunk bytes are not in C order. Let blosc2 assemble the array.
            return np.ascontiguousarray(blosc2.ndarray_from_cframe(raw)[...]), "blosc2-b2nd"
        if s.nchunks == 1:
            return s.decompress_chunk(0), "blosc2"
        return b"".join(s.decompress_chunk(i) for i in range(s.nchunks)), "blosc2"

    def decode_into(self, raw: Any, out: np.ndarray) -> str | None:
        """Decompress a one-chunk Blosc2 super-chunk frame (what our encoder writes) into
        ``out``; None for any other frame."""
        import blosc2

        dst = out.reshape(-1).view(np.uint8)
        chunk = frame_chunk(raw, out.nbytes)
        if chunk is not None:
            blosc2.decompress(chunk, dst=dst)  # raises on a damaged chunk
            return "blosc2-chunk"
        s = blosc2.schunk_from_cframe(raw, copy=False)
        if s.nchunks != 1 or s.nbytes != out.nbytes or "b2nd" in s.meta.keys():
            return None
        s.decompress_chunk(0, dst=dst)
        return "blosc2"


class Blosc2Codec(Codec):
    """Blosc2 with byte shuffle done inside Blosc2 (not HDF5's shuffle filter). ``cname`` is
    the inner compressor as both hdf5plugin and blosc2 spell it (``lz4``, ``zstd``)."""

    levels = range(0, 10)  # Blosc2's clevel, whatever the inner compressor
    filter_ids = (FILTER_BLOSC2,)
    steps = (Blosc2Step(),)  # one instance: the two codecs share the filter and its step

    def __init__(self, name: str, cname: str, default_level: int):
        self.name, self.cname, self.default_level = name, cname, default_level  # type: ignore[misc]

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        import hdf5plugin

        b2_filter = hdf5plugin.Blosc2.SHUFFLE if uses_shuffle(shuffle, itemsize) else hdf5plugin.Blosc2.NOFILTER
        return dict(hdf5plugin.Blosc2(cname=self.cname, clevel=level, filters=b2_filter))

    def encoder(self, level: int | None, shuffle: bool, dtype: np.dtype) -> Encoder | None:
        import blosc2

        codec = getattr(blosc2.Codec, self.cname.upper())
        filt = blosc2.Filter.SHUFFLE if uses_shuffle(shuffle, dtype.itemsize) else blosc2.Filter.NOFILTER
        itemsize = dtype.itemsize

        def enc(a: np.ndarray) -> bytes:
            # The Blosc2 HDF5 filter stores each chunk as a Blosc2 super-chunk frame.
            cparams = {"typesize": itemsize, "clevel": level, "codec": codec, "filters": [filt], "nthreads": 1}
            return blosc2.SChunk(chunksize=a.nbytes, data=a, cparams=cparams).to_cframe()

        return enc


register(Blosc2Codec("blosc2-lz4", "lz4", 5))
register(Blosc2Codec("blosc2-zstd", "zstd", 3))
