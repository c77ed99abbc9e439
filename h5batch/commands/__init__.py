"""The commands of ``h5batch``, one module each, registered in one list.

Every command module defines the same four things and nothing else is needed to register it:

``NAME``
    the word typed after ``h5batch`` (``"cluster-script"``);
``HELP``
    the one line ``h5batch --help`` shows for it;
``add_arguments(parser)``
    adds the command's arguments to the :class:`argparse.ArgumentParser` that
    :func:`h5batch.cli.build_parser` made for it (with ``DESCRIPTION``, when the module
    defines one, as the text of ``h5batch NAME --help``);
``run(args) -> int``
    does the work and returns the exit code.

The rules, and why:

* importing a command module costs only argparse: whatever ``run`` needs (the driver,
  h5py, Dask, matplotlib) is imported inside ``run``, so ``h5batch --help`` starts at once
  and a command never pays for another's dependencies (conversion does not need torch);
* a command reports a failure by raising a :class:`h5batch.errors.H5batchError`; the
  command line prints it once, as ``h5batch NAME: message`` (``h5batch: config error:
  ...`` for a bad job file), and returns the error's ``exit_code``, so no command has an
  error handler of its own and every command's errors read alike;
* the order of :data:`COMMANDS` is the order of ``h5batch --help``.

To add a command ``h5batch frobnicate``: write ``h5batch/commands/frobnicate.py`` defining
``NAME = "frobnicate"``, ``HELP``, ``add_arguments`` and ``run`` (and ``DESCRIPTION``), import
it below and add it to :data:`COMMANDS`; ``tests/test_cli.py`` then checks it appears in
``h5batch --help`` and answers ``--help``.
"""

from __future__ import annotations

from types import ModuleType

from . import bench, cluster_script, compact, convert, export, inspect, preview, sync, verify, view

COMMANDS: tuple[ModuleType, ...] = (convert, sync, compact, inspect, verify, view, preview, export, cluster_script,
                                    bench)


def by_name() -> dict[str, ModuleType]:
    """``NAME -> module`` of every registered command."""
    return {cmd.NAME: cmd for cmd in COMMANDS}
