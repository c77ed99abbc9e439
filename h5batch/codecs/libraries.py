"""Importing the codecs' libraries (``DecodeStep.library``: blosc2, zstandard) by name.

Rule: h5batch imports a codec library through :func:`load`, and blosc2 without httpx's
command-line client. Reason: blosc2 imports httpx (for its remote arrays, which h5batch never
uses), and httpx's ``__init__`` imports its command-line client (``httpx._main``: rich,
pygments, click) whenever those are installed, as rich is, beside blosc2. That was 0.2-0.8 s
of a 0.35-1.3 s ``import blosc2`` here (``python -X importtime``; 0.15 s without it, quiet),
paid by the writer of every ``codec: auto`` conversion before the codec trial could answer,
and by every process that reads a compressed file. httpx guards that import itself (``try:
from ._main import main / except ImportError``), so :func:`load` blocks the submodule while
blosc2 loads, when httpx is not loaded yet, and lifts the block right after: a later ``import
httpx._main`` works; only the attribute ``httpx.main`` is the stub httpx installs when its
command line cannot run.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

_HTTPX_CLI = "httpx._main"


def load(name: str) -> ModuleType:
    """The module ``name``, imported now if it is not yet (blosc2: see the module)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    block = name == "blosc2" and "httpx" not in sys.modules and _HTTPX_CLI not in sys.modules
    if block:
        sys.modules[_HTTPX_CLI] = None  # type: ignore[assignment]  # "import httpx._main" raises ImportError
    try:
        return importlib.import_module(name)
    finally:
        if block and _HTTPX_CLI in sys.modules and sys.modules[_HTTPX_CLI] is None:
            del sys.modules[_HTTPX_CLI]
