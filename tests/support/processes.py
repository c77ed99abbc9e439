"""Looking at the processes of a run from a test: who holds a file open, who is left in a
process group, and waiting for a file a run writes when it reaches a point."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``path`` exists; fail if ``proc`` ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {path.name} appeared: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout}s")
        time.sleep(0.05)


def holder_of(path: Path) -> int | None:
    """A process that has ``path`` open (the writer is the one holding the partial)."""
    target = str(path.resolve())
    for p in psutil.process_iter():
        try:
            if any(f.path == target for f in p.open_files()):
                return p.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return out


def kill_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """``kill -9`` of ``proc``'s process group, then wait until none of it is alive: the
    leader's exit does not mean its writer has let go of the output (an HDF5 file lock, the
    output's lock) or that its segments' owners are gone."""
    os.killpg(proc.pid, 9)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while group_members(proc.pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes of group {proc.pid} still alive {timeout}s after kill -9")
        time.sleep(0.02)
