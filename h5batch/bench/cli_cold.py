"""Whole-command conversions, timed from outside: what a user waits for at the shell.

Rule: ``h5batch convert JOB --json`` runs in a fresh interpreter with the job's defaults
(``cluster.kind: auto``, ``batch_size: auto``, ``codec: auto``), and the naive recipe runs
the same way (:func:`naive_main`: a fresh interpreter that imports h5py and h5batch's
decoder only, then :func:`~h5batch.bench.baselines.naive_convert`'s loop). Reason: both pay
Python's start-up and their imports, so the ratio is the one a user sees on a first run
(issue 19 item 1: FSDD cold >= 3x the naive recipe); the in-process rows of the bench
exclude them. The command's own ``seconds`` (``convert --json``: from the start of work to
the finished file, the interpreter's start and imports excluded) are kept as well: the
demo job's target (< 1 s) is on that figure.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

CLI_TIMEOUT = 900  # seconds; a whole command that takes longer has hung


def write_job(path: str, name: str, root: str, source: dict[str, Any], fields: dict[str, Any],
              out_path: str) -> str:
    """A job file (JSON is YAML) for ``h5batch convert``: the corpus and fields, and every
    other setting left at its default."""
    data = {"name": name, "source": {"root": root, **source}, "fields": fields,
            "output": {"path": out_path, "overwrite": True}}
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
    return path


def run_convert(job_path: str, out_path: str, extra: Sequence[str] = ()) -> tuple[float, dict[str, Any]]:
    """``h5batch convert`` of ``job_path`` in a new interpreter: ``(wall seconds, its JSON
    summary)``. Raises with the command's stderr when it fails."""
    return _timed([sys.executable, "-m", "h5batch.cli", "convert", job_path, "--output", out_path, "--overwrite",
                   "--progress", "none", "--json", *extra])


def _timed(cmd: list[str]) -> tuple[float, dict[str, Any]]:
    """``cmd`` to its end: ``(wall seconds, the JSON it printed last)``; raises with its
    stderr when it fails."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return wall, json.loads(r.stdout.splitlines()[-1])


def run_naive(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, Any]], out_path: str,
              scratch: str) -> tuple[float, dict[str, Any]]:
    """The naive recipe in a new interpreter (:func:`naive_main`): ``(wall seconds, its
    result)``. The item list and field settings travel in a pickle written beforehand, outside
    the timing (a hand-written script has them in its source)."""
    spec = os.path.join(scratch, "naive-cli.pkl")
    with open(spec, "wb") as fh:
        pickle.dump({"items": list(items), "fields": list(fields), "out": out_path}, fh)
    return _timed([sys.executable, "-c", "from h5batch.bench.cli_cold import naive_main; naive_main()", spec])


def naive_main() -> None:
    """Entry of the naive recipe's interpreter: the tutorial loop (one process, one gzip
    dataset per sample and field), with h5batch's decoder so the arrays equal the others'.
    Imports nothing else of h5batch (not torch, not Dask)."""
    import h5py

    from ..fields import decode_field

    with open(sys.argv[1], "rb") as fh:
        spec = pickle.load(fh)
    n = nbytes = 0
    with h5py.File(spec["out"], "w") as f:
        g = f.create_group("samples")
        for i, paths in enumerate(spec["items"]):
            s = g.create_group(f"{i:08d}")
            for (name, fc), path in zip(spec["fields"], paths):
                a = decode_field(path, fc)
                nbytes += a.nbytes
                s.create_dataset(name, data=a, compression="gzip", chunks=True)
            n += 1
    print(json.dumps({"samples": n, "bytes_decoded": nbytes, "output_bytes": os.path.getsize(spec["out"])}))


def demo_job() -> str | None:
    """The repository's ``jobs/demo.yaml`` (``make convert``'s default job), or None where
    h5batch runs from an installed package without the repository."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "jobs", "demo.yaml")
    return path if os.path.isfile(path) else None


def run_demo(job_path: str, root: str, out_path: str) -> tuple[float, dict[str, Any]]:
    """``h5batch convert jobs/demo.yaml`` with its corpus under ``root`` (generated there by
    the job's ``source.generate`` on the first run), in a new interpreter."""
    return run_convert(job_path, out_path, extra=["--set", f"source.root={root}"])
