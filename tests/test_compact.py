"""``h5batch compact``: the dead space that syncs leave in an output comes back, and nothing
else changes: every dataset and attribute, every row where it was (tombstones and views
included), the inventory a later sync reads. Crash-safe: a ``kill -9`` before the rename
leaves the output as it was.

Real conversions and syncs in subprocesses, real kill -9 of the process group.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py

from h5batch.tools.compact import TMP_SUFFIX, dataset_bytes
from h5batch.torch import H5Dataset
from tests.support.h5compare import assert_same_h5
from tests.support.processes import kill_group, wait_for
from tests.support.run import convert, h5batch_cmd, run_h5batch, start
from tests.test_sync import _class_corpus, _class_job, _grow, _sync, _wav, _yielded


def _synced_twice(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A class-folder output synced twice (files added, changed, removed), with a view."""
    root, out = tmp_path / "corpus", tmp_path / "out.h5"
    _class_corpus(root)
    job = _class_job(tmp_path, root, out)
    convert(job, "--set", "cluster.batch_size=8", check=True)
    res = run_h5batch("view", "add", str(out), "dogs", "--split", "test", "--where", 'label == "dog"')
    assert res.returncode == 0, res.stderr
    _grow(root)
    assert _sync(job).returncode == 0
    os.remove(root / "test" / "dog" / "dog3.wav")
    _wav(root / "train" / "owl" / "late.wav", seed=4242)
    assert _sync(job).returncode == 0
    return root, out, job


def _metadata_and_dead(path: Path) -> int:
    with h5py.File(path, "r") as f:
        return os.path.getsize(path) - dataset_bytes(f)


def test_compact_gives_the_dead_space_back_and_changes_nothing_else(tmp_path):
    root, out, job = _synced_twice(tmp_path)
    before = tmp_path / "before.h5"
    shutil.copyfile(out, before)
    yielded = _yielded(out)
    dogs = [str(s["source"]) for s in H5Dataset(str(out), "test", view="dogs", with_source=True)]
    overhead = _metadata_and_dead(out)
    res = run_h5batch("inspect", str(out))
    assert "which `h5batch compact` gives back" in res.stdout, res.stdout

    res = run_h5batch("compact", str(out), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["before"] == before.stat().st_size and r["after"] == out.stat().st_size
    assert r["freed"] > 0 and r["verified"], r
    assert "given back" in res.stderr
    # What is left beside the datasets is metadata: what the syncs freed is gone.
    assert _metadata_and_dead(out) == overhead - r["freed"]
    assert not Path(str(out) + TMP_SUFFIX).exists()
    assert_same_h5(before, out)
    assert _yielded(out) == yielded
    assert [str(s["source"]) for s in H5Dataset(str(out), "test", view="dogs", with_source=True)] == dogs
    with h5py.File(out, "r") as f, h5py.File(before, "r") as g:
        for split in ("train", "test"):
            assert f[split]["tombstones"][...].tolist() == g[split]["tombstones"][...].tolist()
    res = run_h5batch("verify", str(out))
    assert res.returncode == 0, res.stderr
    res = _sync(job, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["up_to_date"], res.stderr


def test_kill_9_inside_compact_leaves_the_output_as_it_was(tmp_path):
    _root, out, _job = _synced_twice(tmp_path)
    original = out.read_bytes()
    proc = start(h5batch_cmd("compact", str(out)), env_extra={"H5BATCH_FAULTS": "pause_at=compact"}, new_session=True)
    wait_for(Path(str(out) + ".paused"), proc)
    assert Path(str(out) + TMP_SUFFIX).exists()  # the copy is made and checked next
    kill_group(proc)
    os.unlink(str(out) + ".paused")
    assert out.read_bytes() == original
    assert len(H5Dataset(str(out), "train")) > 0
    res = run_h5batch("compact", str(out), "--no-verify")
    assert res.returncode == 0, res.stderr
    assert "left by an interrupted compact" in res.stderr
    assert "not verified" in res.stderr
    assert out.stat().st_size < len(original)


def test_compact_refuses_what_is_not_a_finished_output(tmp_path):
    missing = run_h5batch("compact", str(tmp_path / "nothing.h5"))
    assert missing.returncode == 2 and "nothing.h5 does not exist" in missing.stderr, missing.stderr
    assert not (tmp_path / "nothing.h5.lock").exists()
    (tmp_path / "text.h5").write_text("not HDF5")
    text = run_h5batch("compact", str(tmp_path / "text.h5"))
    assert text.returncode == 2 and "text.h5: cannot make its compacted copy" in text.stderr, text.stderr
    assert "Traceback" not in text.stderr and (tmp_path / "text.h5").read_text() == "not HDF5"
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = [1, 2, 3]
    plain = run_h5batch("compact", str(tmp_path / "plain.h5"))
    assert plain.returncode == 1 and "plain.h5: root attribute complete" in plain.stderr, plain.stderr
    assert (tmp_path / "plain.h5").exists() and not (tmp_path / ("plain.h5" + TMP_SUFFIX)).exists()
