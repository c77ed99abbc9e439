"""Several writers (``output.writers``): shard files joined into one output (h5batch/shards.py).

The same job with 1, 2 and 4 writers gives the same values through plain h5py and the same
sample at every index through ``H5Dataset``; ``verify`` passes; a shard moved away fails
``verify`` and the reader naming it; a resume with another number of writers is refused;
``kill -9`` of one writer mid-run, then the same command, gives the uninterrupted output.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import torch

from h5batch import format as fmt
from h5batch.shards import records, shard_path
from h5batch.torch import H5Dataset
from tests.conftest import REPO
from tests.support.h5compare import assert_same_h5
from tests.support.run import convert_cmd, h5batch_cmd, run, start
from tests.support.torture import paired_with_rejects

JOB = REPO / "jobs" / "paired_audio.yaml"
BAD = ("train/data/17.wav",)  # a reject, so that the rejects are joined too


def cmd(root: Path, out: Path, writers: int, *extra: str) -> list[str]:
    # Batches of 8 pairs: 30 batches, several per shard, and shard edges inside a chunk.
    return convert_cmd(JOB, *extra, output=out, root=root,
                       settings=(f"output.writers={writers}", "cluster.batch_size=8", "output.chunk_bytes=65536"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards") / "corpus"
    return paired_with_rejects(root, BAD, n_train=200, n_test=40, seconds=0.25, seed=3)


@pytest.fixture(scope="module")
def outputs(corpus, tmp_path_factory) -> dict[int, Path]:
    out = {}
    for n in (1, 2, 4):
        path = tmp_path_factory.mktemp(f"w{n}") / "out.h5"
        res = run(cmd(corpus, path, n))
        assert res.returncode == 0, res.stderr
        out[n] = path
    return out


def digest(path: Path) -> dict[str, str]:
    """A sha256 per split of every dataset's values, and of the rejects, read by plain h5py."""
    out = {}
    with h5py.File(path, "r") as f:
        groups = [*json.loads(f.attrs[fmt.ATTR_SPLITS]), fmt.REJECTS]
        for name in groups:
            h = hashlib.sha256()

            def visit(key, obj, h=h):
                if isinstance(obj, h5py.Dataset):
                    h.update(key.encode())
                    h.update(repr(obj.asstr()[...].tolist()).encode() if obj.dtype.kind == "O" else obj[...].tobytes())

            f[name].visititems(visit)
            out[name] = h.hexdigest()
    return out


def test_writers_1_2_4_give_the_same_values_through_plain_h5py(outputs):
    with h5py.File(outputs[4], "r") as f:
        assert f.attrs[fmt.ATTR_FORMAT] == fmt.SHARDED_FORMAT
        assert f["train/data/values"].is_virtual and not f["train/data/offsets"].is_virtual
        assert [r.path for r in records(f)] == [f"out.shard-{k}-of-4.h5" for k in range(4)]
        assert all(r.host and r.bytes == os.path.getsize(outputs[4].parent / r.path) for r in records(f))
        assert sum(r.rows["train"] for r in records(f)) == 199
    with h5py.File(outputs[1], "r") as f:
        assert f.attrs[fmt.ATTR_FORMAT] == 1 and fmt.ATTR_SHARDS not in f.attrs
    ref = digest(outputs[1])
    assert digest(outputs[2]) == ref
    assert digest(outputs[4]) == ref


def _same(x, y) -> None:
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k], k


@pytest.mark.parametrize("n", [2, 4])
def test_h5dataset_gives_the_same_sample_at_every_index(outputs, n):
    for split in ("train", "test"):
        one = H5Dataset(outputs[1], split, with_source=True)
        many = H5Dataset(outputs[n], split, with_source=True)
        assert len(one) == len(many)
        for i in range(len(one)):
            _same(one[i], many[i])
        idx = np.random.default_rng(n).permutation(len(one))  # batches across shards
        for lo in range(0, len(idx), 32):
            a, b = one.__getitems__(idx[lo:lo + 32]), many.__getitems__(idx[lo:lo + 32])
            for j in range(len(a)):
                _same(a.sample(j), b.sample(j))
        seen = [s for batch in many.loader(batch_size=16, num_workers=2) for s in batch["data"]]
        assert len(seen) == len(many)
        # A transform applies to the joined batch, as to one file's.
        total = H5Dataset(outputs[n], split, transform=lambda s: float(s["data"].sum()))
        assert total.__getitems__(idx[:32]) == [float(one[int(i)]["data"].sum()) for i in idx[:32]]


def test_verify_passes_and_a_moved_shard_fails_verify_and_the_reader_naming_it(outputs, tmp_path):
    for n in (1, 2, 4):
        res = run(h5batch_cmd("verify", str(outputs[n])))
        assert res.returncode == 0, res.stderr
    out = tmp_path / "out.h5"
    for p in [outputs[2], *[Path(shard_path(str(outputs[2]), k, 2)) for k in range(2)]]:
        (tmp_path / p.name).write_bytes(p.read_bytes())
    moved = Path(shard_path(str(out), 1, 2))
    moved.rename(tmp_path / "elsewhere.h5")
    res = run(h5batch_cmd("verify", str(out)))
    assert res.returncode == 1 and str(moved) in res.stderr and "missing" in res.stderr
    with pytest.raises(FileNotFoundError, match=str(moved)):
        H5Dataset(out, "train")
    (tmp_path / "elsewhere.h5").rename(moved)
    assert len(H5Dataset(out, "train")) == 199
    with h5py.File(moved, "r") as f:  # written again: another creation time, same size
        created = f.attrs[fmt.ATTR_CREATED].encode()
    data = moved.read_bytes()
    assert data.count(created) == 1
    moved.write_bytes(data.replace(created, b"2000-01-01T00:00:00+00:00"))
    with pytest.raises(ValueError, match=f"{moved}.*written again"):
        H5Dataset(out, "train")
    with moved.open("ab") as fh:  # changed: a byte more
        fh.write(b"\0")
    res = run(h5batch_cmd("verify", str(out)))
    assert res.returncode == 1 and str(moved) in res.stderr and "changed" in res.stderr
    with pytest.raises(ValueError, match=str(moved)):
        H5Dataset(out, "train")


def test_inspect_sample_reads_a_sharded_output(outputs):
    path = str(outputs[2])
    res = run(h5batch_cmd("inspect", path, "--sample", "5"))
    assert res.returncode == 0 and "train/data/5.wav" in res.stdout, res.stderr


def test_a_resume_with_another_number_of_writers_is_refused(corpus, tmp_path):
    out = tmp_path / "out.h5"
    # One writer killed: the run stops, its shards stay partial.
    proc = start(cmd(corpus, out, 2, "--set", "policy.commit_every=0"), new_session=True)
    _kill_a_writer_after_commits(proc, out, 2, 1)
    proc.communicate(timeout=120)
    res = run(cmd(corpus, out, 3))
    assert res.returncode == 2
    assert "output.writers 2" in res.stderr and "output.writers 3" in res.stderr, res.stderr
    res = run(cmd(corpus, out, 1))
    assert res.returncode == 2 and "output.writers 2" in res.stderr, res.stderr
    res = run(cmd(corpus, out, 3, "--restart"))
    assert res.returncode == 0, res.stderr
    assert not list(tmp_path.glob("out.shard-*-of-2.h5*"))


def _kill_a_writer_after_commits(proc, out: Path, n: int, commits: int) -> None:
    """``kill -9`` of the writer of the last shard once its commit record changed ``commits`` times."""
    partial = Path(shard_path(str(out), n - 1, n) + fmt.PARTIAL_SUFFIX)
    record = Path(str(partial) + ".commit.json")
    seen, writer = None, None
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and commits:
        if writer is None:
            for p in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if any(f.path == str(partial.resolve()) and f.mode != "r" for f in p.open_files()):
                        writer = p
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        try:
            now = record.read_bytes()
        except FileNotFoundError:
            now = None
        if now is not None and now != seen:
            seen, commits = now, commits - 1
        time.sleep(0.002)
    assert writer is not None and proc.poll() is None, "the run ended before its writer could be killed"
    writer.send_signal(signal.SIGKILL)


def test_kill_9_of_one_writer_then_rerun_gives_the_uninterrupted_output(corpus, outputs, tmp_path):
    out = tmp_path / "out.h5"
    proc = start(cmd(corpus, out, 4, "--set", "policy.commit_every=0"), new_session=True)
    _kill_a_writer_after_commits(proc, out, 4, 2)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "died" in err, err
    assert not out.exists() and Path(shard_path(str(out), 3, 4) + fmt.PARTIAL_SUFFIX).exists()
    _rerun_resumes_to_the_uninterrupted_output(corpus, out, outputs, 4)
    ref = Path(str(outputs[4]).replace(".h5", ".rejects.jsonl")).read_text()
    assert Path(str(out).replace(".h5", ".rejects.jsonl")).read_text() == ref


def test_a_complete_shard_cut_by_another_batch_size_is_refused_not_joined(corpus, outputs, tmp_path):
    out = tmp_path / "out.h5"
    assert run(cmd(corpus, out, 2)).returncode == 0
    out.unlink()
    Path(shard_path(str(out), 1, 2)).unlink()  # shard 0 complete, shard 1 to write again
    res = run(convert_cmd(JOB, output=out, root=corpus, settings=("output.writers=2", "cluster.batch_size=6",
                                                                  "output.chunk_bytes=65536")))
    assert res.returncode == 2 and "out.shard-0-of-2.h5 holds manifest items" in res.stderr, res.stderr
    res = run(cmd(corpus, out, 2))
    assert res.returncode == 0, res.stderr
    assert digest(out) == digest(outputs[1])


def test_kill_9_of_the_whole_run_then_rerun_gives_the_uninterrupted_output(corpus, outputs, tmp_path):
    """Driver, writers and decoders killed at once: every shard resumes from its own commit."""
    out = tmp_path / "out.h5"
    proc = start(cmd(corpus, out, 2, "--set", "policy.commit_every=0"), new_session=True)
    record = Path(shard_path(str(out), 1, 2) + fmt.PARTIAL_SUFFIX + ".commit.json")
    deadline = time.monotonic() + 60
    while proc.poll() is None and not record.exists() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not out.exists()
    _rerun_resumes_to_the_uninterrupted_output(corpus, out, outputs, 2)


def _rerun_resumes_to_the_uninterrupted_output(corpus, out: Path, outputs, n: int) -> None:
    """The same command again resumes, and gives the one-writer values and the uninterrupted
    run's shards byte for byte."""
    res = run(cmd(corpus, out, n))
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    assert digest(out) == digest(outputs[1])
    for k in range(n):
        assert_same_h5(shard_path(str(outputs[n]), k, n), shard_path(str(out), k, n))


def test_overwrite_of_a_finished_sharded_output_redoes_every_shard(corpus, tmp_path):
    out = tmp_path / "out.h5"
    assert run(cmd(corpus, out, 2)).returncode == 0
    shard_files = [tmp_path / r.path for r in records_of(out)]
    before = [p.stat().st_mtime_ns for p in shard_files]
    res = run(cmd(corpus, out, 2, "--overwrite", "--json"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["bytes_decoded"] > 0  # decoded again, not only joined again
    # written again (their `created` attribute has whole seconds: a fast rerun may keep it)
    assert all(p.stat().st_mtime_ns != t for p, t in zip(shard_files, before))


def records_of(path: Path):
    with h5py.File(path, "r") as f:
        return records(f)
