"""BucketingBatchSampler: padded-frame bounds, every sample once, similar lengths together,
deterministic, distributed, resumable; lengths from the file's index. Real files and loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from benchmarks.audio_corpus import make_audio_corpus
from h5batch import ConvertOptions, convert
from h5batch.config import load_job
from h5batch.torch import BucketingBatchSampler, H5Dataset, collate
from h5batch.torch.bucketing import field_lengths

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")

REPO = Path(__file__).resolve().parents[1]
MAX_FRAMES = 16_000


@pytest.fixture(scope="module")
def speech_h5(tmp_path_factory) -> Path:
    """600 FSDD-style clips of 0.05-0.1 s at 8 kHz (400-800 frames; 300 in train), small chunks."""
    d = tmp_path_factory.mktemp("bucketing")
    make_audio_corpus(d / "corpus", n_files=600, seconds=0.1, sample_rate=8000)
    job = load_job(REPO / "jobs" / "fsdd.yaml",
                   [f"output.path={d / 'speech.h5'}", f"source.root={d / 'corpus'}", "cluster.workers=1",
                    "output.chunk_bytes=16384"])
    convert(job, ConvertOptions(progress=False))
    return d / "speech.h5"


def _ds(path: Path) -> H5Dataset:
    return H5Dataset(path, "train", with_source=True)


def test_lengths_come_from_the_index(speech_h5):
    ds = _ds(speech_h5)
    lengths = field_lengths(ds)
    assert len(lengths) == len(ds) == 300 and lengths.min() >= 400 and lengths.max() <= 800
    picked = [0, 17, 299]
    assert lengths[picked].tolist() == [int(ds[i]["audio"].shape[0]) for i in picked]
    assert np.array_equal(field_lengths(ds, "audio"), lengths)
    with pytest.raises(KeyError, match="no field 'video'"):
        field_lengths(ds, "video")


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_stay_within_budget_and_hold_every_sample_once(speech_h5, workers):
    ds = _ds(speech_h5)
    s = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=1)
    loader = DataLoader(ds, batch_sampler=s, collate_fn=collate, num_workers=workers)
    epochs = []
    for _ in range(2):
        sources, padded, real = [], 0, 0
        for b in loader:
            t = b["audio_lengths"]
            assert len(t) * int(t.max()) <= MAX_FRAMES
            assert b["audio"].shape == (len(t), int(t.max()))
            sources += b["source"]
            padded += b["audio"].numel()
            real += int(t.sum())
        assert sorted(sources) == sorted(set(sources)) and len(sources) == len(ds)
        epochs.append(sources)
        assert padded / real < 1.03  # similar lengths together
    assert epochs[0] != epochs[1]  # the epoch rolled on by itself


def test_similar_lengths_beat_random_batches_and_quadratic_cost_is_bounded(speech_h5):
    ds = _ds(speech_h5)
    lengths = field_lengths(ds)
    s = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=2)
    batches = s.epoch_batches(0)
    ratio = sum(len(b) * lengths[b].max() for b in batches) / lengths.sum()
    mean = int(np.mean([len(b) for b in batches]))
    order = np.random.default_rng(0).permutation(len(ds))
    rnd = [order[i:i + mean] for i in range(0, len(ds), mean)]
    random_ratio = sum(len(b) * lengths[b].max() for b in rnd) / lengths.sum()
    assert ratio < 1.03 < 1.15 < random_ratio
    q = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, quadratic=2000.0, max_batch_size=20, seed=2)
    for b in q.epoch_batches(0):
        longest = lengths[b].max()
        assert len(b) <= 20 and len(b) * (longest + longest ** 2 / 2000.0) <= MAX_FRAMES
    assert sorted(i for b in q.epoch_batches(0) for i in b) == list(range(len(ds)))


def test_deterministic_and_chunk_local(speech_h5):
    ds = _ds(speech_h5)
    a = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=3)
    b = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=3)
    assert a.epoch_batches(4) == b.epoch_batches(4) != a.epoch_batches(5)
    assert BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=4).epoch_batches(4) != a.epoch_batches(4)
    reader = H5Dataset(speech_h5, "train")
    for batch in a.epoch_batches(0):
        reader.__getitems__(batch)
    loads = sum(store.loads for store in reader._stores.values())
    assert loads <= 1.5 * len(reader.chunk_starts())  # about every chunk once


def test_ranks_split_the_batches(speech_h5):
    ds = _ds(speech_h5)
    whole = BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=5).epoch_batches(0)
    for drop_last in (False, True):
        parts = [list(BucketingBatchSampler(ds, max_frames=MAX_FRAMES, seed=5, rank=r, world_size=3,
                                            drop_last=drop_last)) for r in range(3)]
        assert len({len(p) for p in parts}) == 1
        flat = [i for p in parts for b in p for i in b]
        if drop_last:
            assert len(flat) == len(set(flat)) and [b for p in zip(*parts) for b in p] == whole[:len(parts[0]) * 3]
        else:
            assert set(flat) == set(range(len(ds)))
            assert len(parts[0]) * 3 - len(whole) < 3


@pytest.mark.parametrize("workers", [0, 2])
def test_fresh_loader_resumes_mid_epoch_1(speech_h5, workers):
    def make():
        return StatefulDataLoader(_ds(speech_h5), batch_sampler=BucketingBatchSampler(
            _ds(speech_h5), max_frames=MAX_FRAMES, seed=6), collate_fn=collate, num_workers=workers)

    ref = make()
    whole = [[b["source"] for b in ref] for _ in range(3)]
    first = make()
    got = [[b["source"] for b in first], []]
    for k, b in enumerate(first):
        got[1].append(b["source"])
        if k == 4:
            state = first.state_dict()
            break
    resumed = make()
    resumed.load_state_dict(state)
    got[1] += [b["source"] for b in resumed]
    got.append([b["source"] for b in resumed])
    assert got == whole


def test_bad_arguments(speech_h5):
    with pytest.raises(ValueError, match="max_frames"):
        BucketingBatchSampler([5, 6], max_frames=0)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        BucketingBatchSampler([5, -1], max_frames=10)
    with pytest.raises(TypeError, match="sequence of lengths"):
        BucketingBatchSampler(object(), max_frames=10)
    with pytest.raises(ValueError, match="quadratic"):
        BucketingBatchSampler([5], max_frames=10, quadratic=0)
    # A sample longer than the budget makes a batch alone.
    s = BucketingBatchSampler([3, 50, 4, 5], max_frames=10, num_buckets=1, chunk_size=2)
    assert s.oversized == 1
    assert sorted(sorted(b) for b in s.epoch_batches(0)) == [[0, 2], [1], [3]]


def test_state_carries_the_seed_and_checks_the_world_size():
    lengths = list(range(1, 400))
    a = BucketingBatchSampler(lengths, max_frames=300, chunk_size=8, seed=6)
    it = iter(a)
    head = [next(it) for _ in range(3)]
    b = BucketingBatchSampler(lengths, max_frames=300, chunk_size=8, seed=0)
    b.load_state_dict(a.state_dict())
    assert head + list(b) == a.epoch_batches(0) and b.seed == 6
    assert list(b) == a.epoch_batches(1)  # then the next epoch
    with pytest.raises(ValueError, match="world_size"):
        BucketingBatchSampler(lengths, max_frames=300, chunk_size=8, world_size=2).load_state_dict(a.state_dict())
