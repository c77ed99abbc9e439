"""``python -m h5batch.bench.convert_ab``: its ratios are taken round by round against the
best peer of the same round, it counts the CPU of the processes a run starts, and a run on a
real (tiny) corpus writes every pair, with the page cache warm or evicted."""

from __future__ import annotations

import multiprocessing as mp

import h5py
import pytest

from h5batch.bench import convert_ab, corpus


def _burn(seconds: float) -> None:
    import time

    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


def test_ratio_is_per_round_against_the_best_peer():
    times = {"h5batch": [(1.0, 2.0), (2.0, 2.0)],
             "webdataset-2p": [(2.0, 4.0), (8.0, 4.0)],
             "litdata-fork": [(3.0, 3.0), (4.0, 5.0)]}
    lines = convert_ab.report(times, 100)
    ratio = next(line for line in lines if line.startswith("h5batch / best peer"))
    # round 1: best peer 2.0 s -> 2.0x; round 2: best 4.0 s -> 2.0x; CPU: 3/2 and 4/2
    assert "wall 2.00 (2.00-2.00)x" in ratio
    assert "CPU 1.75 (1.50-2.00)x" in ratio
    assert lines[0].startswith("h5batch ") and "75 (50-100) pairs/s" in lines[0]


def test_tree_cpu_counts_a_finished_child():
    before = convert_ab.tree_cpu()
    p = mp.get_context("fork").Process(target=_burn, args=(0.3,))
    p.start()
    p.join()
    assert convert_ab.tree_cpu() - before >= 0.25


@pytest.mark.parametrize("cold", [False, True])
def test_auto_run_writes_every_pair(tmp_path, cold):
    cp = corpus.paired_audio(tmp_path / "cache", 16)
    runner = convert_ab.Runner(cp, str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    times = convert_ab.rounds(runner, ["h5batch-auto"], 1, cold, say=lambda s: None)
    wall, cpu = times["h5batch-auto"][0]
    assert wall > 0 and cpu > 0
    with h5py.File(tmp_path / "work" / "h5batch.h5", "r") as f:
        assert f["train/data"].shape == (16, corpus.AUDIO_LENGTH)


def test_unknown_method_is_named():
    with pytest.raises(SystemExit):
        convert_ab.main(["--methods", "h5batch,nonsense"])
