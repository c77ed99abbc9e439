"""Stacks of a test that is about to time out: the Python and native stacks (py-spy) of every
process the test process started, taken shortly before pytest-timeout fails the test, and
printed at the end of the session.

Reason: a conversion seen hanging only in CI (tests/test_audio_formats.py, twice in ~15 runs,
never in 37 local repeats) left nothing but pytest-timeout's dump of the test process, whose
driver was waiting for an event; what the worker, writer and fork-server processes were
doing was lost with them. py-spy reads a process from outside, GIL held or not.

The report lands in files under :data:`DIR` (an xdist worker has no terminal), and the
session's controller prints those of its own session at the end (:func:`print_reports`),
where a CI log's tail shows them. So do the workers that the driver's cluster watch killed
for a missing heartbeat during the session (``H5BATCH_EVENT_LOG``, set for the session by
:func:`event_log`; ``h5batch/conversion/cluster_watch.py``): such a kill ends a freeze and
the test passes, so its message would otherwise go unseen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "h5batch-test-hangs"
_PER_PROCESS_S = 15
_MAX_CHARS = 6000  # of one process's stacks in the printed report


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def dump(nodeid: str, session: str) -> Path | None:
    """Write the stacks of this process's descendants to a report file; return its path."""
    spy = _py_spy()
    lines = [f"== {nodeid}: stacks of the processes it started, {time.strftime('%H:%M:%S')} =="]
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error as e:
        children = []
        lines.append(f"(could not list the children: {e})")
    if spy is None:
        lines.append("(py-spy is not installed: no stacks)")
    for child in children:
        try:
            head = f"-- pid {child.pid} ppid {child.ppid()} {child.status()}: {' '.join(child.cmdline())[:200]}"
        except psutil.Error:
            continue
        lines.append(head)
        if spy is None:
            continue
        try:
            res = subprocess.run([spy, "dump", "--native", "--pid", str(child.pid)], capture_output=True,
                                 text=True, timeout=_PER_PROCESS_S)
            text = (res.stdout + res.stderr).strip()
        except subprocess.TimeoutExpired:
            text = f"(py-spy took more than {_PER_PROCESS_S} s)"
        lines.append(text[:_MAX_CHARS] + (" [...]" if len(text) > _MAX_CHARS else ""))
    DIR.mkdir(exist_ok=True)
    path = DIR / f"{session}-{os.getpid()}-{time.monotonic_ns()}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


class Timer:
    """Calls :func:`dump` ``lead`` seconds before a test's pytest-timeout limit, unless
    cancelled (the test ended)."""

    def __init__(self, nodeid: str, limit: float, session: str, lead: float = 45.0):
        self._timer = threading.Timer(max(limit * 0.5, limit - lead), dump, args=(nodeid, session))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def event_log(session: str) -> Path:
    """The event log of ``session`` (its folder made)."""
    DIR.mkdir(exist_ok=True)
    return DIR / f"{session}-events.log"


def print_reports(session: str, write) -> None:
    """Write the reports and the event log of ``session`` with ``write`` (the terminal
    reporter's), and remove them."""
    if not DIR.is_dir():
        return
    for path in sorted(DIR.glob(f"{session}-*.txt")):
        write(path.read_text())
        path.unlink()
    events = event_log(session)
    if events.exists():
        lines = events.read_text().splitlines()
        write(f"\n== {len(lines)} frozen Dask worker(s) killed by the cluster watch this session ==\n")
        write("".join(line + "\n" for line in lines))
        events.unlink()
