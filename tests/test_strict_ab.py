"""The strict read limit measured row by row in fresh processes (h5batch/bench/strict_ab.py),
on a real file made by the real converter and real ``.npy`` memmaps."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from h5batch import generate
from h5batch.bench import strict_ab
from h5batch.bench.fresh_reads import Zygote
from h5batch.bench.reads import ReadPhase
from h5batch.bench.records import Record
from h5batch.bench.strict import StrictMemmapDataset
from tests.test_reader import make_h5

FIELDS = ("data", "target")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """24 float32 fixed clips of 4,000 samples (codec none) and the limit's memmaps of them."""
    d = tmp_path_factory.mktemp("strict-ab")
    generate.make_paired_audio(d / "corpus", n_train=24, n_test=1, seconds=0.25)
    path = d / "float32-fixed.h5"
    make_h5("paired_audio.yaml", path, d / "corpus", "output.codec=none",
            *(f"fields.{f}.{k}={v}" for f in FIELDS for k, v in (("length", "4000"), ("dtype", "float32"))))
    folder = d / "memmap"
    folder.mkdir()
    with h5py.File(path, "r") as f:
        for k in FIELDS:
            np.save(folder / f"{k}.npy", f["train"][k][...])
    return path, folder


def test_each_row_runs_in_its_own_process_and_reports_its_samples(files):
    path, folder = files
    for row in (strict_ab.LIMIT, str(path)):
        got = strict_ab.FreshRow(row, str(folder), workers=0, batch=8).run(epochs=2)
        assert got["samples"] == 2 * 24 and got["warmup_samples"] == 24
        assert got["wall"] > 0 and got["cpu"] > 0 and got["peak_rss"] >= got["baseline_rss"] > 0


def test_the_bench_records_a_fresh_row_as_one_sample(files):
    """The bench's strict rows (the limit and ds.loader, here with 2 workers) run in children
    forked from one clean interpreter (bench/fresh_reads.py), each recorded as one sample."""
    path, folder = files
    bench = SimpleNamespace(cfg=SimpleNamespace(batch_size=8, seed=0, consume=False),
                            record=lambda *key: Record(*key, info={"epochs": 1}))
    spec = {"corpus": SimpleNamespace(name="c"), "strict_memmap": {k: str(folder / f"{k}.npy") for k in FIELDS},
            "strict_files": [("float32", True, "none", str(path), {"data": "none"})]}
    plan = strict_ab.read_plan(bench, spec, 2)
    assert [r.method for r, _ in plan] == [strict_ab.LIMIT, "h5batch"]
    assert plan[1][0].info["field_codecs"] == {"data": "none"}
    with Zygote() as zygote:
        for rec, row in plan:
            ReadPhase._read_once(None, rec, row, 32000.0, zygote)
            (s,) = rec.runs
            assert rec.info["epochs"] == strict_ab.MIN_EPOCHS  # asked for 1: timed over at least MIN_EPOCHS
            assert s.items == strict_ab.MIN_EPOCHS * 24 and s.nbytes == s.items * 32000.0
            assert s.seconds > 0 and s.extra["fresh_process"] and s.extra["warmup_samples"] == 24


def test_a_failing_row_raises_naming_the_row(files, tmp_path):
    _, folder = files
    missing = str(tmp_path / "missing.h5")
    with pytest.raises(RuntimeError, match="missing.h5"):
        strict_ab.FreshRow(missing, str(folder), workers=0).run(epochs=1)


def test_preallocated_limit_returns_the_limits_rows_in_reused_buffers(files):
    _, folder = files
    paths = {k: str(folder / f"{k}.npy") for k in FIELDS}
    limit, pre = StrictMemmapDataset(paths), strict_ab.PreallocMemmapDataset(paths)
    seen = []
    for idx in ([5, 1, 9, 2], [0, 23, 7, 8], [3, 4, 6, 11], [12, 2, 1, 0]):
        a, b = limit.__getitems__(idx), pre.__getitems__(idx)
        assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in FIELDS)
        seen.append(b["data"].data_ptr())
    assert seen[3] == seen[0] and len(set(seen[:3])) == 3  # SLOTS = 3 buffers in turn


def test_ratios_are_taken_per_repetition_against_that_repetitions_limit():
    lim = [{"wall": 100.0, "cpu": 50.0}, {"wall": 200.0, "cpu": 100.0}, {"wall": 50.0, "cpu": 50.0}]
    row = [{"wall": 80.0, "cpu": 50.0}, {"wall": 100.0, "cpu": 150.0}, {"wall": 50.0, "cpu": 25.0}]
    s = strict_ab.summarize({(strict_ab.LIMIT, ""): lim, ("f", "new"): row})["f new"]
    assert (s["wall"], s["wall_lo"], s["wall_hi"]) == (0.8, 0.5, 1.0)
    assert (s["cpu"], s["cpu_lo"], s["cpu_hi"]) == (1.0, 0.5, 1.5)
    assert s["rate"] == 80.0


def test_the_cli_rotates_rows_and_writes_the_summary(files, tmp_path):
    path, folder = files
    out = tmp_path / "ab.json"
    strict_ab.main(["--memmap", str(folder), "--file", f"f32={path}", "--workers", "0", "--reps", "1",
                    "--epochs", "1", "--batch", "8", "--prealloc", "--out", str(out)])
    res = json.loads(out.read_text())["0"]
    assert set(res) == {strict_ab.LIMIT, strict_ab.PREALLOC, "f32 cwd"}
    assert res[strict_ab.LIMIT]["wall"] == 1.0 and res["f32 cwd"]["rate"] > 0
    assert os.path.getsize(out) > 0
