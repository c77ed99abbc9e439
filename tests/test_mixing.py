"""Mixing several h5batch sources (h5batch.torch.mixing) on real converted files: batches say
where each sample came from and hold what direct reads give; weights within a stated
tolerance; every sample once without weights; deterministic; resume equality through
torchdata's StatefulDataLoader at 0 and 2 workers; clear errors for fields that differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from h5batch.torch import H5Dataset, collate
from h5batch.torch.mixing import MixedDataset, MixingSampler
from tests.test_reader import demo, paired  # noqa: F401  -- module fixtures (real converted files)


@pytest.fixture
def mixed(paired):  # noqa: F811
    """Two sources: the paired file's train split (40) and test split (4), with sources."""
    return MixedDataset([H5Dataset(paired[0], "train", with_source=True),
                         H5Dataset(paired[0], "test", with_source=True)], names=["train", "test"])


def test_batches_say_where_each_sample_came_from(mixed):
    assert len(mixed) == 44 and mixed.names == ["train", "test"]
    idx = [41, 3, 0, 43, 7, 40]  # both sources in one batch
    batch = collate(mixed.__getitems__(idx))
    assert batch["dataset"].tolist() == [1, 0, 0, 1, 0, 1]
    for j, i in enumerate(idx):
        k, local = (1, i - 40) if i >= 40 else (0, i)
        one = mixed.datasets[k][local]
        assert batch["source"][j] == one["source"]
        assert torch.equal(batch["data"][j], one["data"]) and torch.equal(batch["target"][j], one["target"])
    single = mixed[42]
    assert int(single["dataset"]) == 1 and torch.equal(single["data"], mixed.datasets[1][2]["data"])


def test_weights_within_tolerance_and_deterministic(mixed):
    s = MixingSampler(mixed, weights=[1, 3], num_samples=8000, seed=4)
    order = np.array(list(s))
    share = float(np.mean(order >= 40))
    # 8000 independent draws with p = 0.75: standard deviation 0.0048; tolerance 0.02 (> 4 sigma).
    assert abs(share - 0.75) < 0.02, share
    assert len(order) == len(s) == 8000
    again = MixingSampler(mixed, weights=[1, 3], num_samples=8000, seed=4)
    assert np.array_equal(order, list(again))
    assert not np.array_equal(order, list(again)), "the next epoch has another order"
    assert not np.array_equal(order, list(MixingSampler(mixed, weights=[1, 3], num_samples=8000, seed=5)))
    # Each source is drawn pass by pass: within one pass every local index once.
    test_part = order[order >= 40][:4]
    assert sorted(test_part.tolist()) == [40, 41, 42, 43]


def test_every_sample_once_without_weights_and_in_turn(mixed):
    s = MixingSampler(mixed, seed=1)
    assert sorted(s) == list(range(44))
    turn = list(MixingSampler(mixed, in_turn=True, seed=1))
    assert sorted(turn[:40]) == list(range(40)) and sorted(turn[40:]) == [40, 41, 42, 43]
    batches = list(MixingSampler(mixed, batch_size=8, seed=2))
    assert sorted(i for b in batches for i in b) == list(range(44))
    assert all(len({i >= 40 for i in b}) == 1 for b in batches), "each batch from one source"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("per_batch", [False, True])
def test_resume_in_epoch_1_gives_the_uninterrupted_batches(mixed, workers, per_batch):
    def make():
        if per_batch:
            s = MixingSampler(mixed, weights=[0.5, 0.5], num_samples=48, batch_size=6, seed=9)
            return StatefulDataLoader(mixed, batch_sampler=s, collate_fn=collate, num_workers=workers)
        s = MixingSampler(mixed, weights=[0.5, 0.5], num_samples=48, seed=9)
        return StatefulDataLoader(mixed, batch_size=6, sampler=s, collate_fn=collate, num_workers=workers)

    def key(b):
        return list(zip(b["dataset"].tolist(), b["source"], strict=True))

    full = make()
    epochs = [[key(b) for b in full] for _ in range(2)]
    assert epochs[0] != epochs[1]
    run = make()
    first = [key(b) for b in run]
    assert first == epochs[0]
    it = iter(run)
    got = [key(next(it)) for _ in range(3)]
    state = run.state_dict()
    del it, run
    resumed = make()
    resumed.load_state_dict(state)
    got += [key(b) for b in resumed]
    assert got == epochs[1]


def test_fields_must_match(paired, demo):  # noqa: F811
    a = H5Dataset(paired[0], "train")
    with pytest.raises(ValueError, match=r"fields differ: .*\['data', .*'target'.*\].*\['audio'\].*fields="):
        MixedDataset([a, H5Dataset(demo[0], "train", fields=["audio"])])
    with pytest.raises(ValueError, match="field 'data' differs: .*float32.*int16"):
        MixedDataset([a, H5Dataset(paired[0], "test", as_float=False)])
    with pytest.raises(ValueError, match="sources: .* has sources, .* has no"):
        MixedDataset([H5Dataset(paired[0], "train", with_source=True), a])
    with pytest.raises(ValueError, match="weights"):
        MixingSampler(MixedDataset([a, a]), weights=[1])


def test_common_fields_of_files_with_different_fields(demo):  # noqa: F811
    """Sources whose files differ, read through the fields they share; the variable audio
    field is padded across sources."""
    m = MixedDataset([H5Dataset(demo[0], "train", fields=["audio"]),
                      H5Dataset(demo[0], "test", fields=["audio"])])
    idx = [0, len(m.datasets[0]), 1]
    batch = collate(m.__getitems__(idx))
    for j, (k, local) in enumerate([(0, 0), (1, 0), (0, 1)]):
        one = m.datasets[k][local]["audio"]
        n = int(batch["audio_lengths"][j])
        assert n == len(one) and torch.equal(batch["audio"][j, :n], one)
        assert not batch["audio"][j, n:].any()
    loader = DataLoader(m, batch_size=5, sampler=MixingSampler(m, seed=0), collate_fn=collate, num_workers=2)
    assert sum(len(b["dataset"]) for b in loader) == len(m)


def test_sources_with_a_transform(paired):  # noqa: F811
    def t(s):
        return {"energy": s["data"].pow(2).mean()}

    m = MixedDataset([H5Dataset(paired[0], "train", transform=t), H5Dataset(paired[0], "test", transform=t)])
    out = collate(m.__getitems__([40, 1, 41]))
    assert out["dataset"].tolist() == [1, 0, 1] and out["energy"].shape == (3,)
    assert torch.equal(out["energy"][1], m.datasets[0][1]["energy"])
    with pytest.raises(ValueError, match="exclude each other"):
        MixingSampler(m, weights=[1, 1], in_turn=True)


def test_a_batch_of_two_sources_keeps_their_text_fields(tmp_path):
    """A text field is a list column: the mixed batch holds each sample's own string."""
    from tests.test_export import make_annotated

    path = make_annotated(tmp_path)
    train, test = H5Dataset(path, "train"), H5Dataset(path, "test")
    mixed = MixedDataset([train, test])
    idx = [len(train), 0, len(train) + 1, 1]
    batch = collate(mixed.__getitems__(idx))
    want = [test[0], train[0], test[1], train[1]]
    assert batch["caption"] == [w["caption"] for w in want]
    assert batch["dataset"].tolist() == [1, 0, 1, 0]
    assert all(torch.equal(batch["audio"][j][: len(w["audio"])], w["audio"]) for j, w in enumerate(want))
