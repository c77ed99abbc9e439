"""Pre-flight checks on every Dask worker, before the first batch is submitted.

A cluster conversion fails late and confusingly when a worker cannot see the corpus (no
shared file system), lacks a decoder package, runs other versions than the driver (the
output's bytes could then depend on which worker decoded a batch) or would put its
results in a ``/dev/shm`` the writer cannot see. :func:`preflight` asks each worker with
``client.run`` (:func:`probe`) and turns every problem into one line of a
:class:`PreflightError` naming the worker, its host and what to do.

What is checked, per worker present when the run starts:

* the corpus root is a directory there, and a few sample files of the manifest (first,
  middle, last item) can be opened and read;
* the decoders' packages import (numpy, soundfile + libsndfile, Pillow, soxr, librosa for
  ``features``, PyAV (``av``) for the audio formats libsndfile lacks, h5batch);
  versions that shape the decoded bytes must equal the driver's (h5batch is compared by
  version *and* a digest of its source, so two checkouts with one version string differ);
  the Dask stack is compared like ``client.get_versions(check=True)``, as a warning;
* the transport: a worker that would use shared memory (``auto`` on the writer's host, or
  ``shm`` forced) writes a probe segment the driver must see in its own ``/dev/shm``;
  ``shm`` forced on a worker of another host is an error.

BEWARE: workers that join later (an autoscaled or replacement job) are not pre-flighted;
a missing corpus there shows up as rejects, which ``policy.max_reject_fraction`` bounds.
The writer host's output directory is checked by :mod:`h5batch.conversion.partial`.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import secrets
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PreflightError
from .options import detail

# Packages whose versions decide the decoded bytes (must equal the driver's).
DECISIVE = ("python", "h5batch", "numpy", "soundfile", "libsndfile", "pillow", "soxr", "librosa", "av")
# Packages Dask itself compares (distributed.versions.required_packages): a warning.
DASK_STACK = ("dask", "distributed", "cloudpickle", "msgpack", "tornado", "toolz")

_PROBE_BYTES = 16
# Where a package's version is, where not in ``<package>.__version__``.
_VERSION_ATTRS = {"libsndfile": ("soundfile", "__libsndfile_version__"), "pillow": ("PIL", "__version__")}


# -- worker side ---------------------------------------------------------------------------


def source_digest() -> str:
    """sha256 (12 hex) of h5batch's Python sources: the same version string from two
    different checkouts still differs here."""
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parents[1]  # the whole package: fields/ decodes, not conversion/
    for p in sorted(pkg.rglob("*.py")):
        h.update(p.relative_to(pkg).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def _version(name: str) -> str:
    """Import ``name`` and return its version (raises ImportError)."""
    if name == "python":
        return platform.python_version()
    if name == "h5batch":
        from .. import __version__

        return f"{__version__} (src {source_digest()})"
    if name in DASK_STACK:
        from importlib.metadata import version

        return version(name)
    module, attr = _VERSION_ATTRS.get(name, (name, "__version__"))
    return str(getattr(importlib.import_module(module), attr, "unknown"))


@cache
def collect_versions(names: tuple[str, ...] = DECISIVE + DASK_STACK) -> tuple[dict[str, str], dict[str, str]]:
    """``(versions, import errors)`` of ``names`` in this process (callers do not change them).

    Cached per process: imports do not change while it runs, and hashing sources for every
    conversion would be wasted work.
    """
    versions: dict[str, str] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            versions[name] = _version(name)
        except Exception as e:  # any failure to import is what we report
            errors[name] = f"{type(e).__name__}: {e}"
    return versions, errors


def probe(root: str, samples: list[str], run_id: str, transport: str, writer_host: str) -> dict[str, Any]:
    """Run on a worker (``client.run``): what this worker sees. Never raises."""
    from ..transport.segments import create_segment, hostname
    from .worker import choose_mode

    versions, errors = collect_versions()
    out: dict[str, Any] = {
        "host": hostname(), "pid": os.getpid(), "cwd": os.getcwd(), "versions": versions,
        "import_errors": errors, "root_abs": os.path.abspath(root), "root_ok": os.path.isdir(root),
        "unreadable": {}, "mode": None, "segment": None, "token": None, "shm_error": None,
    }
    if out["root_ok"]:
        for rel in samples:
            try:
                with open(os.path.join(root, rel), "rb") as fh:
                    fh.read(1)
            except OSError as e:
                out["unreadable"][rel] = e.strerror or type(e).__name__
    try:
        out["mode"] = choose_mode(transport, writer_host)
        if out["mode"] == "shm":
            token = secrets.token_bytes(_PROBE_BYTES)
            seg = create_segment(run_id, _PROBE_BYTES)
            seg.data[:_PROBE_BYTES] = np.frombuffer(token, dtype=np.uint8)
            out["segment"], out["token"] = seg.name, token.hex()
    except Exception as e:
        out["shm_error"] = f"{type(e).__name__}: {e}"
    return out


# -- driver side ---------------------------------------------------------------------------


def _summary(workers: dict[str, dict[str, Any]], versions: dict[str, str], n_samples: int) -> str:
    """The one line a passed pre-flight prints (``workers``: the probes keyed by address)."""
    hosts = sorted({w["host"] for w in workers.values()})
    modes = Counter(w["mode"] for w in workers.values())
    shown = ", ".join(f"{k} {versions[k]}" for k in ("h5batch", "numpy", "soundfile", "libsndfile", "pillow", "dask")
                      if k in versions)
    return (f"preflight: {len(workers)} workers on {len(hosts)} host(s) ({', '.join(hosts)}): corpus visible, "
            f"{n_samples} sample files readable; transport {', '.join(f'{m} on {n}' for m, n in sorted(modes.items()))}; "
            f"versions match the driver ({shown})")


def needed_packages(job) -> set[str]:
    """Decoder packages this job's fields need on every worker."""
    from ..fields import needed_packages as field_packages

    need = {"python", "h5batch", "numpy"}
    for fc in job.fields.values():
        need |= field_packages(fc)
    return need


def compare_versions(driver: dict[str, str], workers: dict[str, dict[str, Any]],
                     needed: set[str]) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` for version differences between the driver and the workers.

    Decisive packages the job needs must match exactly (python: major.minor); the Dask
    stack and the full python version only warn, as ``client.get_versions(check=True)``.
    """
    errors: list[str] = []
    warnings: list[str] = []
    for addr, w in sorted(workers.items()):
        who = f"{addr} ({w['host']})"
        for name in sorted(needed):
            if name in w["import_errors"]:
                errors.append(f"{who}: cannot import {name}: {w['import_errors'][name]}; install the "
                              f"driver's environment on the workers")
        for name in DECISIVE + DASK_STACK:
            mine, theirs = driver.get(name), w["versions"].get(name)
            if theirs is None or mine == theirs:
                continue
            if name == "python" and mine and mine.rsplit(".", 1)[0] == theirs.rsplit(".", 1)[0]:
                warnings.append(f"{who}: python {theirs} vs driver {mine}")
            elif name in DECISIVE and name in needed:
                errors.append(f"{who}: {name} {theirs} differs from the driver's {mine} (decoded bytes "
                              f"could depend on which worker ran a batch); use one environment everywhere")
            else:
                warnings.append(f"{who}: {name} {theirs} vs driver {mine}")
    return errors, warnings


def _pick_samples(manifest) -> list[str]:
    """The paths of the first, middle and last items."""
    items = manifest.items
    return [p for i in sorted({0, len(items) // 2, len(items) - 1}) if items for p in items[i].paths]


def _check_worker(addr: str, w: Any, root: str, driver_root_abs: str, transport: str,
                  writer_host: str) -> list[str]:
    """Problems of one worker's probe (an exception when the probe could not even run)."""
    if isinstance(w, BaseException):
        hint = ("h5batch is not installed there: install the driver's environment on the workers"
                if isinstance(w, ImportError) or "h5batch" in str(w) else "see the worker's log")
        return [f"{addr}: the pre-flight probe failed: {type(w).__name__}: {w} ({hint})"]
    who = f"{addr} ({w['host']})"
    problems = []
    rel_hint = ""
    if not os.path.isabs(root):
        rel_hint = (f"; source.root {root!r} is relative and this worker resolves it against its own "
                    f"working directory ({w['cwd']}): use an absolute path")
    if not w["root_ok"]:
        problems.append(f"{who}: corpus root {w['root_abs']} is not a directory there: the corpus must be on a "
                        f"file system shared with every worker, at the same path{rel_hint}")
    elif w["unreadable"]:
        rel, why = next(iter(w["unreadable"].items()))
        problems.append(f"{who}: {len(w['unreadable'])} sample files cannot be read there, e.g. {rel}: {why}"
                        f"{rel_hint or '; is the shared copy of the corpus complete?'}")
    elif rel_hint and w["root_abs"] != driver_root_abs:
        problems.append(f"{who}: corpus root resolves to {w['root_abs']} there but to {driver_root_abs} "
                        f"on the driver{rel_hint}")
    if w["shm_error"]:
        problems.append(f"{who}: cannot create a shared-memory segment ({w['shm_error']}); "
                        f"set cluster.transport: network")
    if transport == "shm" and w["host"] != writer_host:
        problems.append(f"{who}: cluster.transport is 'shm' but this worker runs on {w['host']}, not on the "
                        f"writer's host {writer_host}; use transport auto or network")
    return problems


def _check_segment(addr: str, w: dict[str, Any]) -> str | None:
    """The driver must see the worker's probe segment in its own /dev/shm (same host and
    same /dev/shm, not merely the same host name, e.g. two containers). :func:`preflight`
    removes the probe segments after."""
    from ..transport.segments import HEADER, SHM_DIR

    try:
        with open(os.path.join(SHM_DIR, w["segment"]), "rb") as fh:
            fh.seek(HEADER)
            seen = fh.read(_PROBE_BYTES)
    except OSError:
        seen = b""
    if seen.hex() != w["token"]:
        return (f"{addr} ({w['host']}): its shared-memory segments are not visible to the writer (same "
                f"host name, different /dev/shm?); set cluster.transport: network")
    return None


def preflight(client, job, manifest, say: Callable[[str], None]) -> None:
    """Check every connected worker can run ``job``; raise :class:`PreflightError` if not.

    Parameters
    ----------
    client
        A connected :class:`distributed.Client` with at least one worker.
    job
        The :class:`~h5batch.config.JobConfig`.
    manifest
        The job's :class:`~h5batch.manifest.Manifest` (its root and a few sample paths).
    say
        Where to print the one-line summary and any warnings.
    """
    from ..transport.segments import hostname, new_run_id, remove_segments

    root = str(manifest.root)
    samples = _pick_samples(manifest)
    writer_host = hostname()
    run_id = new_run_id()
    versions, _ = collect_versions()
    try:
        results = client.run(probe, root, samples, run_id, job.cluster.transport, writer_host,
                             on_error="return")
        problems: list[str] = []
        bad: set[str] = set()
        probes: dict[str, dict[str, Any]] = {}
        for addr, w in sorted(results.items()):
            found = _check_worker(addr, w, root, os.path.abspath(root), job.cluster.transport, writer_host)
            if not isinstance(w, BaseException):
                probes[addr] = w
                if w["segment"]:
                    found += filter(None, [_check_segment(addr, w)])
            problems += found
            bad |= {addr} if found else set()
    finally:
        remove_segments(run_id)
    errors, warnings = compare_versions(versions, probes, needed_packages(job))
    problems += errors
    bad |= {addr for addr in probes if any(e.startswith(f"{addr} (") for e in errors)}
    if problems:
        raise PreflightError(problems, len(bad), len(results))
    detail(say, _summary(probes, versions, len(samples)))
    for w in warnings:
        say(f"preflight warning: {w}")


def check_engine(conn, job, manifest, say: Callable[[str], None]) -> None:
    """The pre-flight of the run's engine: :func:`preflight` on Dask workers; for the local
    decoder processes, which share this machine, this process and its corpus, that the
    decoder packages the job needs import here (they do there too). Raises
    :class:`PreflightError` naming what is missing."""
    if job.cluster.kind != "processes":
        preflight(conn.client, job, manifest, say)
        return
    versions, errors = collect_versions(tuple(sorted(needed_packages(job) - {"python", "h5batch"})))
    if errors:
        raise PreflightError([f"driver: cannot import {name}: {why}" for name, why in sorted(errors.items())], 1, 1)
    shown = ", ".join(f"{k} {versions[k]}" for k in ("numpy", "soundfile", "libsndfile", "pillow") if k in versions)
    detail(say, f"preflight: decoder packages import ({shown})")

