"""What writing into memory that sat free for a while costs here, against memory just freed.

``python -m h5batch.bench.memstate [SCRATCH_DIR] [--mib N] [--idle S] [--rounds R]`` writes N MiB
(default 256) into the page cache of a scratch file with 1 MiB ``pwrite`` calls, two ways per
round: *hot*, right after the same amount was written and deleted (the writes take the pages
just freed), and *idle*, after deleting it and waiting S seconds (default 1). It prints the
median milliseconds of each and their ratio, and the kernel's free page reporting settings
where it has them (``/sys/module/page_reporting``).

Reason: on a virtual machine whose balloon reports free pages to its host (virtio-balloon
``VIRTIO_BALLOON_F_REPORTING``, as this one's does), memory that stays free for a moment can
lose the host's backing, and the next process that writes into it waits for the host to back
each page again: the likeliest cause of what docs/benchmarks.md's eighteenth round measured
(512 MiB of writes took 0.11 s hot and 1.8-2.0 s after 1 s idle, on the same afternoon).
Every conversion writes its output into freshly allocated page cache, so during such a spell
a bench figure depends on when memory was last freed, not only on the code. On bare metal
the ratio is ~1. The full bench runs
this probe at its start and end and prints it beside the load average, so that a run's noise
can be read for what it is.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

from . import physics

REPORTING = "/sys/module/page_reporting/parameters"
#: the probe of a quick or test-sized run, whose figures nobody compares (~0.5 s)
SMALL = {"mib": 16, "idle": 0.2, "rounds": 1}


def _write(path: str, mib: int) -> float:
    """Seconds to write ``mib`` MiB into a new file's page cache (bench.physics' 1 MiB
    writes, no flush); the file is removed after, so its pages are free as this returns."""
    t = time.perf_counter()
    try:
        physics.write_blocks(path, mib << 20)
        return time.perf_counter() - t
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def reporting() -> dict[str, str]:
    """The kernel's free page reporting parameters (empty where it has none)."""
    out = {}
    if os.path.isdir(REPORTING):
        for name in sorted(os.listdir(REPORTING)):
            try:
                with open(os.path.join(REPORTING, name)) as fh:
                    out[name] = fh.read().strip()
            except OSError:
                pass
    return out


def probe(scratch: str, mib: int = 256, idle: float = 1.0, rounds: int = 2) -> dict:
    """``{"hot_ms", "idle_ms", "ratio", "mib", "idle_s", "reporting"}``: median write times of
    ``mib`` MiB into pages just freed (hot) and into pages free for ``idle`` seconds."""
    if mib < 1 or rounds < 1 or idle < 0:
        raise ValueError("mib and rounds must be >= 1 and idle >= 0")
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, f".h5batch-memstate-{os.getpid()}")
    hot, cold = [], []
    for _ in range(rounds):
        _write(path, mib)  # frees mib MiB for the hot write to take
        hot.append(_write(path, mib))
        time.sleep(idle)
        cold.append(_write(path, mib))
    h, c = statistics.median(hot), statistics.median(cold)
    return {"hot_ms": round(h * 1000, 1), "idle_ms": round(c * 1000, 1), "ratio": round(c / h, 2),
            "mib": mib, "idle_s": idle, "reporting": reporting()}


def describe(p: dict) -> str:
    """One line for a log or a report."""
    rep = p.get("reporting") or {}
    where = (f"; free page reporting on (order {rep.get('page_reporting_order', '?')})"
             if rep else "; no free page reporting in this kernel")
    return (f"{p['mib']} MiB written into the page cache: {p['hot_ms']:.0f} ms into memory just freed, "
            f"{p['idle_ms']:.0f} ms into memory free for {p['idle_s']:g} s ({p['ratio']:.1f}x){where}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m h5batch.bench.memstate", description=__doc__.split("\n\n")[0])
    ap.add_argument("scratch", nargs="?", default=os.path.join("data", "bench"),
                    help="folder for the scratch file (on the disk the outputs go to)")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--idle", type=float, default=1.0, help="seconds the freed memory waits")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args(argv)
    print(describe(probe(a.scratch, a.mib, a.idle, a.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
