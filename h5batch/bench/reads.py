"""The read phase of a benchmark run: every reader through a real DataLoader (batch 64,
shuffle on), one warm-up epoch then one timed epoch per configuration, interleaved."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from . import baselines, corpus, peers, strict_ab
from .checks import train_count
from .measure import PeakRss, Sample, drain
from .records import DEFAULT_CODEC, LOADER, MEMMAP_ROWWISE, PLAIN, Record, close_loader
from .report import STRICT_LITDATA, STRICT_RAW


class ReadPhase:
    """Mixed into :class:`~h5batch.bench.suite.Bench` (uses its records, config and log)."""

    def _read_plan(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> list[tuple[Record, Callable[[], Any]]]:
        from torch.utils.data import DataLoader

        from ..torch import ChunkShuffleSampler, H5Dataset, collate

        cp = spec["corpus"]
        m = spec["manifest"]
        bs = self.cfg.batch_size
        train = train_count(m)
        items = corpus.item_paths(m)[:train]
        job = cp.job(self.path("h5", "x.h5"))
        fields = tuple(job.fields.items())
        names = list(cp.fields)
        plan: list[tuple[Record, Callable[[], Any]]] = []

        def dl(ds: Any, nw: int, **kw: Any) -> Any:
            return DataLoader(ds, batch_size=bs, num_workers=nw, persistent_workers=nw > 0, **kw)

        for nw in self.cfg.workers:
            for codec in spec["codecs"]:
                rec = self.records.get(f"convert/{cp.name}/h5batch/{codec}")
                if rec is None:
                    continue
                path = rec.info["path"]

                def chunked(path: str = path, nw: int = nw) -> Any:
                    ds = H5Dataset(path, "train", as_float=True)
                    return dl(ds, nw, sampler=ChunkShuffleSampler(ds, seed=self.cfg.seed), collate_fn=collate)

                def full(path: str = path, nw: int = nw) -> Any:
                    return dl(H5Dataset(path, "train", as_float=True), nw, shuffle=True, collate_fn=collate)

                plan.append((self.record("read", cp.name, "h5batch", codec, "chunk-shuffle", nw), chunked))
                if codec == DEFAULT_CODEC or self.cfg.random_all_codecs:
                    plan.append((self.record("read", cp.name, "h5batch", codec, "random", nw), full))
                if codec == DEFAULT_CODEC and cp.fixed:
                    # The plain path: how most training scripts build a loader (torch's default
                    # collate, shuffle=True): fixed-length fields only, as default_collate
                    # cannot stack variable lengths (FSDD's full run stopped there).
                    plan.append((self.record("read", cp.name, "h5batch", codec, PLAIN, nw),
                                 lambda path=path, nw=nw: dl(H5Dataset(path, "train"), nw, shuffle=True)))
                if codec == DEFAULT_CODEC:
                    # The one-call fast path, ds.loader().
                    plan.append((self.record("read", cp.name, "h5batch", codec, LOADER, nw),
                                 lambda path=path, nw=nw: H5Dataset(path, "train").loader(
                                     batch_size=bs, num_workers=nw, seed=self.cfg.seed)))
            naive = self.records.get(f"convert/{cp.name}/naive/gzip")
            if naive is not None:
                plan.append((self.record("read", cp.name, "naive", "gzip", "random", nw),
                             lambda nw=nw, p=naive.info["path"]: dl(baselines.NaiveDataset(p, names, train), nw,
                                                                      shuffle=True, collate_fn=baselines.float_collate)))
            # Raw files as a training script reads them (soundfile / Pillow per file, torch's
            # default_collate) is the baseline; raw files given h5batch's decoder and batch
            # assembly isolates what the storage layout alone is worth. Fields the script way
            # cannot batch (variable length, resampling) get only the second, as the baseline.
            strict = lambda nw=nw: dl(baselines.RawFileDataset(items, fields), nw, shuffle=True,  # noqa: E731
                                      collate_fn=baselines.float_collate)
            if baselines.TypicalRawDataset.supports(fields):
                plan.append((self.record("read", cp.name, "raw-files", "", "random", nw),
                             lambda nw=nw: dl(baselines.TypicalRawDataset(items, fields), nw, shuffle=True)))
                plan.append((self.record("read", cp.name, STRICT_RAW, "", "random", nw), strict))
            else:
                plan.append((self.record("read", cp.name, "raw-files", "", "random", nw), strict))
            if "memmap" in spec:
                plan.append((self.record("read", cp.name, MEMMAP_ROWWISE, "", "random", nw),
                             lambda nw=nw: dl(baselines.MemmapDataset(spec["memmap"]), nw, shuffle=True,
                                              collate_fn=baselines.passthrough)))
            plan += strict_ab.read_plan(self, spec, nw)  # the strict limit and h5batch beside it, fresh processes
            for prec in list(self.records.values()):
                if prec.phase != "convert" or prec.corpus != cp.name or not prec.info.get("verify", {}).get("ok"):
                    continue
                if prec.method == f"webdataset-{self.cfg.dask_workers}p":
                    plan.append((self.record("read", cp.name, "webdataset", "", "shard+buffer", nw),
                                 lambda nw=nw, p=prec.info["path"]: peers.wds_loader(p, names, nw, bs)))
                elif prec.method == "litdata-fork":
                    plan.append((self.record("read", cp.name, "litdata", "", "default", nw),
                                 lambda nw=nw, p=prec.info["path"]: peers.litdata_loader(p, names, nw, bs)))
                    plan.append((self.record("read", cp.name, "litdata", "", "batch_decode=0", nw),
                                 lambda nw=nw, p=prec.info["path"]: peers.litdata_loader(p, names, nw, bs,
                                                                                          batch_decode=0)))
                    # its fastest configuration again, batched by h5batch's collate
                    plan.append((self.record("read", cp.name, STRICT_LITDATA, "", "batch_decode=0", nw),
                                 lambda nw=nw, p=prec.info["path"]: peers.litdata_loader(
                                     p, names, nw, bs, batch_decode=0, assembly="h5batch")))
        epochs = max(1, -(-spec["read_samples"] // max(train, 1)))
        for rec, _ in plan:
            rec.info.update(samples_per_epoch=train, epochs=epochs)
        return plan

    def _read_once(self, rec: Record, make: Callable[[], Any], nbytes_per_sample: float) -> None:
        if isinstance(make, strict_ab.FreshRow):  # the strict rows: each in its own process (bench/strict_ab.py)
            rec.info["epochs"] = max(rec.info["epochs"], strict_ab.MIN_EPOCHS)
            rec.runs.append(make.sample(rec.info["epochs"], nbytes_per_sample))
            return
        loader = make()
        sampler = getattr(loader, "sampler", None)
        try:
            warm = drain(loader)  # warm-up epoch: worker start, file opens, caches
            with PeakRss() as mem:
                t0 = time.perf_counter()
                n = 0
                for epoch in range(rec.info["epochs"]):
                    if hasattr(sampler, "set_epoch"):  # as a training loop must, for a new order
                        sampler.set_epoch(epoch + 1)
                    n += drain(loader, consume=self.cfg.consume)
                seconds = time.perf_counter() - t0
        finally:
            close_loader(loader)
        rec.runs.append(Sample(seconds, n, n * nbytes_per_sample, mem.peak, mem.baseline,
                               {"warmup_samples": warm}))

    def _read_phase(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> None:
        cp = spec["corpus"]
        plan = self._read_plan(spec, peer_ok)
        os.sync()  # the conversions' outputs, written back now rather than during the reads
        for rep in range(self.cfg.reps):
            self.say(f"read {cp.name}: round {rep + 1}/{self.cfg.reps} ({len(plan)} configurations)")
            k = rep % max(1, len(plan))
            for rec, make in plan[k:] + plan[:k]:
                self._read_once(rec, make, spec["sample_bytes"])
