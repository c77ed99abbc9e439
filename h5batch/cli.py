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

The console command is :func:`entry` (also ``python -m h5batch.cli``); :func:`main` returns
the exit code, for callers in a Python process (tests, notebooks).
"""

from __future__ import annotations

import argparse
import os
import sys

from .commands import COMMANDS
from .errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, ConfigError, H5batchError


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="h5batch",
        description="Turn a corpus of media files (audio, images) into fast HDF5 training data.")
    parser.add_argument("--version", action="version", version=f"h5batch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.NAME, help=cmd.HELP, description=getattr(cmd, "DESCRIPTION", None))
        cmd.add_arguments(p)
        p.set_defaults(handler=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        if "://" in str(getattr(args, "path", "")):  # an s3:// output: read a local copy, or refuse
            from .remote.local import for_command

            refused = for_command(args.command, args)
            if refused:
                print(refused, file=sys.stderr)
                return EXIT_BAD_INPUT
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
    except BrokenPipeError:  # `h5batch inspect OUT.h5 | head`: the reader has all it wanted
        _quiet_stdout()
        return 0


def _quiet_stdout() -> None:
    """stdout pointed at /dev/null, so the flush at exit raises no second BrokenPipeError."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def entry() -> None:
    """The ``h5batch`` console command."""
    code = main()
    try:
        sys.stdout.flush()  # here, not at exit: a reader that stopped early is not an error
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(code)


if __name__ == "__main__":
    entry()
