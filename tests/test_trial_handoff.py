"""The codec trial takes the samples ``cluster.kind: auto``'s probe decoded
(h5batch/conversion/trial.py, inprocess.py): the same trial, fewer decodes on the serial path
to the writer's start. Real files, real decoders."""

from __future__ import annotations

import numpy as np

from h5batch.config import load_job
from h5batch.conversion import trial
from h5batch.conversion.inprocess import PROBE_ITEMS, choose_kind, spread
from h5batch.conversion.trial import TRIAL_ITEMS, Trial, trial_picks
from h5batch.layouts import discover
from tests.conftest import REPO

PAIRED = REPO / "jobs" / "paired_audio.yaml"


def _job(root, out, *settings: str):
    return load_job(PAIRED, [f"source.root={root}", f"output.path={out}", *settings])


def test_the_trials_picks_are_the_first_of_the_probes_order():
    for n in (1, 5, 31, 32, 33, 100, 4096, 100_003):
        assert sorted(spread(n, TRIAL_ITEMS)) == trial_picks(n)
        assert spread(n, 64)[:min(n, TRIAL_ITEMS)] == spread(n, TRIAL_ITEMS)
    assert TRIAL_ITEMS % PROBE_ITEMS == 0


def test_the_trial_takes_the_probes_samples_and_keeps_what_it_would_have_decoded(paired_root, tmp_path,
                                                                                  monkeypatch):
    job = _job(paired_root, tmp_path / "o.h5", "cluster.kind=auto")
    manifest = discover(job)
    choice = choose_kind(job, manifest, len(manifest.items), resuming=False)
    picks = trial_picks(len(manifest.items))
    assert choice.samples, "the probe kept no sample for the trial"
    assert set(choice.samples) <= set(picks)
    assert all(set(s) == {"data", "target"} for s in choice.samples.values())

    fields = ["data", "target"]
    fresh = Trial.run(job, manifest, fields)  # decodes every pick itself
    decoded: list[str] = []
    real = trial.sample_decoders

    def counting(fields_):
        decoders = real(fields_)
        return [lambda p, d=d: (decoded.append(p), d(p))[1] for d in decoders]

    monkeypatch.setattr(trial, "sample_decoders", counting)
    taken = Trial.run(job, manifest, fields, choice.samples)
    # The same arrays, in the same order; only the picks the probe did not reach are decoded.
    for name in fields:
        assert len(taken.arrays[name]) == len(fresh.arrays[name]) == len(picks)
        for a, b in zip(taken.arrays[name], fresh.arrays[name]):
            np.testing.assert_array_equal(a, b)
    missing = [i for i in picks if i not in choice.samples]
    assert len(decoded) == 2 * len(missing)
    # A sample the probe handed over is the trial's own copy, not the probe's reused row.
    first = choice.samples[picks[0]]["data"]
    assert first.base is None or not np.shares_memory(first, choice.samples[picks[-1]]["data"])


def test_the_probe_keeps_only_samples_that_fit_the_trials_budget(paired_root, tmp_path, monkeypatch):
    # A long recording must not be copied by the probe (memory bounded by the largest
    # sample): with a budget of 1.5 samples per field, only the first pick's are kept.
    from h5batch.conversion import inprocess

    job = _job(paired_root, tmp_path / "o.h5", "cluster.kind=auto")
    manifest = discover(job)
    one = Trial.run(job, manifest, ["data"]).arrays["data"][0].nbytes
    monkeypatch.setattr(inprocess, "TRIAL_BYTES", one + one // 2)
    choice = choose_kind(job, manifest, len(manifest.items), resuming=False)
    assert list(choice.samples) == [trial_picks(len(manifest.items))[0]]
