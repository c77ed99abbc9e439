"""The file walker (h5batch/walker.py): discovery's ordered walk lists each folder by name,
depth first; a sync's unordered walk finds the same files with the same sizes and mtimes,
the same rejects and symlinks, in any order."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from h5batch.walker import Walker


def _corpus(root: Path) -> None:
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    (root / ".hidden").mkdir()
    for rel, size in [("x.wav", 10), ("a/y.wav", 20), ("a/deep/z.wav", 30), ("b/w.png", 40), (".dot.wav", 5),
                      (".hidden/h.wav", 7), ("b/ü-nicode.wav", 3)]:
        (root / rel).write_bytes(b"\0" * size)
    os.utime(root / "a" / "y.wav", ns=(1_000_000_123, 2_000_000_456))
    os.mkfifo(root / "b" / "pipe")
    os.symlink("missing.wav", root / "b" / "broken.wav")
    os.symlink("../x.wav", root / "a" / "link.wav")


def _walk(root: Path, ordered: bool) -> tuple[list, list, int]:
    w = Walker(root, ordered)
    files = w.walk()
    return sorted(files), sorted((r.path, r.reason) for r in w.rejects), w.symlinks


def test_unordered_walk_finds_what_the_ordered_one_finds(tmp_path):
    _corpus(tmp_path)
    files, rejects, links = _walk(tmp_path, ordered=True)
    assert _walk(tmp_path, ordered=False) == (files, rejects, links)
    by_path = {p: (size, mtime) for p, size, mtime in files}
    assert set(by_path) == {"x.wav", "a/y.wav", "a/deep/z.wav", "b/w.png", "b/ü-nicode.wav", "a/link.wav"}
    assert by_path["a/y.wav"] == (20, 2_000_000_456)
    assert by_path["a/deep/z.wav"][0] == 30
    assert by_path["a/link.wav"] == by_path["x.wav"]  # a symlink inside the root: its target's stat
    assert rejects == [("b/broken.wav", "broken symlink"), ("b/pipe", "not a regular file")]
    assert links == 2


def test_ordered_walk_lists_each_folder_by_name_depth_first(tmp_path):
    """Each folder's entries by name, a folder's files in its place among them: ``a/x`` comes
    before ``a-b`` (as components, not as whole paths)."""
    for rel in ("a-b.wav", "a0/x.wav", "a.wav", "a/x.wav", "b/a b/c.wav", "b/a-b.wav", "b/a.b/d.wav", "x.wav"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * len(rel))
    os.symlink("../x.wav", tmp_path / "b" / "link.wav")
    with open(os.fsencode(tmp_path / "a") + b"/caf\xe9.wav", "wb") as f:  # Latin-1 bytes: not UTF-8
        f.write(b"12345")
    odd = os.fsdecode(b"a/caf\xe9.wav")
    w = Walker(tmp_path)
    files = w.walk()
    assert [p for p, _, _ in files] == ["a/caf\udce9.wav", "a/x.wav", "a-b.wav", "a.wav", "a0/x.wav", "b/a b/c.wav",
                                        "b/a-b.wav", "b/a.b/d.wav", "b/link.wav", "x.wav"]
    assert dict((p, s) for p, s, _ in files)[odd] == 5
    assert w.rejects == [] and w.symlinks == 1
    assert [p for p, _, _ in Walker(tmp_path).walk("b")] == ["b/a b/c.wav", "b/a-b.wav", "b/a.b/d.wav", "b/link.wav"]


def test_symlinks_that_leave_the_root_or_loop_are_rejects(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.wav").write_bytes(b"1")
    (tmp_path / "outside.wav").write_bytes(b"2")
    os.symlink(tmp_path / "outside.wav", root / "out.wav")
    os.symlink("..", root / "sub" / "up")
    for ordered in (True, False):
        files, rejects, links = _walk(root, ordered)
        assert [p for p, _, _ in files] == ["sub/f.wav"]
        assert rejects == [("out.wav", "symlink points outside the corpus root"),
                           ("sub/up", "symlink loop: points to a folder that contains it")]
        assert links == 2


def test_walks_close_every_folder_descriptor(tmp_path):
    _corpus(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        _walk(tmp_path, ordered=False)
        _walk(tmp_path, ordered=True)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders without the read permission")
def test_unlistable_folder_is_the_same_reject_in_both_modes(tmp_path):
    _corpus(tmp_path)
    locked = tmp_path / "b"
    locked.chmod(0)
    try:
        assert _walk(tmp_path, ordered=False) == _walk(tmp_path, ordered=True)
        assert ("b", "cannot list folder: Permission denied") in _walk(tmp_path, ordered=False)[1]
    finally:
        locked.chmod(0o755)


def test_a_syncs_walk_of_class_folders_is_discoverys_walk(tmp_path):
    """A sync's stat pass is the layout's own walk, unordered: the same files, rejects,
    symlinks and split folders as discovery's (the top-level README, the folder that
    ``source.splits`` does not list and its broken symlink are no part of the corpus)."""
    from h5batch.config import load_job
    from h5batch.layouts.base import Builder, get

    for rel, size in [("train/dog/a.wav", 10), ("train/dog/b.wav", 20), ("train/cat/ü.wav", 30),
                      ("test/cat/c.wav", 40), ("test/notes.txt", 5), ("train/dog/.hidden.wav", 7),
                      ("README.md", 9), ("notes/extra.wav", 3)]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\0" * size)
    os.mkfifo(tmp_path / "train/cat/pipe.wav")
    os.symlink("missing.wav", tmp_path / "notes" / "broken.wav")
    (tmp_path / "job.yaml").write_text(textwrap.dedent("""
        source: {root: ., layout: class_folders, splits: [train, test]}
        fields:
          audio: {type: audio, extensions: [.wav]}
        output: {path: out.h5}
    """))
    job = load_job(tmp_path / "job.yaml", [f"source.root={tmp_path}"], check_paths=False)

    def walked(ordered: bool):
        b = Builder(job)
        b.ordered_walk = ordered
        files, folders = get(job.source.layout).walk(tmp_path, job.source, b)
        return sorted(files), sorted((r.path, r.reason) for r in b.rejects), b.symlinks, folders

    files, rejects, symlinks, folders = walked(True)
    assert walked(False) == (files, rejects, symlinks, folders)
    assert [p for p, _, _ in files] == ["test/cat/c.wav", "test/notes.txt", "train/cat/ü.wav", "train/dog/a.wav",
                                        "train/dog/b.wav"]
    assert rejects == [("train/cat/pipe.wav", "not a regular file")]
    assert symlinks is False and folders == ["train", "test"]
