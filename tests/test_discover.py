"""Discovery: each layout gives the right items, labels and splits, in the same order
whatever order the files were created in, and every file found is an item's file or a
reject (nothing silently dropped). Files are dummies: discovery never decodes."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from h5batch.config import job_from_dict
from h5batch.layouts import discover
from h5batch.manifest import Manifest, natural_key


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Overrides conftest's /dev/shm check: discovery starts no conversion."""
    yield


AUDIO = {"type": "audio", "extensions": [".wav"], "sample_rate": 16000}
IMAGE = {"type": "image", "extensions": [".png"]}


def _job(root: Path, source: dict, fields: dict | None = None):
    return job_from_dict({"source": {"root": str(root), **source}, "fields": fields or {"audio": AUDIO},
                          "output": {"path": str(root.parent / "out.h5")}}, "test.yaml")


def _make(root: Path, files: list[str], seed: int) -> None:
    """Create ``files`` (relative paths) in a shuffled order."""
    order = list(files)
    random.Random(seed).shuffle(order)
    for rel in order:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rel.encode())


def _view(m: Manifest) -> tuple:
    return ([(it.split, it.key, it.paths, it.label) for it in m.items], [(r.path, r.reason) for r in m.rejects],
            m.splits, m.class_names)


def _all_accounted(m: Manifest, root: Path, under: str = "") -> None:
    """Every non-hidden entry below ``root/under`` is an item's file or a reject, once."""
    files = [p for it in m.items for p in it.paths]
    rejected = [r.path for r in m.rejects]
    assert len(files) + len(rejected) == len(set(files) | set(rejected))
    on_disk = set()
    for dirpath, dirs, names in os.walk(root / under):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        on_disk |= {(Path(dirpath) / n).relative_to(root).as_posix() for n in names if not n.startswith(".")}
    assert on_disk == set(files) | set(rejected)


# --------------------------------------------------------------- class_folders

CLASS_FILES = [f"{split}/{cls}/{n}.wav" for split in ("train", "test") for cls in ("dog", "cat", "bird10", "bird2")
               for n in (1, 2, 10, 21)] + ["val/cat/x.wav"]


@pytest.mark.parametrize("seed", [1, 2])
def test_class_folders_order_independent(tmp_path, seed) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _make(a, CLASS_FILES, seed)
    _make(b, list(reversed(CLASS_FILES)), seed + 10)
    ma, mb = discover(_job(a, {"layout": "class_folders"})), discover(_job(b, {"layout": "class_folders"}))
    assert _view(ma) == _view(mb)
    assert ma.splits == ("test", "train", "val")  # natural sort of folder names
    assert ma.class_names == ("bird2", "bird10", "cat", "dog")
    train = [it for it in ma.items if it.split == "train"]
    assert [it.key for it in train[:4]] == ["bird2/1", "bird2/2", "bird2/10", "bird2/21"]
    assert all(it.label == it.paths[0].split("/")[1] for it in ma.items)
    assert all(ma.label_index(it.label) == ma.class_names.index(it.label) for it in ma.items)
    assert len(ma.items) == len(CLASS_FILES) and not ma.rejects
    _all_accounted(ma, a)


def test_class_folders_listed_splits(tmp_path) -> None:
    _make(tmp_path / "c", CLASS_FILES, 0)
    m = discover(_job(tmp_path / "c", {"layout": "class_folders", "splits": ["train", "val", "holdout"]}))
    assert m.splits == ("train", "val")
    assert {it.split for it in m.items} == {"train", "val"}
    assert [(r.path, r.reason) for r in m.rejects] == [
        ("holdout", "split folder 'holdout' listed in source.splits is missing")]


def test_class_folders_two_fields_by_stem(tmp_path) -> None:
    root = tmp_path / "c"
    _make(root, ["train/cat/1.wav", "train/cat/1.png", "train/cat/2.wav", "train/dog/3.png", "train/dog/3.wav",
                 "train/dog/4.png"], 3)
    m = discover(_job(root, {"layout": "class_folders"}, {"audio": AUDIO, "image": IMAGE}))
    assert [(it.key, it.paths, it.label) for it in m.items] == [
        ("cat/1", ("train/cat/1.wav", "train/cat/1.png"), "cat"),
        ("dog/3", ("train/dog/3.wav", "train/dog/3.png"), "dog")]
    assert {r.path: r.reason for r in m.rejects} == {
        "train/cat/2.wav": "paired sample incomplete: no image file for stem '2'",
        "train/dog/4.png": "paired sample incomplete: no audio file for stem '4'"}
    _all_accounted(m, root)


def test_class_folders_bad_entries(tmp_path) -> None:
    root = tmp_path / "c"
    _make(root, ["train/cat/1.wav", "train/cat/notes.txt", "train/loose.wav", "stray.wav", "README.md",
                 "train/cat/.hidden.wav", "train/.cache/x.wav"], 4)
    (tmp_path / "elsewhere.wav").write_bytes(b"x")
    os.symlink("../../../elsewhere.wav", root / "train/cat/escape.wav")
    os.symlink("nothing.wav", root / "train/cat/broken.wav")
    os.symlink("1.wav", root / "train/cat/alias.wav")
    os.symlink(".", root / "train/cat/loop")
    os.symlink("..", root / "train/cat/up")
    m = discover(_job(root, {"layout": "class_folders"}))
    assert [it.paths[0] for it in m.items] == ["train/cat/1.wav"]  # the alias is the same file
    reasons = {r.path: r.reason for r in m.rejects}
    assert reasons == {
        "stray.wav": "media file is not inside a split folder (<split>/...)",
        "train/loose.wav": "file is not inside a class folder (<split>/<class>/<file>)",
        "train/cat/notes.txt": "extension '.txt' is not accepted (accepted: .wav)",
        "train/cat/escape.wav": "symlink points outside the corpus root",
        "train/cat/broken.wav": "broken symlink",
        "train/cat/loop": "symlink loop: points to a folder that contains it",
        "train/cat/up": "symlink loop: points to a folder that contains it",
        "train/cat/alias.wav": "same file as train/cat/1.wav, through a symlink",
    }
    assert "README.md" not in reasons  # top-level non-media files are not part of the corpus


# --------------------------------------------------------------- paired_folders

PAIRED = {"data": {**AUDIO, "folder": "noisy"}, "target": {**AUDIO, "folder": "clean"}}


@pytest.mark.parametrize("seed", [5, 6])
def test_paired_folders(tmp_path, seed) -> None:
    files = [f"{s}/{f}/{sub}{n}.wav" for s in ("train", "test") for f in ("noisy", "clean")
             for sub in ("", "spk1/") for n in (1, 2, 10)]
    files += ["train/noisy/only_noisy.wav", "train/clean/only_clean.wav", "train/other/1.wav"]
    root_a, root_b = tmp_path / "a", tmp_path / "b"
    _make(root_a, files, seed)
    _make(root_b, files, seed + 100)
    ma = discover(_job(root_a, {"layout": "paired_folders"}, PAIRED))
    mb = discover(_job(root_b, {"layout": "paired_folders"}, PAIRED))
    assert _view(ma) == _view(mb)
    assert ma.splits == ("test", "train") and ma.class_names == ()
    train = [(it.key, it.paths) for it in ma.items if it.split == "train"]
    assert train[:3] == [("1", ("train/noisy/1.wav", "train/clean/1.wav")),
                         ("2", ("train/noisy/2.wav", "train/clean/2.wav")),
                         ("10", ("train/noisy/10.wav", "train/clean/10.wav"))]
    assert ("spk1/10", ("train/noisy/spk1/10.wav", "train/clean/spk1/10.wav")) in train
    assert all(it.label is None for it in ma.items)
    reasons = {r.path: r.reason for r in ma.rejects}
    assert reasons["train/noisy/only_noisy.wav"].startswith("paired sample incomplete: no target file")
    assert reasons["train/clean/only_clean.wav"].startswith("paired sample incomplete: no data file")
    assert reasons["train/other/1.wav"].startswith("not inside a field folder (noisy, clean)")
    _all_accounted(ma, root_a)


# --------------------------------------------------------------- pattern

FSDD = {"layout": "pattern", "pattern": r"(?P<label>\d)_(?P<speaker>[a-z]+)_(?P<index>\d+)\.wav",
        "split": {"group": "index", "ranges": {"test": [0, 4]}, "default": "train"}, "splits": ["train", "test"]}


@pytest.mark.parametrize("seed", [7, 8])
def test_pattern_layout(tmp_path, seed) -> None:
    files = [f"{d}_{spk}_{i}.wav" for d in (0, 1, 9) for spk in ("ann", "bob") for i in (0, 3, 5, 12)]
    files += ["README.txt", "x_ann_1.wav"]
    a, b = tmp_path / "a", tmp_path / "b"
    _make(a, files, seed)
    _make(b, files, seed + 1)
    ma, mb = discover(_job(a, FSDD)), discover(_job(b, FSDD))
    assert _view(ma) == _view(mb)
    assert ma.splits == ("train", "test")
    assert ma.class_names == ("0", "1", "9")
    for it in ma.items:
        idx = int(it.key.rsplit("_", 1)[1])
        assert it.split == ("test" if idx <= 4 else "train")
        assert it.label == it.key[0]
    assert [it.key for it in ma.items if it.split == "train"][:4] == ["0_ann_5", "0_ann_12", "0_bob_5", "0_bob_12"]
    assert {r.path: r.reason for r in ma.rejects} == {
        "README.txt": "extension '.txt' is not accepted (accepted: .wav)",
        "x_ann_1.wav": "path does not match source.pattern"}
    _all_accounted(ma, a)


def test_pattern_split_group_text(tmp_path) -> None:
    _make(tmp_path / "p", ["train/a_1.wav", "val/b_2.wav", "a_3.wav"], 0)
    job = _job(tmp_path / "p", {"layout": "pattern", "pattern": r"((?P<split>[a-z]+)/)?(?P<label>[a-z])_\d+\.wav"})
    m = discover(job)
    assert [(it.split, it.key, it.label) for it in m.items] == [
        ("train", "a_3", "a"), ("train", "train/a_1", "a"), ("val", "val/b_2", "b")]


# --------------------------------------------------------------- manifest (CSV and JSONL)

ROWS = [
    {"path": "clips/b/10.wav", "label": "no", "split": "test"},
    {"path": "clips/a/2.wav", "label": "yes", "split": "train"},
    {"path": "clips/a/10.wav", "label": "yes", "split": "train"},
    {"path": "clips/b/1.wav", "label": "no", "split": "train"},
    {"path": "clips/c/3.wav", "label": "", "split": ""},
]


def _write_manifest(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".csv":
        keys = list(rows[0])
        path.write_text(",".join(keys) + "\n" + "".join(",".join(str(r.get(k, "")) for k in keys) + "\n" for r in rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_manifest_layout(tmp_path, suffix) -> None:
    root = tmp_path / "m"
    _make(root, [r["path"] for r in ROWS] + ["clips/unlisted.wav"], 9)
    mpath = tmp_path / f"list{suffix}"
    _write_manifest(mpath, ROWS)
    m = discover(_job(root, {"layout": "manifest", "manifest": str(mpath)}))
    assert [(it.split, it.key, it.label) for it in m.items] == [
        ("test", "clips/b/10", "no"),
        ("train", "clips/a/2", "yes"), ("train", "clips/a/10", "yes"), ("train", "clips/b/1", "no"),
        ("train", "clips/c/3", None)]
    assert m.class_names == ("no", "yes") and not m.rejects


def test_manifest_csv_and_jsonl_agree(tmp_path) -> None:
    root = tmp_path / "m"
    _make(root, [r["path"] for r in ROWS], 1)
    views = []
    for suffix in (".csv", ".jsonl"):
        mpath = tmp_path / f"list{suffix}"
        _write_manifest(mpath, ROWS)
        views.append(_view(discover(_job(root, {"layout": "manifest", "manifest": str(mpath)}))))
    assert views[0] == views[1]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_manifest_bad_rows(tmp_path, suffix) -> None:
    root = tmp_path / "m"
    _make(root, ["a.wav", "b.wav", "c.flac"], 2)
    (tmp_path / "outside.wav").write_bytes(b"x")
    os.symlink("../outside.wav", root / "link.wav")
    rows = [{"path": p, "split": "train"} for p in
            ("a.wav", "../outside.wav", "link.wav", "missing.wav", "./a.wav", "c.flac", "", "b.wav", "missing.wav")]
    mpath = tmp_path / f"list{suffix}"
    _write_manifest(mpath, rows)
    if suffix == ".jsonl":
        with open(mpath, "a") as fh:
            fh.write("{not json\n[1, 2]\n")
    m = discover(_job(root, {"layout": "manifest", "manifest": str(mpath)}))
    assert [it.paths for it in m.items] == [("a.wav",), ("b.wav",)]
    first = 2 if suffix == ".csv" else 1  # line of the first row
    got = {r.path: r.reason for r in m.rejects}
    want = {
        "../outside.wav": f"manifest row {first + 1} points outside the corpus root",
        "link.wav": f"manifest row {first + 2} points outside the corpus root",
        "missing.wav": f"manifest row {first + 3}: file does not exist",
        f"{mpath.name}:{first + 4}": f"duplicate: a.wav is already listed in row {first}",
        "c.flac": "extension '.flac' is not accepted for field 'audio' (accepted: .wav)",
        f"{mpath.name}:{first + 6}": "row has no 'audio' value",
        # the same bad path again: reported under the row, so no path is rejected twice
        f"{mpath.name}:{first + 8}": f"missing.wav: manifest row {first + 8}: file does not exist "
                                     f"(also listed in row {first + 3})",
    }
    if suffix == ".jsonl":
        want[f"{mpath.name}:10"] = got.get(f"{mpath.name}:10", "")
        assert got[f"{mpath.name}:10"].startswith("not valid JSON")
        want[f"{mpath.name}:11"] = "not a JSON object: [1, 2]"
    assert len(m.rejects) == len(want)
    assert got == want


def test_manifest_two_fields_reject_the_whole_row(tmp_path) -> None:
    root = tmp_path / "m"
    _make(root, ["n/1.wav", "c/1.wav", "n/2.wav", "n/3.wav", "c/3.wav"], 3)
    mpath = tmp_path / "pairs.csv"
    mpath.write_text("noisy,clean,split\nn/1.wav,c/1.wav,train\nn/2.wav,c/2.wav,train\n"
                     "n/3.wav,n/3.wav,train\nn/1.wav,c/3.wav,test\n")
    fields = {"data": {**AUDIO, "column": "noisy"}, "target": {**AUDIO, "column": "clean"}}
    m = discover(_job(root, {"layout": "manifest", "manifest": str(mpath)}, fields))
    assert [it.paths for it in m.items] == [("n/1.wav", "c/1.wav")]
    got = {r.path: r.reason for r in m.rejects}
    assert got["c/2.wav"] == "manifest row 3: file does not exist"
    assert got["n/2.wav"].startswith("another file of manifest row 3 was rejected (c/2.wav:")
    assert got["pairs.csv:4"] == "duplicate: n/3.wav is already listed in this row"
    assert got["pairs.csv:5"] == "duplicate: n/1.wav is already listed in row 2"
    assert got["n/3.wav"].startswith("another file of manifest row 4 was rejected (pairs.csv:4: duplicate")
    assert got["c/3.wav"].startswith("another file of manifest row 5 was rejected")
    assert len(got) == 6
    files = [p for it in m.items for p in it.paths]
    assert not set(files) & set(got)  # a file is never both a sample's and a reject


def test_same_stem_in_a_one_field_job_is_two_samples(tmp_path) -> None:
    """Two files with one stem in a one-field pattern job are two files: both are samples,
    their keys keep the extension; the other keys stay stems."""
    _make(tmp_path / "p", ["a/1.wav", "a/1.flac", "a/2.wav"], 0)
    job = _job(tmp_path / "p", {"layout": "pattern", "pattern": r"(?P<label>[a-z])/\d+\.(wav|flac)"},
               {"audio": {**AUDIO, "extensions": [".wav", ".flac"]}})
    m = discover(job)
    assert [(it.key, it.paths) for it in m.items] == [
        ("a/1.flac", ("a/1.flac",)), ("a/1.wav", ("a/1.wav",)), ("a/2", ("a/2.wav",))]
    assert m.rejects == []


def test_natural_key() -> None:
    names = ["b10", "a2", "a10", "b2", "a1b3", "a1b20"]
    assert sorted(names, key=natural_key) == ["a1b3", "a1b20", "a2", "a10", "b2", "b10"]


def test_natural_key_bytes_order_as_the_tuple_of_runs() -> None:
    """The bytes key orders every pair of names as the tuple of (number or text) runs does:
    numbers by value and before text, leading zeros ignored, a prefix first, U+0000 and U+0001
    below every other character, surrogate escapes in code point order."""
    import itertools
    import re

    def runs(text: str) -> tuple:
        return tuple((0, int(t), "") if t.isdecimal() else (1, 0, t) for t in re.split(r"(\d+)", text) if t)

    names = ["", "a", "a0", "a00", "a1", "a01", "a10", "a9", "a/1", "a\0", "a\0b", "a\x01", "a\x011", "ab", "a b",
             "1", "01", "9", "10", "٣", "3a", "²", "é", "\udce9", "😀", "a1b", "a1b2", "a1\0", "z", "Z1"]
    for x, y in itertools.product(names, repeat=2):
        assert (runs(x) < runs(y)) == (natural_key(x) < natural_key(y)), (x, y)
        assert (runs(x) == runs(y)) == (natural_key(x) == natural_key(y)), (x, y)


def test_digit_like_names_are_sorted_not_crashed_on(tmp_path: Path) -> None:
    """'²' is a digit to str.isdigit but not a decimal: int() rejects it, so a natural sort
    that tested isdigit crashed discovery on a file named ``².wav`` or ``1²2.wav``."""
    files = ["train/a/².wav", "train/a/1²2.wav", "train/a/10.wav", "train/a/2.wav", "train/b/٣.wav"]
    _make(tmp_path / "c", files, 0)
    m = discover(_job(tmp_path / "c", {"layout": "class_folders"}))
    assert [it.paths[0] for it in m.items] == ["train/a/1²2.wav", "train/a/2.wav", "train/a/10.wav",
                                              "train/a/².wav", "train/b/٣.wav"]
    assert m.rejects == []
    # Arabic-Indic three is a decimal digit: \d and int() both take it, so it sorts as 3.
    assert natural_key("٣") == natural_key("3")


def test_the_config_layout_type_is_the_registry(tmp_path) -> None:
    """source.layout is checked against the registry when a job is loaded (no hand-kept
    list), and the error lists the registered layouts in registration order."""
    import typing

    from h5batch import config, layouts
    from h5batch.errors import ConfigError

    assert typing.get_type_hints(config.SourceConfig)["layout"] is config.LayoutName
    assert layouts.names() == ("class_folders", "paired_folders", "pattern", "manifest")
    with pytest.raises(ConfigError, match=r"source\.layout.*must be one of 'class_folders', 'paired_folders', "
                                          r"'pattern', 'manifest', got 'flat'"):
        _job(tmp_path, {"layout": "flat"})
    with pytest.raises(ValueError, match=r"unknown layout 'flat' \(registered: class_folders, paired_folders, pattern, manifest\)"):
        layouts.get("flat")


def test_every_registered_layout_is_documented() -> None:
    from h5batch import layouts

    jobs = (Path(__file__).resolve().parents[1] / "docs" / "jobs.md").read_text()
    row = next(line for line in jobs.splitlines() if line.startswith("| `layout` |"))
    assert [n for n in layouts.names() if f"`{n}`" not in row] == []
    assert [n for n in layouts.names() if f"* `{n}` —" not in jobs] == []


def test_discover_runs_the_registered_layout(tmp_path: Path, monkeypatch) -> None:
    """discover() looks the layout up in the registry: a layout module needs no edit elsewhere
    (a throwaway one here: every file at the top of the root is a sample of split 'all')."""
    import dataclasses

    from h5batch import layouts
    from h5batch.layouts.base import Layout, Walker, stem
    from h5batch.manifest import Item

    class Flat(Layout):
        name = "test-flat"

        def collect(self, root, src, b):
            walker = Walker(root)
            for rel, size, mtime in walker.walk():
                b.items.append(Item(stem(rel), "all", (rel,), None, stats=((size, mtime),)))
            b.rejects.extend(walker.rejects)
            return ["all"]

    monkeypatch.setitem(layouts.LAYOUTS, Flat.name, Flat())
    _make(tmp_path / "c", ["10.wav", "2.wav", ".hidden.wav"], 0)
    job = _job(tmp_path / "c", {"layout": "class_folders"})
    job = dataclasses.replace(job, source=dataclasses.replace(job.source, layout=Flat.name))
    m = discover(job)
    assert [it.key for it in m.items] == ["2", "10"] and m.splits == ("all",) and len(m.hash) == 64


ODD_NAMES = ['a"b', "a\\b", "é", "a\x7f", "a\x1f", "tab\t", "日本", "x y", "", "'", "\u2028", "7"]


@pytest.mark.parametrize("name", ODD_NAMES)
@pytest.mark.parametrize("label", [None, 0, 12, True, "cat", "3", "odd"])
def test_an_item_record_is_json_dumps_whatever_the_names(name, label):
    """The manifest hash takes each item's record (records.item_record): its text is put
    together without json where that gives the same bytes, so stored hashes stay valid."""
    from h5batch.layouts.records import _VALUES_JSON, item_record
    from h5batch.manifest import Item

    label = name if label == "odd" else label  # a class name as odd as the paths
    stats = {"data/1.wav": (10, 123), f"label/{name}": None}
    for paths in ((), ("data/1.wav",), ("data/1.wav", f"label/{name}")):
        for values in ((), (name, 1.5, None)):
            it = Item(name, f"train{name}", paths, label, values)
            want = json.dumps([it.split, it.key, it.paths, it.label]).encode()
            if values:
                want += _VALUES_JSON.encode(values).encode()
            want += b"".join(repr(stats.get(p)).encode() for p in paths)
            assert item_record(it, tuple(stats.get(p) for p in paths)) == want


def test_items_taken_in_any_order_are_the_items_stored():
    """Items.take gathers the columns (keys and paths, stats, splits, labels, values) in the
    order given, a subset too; Items.key reads a key without making its item."""
    from h5batch.manifest import Item, Items

    stored = [Item(f"k{i}{ODD_NAMES[i % len(ODD_NAMES)]}", ("train", "test")[i % 2],
                   tuple(f"d{j}/{i}{ODD_NAMES[j]}" for j in range(i % 4)), (None, "cat", "dog")[i % 3],
                   (i, "v") if i % 5 == 0 else (), (),
                   tuple((i * 10 + j, i) if (i + j) % 3 else None for j in range(i % 4))) for i in range(40)]
    items = Items(stored)
    assert [items.key(i) for i in range(40)] == [it.key for it in stored]
    order = [37, 0, 5, 5, 12, 39, 2, 21]
    taken = items.take(order)
    assert list(taken) == [stored[i] for i in order]
    assert taken.num_paths() == sum(len(stored[i].paths) for i in order)
    assert list(items.take([])) == [] and items.labels(37) == {"cat", "dog"}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fields", [1, 2])
def test_builder_orders_keys_and_drops_duplicates_as_a_dict_of_every_key_would(tmp_path, seed, fields):
    """Builder.finish finds duplicate keys among items whose keys sort alike (``a1``, ``a01``,
    a key twice, in two splits): the manifest is the one a plain sort and a dict of every
    key give (one field: a shared key takes its file's extension first)."""
    import dataclasses

    from h5batch.layouts.base import Builder
    from h5batch.manifest import Item

    rng = random.Random(seed)
    more = {"other": {"type": "audio", "extensions": [".flac"]}} if fields == 2 else {}
    b = Builder(_job(tmp_path, {"layout": "class_folders"}, {"audio": AUDIO, **more}))
    found = []
    for i in range(60):
        key = rng.choice(["a1", "a01", "a001", "b2", "a10", "c"])
        split = rng.choice(["train", "test"])
        paths = (f"{split}/{i}/{key}{rng.choice(['.wav', '.WAV', '.ogg'])}",) + ((f"l/{i}.flac",) if fields == 2 else ())
        found.append(Item(key, split, paths, None, stats=tuple((i, j) for j in range(fields))))
        b.items.append(found[-1])
    m = b.finish(str(tmp_path), ["train", "test"])

    want = found
    if fields == 1:  # the rule of keys_with_extensions, written out
        n = {}
        for it in found:
            n[it.split, it.key] = n.get((it.split, it.key), 0) + 1
        if max(n.values()) > 1:
            want = [dataclasses.replace(it, key=it.key + "." + it.paths[0].rpartition(".")[2])
                    if n[it.split, it.key] > 1 else it for it in found]
    want = sorted(want, key=lambda it: (["train", "test"].index(it.split), natural_key(it.key)))
    kept, dropped = {}, []
    for it in want:
        (dropped if (it.split, it.key) in kept else kept.setdefault((it.split, it.key), [])).append(it)
    assert list(m.items) == [it for it in want if it not in dropped]
    assert sorted(r.path for r in m.rejects) == sorted(p for it in dropped for p in it.paths)
    assert all(r.reason.startswith("duplicate key") for r in m.rejects)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_inventory_keys_sort_as_python_sorts_the_first_paths(seed):
    """The inventory's keys, sorted from the manifest's buffer without a str per key, are
    the first paths in Python's order (stable), stored as keys_blob stores them: names past
    the fixed-width prefix, shared prefixes, non-ASCII and undecodable (surrogate-escaped)
    names, equal first paths."""
    from h5batch.inventory import _keys_blob, keys_blob
    from h5batch.manifest import SORT_PREFIX as PREFIX
    from h5batch.manifest import Item, Items, byte_order

    rng = random.Random(seed)
    parts = ["a", "b", "é", "日本", "\udcff", "z" * (PREFIX - 3), "ab", "a/b"]
    items = Items()
    firsts = []
    for i in range(400):
        first = "/".join(rng.choice(parts) for _ in range(rng.randint(1, 4)))
        firsts.append(first)
        items.append(Item(f"k{i}", "train", (first, f"other{i}.wav")[:rng.randint(1, 2)]), ())
    order = byte_order(*items.first_paths())[0]
    blob = _keys_blob(items, order)
    expected = sorted(range(len(firsts)), key=firsts.__getitem__)
    assert order.tolist() == expected
    assert blob.tobytes() == keys_blob([firsts[i] for i in expected]).tobytes()


@pytest.mark.parametrize("seed", range(4))
def test_byte_order_is_a_stable_sort_of_the_whole_bytes(seed):
    """byte_order, which sorts discovery's keys and the inventory's, gives Python's stable
    order of the byte strings and marks each string equal to the one before it: strings with
    NUL bytes (natural_key writes them), strings that are prefixes of others, strings equal
    in the fixed-width prefix and differing after it, the empty string, equal strings."""
    import numpy as np

    from h5batch.manifest import SORT_PREFIX, byte_order

    rng = random.Random(seed)
    alphabet = [b"\0", b"\1", b"\2", b"a", b"\xff"]
    stems = [b"", b"\0\1", b"x" * (SORT_PREFIX - 1), b"x" * SORT_PREFIX, b"x" * (SORT_PREFIX + 3)]
    strings = [rng.choice(stems) + b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
               for _ in range(500)]
    buf = np.frombuffer(b"".join(strings), dtype=np.uint8)
    hi = np.cumsum([len(x) for x in strings])
    order, same = byte_order(buf, np.concatenate([[0], hi[:-1]]), hi)
    expected = sorted(range(len(strings)), key=strings.__getitem__)
    assert order.tolist() == expected
    assert same.tolist() == [j > 0 and strings[expected[j]] == strings[expected[j - 1]] for j in range(len(expected))]
    assert same.sum() > 10 and not same.all()
