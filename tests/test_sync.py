"""``h5batch sync``: a finished output brought up to date with a corpus that grew, changed
and shrank equals a fresh conversion of the corpus as it is now (what the reader yields:
data, labels by name, splits), crash-safe, and at the cost of the change.

Real files, real conversions in subprocesses, real kill -9 of the process group.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import textwrap
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import inventory
from h5batch.config import load_job
from h5batch.conversion.options import ConvertOptions
from h5batch.conversion.pipeline import convert as convert_in_process
from h5batch.torch import H5Dataset
from tests.conftest import REPO
from tests.support.h5compare import assert_same_h5
from tests.support.processes import kill_group, wait_for
from tests.support.replicas import make_speech_commands
from tests.support.run import convert, h5batch_cmd, run_h5batch, start

RATE = 8000


def _wav(path: Path, seed: int, frames: int | None = None) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = frames or 600 + (seed * 37) % 900
    sf.write(path, (rng.standard_normal(n) * 3000).astype(np.int16), RATE, subtype="PCM_16")


def _class_job(tmp: Path, root: Path, out: Path, kind: str = "local") -> Path:
    job = tmp / "job.yaml"
    job.write_text(textwrap.dedent(f"""\
        name: sync-classes
        source: {{root: {root}, layout: class_folders}}
        fields:
          audio: {{type: audio, extensions: [.wav], sample_rate: {RATE}, dtype: int16}}
        output: {{path: {out}, codec: auto}}
        cluster: {{kind: {kind}, workers: 1}}
        """))
    return job


def _fsdd_job(tmp: Path, root: Path, out: Path, kind: str = "local") -> Path:
    job = tmp / "fsdd.yaml"
    job.write_text(textwrap.dedent(f"""\
        name: sync-fsdd
        source:
          root: {root}
          layout: pattern
          pattern: '(?P<label>\\d)_(?P<speaker>[a-z]+)_(?P<index>\\d+)\\.wav'
          split: {{group: index, ranges: {{test: [0, 4]}}, default: train}}
          splits: [train, test]
        fields:
          audio: {{type: audio, extensions: [.wav], sample_rate: {RATE}, dtype: int16}}
        output: {{path: {out}, codec: none}}
        cluster: {{kind: {kind}, workers: 1}}
        """))
    return job


def _class_corpus(root: Path) -> None:
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            for i in range(12):
                _wav(root / split / c / f"{c}{i}.wav", seed=zlib.crc32(f"{split}/{c}/{i}".encode()) % 10_000)


def _yielded(path: Path) -> dict[str, dict[str, tuple[bytes, str]]]:
    """split -> source path -> (sample bytes, label name), as H5Dataset yields them."""
    out: dict[str, dict[str, tuple[bytes, str]]] = {}
    with h5py.File(path, "r") as f:
        splits = json.loads(f.attrs["splits"])
    for split in splits:
        ds = H5Dataset(str(path), split, with_source=True)
        got = {}
        for i in range(len(ds)):
            s = ds[i]
            label = ds.class_names[int(s["label"])] if ds.class_names else ""
            got[str(s["source"])] = (s["audio"].numpy().tobytes(), label)
        out[split] = got
    return out


def _rejects(path: Path) -> set[tuple[str, str]]:
    lines = Path(str(path).removesuffix(".h5") + ".rejects.jsonl").read_text().splitlines()
    return {(r["path"], r["stage"]) for r in map(json.loads, lines)}


def _fresh(job: Path, root: Path, tmp: Path, name: str) -> Path:
    out = tmp / name
    convert(job, output=out, check=True)
    return out


def _sync(job: Path, *extra: str, **kw):
    return run_h5batch("sync", str(job), "--progress", "none", *extra, **kw)


def _memory(path: Path) -> dict:
    """The manifest hash and the whole inventory (h5batch.inventory, version 3)."""
    with h5py.File(path, "r") as f:
        g = f["inventory"]
        out = {k: (g[k].asstr()[...].tolist() if g[k].dtype.kind == "O" else g[k][...].tolist()) for k in g}
        return {**out, "memo": json.loads(g.attrs["memo"]), "manifest_hash": f.attrs["manifest_hash"]}


def _same_as_fresh(job: Path, out: Path, root: Path, tmp: Path) -> None:
    fresh = _fresh(job, root, tmp, "fresh.h5")
    assert _yielded(out) == _yielded(fresh)
    assert _rejects(out) == _rejects(fresh)
    # What discovery saw, too: a later sync (or convert) finds the synced file up to date.
    assert _memory(out) == _memory(fresh)
    res = run_h5batch("verify", str(out), "--sources")
    assert res.returncode == 0, res.stderr + res.stdout


def test_sync_class_folders_equals_a_fresh_conversion(tmp_path):
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    (root / "train" / "cat" / "broken.wav").write_bytes(b"RIFF....WAVEjunk")  # a reject that gets fixed later
    job = _class_job(tmp_path, root, out)
    convert(job, check=True)
    before = _yielded(out)
    old_names = list(H5Dataset(str(out), "train").class_names)
    # The corpus moves on: new files (one of a new class, one broken), a changed file, a
    # removed file, a fixed reject.
    _wav(root / "train" / "bird" / "b1.wav", seed=901)
    _wav(root / "train" / "bird" / "b2.wav", seed=902)
    _wav(root / "test" / "dog" / "dog20.wav", seed=903)
    (root / "test" / "cat" / "junk.wav").write_bytes(b"not audio")
    time.sleep(0.01)
    _wav(root / "train" / "dog" / "dog3.wav", seed=904, frames=1777)
    os.remove(root / "train" / "cat" / "cat5.wav")
    _wav(root / "train" / "cat" / "broken.wav", seed=905)

    res = convert(job)
    assert res.returncode == 2 and "h5batch sync" in res.stderr, res.stderr
    # Found by the stat pass against the inventory (no full discovery), and said in figures;
    # broken.wav, a reject before, counts as new.
    assert "earlier state of the corpus (5 new, 1 changed, 1 removed files)" in res.stderr, res.stderr

    # A dry run names what a sync would do and writes nothing.
    digest, mtime = hashlib.sha256(out.read_bytes()).hexdigest(), out.stat().st_mtime_ns
    rejects_file = Path(str(out).removesuffix(".h5") + ".rejects.jsonl")
    rejects_before = rejects_file.read_bytes()
    res = _sync(job, "--dry-run", "--json")
    assert res.returncode == 0, res.stderr
    dry = json.loads(res.stdout)
    assert dry["dry_run"] and "dry run: nothing written" in res.stderr
    assert sorted(dry["paths"]["new"]) == ["test/cat/junk.wav", "test/dog/dog20.wav", "train/bird/b1.wav",
                                           "train/bird/b2.wav", "train/cat/broken.wav"]
    assert dry["paths"]["changed"] == ["train/dog/dog3.wav"] and dry["paths"]["removed"] == ["train/cat/cat5.wav"]
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest and out.stat().st_mtime_ns == mtime
    assert rejects_file.read_bytes() == rejects_before

    res = _sync(job, "--json")
    assert res.returncode == 0, res.stderr
    assert "full discovery" not in res.stderr  # incremental: built items for the 6 new and changed files only
    s = json.loads(res.stdout)
    assert (s["new"], s["changed"], s["removed"]) == (5, 1, 1), s  # broken.wav, a reject before, counts as new
    # junk.wav is new but fails to decode: the dry run counted it in, the sync rejects it
    assert {k: v for k, v in dry["counts"].items()} == {k: s["counts"][k] + (k == "test") for k in s["counts"]}
    assert s["in_place"] and not s["up_to_date"]
    after = _yielded(out)
    # Old class numbers kept, the new class appended.
    names = list(H5Dataset(str(out), "train").class_names)
    assert names[: len(old_names)] == old_names and names[len(old_names):] == ["bird"]
    assert "train/cat/cat5.wav" not in after["train"] and "train/cat/cat5.wav" in before["train"]
    assert after["train"]["train/dog/dog3.wav"] != before["train"]["train/dog/dog3.wav"]
    assert after["test"]["test/cat/cat0.wav"] == before["test"]["test/cat/cat0.wav"]
    _same_as_fresh(job, out, root, tmp_path)
    # Nothing changed since: nothing to do, and the file is untouched.
    mtime = out.stat().st_mtime_ns
    res = _sync(job, "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["up_to_date"], res.stderr
    assert out.stat().st_mtime_ns == mtime
    # `convert` of the same job says the synced output is complete, with the samples the
    # reader yields (not the rows: two are tombstoned), and the file untouched...
    res = convert(job, "--json")
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert again["already_complete"] and again["counts"] == {s: len(H5Dataset(str(out), s)) for s in ("test", "train")}
    assert "already complete" in res.stderr and out.stat().st_mtime_ns == mtime
    # ... from the stat pass against its inventory, without a full discovery.
    summary = convert_in_process(load_job(job), ConvertOptions(progress=False, log=io.StringIO()))
    assert summary.extra == {"already_complete": True, "checked": "inventory"}
    assert summary.counts == again["counts"] and out.stat().st_mtime_ns == mtime


def test_sync_fsdd_like_keeps_splits_and_rows(tmp_path):
    root, out = tmp_path / "fsdd", tmp_path / "out.h5"
    for digit in range(3):
        for speaker in ("jackson", "nicolas"):
            for index in range(8):
                _wav(root / f"{digit}_{speaker}_{index}.wav", seed=digit * 100 + index + len(speaker))
    job = _fsdd_job(tmp_path, root, out)
    convert(job, check=True)
    with h5py.File(out, "r") as f:
        old_train = f["train/source"].asstr()[...].tolist()
    for index in range(8):  # a new speaker, both splits
        _wav(root / f"1_theo_{index}.wav", seed=500 + index)
    _wav(root / "9_jackson_2.wav", seed=600)  # a new digit
    os.remove(root / "0_nicolas_6.wav")
    _wav(root / "2_jackson_7.wav", seed=700, frames=2222)
    res = _sync(job, "--json")
    assert res.returncode == 0, res.stderr
    assert "full discovery" not in res.stderr
    s = json.loads(res.stdout)
    assert (s["new"], s["changed"], s["removed"]) == (9, 1, 1), s
    with h5py.File(out, "r") as f:
        # Rows never move: the old rows are where they were, new ones come after them.
        assert f["train/source"].asstr()[: len(old_train)].tolist() == old_train
        dead = f["train/tombstones"][...].tolist()
        assert dead == sorted([old_train.index("0_nicolas_6.wav"), old_train.index("2_jackson_7.wav")])
        assert len(inventory.load(f)) == len(list(root.iterdir()))
    ds = H5Dataset(str(out), "train")
    assert len(ds) == len(old_train) - 1 + 3  # one removed; theo_5..7 are train (0..4: test)
    _same_as_fresh(job, out, root, tmp_path)


def _as_version_1(path: Path) -> None:
    """Make ``path``'s inventory what h5batch wrote before incremental discovery."""
    with h5py.File(path, "r+") as f:
        g = f["inventory"]
        for k in ("stat", "order", "record", "record_end"):
            del g[k]
        del g.attrs["memo"]


@pytest.mark.parametrize("layout", ["class_folders", "pattern"])
def test_incremental_and_full_discovery_sync_to_the_same_file(tmp_path, layout):
    """One output, synced twice with the same change: incrementally, and through a full
    discovery (its copy's inventory made version 1, which forces it). Same samples, rejects,
    manifest hash and inventory; the full sync upgrades the inventory, so the next is fast."""
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    if layout == "class_folders":
        _class_corpus(root)
        job = _class_job(tmp_path, root, out, kind="auto")
        new = [root / "train" / "owl" / "o1.wav", root / "test" / "cat" / "cat40.wav", root / "test" / "cat" / "cat3.wav"]
        unknown, gone, edit = root / "train" / "cat" / "notes.txt", root / "test" / "dog" / "dog4.wav", root / "train" / "dog" / "dog7.wav"
    else:
        for d in range(3):
            for speaker in ("jackson", "nicolas"):
                for index in range(6):
                    _wav(root / f"{d}_{speaker}_{index}.wav", seed=d * 10 + index + len(speaker))
        job = _fsdd_job(tmp_path, root, out, kind="auto")
        new = [root / "7_theo_1.wav", root / "1_theo_9.wav", root / "0_jackson_33.wav"]
        unknown, gone, edit = root / "x_not_a_match.wav", root / "2_jackson_3.wav", root / "1_jackson_5.wav"
    unknown.write_bytes(b"a discovery reject")
    convert(job, check=True)
    full = tmp_path / "full.h5"
    shutil.copyfile(out, full)
    shutil.copyfile(tmp_path / "out.rejects.jsonl", tmp_path / "full.rejects.jsonl")
    _as_version_1(full)
    for i, p in enumerate(new):
        if p.exists():
            p.unlink()  # (cat3 is there already: removed and added back, another file)
        _wav(p, seed=3000 + i, frames=1234 + i)
    _wav(edit, seed=3100, frames=999)
    gone.unlink()
    (root / "new_junk.txt" if layout == "pattern" else root / "test" / "dog" / "junk.txt").write_text("x")

    fast = _sync(job, "--json")
    slow = _sync(job, "--json", "--output", str(full))
    assert fast.returncode == 0 and slow.returncode == 0, fast.stderr + slow.stderr
    assert "full discovery" not in fast.stderr
    assert "sync: full discovery (the output's inventory predates incremental discovery" in slow.stderr
    counts = [tuple(json.loads(r.stdout)[k] for k in ("new", "changed", "removed", "unchanged")) for r in (fast, slow)]
    assert counts[0] == counts[1] and counts[0][:3] == ((2, 2, 1) if layout == "class_folders" else (3, 1, 1)), counts
    assert _yielded(out) == _yielded(full)
    assert _rejects(out) == _rejects(full)
    assert _memory(out) == _memory(full)
    _same_as_fresh(job, out, root, tmp_path)
    # The full sync wrote the new inventory: the next sync of that file is incremental.
    _wav(new[0].with_name("late.wav" if layout == "class_folders" else "4_theo_7.wav"), seed=3200)
    res = _sync(job, "--json", "--output", str(full))
    assert res.returncode == 0 and "full discovery" not in res.stderr, res.stderr
    assert json.loads(res.stdout)["new"] == 1


def test_sync_speech_commands_with_a_speaker_field_is_incremental(tmp_path):
    """jobs/speech_commands.yaml (a speaker category from the path, split lists,
    _background_noise_ excluded) on a miniature replica: a value field no longer forces a
    full discovery. The new samples' speakers are appended to the output's categories (old
    codes kept), and the output yields what a fresh conversion yields, speakers by name."""
    root, out = tmp_path / "sc", tmp_path / "out.h5"
    make_speech_commands(root)
    job = REPO / "jobs" / "speech_commands.yaml"
    where = ("--set", f"source.root={root}", "--output", str(out))
    convert(job, "--set", f"source.root={root}", output=out, check=True)
    old = _speakers(out)
    for i, rel in enumerate(["yes/00000000_nohash_0.wav",  # a new speaker that sorts first
                             "go/0a7c2a8d_nohash_0.wav",  # a new word, an old speaker
                             "up/1b4c9b89_nohash_1.wav"]):  # changed (another length)
        (root / rel).parent.mkdir(exist_ok=True)
        sf.write(root / rel, (np.sin(np.arange(4000 + 500 * i) / (3 + i)) * 9000).astype(np.int16), 16000)
    (root / "no/c50f55b8_nohash_0.wav").unlink()
    res = _sync(job, *where, "--json")
    assert res.returncode == 0, res.stderr
    assert "full discovery" not in res.stderr, res.stderr
    s = json.loads(res.stdout)
    assert (s["new"], s["changed"], s["removed"]) == (2, 1, 1), s
    now = _speakers(out)
    assert now["categories"][:len(old["categories"])] == old["categories"]
    assert now["categories"][len(old["categories"]):] == ["00000000"]
    assert now["by_source"]["train"]["yes/00000000_nohash_0.wav"] == "00000000"
    fresh = tmp_path / "fresh.h5"
    convert(job, "--set", f"source.root={root}", output=fresh, check=True)
    assert _speakers(fresh)["categories"][0] == "00000000"  # a fresh conversion sorts them
    assert now["by_source"] == _speakers(fresh)["by_source"]
    assert _yielded(out) == _yielded(fresh)
    assert _rejects(out) == _rejects(fresh)
    assert _memory(out)["manifest_hash"] == _memory(fresh)["manifest_hash"]


def _speakers(path: Path) -> dict:
    """The speaker field's categories, and per split each live sample's speaker by name."""
    by_source = {}
    with h5py.File(path, "r") as f:
        splits = json.loads(f.attrs["splits"])
        cats = next(list(f[s]["speaker"].attrs["categories"]) for s in splits if s in f and "speaker" in f[s])
    cats = [c.decode() if isinstance(c, bytes) else str(c) for c in cats]
    for split in splits:
        ds = H5Dataset(str(path), split, with_source=True)
        by_source[split] = {str(ds[i]["source"]): cats[int(ds[i]["speaker"])] for i in range(len(ds))}
    return {"categories": cats, "by_source": by_source}


def test_an_edited_table_forces_a_full_discovery_and_is_picked_up(tmp_path):
    """ESC-50 style: labels from a table. A new file whose row was already there syncs
    incrementally; an edited table (a relabelled file) makes the sync discover everything."""
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    table = root / "meta" / "labels.csv"
    table.parent.mkdir(parents=True)
    rows = [f"c{i}.wav,{'dog' if i % 2 else 'cat'}" for i in range(10)]
    table.write_text("filename,category\n" + "\n".join(rows) + "\n")
    for i in range(8):
        _wav(root / "audio" / f"c{i}.wav", seed=40 + i)
    job = tmp_path / "esc.yaml"
    job.write_text(textwrap.dedent(f"""\
        name: sync-table
        source:
          root: {root}
          layout: pattern
          pattern: 'audio/(?P<clip>[^/]+)\\.wav'
          tables: [{{path: meta/labels.csv, key: filename}}]
          label_column: category
        fields:
          audio: {{type: audio, extensions: [.wav], sample_rate: {RATE}, dtype: int16}}
        output: {{path: {out}, codec: none}}
        cluster: {{kind: auto, workers: 1}}
        """))
    convert(job, check=True)
    _wav(root / "audio" / "c8.wav", seed=48)
    res = _sync(job, "--json")
    assert res.returncode == 0 and "full discovery" not in res.stderr, res.stderr
    assert json.loads(res.stdout)["new"] == 1
    time.sleep(0.01)
    table.write_text(table.read_text().replace("c2.wav,cat", "c2.wav,bird"))
    res = _sync(job, "--json")
    assert res.returncode == 0, res.stderr
    assert "sync: full discovery (annotation file meta/labels.csv changed)" in res.stderr
    assert json.loads(res.stdout)["changed"] == 1
    (split,) = _yielded(out).values()
    assert split["audio/c2.wav"][1] == "bird" and split["audio/c8.wav"][1] == "cat"
    _same_as_fresh(job, out, root, tmp_path)


def test_removed_only_sync_needs_no_workers(tmp_path):
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    convert(job, check=True)
    res = run_h5batch("view", "add", str(out), "dogs", "--split", "test", "--where", 'label == "dog"')
    assert res.returncode == 0, res.stderr
    os.remove(root / "test" / "dog" / "dog1.wav")
    res = _sync(job, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["removed"] == 1
    assert "decoding on" not in res.stderr  # nothing to decode: no engine started
    assert len(H5Dataset(str(out), "test")) == 23
    res = run_h5batch("inspect", str(out))
    assert "[test] 23 samples (+ 1 rows removed by sync" in res.stdout + res.stderr
    # Views and loaders skip the tombstoned row; the view's other rows stay where they were.
    dogs = H5Dataset(str(out), "test", view="dogs", with_source=True)
    assert len(dogs) == 11
    for workers in (0, 2):
        seen = [src for b in dogs.loader(batch_size=4, num_workers=workers) for src in b["source"]]
        assert sorted(seen) == sorted(f"test/dog/dog{i}.wav" for i in range(12) if i != 1)
    _same_as_fresh(job, out, root, tmp_path)


def _grow(root: Path) -> None:
    for i in range(40):  # several batches of new files
        _wav(root / "train" / ("cat" if i % 2 else "owl") / f"new{i}.wav", seed=2000 + i)
    os.remove(root / "train" / "dog" / "dog2.wav")
    _wav(root / "test" / "cat" / "cat1.wav", seed=2999, frames=1500)


def _kill_9_sync_at(job: Path, out: Path, point: str) -> None:
    """A sync of ``job`` stopped at the writer's pause ``point`` and its process group
    killed (kill -9): the output is left half-synced, with its undo journal."""
    proc = start(h5batch_cmd("sync", str(job), "--progress", "none", "--set", "cluster.batch_size=8"),
                 env_extra={"H5BATCH_FAULTS": f"pause_at={point}"}, new_session=True)
    wait_for(Path(str(out) + ".paused"), proc)
    assert Path(str(out) + ".sync-journal").exists()  # in place, with its undo journal
    kill_group(proc)
    os.unlink(str(out) + ".paused")


@pytest.mark.parametrize("point", ["store:1", "finalize"])
def test_kill_9_inside_sync_then_rerun_equals_an_uninterrupted_sync(tmp_path, point):
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    convert(job, "--set", "cluster.batch_size=8", check=True)
    original = out.read_bytes()
    _grow(root)
    # The reference: an uninterrupted sync of a copy of the same output.
    ref = tmp_path / "ref.h5"
    shutil.copyfile(out, ref)
    shutil.copyfile(str(out).removesuffix(".h5") + ".rejects.jsonl", tmp_path / "ref.rejects.jsonl")
    res = _sync(job, "--output", str(ref), "--set", "cluster.batch_size=8")
    assert res.returncode == 0, res.stderr

    _kill_9_sync_at(job, out, point)
    # The half-synced file is not handed to a reader.
    with pytest.raises(OSError, match="sync"):
        H5Dataset(str(out), "train")
    res = _sync(job, "--set", "cluster.batch_size=8")
    assert res.returncode == 0, res.stderr
    assert "undid an interrupted sync" in res.stderr
    assert not Path(str(out) + ".sync-journal").exists()
    assert_same_h5(out, ref)
    assert _yielded(out) == _yielded(ref)
    assert out.read_bytes() != original


def test_a_view_added_after_a_killed_sync_undoes_the_sync_first(tmp_path):
    """``h5batch view`` replaces the output by an edited copy (tools/replace.py): a
    half-synced file must not be copied, or the journal the killed sync left would later be
    rolled back onto the copy. The view command undoes the sync first, as a sync would."""
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    convert(job, "--set", "cluster.batch_size=8", check=True)
    before = _yielded(out)
    _grow(root)
    _kill_9_sync_at(job, out, "store:1")
    res = run_h5batch("view", "add", str(out), "dogs", "--split", "test", "--where", 'label == "dog"')
    assert res.returncode == 0, res.stderr
    assert not Path(str(out) + ".sync-journal").exists()
    assert _yielded(out) == before  # the samples of before the sync, and the view
    assert len(H5Dataset(str(out), "test", view="dogs")) == 12
    res = _sync(job, "--set", "cluster.batch_size=8")
    assert res.returncode == 0, res.stderr
    _same_as_fresh(job, out, root, tmp_path)


def test_a_reader_holding_the_file_gets_a_copy_synced(tmp_path):
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    convert(job, check=True)
    _wav(root / "train" / "cat" / "late.wav", seed=77)
    reader = h5py.File(out, "r")  # holds HDF5's shared lock, as a training job's reader does
    try:
        n_before = reader["train/source"].shape[0]
        res = _sync(job, "--json")
        assert res.returncode == 0, res.stderr
        assert not json.loads(res.stdout)["in_place"]
        assert reader["train/source"].shape[0] == n_before  # the open file is the old one, intact
    finally:
        reader.close()
    assert "train/cat/late.wav" in _yielded(out)["train"]
    assert not Path(str(out) + ".sync-copy").exists()


def test_sync_refuses_another_job_and_a_missing_output(tmp_path):
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    res = _sync(job)
    assert res.returncode == 2 and "does not exist" in res.stderr and "convert" in res.stderr
    convert(job, check=True)
    res = _sync(job, "--set", "fields.audio.sample_rate=16000")
    assert res.returncode == 2 and "different job" in res.stderr, res.stderr


def test_a_sync_over_the_reject_limit_counts_the_whole_corpus(tmp_path):
    """The writer judges max_reject_fraction against every input of the corpus; the message
    says the same N (not only the files this sync decoded), and the sync is undone."""
    root = tmp_path / "corpus"
    _class_corpus(root)
    out = tmp_path / "out.h5"
    job = _class_job(tmp_path, root, out)
    convert(job, check=True)
    before = out.read_bytes()
    for i in range(4):  # 4 unreadable files of 52: 7.7 %, above the default 5 %
        (root / "train" / "cat" / f"broken{i}.wav").write_bytes(b"not a wav file" * (i + 1))
    r = _sync(job)
    assert r.returncode == 1
    assert "4 of 52 input files rejected (7.7%)" in r.stderr, r.stderr
    assert out.read_bytes() == before
