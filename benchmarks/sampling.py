"""The sampling bench: shuffle quality vs locality, ranks, resume latency, length bucketing.

``python benchmarks/sampling.py --out DIR`` writes ``DIR/sampling.json`` and
``DIR/sampling.md`` (``--small``: a fifth of the files, for a quick look). What it measures, each on files it converts itself (deterministic generated corpora):

* **shuffle**: on a class-sorted corpus (FSDD-style, 10 digits x 270 train files, chunk
  groups of 64 samples, blosc2-lz4 so that reading a chunk means decoding it), per sampler:
  the mean KL divergence in bits of the batch label histogram (batches of 64) from the
  corpus' (:func:`quality.batch_label_kl`), chunks decoded in one epoch with
  ``H5Dataset``'s default cache (its own counter), and samples/s of that epoch at 0 workers;
* **ranks**: per world size 1, 2, 4, 8 and way of splitting, the distinct chunk groups each
  rank touches in an epoch and the chunks each rank decodes with the default cache;
* **resume**: seconds from a fresh ``StatefulDataLoader`` + ``load_state_dict`` to its first
  batch, mid-epoch, against a fresh loader's first batch; and a sampler alone resumed at
  sample 9,000,000 of 10,000,000 (``load_state_dict`` + first index) against replaying it;
* **bucketing**: padding ratio (padded frames / real frames), mean batch size and samples/s
  read, for :class:`~h5batch.torch.BucketingBatchSampler`, random batches of a fixed size
  and Lhotse's ``DynamicBucketingSampler``, on the same lengths: a file's (clips of 1-2 s)
  and LibriSpeech-like synthetic lengths (log-normal, 1-35 s; padding only).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 64
RATE = 8000


def _convert(root: Path, out: Path, n_files: int, seconds: float, chunk_bytes: int, codec: str,
             workers: int | None = 2) -> Path:
    """Generate and convert a corpus once; ``workers`` None: the job's default."""
    from audio_corpus import make_audio_corpus

    from h5batch import ConvertOptions, convert
    from h5batch.config import load_job

    if out.exists():
        return out
    make_audio_corpus(root, n_files=n_files, seconds=seconds, sample_rate=RATE)
    job_file = Path(__file__).resolve().parents[1] / "jobs" / "fsdd.yaml"
    cluster = [] if workers is None else [f"cluster.workers={workers}"]
    job = load_job(job_file, [f"output.path={out}", f"source.root={root}", *cluster,
                              f"output.chunk_bytes={chunk_bytes}", f"output.codec={codec}"])
    convert(job, ConvertOptions(progress=False))
    return out


def _read_epoch(path: Path, batches: list[list[int]]) -> tuple[float, int, list[list[int]]]:
    """One epoch of ``batches`` from a fresh dataset: (samples/s, chunks decoded, labels)."""
    from torch.utils.data import DataLoader

    from h5batch.torch import H5Dataset, collate

    ds = H5Dataset(path, "train")
    t0 = time.perf_counter()
    labels = [b["label"].tolist() for b in DataLoader(ds, batch_sampler=batches, collate_fn=collate)]
    seconds = time.perf_counter() - t0
    loads = sum(s.loads for s in ds._stores.values())
    return sum(map(len, batches)) / seconds, loads, labels


def shuffle_rows(path: Path) -> list[dict[str, Any]]:
    from quality import batch_label_kl, chunks_touched, label_batches_kl

    from h5batch.torch import ChunkShuffleSampler, GlobalBatchSampler, H5Dataset

    ds = H5Dataset(path, "train")
    labels = ds._index_array("label")
    starts = ds.chunk_starts()
    n = len(ds)

    def batched(order: np.ndarray) -> list[list[int]]:
        return [order[i:i + BATCH].tolist() for i in range(0, n, BATCH)]

    samplers = {
        "ChunkShuffleSampler (default: stratified, window 12)": lambda s: batched(ChunkShuffleSampler(ds, seed=s).indices()),
        "ChunkShuffleSampler random, window 8 (old default)": lambda s: batched(
            ChunkShuffleSampler(ds, seed=s, window=8, mixing="random").indices()),
        "ChunkShuffleSampler random, window 12": lambda s: batched(
            ChunkShuffleSampler(ds, seed=s, window=12, mixing="random").indices()),
        "GlobalBatchSampler, 1 rank": lambda s: GlobalBatchSampler(ds, BATCH, seed=s).local_batches().tolist(),
        "full random permutation": lambda s: batched(np.random.default_rng(s).permutation(n)),
        "sequential": lambda s: batched(np.arange(n)),
    }
    _read_epoch(path, batched(np.arange(n)))  # warm the page cache
    rows = []
    for name, make in samplers.items():
        kls, per_batch = [], []
        for seed in range(5):
            batches = make(seed)
            kls.append(batch_label_kl(batches[:-1] if len(batches[-1]) < BATCH else batches, labels))
            per_batch.append(np.mean([chunks_touched([b], starts) for b in batches]))
        rate, loads, got = _read_epoch(path, make(0))
        assert abs(label_batches_kl(got, labels) - batch_label_kl(make(0), labels)) < 1e-9
        rows.append({"sampler": name, "kl_bits": float(np.mean(kls)), "kl_bits_max": float(np.max(kls)),
                     "chunks_per_batch": float(np.mean(per_batch)), "chunks_decoded": int(loads),
                     "chunk_groups": len(starts), "samples_per_s": rate})
    return rows


def rank_rows(path: Path) -> list[dict[str, Any]]:
    from quality import chunks_touched

    from h5batch.torch import ChunkShuffleSampler, GlobalBatchSampler, H5Dataset

    ds = H5Dataset(path, "train")
    starts = ds.chunk_starts()
    rows = []
    for world in (1, 2, 4, 8):
        ways = {"ChunkShuffleSampler contiguous slices (per-rank batches of 64)": [
                    [s.indices()[i:i + BATCH].tolist() for i in range(0, len(s), BATCH)]
                    for s in (ChunkShuffleSampler(ds, rank=r, world_size=world) for r in range(world))],
                "GlobalBatchSampler by_chunk (global batch 64)": [
                    GlobalBatchSampler(ds, BATCH, rank=r, world_size=world).local_batches().tolist()
                    for r in range(world)],
                "GlobalBatchSampler interleaved (global batch 64)": [
                    GlobalBatchSampler(ds, BATCH, rank=r, world_size=world, split="interleaved")
                    .local_batches().tolist() for r in range(world)]}
        for name, per_rank in ways.items():
            touched = [chunks_touched(b, starts) for b in per_rank]
            decoded = [_read_epoch(path, b)[1] for b in per_rank[:2]]  # ranks are alike: two suffice
            rows.append({"world_size": world, "split": name, "chunks_touched_per_rank": float(np.mean(touched)),
                         "chunks_decoded_per_rank": float(np.mean(decoded)), "chunk_groups": len(starts)})
    return rows


def resume_rows(path: Path, big_n: int) -> list[dict[str, Any]]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from h5batch.torch import ChunkShuffleSampler, H5Dataset, collate

    rows = []
    for workers in (0, 2):
        def loader(workers: int = workers) -> Any:
            ds = H5Dataset(path, "train")
            return StatefulDataLoader(ds, sampler=ChunkShuffleSampler(ds, seed=1), batch_size=BATCH,
                                      collate_fn=collate, num_workers=workers)
        first = loader()
        state = None
        for k, _ in enumerate(first):
            if k == len(first) // 2:
                state = first.state_dict()
                break
        del first
        times = {}
        for what in ("fresh", "resumed"):
            t0 = time.perf_counter()
            fresh = loader()
            if what == "resumed":
                fresh.load_state_dict(state)
            next(iter(fresh))
            times[what] = time.perf_counter() - t0
            del fresh
        rows.append({"what": f"StatefulDataLoader, {workers} workers, mid-epoch",
                     "resume_s": times["resumed"], "baseline_s": times["fresh"],
                     "baseline": "fresh loader, first batch"})
    at = big_n * 9 // 10
    state = {**ChunkShuffleSampler(big_n, chunk_size=64, seed=0).state_dict(), "position": at}
    t0 = time.perf_counter()
    s = ChunkShuffleSampler(big_n, chunk_size=64)
    s.load_state_dict(state)
    first = next(iter(s))
    resume = time.perf_counter() - t0
    t0 = time.perf_counter()
    replay = next(itertools.islice(iter(ChunkShuffleSampler(big_n, chunk_size=64)), at, None))
    rows.append({"what": f"ChunkShuffleSampler of {big_n:,} samples at sample {at:,}: load_state_dict + first index",
                 "resume_s": resume, "baseline_s": time.perf_counter() - t0,
                 "baseline": "replaying the sampler to the position (what torchdata does without state)"})
    assert first == replay
    return rows


def _lhotse_batches(lengths: np.ndarray, max_frames: int, quadratic: float | None) -> list[list[int]]:
    from lhotse import CutSet
    from lhotse.cut import MonoCut
    from lhotse.dataset import DynamicBucketingSampler

    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(t) / RATE, channel=0)
                            for i, t in enumerate(lengths.tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "eagerly read CutSet": the lengths are in memory anyway
        s = DynamicBucketingSampler(cuts, max_duration=max_frames / RATE, num_buckets=10, shuffle=True, seed=0,
                                    quadratic_duration=None if quadratic is None else quadratic / RATE)
        return [[int(c.id) for c in b] for b in s]


def bucketing_rows(path: Path | None, lengths: np.ndarray, max_frames: int, corpus: str) -> list[dict[str, Any]]:
    from h5batch.torch import BucketingBatchSampler

    t0 = time.perf_counter()
    ours = BucketingBatchSampler(lengths if path is None else _dataset(path), max_frames=max_frames, seed=0)
    plans = {"BucketingBatchSampler": (ours.epoch_batches(0), time.perf_counter() - t0)}
    t0 = time.perf_counter()
    plans["Lhotse DynamicBucketingSampler"] = (_lhotse_batches(lengths, max_frames, None), time.perf_counter() - t0)
    size = max(1, round(np.mean([len(b) for b in plans["BucketingBatchSampler"][0]])))
    order = np.random.default_rng(0).permutation(len(lengths))
    plans[f"random batches of {size}"] = ([order[i:i + size].tolist() for i in range(0, len(order), size)], 0.0)
    rows = []
    for name, (batches, plan_s) in plans.items():
        padded = [len(b) * int(lengths[b].max()) for b in batches]
        row = {"corpus": corpus, "sampler": name, "max_frames": max_frames,
               "padding_ratio": sum(padded) / int(lengths.sum()), "batches": len(batches),
               "mean_batch": float(np.mean([len(b) for b in batches])),
               "over_budget": int(sum(p > max_frames for p in padded)), "plan_s": plan_s,
               "every_sample_once": sorted(i for b in batches for i in b) == list(range(len(lengths)))}
        if path is not None:
            _read_epoch(path, batches)  # warm
            row["samples_per_s"] = _read_epoch(path, batches)[0]
        rows.append(row)
    return rows


def _dataset(path: Path) -> Any:
    from h5batch.torch import H5Dataset

    return H5Dataset(path, "train")


def measure(work: str | os.PathLike[str], small: bool = False) -> dict[str, Any]:
    """Every table of the module docstring; converts its corpora under ``work`` (kept).

    ``small``: a fifth of the files and of the resumed sampler, with the job's default workers.
    """
    from h5batch.torch.bucketing import field_lengths

    work, k = Path(work), 5 if small else 1
    workers = None if small else 2
    sorted_h5 = _convert(work / "sorted-corpus", work / "sorted.h5", 3000 // k, 0.5, 384_000, "blosc2-lz4", workers)
    speech_h5 = _convert(work / "speech-corpus", work / "speech.h5", 2400 // k, 2.0, 1 << 20, "auto", workers)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"shuffle": shuffle_rows(sorted_h5), "ranks": rank_rows(sorted_h5),
                           "resume": resume_rows(sorted_h5, 10_000_000 // k)}
    lengths = field_lengths(_dataset(speech_h5))
    out["bucketing"] = bucketing_rows(speech_h5, lengths, 64 * int(lengths.mean()), "generated clips 1-2 s")
    rng = np.random.default_rng(0)
    synth = np.clip(rng.lognormal(np.log(12.0), 0.6, 20_000 // k), 1.0, 35.0) * RATE
    out["bucketing"] += bucketing_rows(None, synth.astype(np.int64), int(200 * RATE), "LibriSpeech-like 1-35 s")
    out["seconds"] = time.perf_counter() - t0
    return out


def markdown(res: dict[str, Any]) -> list[str]:
    """The tables of ``sampling.md``."""
    lines = ["## Sampling", "", "Shuffle quality vs locality (class-sorted corpus, 10 classes, chunk groups of 64, "
             "batches of 64, default cache, 0 workers):", "",
             "| sampler | KL bits (mean / max of 5 seeds) | chunks per batch | chunks decoded / epoch | samples/s |",
             "|---|---:|---:|---:|---:|"]
    for r in res.get("shuffle", []):
        lines.append(f"| {r['sampler']} | {r['kl_bits']:.3f} / {r['kl_bits_max']:.3f} | {r['chunks_per_batch']:.1f} "
                     f"| {r['chunks_decoded']} of {r['chunk_groups']} | {r['samples_per_s']:,.0f} |")
    lines += ["", "Per rank, one epoch (chunk groups touched; chunks decoded with the default cache):", "",
              "| world size | order | touched per rank | decoded per rank |", "|---:|---|---:|---:|"]
    for r in res.get("ranks", []):
        lines.append(f"| {r['world_size']} | {r['split']} | {r['chunks_touched_per_rank']:.1f} of {r['chunk_groups']} "
                     f"| {r['chunks_decoded_per_rank']:.1f} |")
    lines += ["", "Resume latency:", "", "| what | resumed (s) | baseline (s) | baseline |", "|---|---:|---:|---|"]
    for r in res.get("resume", []):
        lines.append(f"| {r['what']} | {r['resume_s']:.3f} | {r['baseline_s']:.3f} | {r['baseline']} |")
    lines += ["", "Length bucketing (padding ratio = padded frames / real frames):", "",
              "| lengths | sampler | padding ratio | batches | mean batch | over budget | plan (s) | samples/s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in res.get("bucketing", []):
        rate = f"{r['samples_per_s']:,.0f}" if "samples_per_s" in r else "—"
        lines.append(f"| {r['corpus']} | {r['sampler']} | {r['padding_ratio']:.3f} | {r['batches']} | "
                     f"{r['mean_batch']:.1f} | {r['over_budget']} | {r['plan_s']:.2f} | {rate} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python benchmarks/sampling.py", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for sampling.json, sampling.md and the converted files")
    p.add_argument("--small", action="store_true", help="a fifth of the files")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res = measure(os.path.join(args.out, "work"), args.small)
    with open(os.path.join(args.out, "sampling.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    text = "\n".join(markdown(res))
    with open(os.path.join(args.out, "sampling.md"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
