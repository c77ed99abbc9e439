"""A sync's stat pass (h5batch/layouts/stat_pass.py): walked in a forked child where the
process may fork, on a thread where it may not, and the same result either way: the same
files with the same sizes and mtimes, the same rejects, symlinks and split folders as the
layout's own walk in the process. The child keeps no inherited descriptor (the output's
lock) and no child outlives the block, however it ends.

The forked mode needs a process without other threads (pytest-xdist's workers have
some): those checks run in a fresh interpreter started by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(r"""
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from h5batch.config import load_job
    from h5batch import walk_ahead
    from h5batch.layouts import stat_pass
    from h5batch.layouts.base import Builder, get

    root, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    job = load_job(Path(root) / "job.yaml", [f"source.root={root}", f"output.path={out}"], check_paths=False)
    if mode == "thread":
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()  # no fork with a thread
    walk_ahead.SPLIT_MIN = 64  # the child's stats split with a second child even on this small corpus
    from h5batch import walker as _walker
    _walker.THREAD_MIN = 64  # or with a second thread, where the walker's C loop is built
    if mode.endswith("-pyloop"):  # the path of an install built without a C compiler
        mode = mode.removesuffix("-pyloop")
        walk_ahead.FAST_STAT = False
        walk_ahead.scan_files = lambda root: None
    from h5batch import walker
    report_scan = walker.scan_files(root) is not None and walk_ahead.scan_files is walker.scan_files
    lock = os.open(out + ".lock", os.O_CREAT | os.O_RDWR)  # stands for the output's lock
    report = {"scan": report_scan}  # the tree is plain files and folders: the child lists it in C

    def dump(b, files, folders):
        rows = sorted(files.row(i) for i in range(len(files)))
        return {"files": rows, "rejects": sorted((r.path, r.reason) for r in b.rejects),
                "symlinks": bool(b.symlinks), "folders": folders}

    ahead = None
    if mode.startswith("ahead"):  # the walk h5batch sync starts from the job file, before loading the job
        where = root if mode == "ahead" else str(Path(root) / "train")  # ahead-elsewhere: not the job's root
        ahead = walk_ahead.ahead_of(str(Path(root) / "job.yaml"), [f"source.root={where}"])
        ahead_pid = ahead._child.pid
    with stat_pass.started(job, ahead) as w:
        if ahead is not None:
            report["ahead_taken"] = ahead._child is None
            report["ahead_gone"] = not os.path.exists(f"/proc/{ahead_pid}")
            report["ahead_used"] = w._child is not None and w._child.pid == ahead_pid
        report["forked"] = w.forked
        if w.forked:  # the child blocks on its pipe (its result is over a pipe's 64 KiB) until result()
            pid = w._child.pid
            lock_path = os.path.realpath(out + ".lock")

            def targets():  # what each descriptor of the child is open on (by path: numbers are reused)
                found = {}
                for f in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        found[f] = os.readlink(f"/proc/{pid}/fd/{f}")
                    except OSError:  # closed meanwhile
                        pass
                return found

            deadline = time.monotonic() + 10
            while True:
                fds = targets()
                if lock_path not in fds.values() or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            report["child_fds"], report["lock_path"], report["root"] = fds, lock_path, os.path.realpath(root)
        if mode == "killed" and w.forked:
            os.kill(w._child.pid, signal.SIGKILL)  # a child that dies: the walk is done here instead
        report["pass"] = dump(*w.result())
        report["left"] = w.forked
        report["used"] = w.from_child
    b = Builder(job)
    b.ordered_walk = False
    listed, folders = get(job.source.layout).walk(Path(root), job.source, b)
    report["inline"] = dump(b, stat_pass.columns(listed), folders)
    if mode == "raised":
        try:
            with stat_pass.started(job) as w:
                pid = w._child.pid
                raise RuntimeError("the sync failed")
        except RuntimeError:
            pass
        report["after_raise"] = os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    print(json.dumps(report))
""")


_MANY = 2000  # files enough that the walk's result fills a pipe: the child waits for the parent


def _corpus(root: Path, plain: bool = False) -> None:
    """``plain``: regular files and folders only (no fifo, no symlink)."""
    (root / "train/many").mkdir(parents=True)
    for i in range(_MANY):
        (root / f"train/many/a-long-file-name-for-the-pipe-{i:05d}.wav").write_bytes(b"")
    for rel, size in [("train/dog/a.wav", 10), ("train/dog/b.wav", 20), ("train/cat/ü.wav", 30),
                      ("test/cat/c.wav", 40), ("test/notes.txt", 5), ("train/dog/.hidden.wav", 7),
                      ("README.md", 9), ("notes/extra.wav", 3)]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\0" * size)
    os.utime(root / "train/dog/b.wav", ns=(1_000_000_123, 2_000_000_456))
    if not plain:
        os.mkfifo(root / "train/cat/pipe.wav")
        # Not part of the corpus: a folder that source.splits does not list, a symlink in it.
        os.symlink("missing.wav", root / "notes" / "broken.wav")
    (root / "job.yaml").write_text(textwrap.dedent("""
        source: {root: ., layout: class_folders, splits: [train, test]}
        fields:
          audio: {type: audio, extensions: [.wav]}
        output: {path: out.h5}
    """))


def _run(root: Path, mode: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _SCRIPT, str(root), str(root / "out.h5"), mode],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_forked_walk_finds_what_the_layouts_walk_finds(tmp_path):
    _corpus(tmp_path)
    r = _run(tmp_path, "forked")
    assert r["forked"], "a single-threaded Linux process walks in a forked child"
    assert r["pass"] == r["inline"]
    files = {p: (size, mtime) for p, size, mtime in r["pass"]["files"]}
    assert set(files) - {p for p in files if p.startswith("train/many/")} == {
        "train/dog/a.wav", "train/dog/b.wav", "train/cat/ü.wav", "test/cat/c.wav", "test/notes.txt"}
    assert len(files) == 5 + _MANY
    assert files["train/dog/b.wav"] == (20, 2_000_000_456)
    assert r["pass"]["rejects"] == [["train/cat/pipe.wav", "not a regular file"]]
    assert sorted(r["pass"]["folders"]) == ["test", "train"]
    # The child holds pipes (the standard three here, its result's) and, while it walks, folders
    # of the corpus: not the lock the parent had open, nor anything else of the parent's. By
    # path, not by number or count: a number the child closed is taken by the next folder it
    # opens, and the snapshot may catch it mid-walk (a count of 4 failed once as [0,1,2,5,6,7]).
    held = r["child_fds"].values()
    assert r["lock_path"] not in held
    assert all(t.startswith("pipe:") or t == "/dev/null" or t.startswith(r["root"]) for t in held), r["child_fds"]
    assert r["left"] is False
    assert r["used"], "the child's walk is the one used"


@pytest.mark.parametrize("loop", ["", "-pyloop"])
def test_a_tree_of_plain_files_is_listed_in_c_and_found_the_same(tmp_path, loop):
    """No symlink or special file: the child lists the tree with the C scan (where it was
    built), and the pass finds what the layout's own walk finds, as without it."""
    from h5batch import walker

    _corpus(tmp_path, plain=True)
    (tmp_path / "out.h5").write_bytes(b"")  # the job's output, in the root: a file of the walk, not of the corpus
    r = _run(tmp_path, "ahead" + loop)
    assert r["scan"] is (walker._c_scan_tree is not None and not loop)
    assert r["ahead_taken"] and r["ahead_used"] and r["used"]
    assert r["pass"] == r["inline"]
    files = {p: (size, mtime) for p, size, mtime in r["pass"]["files"]}
    assert len(files) == 5 + _MANY and files["train/dog/b.wav"] == (20, 2_000_000_456)
    assert r["pass"]["rejects"] == [] and r["pass"]["symlinks"] is False


@pytest.mark.parametrize("loop", ["", "-pyloop"])
def test_the_walk_started_before_the_job_loads_is_taken_over(tmp_path, loop):
    """``h5batch sync`` walks the root the job file names before it loads the job; the
    class_folders layout derives its walk from that whole-root walk: the same files,
    rejects, symlinks and split folders as its own walk (the top-level README, the unlisted
    folder and its broken symlink are no part of the corpus). With the walker's C loop (two
    threads) and without it (a second child)."""
    _corpus(tmp_path)
    r = _run(tmp_path, "ahead" + loop)
    assert r["ahead_taken"] and r["ahead_used"]
    assert r["used"] and r["pass"] == r["inline"]
    assert r["pass"]["symlinks"] is False
    assert len(r["pass"]["files"]) == 5 + _MANY


def test_a_walk_ahead_of_another_root_is_ended_and_the_pass_walks_its_own(tmp_path):
    _corpus(tmp_path)
    r = _run(tmp_path, "ahead-elsewhere")
    assert not r["ahead_used"] and r["ahead_gone"], "the walk of the wrong root is ended at once"
    assert r["used"] and r["pass"] == r["inline"]
    assert len(r["pass"]["files"]) == 5 + _MANY


def test_thread_walk_where_the_process_has_threads(tmp_path):
    _corpus(tmp_path)
    r = _run(tmp_path, "thread")
    assert not r["forked"]
    assert r["pass"] == r["inline"]
    assert len(r["pass"]["files"]) == 5 + _MANY


def test_a_child_that_dies_is_walked_again_in_the_process(tmp_path):
    _corpus(tmp_path)
    r = _run(tmp_path, "killed")
    assert r["forked"] and not r["used"]
    assert r["pass"] == r["inline"]
    assert len(r["pass"]["files"]) == 5 + _MANY


def test_no_child_outlives_a_block_that_raised(tmp_path):
    _corpus(tmp_path)
    r = _run(tmp_path, "raised")
    assert r["after_raise"] is False


def test_walked_contains_by_hash_and_by_set_when_hashes_collide():
    import numpy as np

    from h5batch.inventory import name_hashes, names_of
    from h5batch.layouts.stat_pass import Walked

    paths = ["a/x.wav", "b/ü.wav", "README.md", "c/" + "long" * 20 + ".wav"]
    names = names_of(paths)
    stat = np.zeros((4, 2), dtype=np.int64)
    asked = ["README.md", "nope.txt", "b/ü.wav", "c/" + "long" * 20 + ".wav", "a/x.wa"]
    want = [True, False, True, True, False]
    assert Walked(stat, None, names, name_hashes(names)).contains(asked) == want
    same = np.zeros(4, dtype=np.uint64)  # every hash alike: the byte check cannot tell, a set does
    assert Walked(stat, None, names, same).contains(asked) == want
    assert Walked(stat, paths).contains(asked) == want
    assert Walked(stat[:0], []).contains(asked) == [False] * 5


def test_a_sync_that_stops_before_its_stat_pass_ends_the_walk_ahead(tmp_path):
    """``sync(job, ahead=...)`` ends a walk it did not take over, however it ends: here the
    output does not exist, which is an error before any walk is looked at."""
    _corpus(tmp_path)
    script = textwrap.dedent(r"""
        import json, os, sys
        from pathlib import Path
        from h5batch import walk_ahead
        from h5batch.config import load_job
        from h5batch.conversion.sync import sync
        from h5batch.errors import ConvertError
        root = sys.argv[1]
        ahead = walk_ahead.ahead_of(str(Path(root) / "job.yaml"), [f"source.root={root}"])
        pid = ahead._child.pid
        job = load_job(Path(root) / "job.yaml", [f"source.root={root}", f"output.path={root}/none.h5"],
                       check_paths=False)
        try:
            sync(job, ahead=ahead)
            message = None
        except ConvertError as e:
            message = str(e)
        print(json.dumps({"message": message, "gone": not os.path.exists(f"/proc/{pid}")}))
    """)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert "none.h5 does not exist" in r["message"]
    assert r["gone"], "the walk's child is ended and reaped"
