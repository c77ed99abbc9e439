"""What a conversion row runs where it is timed: the untimed warm-up, then the timed conversion.

Rule: this module, and what it imports, never imports torch. Reason: h5batch's rows run in
children of a conversion zygote that has only this and h5batch's own modules imported, so that
``kind: auto`` is timed as ``h5batch convert`` runs, which never imports torch
(bench.converts); the peers' rows run in a second zygote with torch imported, which they
need. What torch in the process costs a conversion is small and unsteady: 4,096 pairs, 8
pairs of fresh processes 1.026x the wall time; 12 alternating rounds through the two zygotes
0.995x (0.931-1.034). The rule is for fidelity, not speed.
"""

from __future__ import annotations

import gc
import io
import os
import shutil
import sys
import time
from typing import Any

from ..conversion.options import ConvertOptions
from ..conversion.pipeline import convert
from .zygote import timing_starts


def h5batch_convert(job: Any) -> dict[str, Any]:
    """``convert`` as a row runs it (overwrite, no progress, log to memory)."""
    s = convert(job, ConvertOptions(overwrite=True, restart=True, progress="none", log=io.StringIO()))
    return {"samples": s.samples, "bytes_decoded": s.bytes_decoded, "files": s.inputs, "rejects": s.rejects,
            "output_bytes": s.output_bytes, "internal_seconds": s.seconds, "path": s.path}


def convert_row(job: dict[str, Any]) -> dict[str, Any]:
    """One conversion row where it runs (a zygote's child, or the bench's process): ``fn(*warm)``
    untimed (its output ``warm_out`` removed after), then ``fn(*args)`` timed. ``cpu_seconds``
    counts this process and every child it reaped (decoders, worker processes) or forked
    writer it waits for after the timing (:func:`reap_writers`);
    ``torch_imported`` says whether the timed run had torch in its process."""
    fn = job["fn"]
    if job.get("warm") is not None:
        fn(*job["warm"])
        remove_output(job["warm_out"])
        gc.collect()  # the warm-up's garbage, collected before the timing starts
    torch_imported = "torch" in sys.modules
    c0 = os.times()
    m0 = machine_cpu()
    timing_starts()
    t0 = time.perf_counter()
    result = fn(*job["args"])
    seconds = time.perf_counter() - t0
    m1 = machine_cpu()
    reap_writers()  # untimed: so that cpu_seconds counts the writer too
    c1 = os.times()
    return {"seconds": seconds, "cpu_seconds": sum(c1[:4]) - sum(c0[:4]), "result": result,
            "torch_imported": torch_imported,
            "machine": {k: round(m1[k] - m0[k], 2) for k in m0} if m0 and m1 else {}}


def reap_writers(timeout: float = 30.0) -> None:
    """Wait for this process's h5batch writers to exit (after the timing). Reason: a
    conversion returns at the writer's ``Done`` without waiting for its exit
    (``conversion/pipeline.py``), so ``os.times`` did not count the writer, ~0.2 CPU-s of a
    4,096-pair ``kind: auto`` run (0.46 "own" CPU-s beside 0.65-0.67 of the machine busy).
    A writer from a fork server is not this process's child; its CPU is not counted."""
    import multiprocessing as mp

    for p in mp.active_children():
        if p.name == "h5batch-writer":
            p.join(timeout)


def machine_cpu() -> dict[str, float]:
    """The whole machine's CPU time so far, in seconds, by state (``/proc/stat``; empty where
    there is none). Beside a row's own CPU-seconds it tells what a slow run waited for: the
    cores busy with other processes (``busy`` above the row's own), nothing (``idle``: a
    wait the row's processes do not account, e.g. the host backing fresh memory), the disk
    (``iowait``), or the host (``steal``, where the hypervisor reports it)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return {}
    v += [0] * (8 - len(v))
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return {"busy": (user + nice + system + irq + softirq) / hz, "idle": idle / hz, "iowait": iowait / hz,
            "steal": steal / hz}


def remove_output(path: str) -> None:
    """Remove the previous round's output before a timed conversion.

    Every method would otherwise spend part of its time dropping the previous output's
    cached pages (unlink, ``O_TRUNC``, ``rmtree``: ~0.05 s per 500 MB here), which is not
    conversion work and which a first conversion does not pay.
    """
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)
