"""The C library inside the blosc2 wheel, called through :mod:`ctypes`: ``codec: auto``'s
trial compresses and decompresses with it without importing the ``blosc2`` package.

Rule: :func:`library` loads ``blosc2/lib/libblosc2.so`` from where the installed ``blosc2``
package lies (found without importing it) when its version is one whose parameter structs
are declared below (:data:`LAYOUTS`), else returns None and the caller imports ``blosc2``
(:mod:`.libraries`). :func:`compress2` and :func:`decompress2` do what the Python
package's functions of the same name do for the trial's arguments: a context built from the
same parameters (the package's defaults for every one the trial leaves unset: AUTO_SPLIT,
automatic block size, STUNE), so the chunks are byte for byte the package's
(``tests/test_blosc2_lib.py`` compares them). Neither touches the library's global settings.

Reason: ``import blosc2`` costs ~0.35 CPU-s (its ndarray, lazy-expression and remote
modules; measured with :mod:`.libraries`' httpx block), which every ``codec: auto``
conversion paid in its writer, and the driver waited for it before its first batch (issue
19 item 1: FSDD, whole command); loading the C library takes a few milliseconds. The wheel
ships the library beside its extension (same release: the version is checked against the
layouts), and a stored chunk is decoded by the reader through the package as before.

BEWARE: ctypes trusts the declared structs; a C release that changes them must be added to
:data:`LAYOUTS` only after ``tests/test_blosc2_lib.py`` passes with it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from functools import cache
from typing import Any

LAYOUTS = ("2.", "3.")  # C library versions (prefixes) whose blosc2_cparams/dparams are declared below
MAX_FILTERS = 6
MAX_OVERHEAD = 32  # BLOSC2_MAX_OVERHEAD: the extended header
AUTO_SPLIT = 3  # BLOSC_AUTO_SPLIT, the Python package's default split mode
CODECS = {"lz4": 1}  # BLOSC_LZ4
FILTERS = {"none": 0, "shuffle": 1}  # BLOSC_NOSHUFFLE, BLOSC_SHUFFLE


class _CParams(ctypes.Structure):
    _fields_ = [("compcode", ctypes.c_uint8), ("compcode_meta", ctypes.c_uint8), ("clevel", ctypes.c_uint8),
                ("use_dict", ctypes.c_int), ("typesize", ctypes.c_int32), ("nthreads", ctypes.c_int16),
                ("blocksize", ctypes.c_int32), ("splitmode", ctypes.c_int32), ("schunk", ctypes.c_void_p),
                ("filters", ctypes.c_uint8 * MAX_FILTERS), ("filters_meta", ctypes.c_uint8 * MAX_FILTERS),
                ("prefilter", ctypes.c_void_p), ("preparams", ctypes.c_void_p), ("tuner_params", ctypes.c_void_p),
                ("tuner_id", ctypes.c_int), ("instr_codec", ctypes.c_bool), ("codec_params", ctypes.c_void_p),
                ("filter_params", ctypes.c_void_p * MAX_FILTERS)]


class _DParams(ctypes.Structure):
    _fields_ = [("nthreads", ctypes.c_int16), ("schunk", ctypes.c_void_p), ("postfilter", ctypes.c_void_p),
                ("postparams", ctypes.c_void_p), ("typesize", ctypes.c_int32)]


def _path() -> str | None:
    """Where the wheel's C library lies, without importing the package; None if absent."""
    try:
        spec = importlib.util.find_spec("blosc2")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "lib", "libblosc2.so")
        if os.path.isfile(path):
            return path
    return None


@cache
def library() -> Any | None:
    """The loaded C library with its functions declared, or None (absent, not loadable, or
    a version without declared layouts): the caller then uses the ``blosc2`` package."""
    path = _path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.blosc2_get_version_string.restype = ctypes.c_char_p
        version = lib.blosc2_get_version_string().decode()
    except (OSError, AttributeError):
        return None
    if not version.startswith(LAYOUTS):
        return None
    lib.blosc2_init()  # idempotent: the package (if loaded too) initialises the same way
    lib.blosc2_create_cctx.restype = lib.blosc2_create_dctx.restype = ctypes.c_void_p
    lib.blosc2_create_cctx.argtypes = [_CParams]
    lib.blosc2_create_dctx.argtypes = [_DParams]
    lib.blosc2_free_ctx.argtypes = [ctypes.c_void_p]
    lib.blosc2_compress_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p,
                                        ctypes.c_int32]
    lib.blosc2_decompress_ctx.argtypes = lib.blosc2_compress_ctx.argtypes
    return lib


def _address(buf: Any, writable: bool = False) -> tuple[int, int, Any]:
    """``(address, nbytes, keep-alive)`` of a contiguous buffer."""
    mv = memoryview(buf).cast("B")
    if writable:
        return ctypes.addressof(ctypes.c_char.from_buffer(mv)), mv.nbytes, mv
    holder = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv) if mv.readonly else ctypes.c_char.from_buffer(mv)
    return ctypes.addressof(holder), mv.nbytes, (mv, holder)


def compress2(lib: Any, src: Any, typesize: int, clevel: int, codec: str, filt: str, nthreads: int = 1) -> bytes:
    """``blosc2.compress2(src, typesize=, clevel=, codec=, filters=[filt], nthreads=)``."""
    p = _CParams(compcode=CODECS[codec], clevel=clevel, typesize=typesize, nthreads=nthreads,
                 splitmode=AUTO_SPLIT)
    p.filters[0] = FILTERS[filt]
    addr, n, keep = _address(src)
    dest = ctypes.create_string_buffer(n + MAX_OVERHEAD)
    ctx = lib.blosc2_create_cctx(p)
    if not ctx:
        raise RuntimeError("blosc2: could not create the compression context")
    try:
        size = lib.blosc2_compress_ctx(ctx, addr, n, dest, n + MAX_OVERHEAD)
    finally:
        lib.blosc2_free_ctx(ctx)
    del keep
    if size <= 0:
        raise RuntimeError(f"blosc2: compression failed ({size})")
    return dest.raw[:size]


def decompress2(lib: Any, chunk: bytes, dst: Any, nthreads: int = 1) -> int:
    """``blosc2.decompress2(chunk, dst=dst, nthreads=)``: decoded bytes written into ``dst``."""
    p = _DParams(nthreads=nthreads, typesize=8)
    addr, n, keep = _address(dst, writable=True)
    ctx = lib.blosc2_create_dctx(p)
    if not ctx:
        raise RuntimeError("blosc2: could not create the decompression context")
    try:
        size = lib.blosc2_decompress_ctx(ctx, chunk, len(chunk), addr, n)
    finally:
        lib.blosc2_free_ctx(ctx)
    del keep
    if size < 0:
        raise ValueError(f"blosc2: decompression failed ({size})")
    return size
