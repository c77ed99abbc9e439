"""Every exception h5batch raises on purpose, and the exit code the command line gives it.

One module so that no other module has to import a driver, a decoder or the verifier just
to raise or catch their error (that is what held an import cycle together before). Each
error derives from :class:`H5batchError` and from the builtin a caller would catch anyway
(``ValueError`` for bad configuration, ``RuntimeError`` for a run that cannot go on).

Exit codes, as ``h5batch`` returns them (documented in README.md):

====  ==========================================================================
0     done
1     failed (too many rejects, a worker or writer failure, a broken file found by verify)
2     bad job file or arguments, or an output that cannot be used as asked
75    busy: another run is writing the same output (``EX_TEMPFAIL``: try again later)
129   hung up (SIGHUP), progress kept
130   interrupted (Ctrl-C), progress kept: the same command resumes
143   terminated (SIGTERM), progress kept
====  ==========================================================================
"""

from __future__ import annotations

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BUSY",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "ConfigError",
    "ConvertError",
    "CorruptFileError",
    "DecodeError",
    "H5batchError",
    "MissingShardError",
    "ObjectChangedError",
    "PreflightError",
    "RemoteError",
    "VerifyError",
]

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_BUSY = 75
EXIT_INTERRUPTED = 130


class H5batchError(Exception):
    """Base of every h5batch error. ``exit_code`` is what the command line returns."""

    exit_code: int = EXIT_FAILED


class ConfigError(H5batchError, ValueError):
    """A job file is invalid. ``str(err)`` is one line: ``FILE: KEY: what is wrong``."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, file: str, key: str, message: str):
        self.file, self.key, self.message = file, key, message
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {message}")

    def __reduce__(self):  # keep the three arguments when the error crosses processes
        return (type(self), (self.file, self.key, self.message))


class ConvertError(H5batchError, RuntimeError):
    """A conversion that cannot start or cannot finish; the message says what to do."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        return (type(self), (str(self), self.exit_code))


class PreflightError(ConvertError):
    """One or more workers cannot run this job. ``problems`` holds one line per issue."""

    def __init__(self, problems: list[str], bad: int, n_workers: int):
        self.problems, self.bad, self.n_workers = problems, bad, n_workers
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"pre-flight checks failed ({bad} of {n_workers} workers):\n{lines}", EXIT_BAD_INPUT)

    def __reduce__(self):
        return (type(self), (self.problems, self.bad, self.n_workers))


class CorruptFileError(H5batchError, ValueError):
    """A file the reader will not read: its index contradicts itself (offsets, shapes, row
    counts, labels) or it is not a finished output. Found when the file is opened, before
    any sample is read. ``where`` is the dataset or attribute, ``row`` the first bad row
    (None when the dataset as a whole is wrong); the message says to run ``h5batch verify``."""

    def __init__(self, path: str, where: str, what: str, row: int | None = None):
        self.path, self.where, self.what, self.row = path, where, what, row
        at = where if row is None else f"{where}, row {row}"
        super().__init__(f"{path}: {at}: {what}; run `h5batch verify {path}` for a full report")

    def __reduce__(self):  # keep the arguments when the error crosses processes
        return (type(self), (self.path, self.where, self.what, self.row))


class DecodeError(H5batchError):
    """A file could not be turned into a sample. ``reason`` says why; the file becomes a
    reject, the run goes on."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self):  # keep both arguments when the error crosses processes
        return (type(self), (self.path, self.reason))


class VerifyError(H5batchError):
    """The file cannot be verified at all (missing, not HDF5, not an h5batch file)."""

    exit_code = EXIT_BAD_INPUT


class MissingShardError(H5batchError, FileNotFoundError):
    """A shard file of a sharded output (h5batch/shards.py) is not beside it: the output
    cannot be read (never as the fill values HDF5 would give)."""


class RemoteError(H5batchError, OSError):
    """A request to object storage failed for good (after its retries). ``url`` is the
    object, ``what`` the request (``GET bytes A-B``, an upload); never a credential."""

    def __init__(self, url: str, what: str):
        self.url, self.what = url, what
        super().__init__(f"{url}: {what}")

    def __str__(self) -> str:  # OSError's would print its args as a tuple
        return f"{self.url}: {self.what}"

    def __reduce__(self):
        return (type(self), (self.url, self.what))


class ObjectChangedError(RemoteError):
    """The object was replaced while a reader or its node cache held parts of the old one:
    never mixed, so the reader stops; clear the cache entry or re-open the dataset."""
