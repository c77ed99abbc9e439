"""The file walker's two modes (h5batch/walker.py): the unordered one of a sync's
stat pass lists each folder through a descriptor of it, and must find what the ordered one
of discovery finds: the same files with the same sizes and mtimes, the same rejects."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h5batch import walker
from h5batch.walker import Walker, stat_lists


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
    assert rejects == [("b/broken.wav", "broken symlink"), ("b/pipe", "not a regular file")]
    assert links == 2


def test_unordered_walk_closes_every_folder_descriptor(tmp_path):
    _corpus(tmp_path)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        _walk(tmp_path, ordered=False)
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


def test_unordered_walk_without_descriptor_listing_finds_the_same(tmp_path, monkeypatch):
    """Where scandir cannot take a descriptor (not POSIX), the unordered walk lists by path."""
    from h5batch import walker

    _corpus(tmp_path)
    by_fd = _walk(tmp_path, ordered=False)
    monkeypatch.setattr(walker, "_BY_FD", False)
    assert _walk(tmp_path, ordered=False) == by_fd == _walk(tmp_path, ordered=True)


def test_a_deferred_walk_stat_ed_later_finds_the_same_files(tmp_path):
    _corpus(tmp_path)
    w = Walker(tmp_path, ordered=False, defer=True)
    rest = w.walk()
    assert [p for p, _, _ in rest] == ["a/link.wav"]  # a symlink's stat is not deferred
    assert "a/link.wav" not in w.deferred and "a/deep/z.wav" in w.deferred
    listed = w.deferred + [p for p, _, _ in rest]
    sizes, mtimes, failed = stat_lists(tmp_path, listed)
    assert failed == []
    got = sorted(zip(listed, sizes, mtimes))
    files, rejects, symlinks = _walk(tmp_path, ordered=False)
    assert got == files
    assert sorted((r.path, r.reason) for r in w.rejects) == rejects


def test_stat_lists_names_what_it_could_not_stat(tmp_path):
    _corpus(tmp_path)
    sizes, mtimes, failed = stat_lists(tmp_path, ["x.wav", "gone.wav", "nofolder/y.wav", "a/y.wav"])
    assert failed == [(1, "cannot stat: No such file or directory"), (2, "cannot stat: No such file or directory")]
    assert list(zip(sizes, mtimes)) == [(10, os.stat(tmp_path / "x.wav").st_mtime_ns), (-1, -1), (-1, -1),
                                        (20, 2_000_000_456)]


@pytest.mark.parametrize("loop", ["c", "python"])
def test_stat_blob_gives_what_stat_lists_gives(tmp_path, monkeypatch, loop):
    """The paths as the walk ahead sends them (NUL-padded UTF-8, surrogateescape): the C loop
    of the optional extension and its Python fallback both answer as stat_lists does, for
    any slice, with runs of one folder, a missing file, a missing folder, a name that is not
    UTF-8 and a symlink (followed)."""
    if loop == "c" and not walker.FAST_STAT:
        pytest.skip("h5batch._stat_many was not built (no C compiler at install)")
    if loop == "python":
        monkeypatch.setattr(walker, "_c_stat_blob", None)
    _corpus(tmp_path)
    raw = os.fsencode(tmp_path / "b") + b"/caf\xe9.wav"  # Latin-1 bytes: not UTF-8
    with open(raw, "wb") as f:
        f.write(b"12345")
    odd = os.fsdecode(b"b/caf\xe9.wav")
    paths = ["x.wav", "a/y.wav", "a/deep/z.wav", "gone.wav", "nofolder/y.wav", "b/w.png", odd, "b/ü-nicode.wav",
             "a/link.wav", "a/y.wav"]
    enc = [p.encode("utf-8", "surrogateescape") for p in paths]
    width = max(map(len, enc))
    blob = b"".join(e.ljust(width, b"\0") for e in enc)
    want_sizes, want_mtimes, want_failed = stat_lists(tmp_path, paths)
    assert want_failed == [(3, "cannot stat: No such file or directory"), (4, "cannot stat: No such file or directory")]
    assert want_sizes[6] == 5
    for start, stop in [(0, len(paths)), (2, 7), (5, 5), (9, 10)]:
        sizes, mtimes, failed = walker.stat_blob(str(tmp_path), blob, width, start, stop)
        assert list(sizes) == want_sizes[start:stop]
        assert list(mtimes) == want_mtimes[start:stop]
        assert failed == [(i, why) for i, why in want_failed if start <= i < stop]
    sizes, _, failed = walker.stat_blob(str(tmp_path / "nowhere"), blob, width, 0, 2)
    assert list(sizes) == [-1, -1] and [i for i, _ in failed] == [0, 1]
    with pytest.raises(ValueError):
        walker.stat_blob(str(tmp_path), blob, width, 0, len(paths) + 1)


def _plain_tree(root: Path) -> set[str]:
    """Regular files and folders only (what scan_files lists itself); the relative paths of
    the files the walker lists."""
    (root / "a" / "deep" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / ".hidden").mkdir()
    rels = ["x.wav", "a/y.wav", "a/deep/z.wav", "a/deep/deeper/w.wav", "b ü-nicode.wav", ".dot.wav", ".hidden/h.wav",
            "a/.also-hidden.wav"] + [f"a/many-{i:04d}.wav" for i in range(300)]
    for i, rel in enumerate(rels):
        (root / rel).write_bytes(b"\0" * i)
    with open(os.fsencode(root / "a") + b"/caf\xe9.wav", "wb") as f:  # Latin-1 bytes: not UTF-8
        f.write(b"12345")
    return {r for r in rels if not any(part.startswith(".") for part in r.split("/"))} | {os.fsdecode(b"a/caf\xe9.wav")}


def _scanned(root: Path) -> list[str] | None:
    got = walker.scan_files(str(root))
    if got is None:
        return None
    blob, width, n = got
    assert len(blob) == width * n
    return [blob[i * width:(i + 1) * width].rstrip(b"\0").decode("utf-8", "surrogateescape") for i in range(n)]


@pytest.fixture
def c_scan():
    if walker._c_scan_tree is None:
        pytest.skip("h5batch._stat_many was not built (no C compiler at install)")


def test_scan_files_lists_the_files_the_walker_lists(tmp_path, c_scan):
    """A tree of plain files and folders (nested, empty, hidden, a name that is not UTF-8):
    the C listing finds each file once, with the path the walker gives it, and stat_blob
    of its blob gives the walker's sizes and mtimes."""
    want = _plain_tree(tmp_path)
    listed = _scanned(tmp_path)
    assert listed is not None and len(listed) == len(set(listed))
    assert set(listed) == want
    files, rejects, links = _walk(tmp_path, ordered=False)
    assert rejects == [] and links == 0
    blob, width, n = walker.scan_files(str(tmp_path))
    sizes, mtimes, failed = walker.stat_blob(str(tmp_path), blob, width, 0, n)
    assert failed == []
    assert sorted(zip(listed, sizes, mtimes)) == files


@pytest.mark.parametrize("odd", ["symlink", "fifo", "folder symlink"])
def test_scan_files_leaves_a_tree_with_anything_else_to_the_walker(tmp_path, c_scan, odd):
    """A symlink or a special file anywhere in the tree: None, and the walker says what it is."""
    _plain_tree(tmp_path)
    where = tmp_path / "a" / "deep"
    if odd == "symlink":
        os.symlink("z.wav", where / "link.wav")
    elif odd == "fifo":
        os.mkfifo(where / "pipe")
    else:
        os.symlink("..", where / "up")
    assert walker.scan_files(str(tmp_path)) is None


def test_scan_files_skips_hidden_entries_of_any_kind(tmp_path, c_scan):
    want = _plain_tree(tmp_path)
    os.symlink("z.wav", tmp_path / "a" / "deep" / ".hidden-link")
    os.mkfifo(tmp_path / ".pipe")
    assert set(_scanned(tmp_path)) == want


def test_scan_files_of_no_folder_is_none(tmp_path, c_scan):
    assert walker.scan_files(str(tmp_path / "nowhere")) is None
    (tmp_path / "file").write_bytes(b"")
    assert walker.scan_files(str(tmp_path / "file")) is None
    assert walker.scan_files(str(tmp_path)) == (b"file", 4, 1)
    os.unlink(tmp_path / "file")
    assert walker.scan_files(str(tmp_path)) == (b"", 1, 0)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads folders without the read permission")
def test_scan_files_of_a_tree_with_an_unlistable_folder_is_none(tmp_path, c_scan):
    _plain_tree(tmp_path)
    (tmp_path / "a" / "deep").chmod(0)
    try:
        assert walker.scan_files(str(tmp_path)) is None
    finally:
        (tmp_path / "a" / "deep").chmod(0o755)


def test_the_ordered_walk_in_c_gives_what_the_python_walk_gives(tmp_path, c_scan, monkeypatch):
    """A discovery's walk of plain files and folders goes through the C listing and stat
    loop: the same files in the same order (names that sort differently as paths and as
    components: ``a/x`` before ``a-b``), sizes, mtimes, identities and rejects as the Python
    walk, for the whole root and for a folder of it, on one thread and on two."""
    _plain_tree(tmp_path)
    for rel in ("a-b.wav", "a0/x.wav", "a.wav", "a/x.wav", "b/a b/c.wav", "b/a-b.wav", "b/a.b/d.wav"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x" * len(rel))

    def walked(rel: str, c: bool, threads_from: int = 1024):
        monkeypatch.setattr(walker, "THREAD_MIN", threads_from)
        if not c:
            monkeypatch.setattr(walker, "_c_scan_tree", None)
        w = Walker(tmp_path)
        files = w.walk(rel)
        monkeypatch.undo()
        return files, w.all_ids(), [(r.path, r.reason) for r in w.rejects]

    for rel in ("", "a", "b"):
        want = walked(rel, c=False)
        assert want[0] and not want[2]
        assert walked(rel, c=True) == want
        assert walked(rel, c=True, threads_from=2) == want
    paths = [p for p, _, _ in walked("", c=True)[0]]
    assert paths.index("a/x.wav") < paths.index("a-b.wav") < paths.index("a.wav") < paths.index("a0/x.wav")
    os.symlink("../x.wav", tmp_path / "b" / "link.wav")  # anything but plain files: the Python walk
    files, ids, _ = walked("", c=True)
    assert "b/link.wav" in ids and ids["b/link.wav"] == ids["x.wav"]
    assert [p for p, _, _ in files] == [p for p, _, _ in walked("", c=False)[0]]
