"""The commands of ``h5batch``, one module each, registered in one list.

Each command module defines ``NAME`` (the word after ``h5batch``), ``HELP`` (its line in
``h5batch --help``), ``add_arguments(parser)`` (for the parser
:func:`h5batch.cli.build_parser` made, described by ``DESCRIPTION`` if defined) and
``run(args) -> int`` (the exit code).

Rules, and why:

* importing a command module costs only argparse; ``run`` imports what it needs, so
  ``--help`` is instant and no command pays for another's dependencies;
* failures are raised as :class:`h5batch.errors.H5batchError`; the command line prints
  ``h5batch NAME: message`` once and returns its ``exit_code``, so every command's errors
  read alike;
* the order of :data:`COMMANDS` is the order of ``h5batch --help``.

To add a command, write its module, import it below and add it to :data:`COMMANDS`;
``tests/test_cli.py`` checks it answers ``--help``.
"""

from __future__ import annotations

from types import ModuleType

from . import (
    bench,
    cluster_script,
    compact,
    convert,
    export,
    init,
    inspect,
    preview,
    sync,
    verify,
    view,
)

COMMANDS: tuple[ModuleType, ...] = (init, convert, sync, compact, inspect, verify, view, preview, export, cluster_script,
                                    bench)


def by_name() -> dict[str, ModuleType]:
    """``NAME -> module`` of every registered command."""
    return {cmd.NAME: cmd for cmd in COMMANDS}
