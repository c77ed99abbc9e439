"""One writer: in a whole ``h5batch convert``, exactly one process opens the output for
writing and only that process writes to it (docs/architecture.md; issue 44). Traced from
outside with ``strace -f -y``, whatever the engine does inside: every open of
``OUT.partial`` (or ``OUT``) with ``O_WRONLY``/``O_RDWR`` and every ``write``/``pwrite64``/
``pwritev`` whose descriptor resolves to it, threads mapped to their processes through the
traced ``clone`` calls.

strace is installed here when it is missing (apt-get as root, as the SLURM tests install
SLURM); the module is skipped with the reason where that is impossible or ptrace is not
allowed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from h5batch import generate
from tests.conftest import REPO
from tests.support.run import convert_cmd, run

JOB = REPO / "jobs" / "paired_audio.yaml"
SYSCALLS = "openat,pwrite64,pwritev,pwritev2,write,writev,clone,clone3,fork,vfork"

# Fixed-length fields stored uncompressed, in batches of whole chunks (16 rows of 2 s at
# 16 kHz int16 = 64,000 bytes in a 1 MiB chunk): the shape for which decoders wrote their
# own chunks into the output before issue 44.
FIXED = ("fields.data.length=32000", "fields.target.length=32000", "output.codec=none", "cluster.batch_size=16")


def _install_strace() -> str:
    """The strace binary, installed with apt-get where it is missing and this is root."""
    found = shutil.which("strace")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("strace is not installed and cannot be (not root, or no apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "strace"]):
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if res.returncode != 0:
            pytest.skip(f"{' '.join(cmd)} failed: {(res.stderr.strip().splitlines() or ['?'])[-1]}")
    found = shutil.which("strace")
    if not found:
        pytest.skip("strace still missing after apt-get install")
    return found


@pytest.fixture(scope="module")
def strace() -> str:
    exe = _install_strace()
    res = subprocess.run([exe, "-f", "-o", os.devnull, "true"], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace not allowed?): {res.stderr.strip()}")
    return exe


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """What the job's ``source.generate: paired_audio`` makes: 64 + 16 pairs of 2 s."""
    root = tmp_path_factory.mktemp("single-writer") / "corpus"
    generate.CORPORA["paired_audio"](root)
    return root


_LINE = re.compile(r"^(\d+)\s+(.*)$")
_OPEN = re.compile(r'^openat\((?:AT_FDCWD|\d+)(?:<([^>]*)>)?, "((?:[^"\\]|\\.)*)", ([A-Z0-9_|]+)')
_WRITE = re.compile(r"^(?:write|pwrite64|pwritev2?|writev)\(\d+<([^>]*)>")
_CLONE = re.compile(r"^(?:clone3?|v?fork)\(")
_RESUMED_CLONE = re.compile(r"^<\.\.\. (?:clone3?|v?fork) resumed>")
_RESULT = re.compile(r"= (\d+)$")


def _processes(lines: list[tuple[int, str]]) -> dict[int, int]:
    """Thread id -> process id (thread group) of every id in the trace."""
    parent: dict[int, tuple[int, bool]] = {}  # child -> (the tid that made it, a thread?)
    pending: dict[int, bool] = {}
    for tid, call in lines:
        if _CLONE.match(call):
            is_thread = "CLONE_THREAD" in call
            if "<unfinished" in call:
                pending[tid] = is_thread
                continue
        elif _RESUMED_CLONE.match(call):
            is_thread = pending.pop(tid, False)
        else:
            continue
        if m := _RESULT.search(call):
            parent[int(m.group(1))] = (tid, is_thread)

    def tgid(t: int) -> int:
        while t in parent and parent[t][1]:
            t = parent[t][0]
        return t

    return {tid: tgid(tid) for tid, _ in lines}


def writers_of(log: Path, out: Path) -> tuple[dict[int, list[str]], dict[int, int]]:
    """``(openers, writes)``: per process, its opens of the output for writing (the flags),
    and how many writes it made to a descriptor of the output (``OUT.partial`` or ``OUT``)."""
    targets = {os.path.realpath(str(out) + ".partial"), os.path.realpath(out)}
    lines = [(int(m.group(1)), m.group(2)) for m in map(_LINE.match, log.read_text(errors="replace").splitlines()) if m]
    pid = _processes(lines)
    openers: dict[int, list[str]] = defaultdict(list)
    writes: dict[int, int] = defaultdict(int)
    for tid, call in lines:
        if m := _OPEN.match(call):
            where, path, flags = m.groups()
            full = os.path.normpath(os.path.join(where or "/", path))
            if full in targets and ("O_WRONLY" in flags or "O_RDWR" in flags):
                openers[pid[tid]].append(flags)
        elif (m := _WRITE.match(call)) and m.group(1) in targets:
            writes[pid[tid]] += 1
    return dict(openers), dict(writes)


CASES = {
    "as shipped, default engine": ((), None),
    "as shipped, --workers 2": ((), 2),
    "fixed-length uncompressed, default engine": (FIXED, None),
    "fixed-length uncompressed, --workers 2": (FIXED, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_process_opens_the_output_for_writing_and_writes_it(case, strace, corpus, tmp_path):
    settings, workers = CASES[case]
    out, log = tmp_path / "out.h5", tmp_path / "strace.log"
    cmd = convert_cmd(JOB, output=out, root=corpus, workers=workers, settings=settings)
    res = run([strace, "-f", "-qq", "-y", "-e", f"trace={SYSCALLS}", "-o", str(log), *cmd], timeout=240)
    assert res.returncode == 0, f"{case}: convert failed ({res.returncode}):\n{res.stderr}"
    assert out.exists() and not Path(str(out) + ".partial").exists()
    openers, writes = writers_of(log, out)
    assert len(openers) == 1, (f"{case}: {len(openers)} processes open the output for writing: {openers}; "
                               f"writes per process: {writes}")
    assert writes, f"{case}: no write to the output traced (is the trace right?)"
    assert set(writes) <= set(openers), (f"{case}: processes {sorted(set(writes) - set(openers))} write "
                                         f"to the output beside its one opener {sorted(openers)}: {writes}")


def test_the_trace_reader_maps_threads_to_their_processes(tmp_path):
    """Threads of one process count as that process; a forked child counts as its own; a
    relative path resolves against its directory's descriptor; a write to another file or a
    read-only open is no one's."""
    out = tmp_path / "o.h5"
    d = tmp_path
    log = tmp_path / "log"
    log.write_text("\n".join([
        f'10  openat(AT_FDCWD<{d}>, "o.h5.partial", O_RDWR|O_CREAT|O_TRUNC, 0666) = 3<{d}/o.h5.partial>',
        "10  clone3({flags=CLONE_VM|CLONE_THREAD|CLONE_SETTLS, exit_signal=0} <unfinished ...>",
        f"11  pwrite64(3<{d}/o.h5.partial>, \"x\", 1, 0) = 1",  # the thread, before its clone returned
        "10  <... clone3 resumed> => {parent_tid=[11]}, 88) = 11",
        "10  clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|SIGCHLD) = 20",
        f'20  openat(AT_FDCWD<{d}>, "{d}/o.h5.partial", O_RDONLY|O_CLOEXEC) = 4<{d}/o.h5.partial>',
        f"20  write(5<{d}/o.h5.lock>, \"1\", 1) = 1",
        f"20  pwrite64(3<{d}/o.h5>, \"x\", 1, 0) = 1",  # an inherited descriptor, after the rename
        "",
    ]))
    openers, writes = writers_of(log, out)
    assert openers == {10: ["O_RDWR|O_CREAT|O_TRUNC"]}
    assert writes == {10: 1, 20: 1}
