"""A file reached through several symlinks inside the corpus root is one sample; every other
path to it is a reject naming the kept path (issue 20). Real files and real symlinks, made at
test time. Hard links are distinct directory entries and stay distinct samples, like copies."""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from h5batch import ConvertOptions, convert, generate
from h5batch.config import job_from_dict, load_job
from h5batch.layouts import discover
from h5batch.manifest import Manifest
from tests.conftest import REPO

AUDIO = {"type": "audio", "extensions": [".wav"], "sample_rate": 16000}
PAIRED = {"data": {**AUDIO, "folder": "noisy"}, "target": {**AUDIO, "folder": "clean"}}
FSDD = {"layout": "pattern", "pattern": r"(?:[a-z]+/)?(?P<label>\d)_(?P<speaker>[a-z]+)_(?P<index>\d+)\.wav",
        "split": {"group": "index", "ranges": {"test": [0, 4]}, "default": "train"}, "splits": ["train", "test"]}


def _job(root: Path, source: dict, fields: dict | None = None):
    return job_from_dict({"source": {"root": str(root), **source}, "fields": fields or {"audio": AUDIO},
                          "output": {"path": str(root.parent / "out.h5")}}, "test.yaml")


def _make(root: Path, files: list[str]) -> None:
    for rel in files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())


def _alias(kept: str) -> str:
    return f"same file as {kept}, through a symlink"


def _paths(m: Manifest) -> list[str]:
    return [p for it in m.items for p in it.paths]


def _reasons(m: Manifest) -> dict[str, str]:
    reasons = {r.path: r.reason for r in m.rejects}
    assert len(reasons) == len(m.rejects), "a path is rejected twice"
    assert not set(reasons) & set(_paths(m)), "a path is both a sample and a reject"
    return reasons


def test_folder_symlink_to_the_root_gives_each_file_once(tmp_path) -> None:
    """The case of the issue: train/a/root -> the corpus root made 66 files 132 samples. Half
    the names sort before 'root', half after: the real path is kept either way."""
    root = tmp_path / "c"
    names = [f"{'a' if n % 2 else 'x'}{n}.wav" for n in range(66)]
    _make(root, [f"train/a/{n}" for n in names])
    plain = discover(_job(root, {"layout": "class_folders"}))
    os.symlink("../..", root / "train/a/root")
    m = discover(_job(root, {"layout": "class_folders"}))
    assert len(m.items) == 66
    assert [(it.key, it.paths, it.label) for it in m.items] == [(it.key, it.paths, it.label) for it in plain.items]
    assert _reasons(m) == {**{f"train/a/root/train/a/{n}": _alias(f"train/a/{n}") for n in names},
                           "train/a/root/train/a/root": "symlink loop: points to a folder that contains it"}
    assert sum(r.reason.startswith("same file as") for r in m.rejects) == 66
    assert all(r.stage == "discover" for r in m.rejects)
    assert discover(_job(root, {"layout": "class_folders"})).hash == m.hash


def test_file_symlinks_beside_and_across_classes_and_splits(tmp_path) -> None:
    """A file symlink is the same file as its target wherever it lies: beside it (even when it
    sorts first), in another class, in another split, through a chain of links. The target's
    own path is the one kept."""
    root = tmp_path / "c"
    _make(root, ["train/cat/1.wav", "train/cat/5.wav", "train/dog/7.wav", "pool/p.wav"])
    (tmp_path / "elsewhere.wav").write_bytes(b"x")
    os.symlink("1.wav", root / "train/cat/0.wav")           # beside, sorts before its target
    os.symlink("0.wav", root / "train/cat/zz.wav")          # a chain: zz -> 0 -> 1
    os.symlink("../cat/1.wav", root / "train/dog/1.wav")    # another class
    (root / "test/cat").mkdir(parents=True)
    os.symlink("../../train/cat/5.wav", root / "test/cat/5.wav")  # another split, which sorts first
    os.symlink("../../pool/p.wav", root / "train/dog/p.wav")      # its target is no sample: kept
    os.symlink("../../../elsewhere.wav", root / "train/dog/out.wav")  # outside the root: as before
    m = discover(_job(root, {"layout": "class_folders", "splits": ["test", "train"]}))
    assert _paths(m) == ["train/cat/1.wav", "train/cat/5.wav", "train/dog/7.wav", "train/dog/p.wav"]
    assert m.splits == ("train",)
    assert _reasons(m) == {
        "train/cat/0.wav": _alias("train/cat/1.wav"),
        "train/cat/zz.wav": _alias("train/cat/1.wav"),
        "train/dog/1.wav": _alias("train/cat/1.wav"),
        "test/cat/5.wav": _alias("train/cat/5.wav"),
        "train/dog/out.wav": "symlink points outside the corpus root",
    }


def test_no_path_is_the_files_own_the_first_in_manifest_order_is_kept(tmp_path) -> None:
    """Two symlinks to a file that is not a sample (a folder outside the listed splits): the
    first of them in manifest order is the sample."""
    root = tmp_path / "c"
    _make(root, ["pool/p.wav", "train/cat/1.wav"])
    os.symlink("../../pool/p.wav", root / "train/cat/b.wav")
    os.symlink("../../pool/p.wav", root / "train/cat/a.wav")
    m = discover(_job(root, {"layout": "class_folders", "splits": ["train"]}))
    assert _paths(m) == ["train/cat/1.wav", "train/cat/a.wav"]
    assert _reasons(m) == {"train/cat/b.wav": _alias("train/cat/a.wav")}


def test_hard_links_stay_distinct_samples(tmp_path) -> None:
    """Two directory entries of one inode are kept, like two copies (a file deliberately put
    into two classes); a symlink to one of them is an alias of that one."""
    root = tmp_path / "c"
    _make(root, ["train/cat/1.wav"])
    (root / "train/dog").mkdir()
    os.link(root / "train/cat/1.wav", root / "train/dog/1.wav")
    os.symlink("1.wav", root / "train/dog/s.wav")
    m = discover(_job(root, {"layout": "class_folders"}))
    assert [(it.paths, it.label) for it in m.items] == [(("train/cat/1.wav",), "cat"), (("train/dog/1.wav",), "dog")]
    assert _reasons(m) == {"train/dog/s.wav": _alias("train/dog/1.wav")}


def test_symlink_loops_are_still_caught(tmp_path) -> None:
    """Loops through one link (., ..) and through two (a/b -> c, c/d -> a) are rejects, and
    the files seen on the way round are aliases."""
    root = tmp_path / "c"
    _make(root, ["train/a/1.wav", "train/c/2.wav"])
    os.symlink(".", root / "train/a/self")
    os.symlink("..", root / "train/a/up")
    os.symlink("../c", root / "train/a/b")
    os.symlink("../a", root / "train/c/d")
    m = discover(_job(root, {"layout": "class_folders"}))
    assert _paths(m) == ["train/a/1.wav", "train/c/2.wav"]
    loop = "symlink loop: points to a folder that contains it"
    assert _reasons(m) == {
        "train/a/self": loop, "train/a/up": loop, "train/a/b/d": loop, "train/c/d/b": loop,
        "train/c/d/self": loop, "train/c/d/up": loop,  # a's own loops, met again through c/d
        "train/a/b/2.wav": _alias("train/c/2.wav"), "train/c/d/1.wav": _alias("train/a/1.wav")}


def test_paired_folders_aliased_pair_and_shared_partner(tmp_path) -> None:
    """A pair whose two files are both another pair's (field folders linked into another split,
    a whole split linked to another) is rejected file by file; a pair sharing only its target
    with another (one clean file for two noisy ones) is a sample of its own."""
    root = tmp_path / "c"
    _make(root, [f"{s}/{f}/{n}.wav" for s, ns in (("train", (1, 2)), ("test", (7,)))
                 for f in ("noisy", "clean") for n in ns] + ["train/noisy/3.wav"])
    os.symlink("1.wav", root / "train/clean/3.wav")
    os.symlink("../../test/noisy", root / "train/noisy/t")
    os.symlink("../../test/clean", root / "train/clean/t")
    os.symlink("test", root / "val")
    m = discover(_job(root, {"layout": "paired_folders"}, PAIRED))
    assert [(it.split, it.key, it.paths) for it in m.items] == [
        ("test", "7", ("test/noisy/7.wav", "test/clean/7.wav")),
        ("train", "1", ("train/noisy/1.wav", "train/clean/1.wav")),
        ("train", "2", ("train/noisy/2.wav", "train/clean/2.wav")),
        ("train", "3", ("train/noisy/3.wav", "train/clean/3.wav"))]
    assert m.splits == ("test", "train")
    assert _reasons(m) == {
        "train/noisy/t/7.wav": _alias("test/noisy/7.wav"), "train/clean/t/7.wav": _alias("test/clean/7.wav"),
        "val/noisy/7.wav": _alias("test/noisy/7.wav"), "val/clean/7.wav": _alias("test/clean/7.wav")}


def test_pattern_layout_folder_and_file_symlinks(tmp_path) -> None:
    """A flat corpus: a folder linked under a second name and a file linked under a name of
    another split. The linked names sort first and would change the split: the files' own
    paths are kept."""
    root = tmp_path / "c"
    names = [f"{d}_{spk}_{i}.wav" for d in (0, 1) for spk in ("ann", "bob") for i in (2, 9)]
    _make(root, [f"recordings/{n}" for n in names])
    os.symlink("recordings", root / "more")
    os.symlink("1_bob_2.wav", root / "recordings/1_bob_12.wav")  # index 12: would be train
    m = discover(_job(root, FSDD))
    assert sorted(_paths(m)) == sorted(f"recordings/{n}" for n in names)
    assert next(it.split for it in m.items if it.paths == ("recordings/1_bob_2.wav",)) == "test"
    assert _reasons(m) == {**{f"more/{n}": _alias(f"recordings/{n}") for n in names},
                           "recordings/1_bob_12.wav": _alias("recordings/1_bob_2.wav"),
                           "more/1_bob_12.wav": _alias("recordings/1_bob_2.wav")}


def test_convert_writes_each_file_once_and_lists_the_aliases(tmp_path) -> None:
    """End to end: the output holds each sample once, and its rejects table (and the rejects
    count) has every alias path with its reason."""
    root = tmp_path / "demo"
    generate.make_demo_corpus(root, per_class=5)
    real = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.wav"))
    os.symlink("../circle", root / "train/square/circle")  # a class folder linked into another
    stem = "train/triangle/triangle_0000"
    for suffix in (".wav", ".png"):  # a whole two-file sample linked beside itself
        os.symlink(f"triangle_0000{suffix}", root / f"train/triangle/again{suffix}")
    circle = sorted(p.name for p in (root / "train/circle").iterdir())
    expected = {f"train/square/circle/{n}": _alias(f"train/circle/{n}") for n in circle}
    expected |= {f"train/triangle/again{s}": _alias(f"{stem}{s}") for s in (".wav", ".png")}

    # 10 of the 40 input files are aliases, more than the default policy.max_reject_fraction.
    job = load_job(REPO / "jobs" / "demo.yaml", [f"source.root={root}", f"output.path={tmp_path / 'out.h5'}",
                                                  "cluster.workers=1", "policy.max_reject_fraction=0.5"])
    summary = convert(job, ConvertOptions(progress=False))
    assert summary.rejects == len(expected)
    with h5py.File(tmp_path / "out.h5", "r") as f:
        wavs = [p for split in ("train", "test") for p in f[split]["source"].asstr()[:, 0]]
        assert sorted(wavs) == real  # each file once, at its own path
        rejects = dict(zip(f["rejects/path"].asstr()[...], f["rejects/reason"].asstr()[...]))
        assert set(f["rejects/stage"].asstr()[...]) == {"discover"}
    assert rejects == expected
