"""Incremental discovery (h5batch/layouts/incremental.py): after any change of the corpus it
gives what a full discovery gives (manifest hash, rejects, the whole inventory), or says why
it cannot and leaves the work to a full discovery.

In process and without conversions: the inventory is taken from a real discovery's manifest
(what the writer would store), the corpus is real files on disk (discovery reads no content).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from h5batch import inventory
from h5batch.config import job_from_dict
from h5batch.layouts import discover
from h5batch.layouts.incremental import rediscover
from h5batch.manifest import Reject

FSDD = r"(?P<label>\d)_(?P<speaker>[a-z]+)_(?P<index>\d+)\.(wav|flac)"


def _job(root: Path, source: dict, extensions=(".wav",)):
    return job_from_dict({
        "name": "t",
        "source": {"root": str(root), **source},
        "fields": {"audio": {"type": "audio", "extensions": list(extensions), "sample_rate": 8000}},
        "output": {"path": str(root.parent / "out.h5")},
    }, "job.yaml")


def _fsdd(root: Path, extensions=(".wav",)):
    for d in range(3):
        for i in range(7):
            _file(root / f"{d}_jackson_{i}.wav", d * 10 + i)
    (root / "README.txt").write_text("not a sample")  # a discovery reject, carried over
    return _job(root, {"layout": "pattern", "pattern": FSDD,
                       "split": {"group": "index", "ranges": {"test": [0, 1]}, "default": "train"},
                       "splits": ["train", "test"]}, extensions)


def _classes(root: Path):
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            for i in range(6):
                _file(root / split / c / f"{c}{i}.wav", i)
    _file(root / "train" / "stray.wav", 1)  # not inside a class folder: a reject
    return _job(root, {"layout": "class_folders"})


def _file(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * (100 + n))


def _store(f, keys: np.ndarray, stamps: np.ndarray, extra: dict) -> None:
    """``/inventory`` of an open writable file from the arrays, each stored whole: what the
    writer's blockwise :func:`inventory.store_sidecar` must give."""
    if inventory.GROUP in f:
        del f[inventory.GROUP]
    g = f.create_group(inventory.GROUP)
    g.create_dataset(inventory.KEY, data=keys)
    g.create_dataset(inventory.STAMP, data=np.asarray(stamps, dtype=np.int64))
    if extra:
        for k in inventory.EXTRA:
            g.create_dataset(k, data=extra[k])
        g.attrs["memo"] = extra["memo"]


def _memory(m) -> inventory.Memory:
    keys, stamps, extra = inventory.of_manifest(m)
    memo = json.loads(extra["memo"])
    return inventory.Memory(inventory.keys_of_blob(keys), stamps, extra["stat"], extra["order"], extra["record"], extra["record_end"],
                            memo["inputs"], memo["splits"], memo["plain"])


def _assert_same_as_full(job, r) -> None:
    assert not isinstance(r, str), r
    full = discover(job)
    assert r.manifest.hash == full.hash
    assert r.manifest.rejects == full.rejects
    assert r.items == len(full.items)
    keys, stamps, extra = inventory.of_manifest(full)
    got_keys, got_stamps, got = r.inventory
    assert got_keys == inventory.keys_of_blob(keys) and got_stamps.tolist() == stamps.tolist()
    for k in inventory.EXTRA:
        assert np.array_equal(got[k], extra[k]), k
    assert got["memo"] == extra["memo"]


def _bump(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"more")  # another size
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))


def test_pattern_add_change_remove_reject_new_label(tmp_path):
    root = tmp_path / "c"
    job = _fsdd(root)
    m0 = discover(job)
    for name in ("7_theo_0.wav", "1_theo_12.wav", "0_jackson_100.wav", "2_jackson_10.wav"):
        _file(root / name, 5)  # a new label (7), new ones in both splits, sorted among the old
    _file(root / "nope.wav", 3)  # a new discovery reject
    _bump(root / "1_jackson_3.wav")
    (root / "2_jackson_6.wav").unlink()
    for i in range(7):
        (root / f"0_jackson_{i}.wav").unlink() if i != 0 else None
    r = rediscover(job, _memory(m0), m0.rejects)
    _assert_same_as_full(job, r)
    assert r.changed == ["1_jackson_3.wav"]
    assert sorted(r.removed) == sorted(["2_jackson_6.wav"] + [f"0_jackson_{i}.wav" for i in range(1, 7)])
    assert sorted(it.paths[0] for it in r.manifest.items) == sorted(
        ["7_theo_0.wav", "1_theo_12.wav", "0_jackson_100.wav", "2_jackson_10.wav", "1_jackson_3.wav"])


def test_names_with_escapes_and_non_ascii_are_placed_and_matched(tmp_path):
    """Stored records whose key JSON escapes (a quote, a backslash, non-ASCII) are decoded the
    slow way during the bisection; the keys' bytes (inventory version 3) match them back."""
    root = tmp_path / "c"
    folders = {"cat": ['c"1', "c\\2", "c3", "c\u00e94", "c\u00e95", "c6"], "dog": ["d1", "d\u00fc2", "d3"]}
    for c, names in folders.items():
        for i, n in enumerate(names):
            _file(root / "train" / c / f"{n}.wav", i)
    job = _job(root, {"layout": "class_folders"})
    m0 = discover(job)
    for n in ('c"0', "c\u00e93", "c\u00e96", "c7", "d\u00fc1", "d\u00fc3"):
        _file(root / "train" / ("cat" if n[0] == "c" else "dog") / f"{n}.wav", 9)
    _bump(root / "train" / "cat" / "c\u00e94.wav")
    (root / "train" / "dog" / "d\u00fc2.wav").unlink()
    r = rediscover(job, _memory(m0), m0.rejects)
    _assert_same_as_full(job, r)
    assert r.changed == ["train/cat/c\u00e94.wav"] and r.removed == ["train/dog/d\u00fc2.wav"]
    keys = r.inventory[0]
    assert inventory.keys_of_blob(inventory.keys_blob(keys)) == keys


def test_memory_find_matches_any_key_and_only_keys():
    keys = sorted(["a", "a/b", "ab", "b\u00e9", "z" * 300, "\udcff-undecodable", "b\udc80", "c"])  # (bytes sort it elsewhere)
    n = len(keys)
    mem = inventory.Memory(keys, np.zeros(n, dtype=np.int64), np.zeros((n, 2), dtype=np.int64), np.arange(n),
                           np.zeros(0, dtype=np.uint8), np.zeros(n, dtype=np.int64), [], ["train"], True)
    wanted = ["c", "x", "a/b", "\udcff-undecodable", "b\u00e9", "", "z" * 300, "a", "b", "b\udc80"]
    assert mem.find(wanted).tolist() == [keys.index(w) if w in keys else -1 for w in wanted]
    assert mem.find([]).tolist() == []


def test_class_folders_new_class_and_nothing_changed(tmp_path):
    root = tmp_path / "c"
    job = _classes(root)
    m0 = discover(job)
    same = rediscover(job, _memory(m0), m0.rejects)
    _assert_same_as_full(job, same)
    assert same.manifest.hash == m0.hash and not same.manifest.items and not same.removed
    _file(root / "train" / "owl" / "o1.wav", 1)
    _file(root / "test" / "cat" / "cat10.wav", 1)
    _file(root / "test" / "readme.md", 1)  # outside a class folder
    (root / "test" / "dog" / "dog2.wav").unlink()
    _bump(root / "train" / "cat" / "cat0.wav")
    r = rediscover(job, _memory(m0), m0.rejects)
    _assert_same_as_full(job, r)
    assert r.changed == ["train/cat/cat0.wav"] and r.removed == ["test/dog/dog2.wav"]


def test_what_the_fast_path_cannot_vouch_for_falls_back(tmp_path):
    root = tmp_path / "c"
    job = _fsdd(root, extensions=(".wav", ".flac"))
    m0 = discover(job)
    mem = _memory(m0)
    # A second file of one stem: the keys take their extensions, which depends on both files.
    _file(root / "1_jackson_2.flac", 1)
    assert "1_jackson_2.flac clashes with another item's" in rediscover(job, mem, m0.rejects)
    m1 = discover(job)
    assert "depended on each other" in rediscover(job, _memory(m1), m1.rejects)
    (root / "1_jackson_2.flac").unlink()
    # A symlink in the corpus.
    os.symlink(root / "0_jackson_1.wav", root / "0_jackson_50.wav")
    assert rediscover(job, mem, m0.rejects) == "the corpus has symlinks"
    (root / "0_jackson_50.wav").unlink()
    _assert_same_as_full(job, rediscover(job, mem, m0.rejects))


def test_an_edited_split_list_falls_back(tmp_path):
    root = tmp_path / "c"
    for i in range(6):
        _file(root / "a" / f"{i}.wav", i)
    (root / "test.txt").write_text("a/0.wav\na/1.wav\n")
    job = _job(root, {"layout": "pattern", "pattern": r"a/(?P<n>\d+)\.wav",
                      "split": {"lists": {"test": "test.txt"}, "default": "train"}})
    m0 = discover(job)
    mem = _memory(m0)
    _file(root / "a" / "9.wav", 9)  # the list did not change: incremental
    _assert_same_as_full(job, rediscover(job, mem, m0.rejects))
    (root / "test.txt").write_text("a/0.wav\na/1.wav\na/9.wav\n")
    assert rediscover(job, mem, m0.rejects) == "annotation file test.txt changed"


def test_a_job_the_layout_cannot_rediscover_says_why(tmp_path):
    root = tmp_path / "c"
    _file(root / "train" / "cat" / "1.wav", 1)
    _file(root / "train" / "cat" / "1.png", 1)
    job = job_from_dict({
        "name": "t", "source": {"root": str(root), "layout": "class_folders"},
        "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": 8000},
                   "image": {"type": "image", "extensions": [".png"]}},
        "output": {"path": str(tmp_path / "out.h5")}}, "job.yaml")
    m0 = discover(job)
    assert rediscover(job, _memory(m0), m0.rejects) == "class_folders with several fields pairs files by stem"


def test_a_walk_reject_that_became_readable_becomes_an_item(tmp_path):
    """A file the last walk could not stat (its reject says so) and that is readable now is
    built, as a full discovery builds it; a path reject (not a match) is still carried."""
    root = tmp_path / "c"
    job = _fsdd(root)
    m0 = discover(job)
    _file(root / "1_jackson_9.wav", 4)  # not there for m0's walk: as if its stat had failed
    _file(root / "2_jackson_9.wav", 4)  # the same, a regular file now where a FIFO was
    was = [Reject("1_jackson_9.wav", "discover", "cannot stat: Permission denied"),
           Reject("2_jackson_9.wav", "discover", "not a regular file")]
    r = rediscover(job, _memory(m0), sorted(m0.rejects + was, key=lambda x: x.path))
    _assert_same_as_full(job, r)
    assert sorted(it.paths[0] for it in r.manifest.items) == ["1_jackson_9.wav", "2_jackson_9.wav"]
    assert [x.path for x in r.manifest.rejects] == ["README.txt"]


def test_rejects_whose_names_tie_in_natural_order_hash_alike_in_any_order(tmp_path):
    """"x01.txt" and "x1.txt" have one natural key: the path breaks the tie, so a sync that
    finds them in another order than the walk gets the full discovery's hash."""
    root = tmp_path / "c"
    job = _fsdd(root)
    for name in ("x1.txt", "x01.txt", "x001.txt"):
        (root / name).write_text("no sample")
    m0 = discover(job)
    for name in ("x01.txt", "x1.txt", "x001.txt"):  # change their state and order
        (root / name).unlink()
        (root / name).write_text("no sample, written again")
    _file(root / "1_theo_12.wav", 5)
    r = rediscover(job, _memory(m0), list(reversed(m0.rejects)))
    _assert_same_as_full(job, r)


def test_a_column_rule_on_a_pattern_group_keeps_the_fast_path_with_nothing_new(tmp_path):
    """A split taken from a pattern group (``split.column``) and no new file: nothing to
    check the column against, and no fall-back (it said "no column 'fold'")."""
    root = tmp_path / "c"
    for fold in ("train", "test"):
        for i in range(3):
            _file(root / f"{fold}_{i}.wav", i)
    job = _job(root, {"layout": "pattern", "pattern": r"(?P<fold>train|test)_(?P<index>\d+)\.wav",
                      "split": {"column": "fold"}, "splits": ["train", "test"]})
    m0 = discover(job)
    r = rediscover(job, _memory(m0), m0.rejects)
    assert not isinstance(r, str), r
    _assert_same_as_full(job, r)


def test_an_unreadable_inventory_is_a_reason_not_a_traceback(tmp_path):
    """A corrupt memo or arrays that disagree make ``inventory.memory`` say why (a sync then
    runs a full discovery, which rewrites the inventory); an intact one reads back."""
    import h5py

    root = tmp_path / "c"
    m = discover(_fsdd(root))
    keys, stamps, extra = inventory.of_manifest(m)
    path = tmp_path / "o.h5"
    with h5py.File(path, "w") as f:
        _store(f, keys, stamps, extra)
    with h5py.File(path, "r") as f:
        mem = inventory.memory(f)
        assert isinstance(mem, inventory.Memory) and mem.keys == sorted(mem.keys) and len(mem.keys) == len(m.items)
    for damage, reason in (("memo", "unreadable (Expecting"), ("memo-list", "not a JSON object"),
                           ("order", "rows"), ("record", "bytes")):
        with h5py.File(path, "r+") as f:
            g = f[inventory.GROUP]
            if damage == "memo":
                g.attrs["memo"] = '{"version": 3, "inputs": ['
            elif damage == "memo-list":
                g.attrs["memo"] = "[3]"
            else:
                old = g[damage][...]
                del g[damage]
                g.create_dataset(damage, data=old[:-1])
        with h5py.File(path, "r") as f:
            got = inventory.memory(f)
        assert isinstance(got, str) and got.startswith("the output's inventory is unreadable") and reason in got, got
        with h5py.File(path, "r+") as f:  # put the intact inventory back for the next damage
            _store(f, keys, stamps, extra)


def test_the_sidecar_stored_in_blocks_is_the_inventory(tmp_path, monkeypatch):
    """The writer stores the driver's sidecar block by block (a few rows at a time here): the
    same datasets, dtypes, values and memo as the arrays stored whole; a file that is not a
    sidecar is an error naming it."""
    import h5py

    m = discover(_fsdd(tmp_path / "c"))
    keys, stamps, extra = inventory.of_manifest(m)
    monkeypatch.setattr(inventory, "BLOCK", 40)
    for ex in (extra, {}):
        side = inventory.write_arrays(str(tmp_path / "o.h5.partial"), keys, stamps, ex)
        with h5py.File(tmp_path / "a.h5", "w") as a, h5py.File(tmp_path / "b.h5", "w") as b:
            inventory.store_sidecar(a, side)
            _store(b, keys, stamps, ex)
            ga, gb = a[inventory.GROUP], b[inventory.GROUP]
            assert sorted(ga) == sorted(gb) == sorted([inventory.KEY, inventory.STAMP, *(inventory.EXTRA if ex else ())])
            for k in ga:
                assert ga[k].dtype == gb[k].dtype and np.array_equal(ga[k][...], gb[k][...]), k
            assert dict(ga.attrs) == dict(gb.attrs)
    with open(side, "ab") as fh:
        np.save(fh, np.zeros(3))
    with h5py.File(tmp_path / "c.h5", "w") as f, pytest.raises(ValueError, match="not an inventory sidecar"):
        inventory.store_sidecar(f, side)
