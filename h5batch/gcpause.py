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

Only the console process pauses: :func:`h5batch.cli.main` called from a notebook or a test
leaves the caller's collector alone (freezing a user's objects would keep their cycles
for good).
"""

from __future__ import annotations

import gc

_paused = False  # set by pause() in this process, inherited by forked children


def pause() -> None:
    """Turn the collector off until :func:`resume` (console commands only)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Freeze what is alive and turn collection on again, where :func:`pause` turned it off
    (in this process or in the one it was forked from); otherwise nothing."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
