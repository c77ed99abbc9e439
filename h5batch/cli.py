"""The ``h5batch`` command line: a parser built from the command registry, one dispatch,
one error mapping.

Each command lives in its own module of :mod:`h5batch.commands` (which says how to add
one); this module only builds ``h5batch COMMAND ...`` from :data:`h5batch.commands.COMMANDS`,
runs the chosen command and turns what it raises into a message and an exit code, so every
command reports its errors the same way:

* :class:`~h5batch.errors.ConfigError` -> ``h5batch: config error: FILE: KEY: ...``;
* any other :class:`~h5batch.errors.H5batchError` -> ``h5batch COMMAND: message``;
* either way the exit code is the error's ``exit_code`` (see :mod:`h5batch.errors`);
* Ctrl-C -> ``h5batch: interrupted``, exit code 130.

The console command (:func:`entry`, also ``python -m h5batch.cli``) ends the process with
:func:`quick_exit` once the command returns; :func:`main` itself returns, for callers in a
Python process (tests, notebooks).
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading

from . import gcpause
from .commands import COMMANDS
from .errors import EXIT_INTERRUPTED, ConfigError, H5batchError


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of the command named ``only`` alone (where it is
    one): what parsing that command's line needs, its usage and errors the same. Reason:
    building every command's arguments took ~10-15 ms of each command's start (a sync of
    100,000 files waits for its start)."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="h5batch",
        description="Turn a corpus of media files (audio, images) into fast HDF5 training data.")
    parser.add_argument("--version", action="version", version=f"h5batch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = [cmd for cmd in COMMANDS if cmd.NAME == only]
    for cmd in chosen or COMMANDS:
        p = sub.add_parser(cmd.NAME, help=cmd.HELP, description=getattr(cmd, "DESCRIPTION", None))
        cmd.add_arguments(p)
        p.set_defaults(handler=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as e:
        print(f"h5batch: config error: {e}", file=sys.stderr)
        return e.exit_code
    except H5batchError as e:
        print(f"h5batch {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("h5batch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


# Commands whose set-up runs with the garbage collector paused (h5batch.gcpause).
PAUSE_GC = frozenset({"convert", "sync"})


def entry() -> None:
    """The ``h5batch`` console command: :func:`main`, then :func:`quick_exit`."""
    # numpy's OpenBLAS starts a thread per core when numpy is imported, and they spin for
    # ~0.1 s before they sleep: 0.05-0.07 CPU-s of the other core per process that imports
    # numpy (user 0.13 -> 0.06 s for ``import numpy`` here), taken from the sync's walk
    # ahead and the conversion's writer start. h5batch calls no BLAS routine, and runs one
    # decoder per core, where BLAS threads could only oversubscribe (Dask's nanny sets the
    # same for its workers). A value the user set is kept; processes this one starts
    # (workers, the writer's fork server) inherit it. Measured: +1 % sync of 100,000
    # files, 6 alternating pairs, median 0.634 -> 0.569 s.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if sys.argv[1:2] and sys.argv[1] in PAUSE_GC:
        gcpause.pause()  # imported with this module: compiling it could start a collection
    quick_exit(main())


def quick_exit(code: int | None) -> None:
    """End the process with ``code``, skipping the interpreter's finalization where that
    cannot lose anything: no other non-daemon thread runs and no HDF5 file is open; the
    ``atexit`` functions run first and standard output and error are flushed. Otherwise (or
    should a flush fail) :func:`sys.exit`, the normal way.

    Reason: finalization frees every module and object one by one; after a conversion of
    FSDD that was 0.07-0.19 s of CPU without a system call (strace), ~10 % of the whole
    command a user waits for (issue 19 item 1). ``os._exit`` skips C-level ``atexit``
    handlers too, HDF5's among them, hence the check for open files.
    """
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    h5py = sys.modules.get("h5py")
    open_files = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) if h5py is not None else 0
    if others or open_files:
        sys.exit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 - what finalization would run first; its errors are printed
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: let Python report it as usual
        sys.exit(code)
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    entry()
