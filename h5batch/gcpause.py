"""Python's cyclic garbage collector, paused while a console command sets its job up.

Rule: the ``h5batch convert`` and ``h5batch sync`` console commands (:func:`h5batch.cli.entry`)
call :func:`pause` first; the work loop (:meth:`h5batch.conversion.driver.Driver.run`) and
every process forked from the paused one (the writer, the forked decoders) call
:func:`resume` when their work starts: it moves every object alive then (modules, the
job, the manifest) into the permanent generation (``gc.freeze``) and turns collection on
again. Reason: the set-up allocates long-lived objects only (imports, one item per input
file), which the collector traverses again and again for nothing: 147 young, 13 middle
and one full collection took 23 ms of a 0.56 s FSDD conversion, and frozen, a million
manifest items are never traversed by the full collections of a long run. Collection is
on again for the run itself, where Dask's event loop makes cyclic garbage for hours.

A library call (:func:`h5batch.conversion.pipeline.convert` from a notebook or a test) gets
the same pause through :func:`library_call`, with one difference: what the run froze is
unfrozen when the call returns, so the caller's own cyclic garbage is collected as before,
only later (frozen for good, a user's cycles would be kept for good). Reason: a 4,096-pair
conversion called from Python ran 72-82 young and 6-7 middle collections, and one run in
four a full one that scanned the caller's and the manifest's ~180,000 objects for 110-160
ms while holding the GIL the in-process decode thread needed. Where the caller keeps
objects frozen already (``gc.get_freeze_count()``) or runs with the collector off, the call
leaves it alone.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False  # set by pause() in this process, inherited by forked children
_resumed = False  # resume() froze what was alive (library_call() unfreezes it at the end)


def pause() -> None:
    """Turn the collector off until :func:`resume` (console commands only)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze what is alive and turn collection on again, where :func:`pause` turned it off
    (in this process or in the one it was forked from); otherwise nothing."""
    global _paused, _resumed
    if _paused:
        _paused = False
        _resumed = True
        gc.freeze()
        gc.enable()


@contextmanager
def library_call() -> Iterator[None]:
    """The console's pause for a call from Python (see the module): the collector off until
    the run's :func:`resume`, and at the end what that froze back in the oldest generation
    and the collector on, as the caller had it."""
    global _paused, _resumed
    if not gc.isenabled() or gc.get_freeze_count():
        yield  # the console paused it already, or the caller manages the collector itself
        return
    gc.disable()
    _paused, _resumed = True, False
    try:
        yield
    finally:
        if _resumed:
            gc.unfreeze()
        _paused = _resumed = False
        gc.enable()
