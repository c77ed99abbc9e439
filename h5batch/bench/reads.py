"""The read phase of a benchmark run: every reader through a real DataLoader (batch 64,
shuffle on), one warm-up epoch then the timed epochs per configuration, interleaved.

Every row is a :class:`~h5batch.bench.loaders.Recipe`; rows at ``num_workers=0`` (and the
strict rows at any worker count) are each measured in a process of their own, forked from one
clean interpreter (:mod:`h5batch.bench.fresh_reads`: in the bench's own process their figures
moved with its heap's history), the other rows in the bench's process, all by
:func:`~h5batch.bench.fresh_reads.measure_loader`."""

from __future__ import annotations

import os
from typing import Any

from . import corpus, loaders, strict_ab
from .checks import train_count
from .fresh_reads import FreshRead, Zygote, measure_loader, to_sample
from .loaders import Recipe
from .records import DEFAULT_CODEC, LOADER, MEMMAP_ROWWISE, PLAIN, Record
from .report import STRICT_LITDATA, STRICT_RAW

Row = Recipe | FreshRead


class ReadPhase:
    """Mixed into :class:`~h5batch.bench.suite.Bench` (uses its records, config and log)."""

    def _read_plan(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> list[tuple[Record, Row]]:
        from .baselines import TypicalRawDataset

        cp = spec["corpus"]
        m = spec["manifest"]
        bs = self.cfg.batch_size
        seed = self.cfg.seed
        train = train_count(m)
        items = corpus.item_paths(m)[:train]
        job = cp.job(self.path("h5", "x.h5"))
        fields = tuple(job.fields.items())
        names = list(cp.fields)
        plan: list[tuple[Record, Row]] = []

        for nw in self.cfg.workers:
            rows: list[tuple[Record, Recipe]] = []

            def add(method: str, codec: str, variant: str, build: Any, **args: Any) -> None:
                rows.append((self.record("read", cp.name, method, codec, variant, nw),  # noqa: B023
                             Recipe(build, {**args, "workers": nw, "batch": bs})))  # noqa: B023

            for codec in spec["codecs"]:
                rec = self.records.get(f"convert/{cp.name}/h5batch/{codec}")
                if rec is None:
                    continue
                path = rec.info["path"]
                add("h5batch", codec, "chunk-shuffle", loaders.h5_chunk_shuffle, path=path, seed=seed)
                if codec == DEFAULT_CODEC or self.cfg.random_all_codecs:
                    add("h5batch", codec, "random", loaders.h5_random, path=path)
                if codec == DEFAULT_CODEC and cp.fixed:
                    # The plain path: how most training scripts build a loader (torch's default
                    # collate, shuffle=True): fixed-length fields only, as default_collate
                    # cannot stack variable lengths (FSDD's full run stopped there).
                    add("h5batch", codec, PLAIN, loaders.h5_plain, path=path)
                if codec == DEFAULT_CODEC:
                    add("h5batch", codec, LOADER, loaders.h5_loader, path=path, seed=seed)  # ds.loader()
            naive = self.records.get(f"convert/{cp.name}/naive/gzip")
            if naive is not None:
                add("naive", "gzip", "random", loaders.naive, path=naive.info["path"], names=names, n=train)
            # Raw files as a training script reads them (soundfile / Pillow per file, torch's
            # default_collate) is the baseline; raw files given h5batch's decoder and batch
            # assembly isolates what the storage layout alone is worth. Fields the script way
            # cannot batch (variable length, resampling) get only the second, as the baseline.
            if TypicalRawDataset.supports(fields):
                add("raw-files", "", "random", loaders.raw_typical, items=items, fields=fields)
                add(STRICT_RAW, "", "random", loaders.raw_strict, items=items, fields=fields)
            else:
                add("raw-files", "", "random", loaders.raw_strict, items=items, fields=fields)
            if "memmap" in spec:
                add(MEMMAP_ROWWISE, "", "random", loaders.memmap_rowwise, paths=spec["memmap"])
            for prec in list(self.records.values()):
                if prec.phase != "convert" or prec.corpus != cp.name or not prec.info.get("verify", {}).get("ok"):
                    continue
                p = prec.info["path"]
                if prec.method == f"webdataset-{self.cfg.dask_workers}p":
                    add("webdataset", "", "shard+buffer", loaders.webdataset, path=p, names=names)
                elif prec.method == "litdata-fork":
                    add("litdata", "", "default", loaders.litdata, path=p, names=names)
                    add("litdata", "", "batch_decode=0", loaders.litdata, path=p, names=names, batch_decode=0)
                    # its fastest configuration again, batched by h5batch's collate
                    add(STRICT_LITDATA, "", "batch_decode=0", loaders.litdata, path=p, names=names,
                        batch_decode=0, assembly="h5batch")
            fresh = nw == 0 and self.cfg.fresh_reads
            plan += [(rec, FreshRead(r, seed, self.cfg.consume) if fresh else r) for rec, r in rows]
            plan += strict_ab.read_plan(self, spec, nw)  # the strict limit and h5batch beside it, own processes
        epochs = max(1, -(-spec["read_samples"] // max(train, 1)))
        for rec, _ in plan:
            rec.info.update(samples_per_epoch=train, epochs=epochs)
        return plan

    def _read_once(self, rec: Record, row: Row, nbytes_per_sample: float, zygote: Zygote | None = None) -> None:
        if isinstance(row, FreshRead):  # in a process of its own: its start is not timed
            rec.info["epochs"] = max(rec.info["epochs"], strict_ab.MIN_EPOCHS)
            rec.runs.append(row.sample(zygote, rec.info["epochs"], nbytes_per_sample))
            return
        r = measure_loader(row(), rec.info["epochs"], self.cfg.consume)
        rec.runs.append(to_sample(r, nbytes_per_sample, row.args.get("batch")))

    def _read_phase(self, spec: dict[str, Any], peer_ok: dict[str, bool], zygote: Zygote) -> None:
        """``zygote``: what the 0-worker rows' processes fork from (bench.fresh_reads)."""
        cp = spec["corpus"]
        plan = self._read_plan(spec, peer_ok)
        os.sync()  # the conversions' outputs, written back now rather than during the reads
        for rep in range(self.cfg.reps):
            self.say(f"read {cp.name}: round {rep + 1}/{self.cfg.reps} ({len(plan)} configurations)")
            k = rep % max(1, len(plan))
            for rec, row in plan[k:] + plan[:k]:
                self._read_once(rec, row, spec["sample_bytes"], zygote)
