"""``batch_size: auto`` aims at fewer, bigger tasks on worker processes than in process.

Rule under test (``conversion/auto.py``, "Batch size"): a batch decoded in process carries
about ``TARGET_BATCH_BYTES``, a task for worker processes ``TARGET_TASK_BYTES``; the kind
``auto`` resolves to is settled before the plan, so a converted file's batches follow it.
Real wav files and a real conversion; no Dask cluster is started.
"""

from __future__ import annotations

import io

import h5py
import numpy as np
import soundfile as sf

from h5batch import ConvertOptions, convert
from h5batch.config import job_from_dict
from h5batch.conversion.auto import TARGET_BATCH_BYTES, TARGET_TASK_BYTES, resolve
from h5batch.layouts import discover

SR = 8000
LENGTH = 1 << 20  # frames per stored sample: 2 MiB of int16 per file, 4 MiB per pair
PAIRS = 80


def _corpus(root):
    rng = np.random.default_rng(0)
    for i in range(PAIRS):
        for folder in ("data", "label"):
            d = root / "train" / folder
            d.mkdir(parents=True, exist_ok=True)
            sf.write(d / f"{i}.wav", rng.integers(-999, 999, 200, dtype=np.int16), SR, subtype="PCM_16")


def _job(root, out, cluster=None):
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": LENGTH}
    return job_from_dict({"name": "bt", "source": {"root": str(root), "layout": "paired_folders"},
                          "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
                          "output": {"path": str(out), "codec": "none"}, "cluster": cluster or {}}, file="<test>")


def test_target_follows_the_resolved_kind(tmp_path):
    _corpus(tmp_path)
    job = _job(tmp_path, tmp_path / "x.h5")
    m = discover(job)
    item = 2 * LENGTH * 2
    assert resolve(job, m).batch_size == TARGET_BATCH_BYTES // item  # the default: decoder processes
    inproc = _job(tmp_path, tmp_path / "x.h5", {"kind": "inprocess"})  # an older job file's kind
    assert resolve(inproc, m).batch_size == TARGET_BATCH_BYTES // item
    assert resolve(_job(tmp_path, tmp_path / "x.h5", {"kind": "local"}), m).batch_size == TARGET_TASK_BYTES // item
    fixed = _job(tmp_path, tmp_path / "x.h5", {"batch_size": 3, "kind": "local"})
    assert resolve(fixed, m).batch_size == 3  # an integer is kept


def test_the_default_engine_uses_its_batch_size(tmp_path):
    _corpus(tmp_path)
    log = io.StringIO()
    summary = convert(_job(tmp_path, tmp_path / "o.h5", {"kind": "inprocess"}),
                      ConvertOptions(progress="none", log=log))
    assert f"batch_size auto: {TARGET_BATCH_BYTES // (4 * LENGTH)} items per task" in log.getvalue()
    with h5py.File(summary.path) as f:
        data = f["train/data"]
        assert data.shape == (PAIRS, LENGTH)
        assert not data[7, 200:].any() and data[7, :200].any()


def test_auto_batches_hold_whole_chunks(tmp_path):
    """``batch_size: auto`` is rounded down to whole chunks of every fixed-shape field
    (``auto.whole_chunks``): 64,000-byte rows in 1 MiB chunks are 16 rows a chunk."""
    from h5batch.conversion.auto import MIN_BATCHES, whole_chunks

    rng = np.random.default_rng(1)
    pairs = 200  # 25 a batch at least (MIN_BATCHES), rounded to 16
    for i in range(pairs):
        for folder in ("data", "label"):
            d = tmp_path / "train" / folder
            d.mkdir(parents=True, exist_ok=True)
            sf.write(d / f"{i}.wav", rng.integers(-999, 999, 50, dtype=np.int16), SR, subtype="PCM_16")
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": 32000}
    job = job_from_dict({"name": "wc", "source": {"root": str(tmp_path), "layout": "paired_folders"},
                         "fields": {"data": {**field, "folder": "data"}, "target": {**field, "folder": "label"}},
                         "output": {"path": str(tmp_path / "x.h5"), "codec": "none"}}, file="<test>")
    bs = resolve(job, discover(job)).batch_size
    unrounded = min(round(TARGET_BATCH_BYTES / 128000), -(-pairs // MIN_BATCHES))
    assert unrounded == 25 and bs == 16
    fixed = {"a": ((32000,), np.dtype("int16")), "b": ((8000,), np.dtype("int16")), "c": None}  # 16 and 65 rows
    assert whole_chunks(131, job, fixed) == 131  # below one step (1,040 rows): kept
    assert whole_chunks(2100, job, fixed) == 2080
