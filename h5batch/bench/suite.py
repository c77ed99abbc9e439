"""The benchmark run: conversions, correctness, reads, side by side on the same corpora.

Order of a run; each phase rotates its configurations within every round, so that slow
drift of the machine hits all of them alike, and every row runs in a process of its own
(:mod:`.measure`):

1. corpora: generated once into the cache directory, real ones used when present;
2. conversions, per corpus: an untimed round (the machine's first writes of that much data
   were 2-4x slower than the others), then ``reps`` rounds of ``h5batch convert`` (every
   codec, and the default codec on the x``scale`` corpus), the naive recipe and the peers,
   each a whole command timed from outside, ``sync(2)`` before each;
3. correctness: every output is compared with the source decoded in this process;
4. reads through a DataLoader, per corpus and ``num_workers``: one untimed epoch, then
   whole epochs timed (at least :data:`MIN_EPOCHS`), the same for every row.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np

from .. import __version__
from ..codecs import choices
from . import corpus, loaders, measure, writers

ALL_CODECS = choices()  # auto first, then every registered codec (h5batch/codecs/)
DEFAULT_CODEC = "auto"  # the job default
PLAIN = "plain-dataloader"  # DataLoader(ds, batch_size, shuffle=True), torch's default collate
LOADER = "ds.loader"  # H5Dataset(...).loader(batch_size, num_workers)
MIN_EPOCHS = 3  # timed epochs of a read row at least: one epoch of the quick corpus is ~0.1 s


@dataclass
class BenchConfig:
    """What one ``h5batch bench`` run measures: its defaults are ``--quick``'s; :func:`full_config`
    gives the full run's."""

    mode: str = "quick"
    pairs: int = 1024  # paired-audio samples of the main corpus
    rate: int = corpus.AUDIO_RATE  # Hz of the generated paired audio (2 s clips)
    images: int = 64  # generated images; 0: no image corpus
    scale: int = 4  # the scaling corpus is scale x pairs; 1: none
    reps: int = 2
    codecs: tuple[str, ...] = ("auto", "blosc2-lz4", "gzip")
    image_codecs: tuple[str, ...] = ("auto",)
    workers: tuple[int, ...] = (0, 2)  # DataLoader num_workers
    read_samples: int = 2048  # timed samples per read row of the main corpus (whole epochs)
    batch_size: int = 64
    processes: int = 2  # processes of the peers' writers
    peers: bool = False
    s3: bool = False  # object-storage rows (h5batch.bench.s3): moto's server on loopback
    real: bool = False  # include ../shared/corpora
    shared: str = os.path.join("..", "shared", "corpora")
    cache: str = os.path.join("data", "bench")
    out_root: str = os.path.join("bench", "results")
    keep: bool = False  # keep the converted outputs (else deleted at the end)
    warmup: bool = True  # an untimed conversion round first
    consume: bool = False  # reads: sum every tensor of every batch (measure.read_row)
    seed: int = 0


def full_config(**over: Any) -> BenchConfig:
    base = dict(mode="full", pairs=4096, images=400, reps=3, codecs=ALL_CODECS,
                image_codecs=("auto", "blosc2-lz4", "gzip"), read_samples=8192, peers=True, real=True)
    return BenchConfig(**{**base, **over})


@dataclass
class Record:
    """All repetitions of one configuration: one row of a table."""

    phase: str  # convert | read
    corpus: str
    method: str  # h5batch, naive, raw-files, memmap, webdataset[-Np], litdata
    codec: str = ""
    variant: str = ""  # the reader's order, or the scaled corpus (x4)
    workers: int | None = None  # DataLoader num_workers (reads)
    runs: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        parts = [self.phase, self.corpus, self.method, self.codec, self.variant,
                 "" if self.workers is None else f"w{self.workers}"]
        return "/".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        rate = measure.summarize(r["items"] / r["seconds"] for r in self.runs if r["seconds"] > 0)
        return {**asdict(self), "key": self.key, "rate": rate,
                "seconds": measure.summarize(r["seconds"] for r in self.runs),
                "peak_rss": measure.summarize(r["peak_rss"] for r in self.runs)}


Row = tuple[Record, str, Callable[[], dict[str, Any]]]  # (its record, output path, one run: measure.run/call)


class Bench:
    """One benchmark run; :meth:`run` returns the results dict that :mod:`.report` renders."""

    def __init__(self, cfg: BenchConfig, log: Any = None):
        self.cfg = cfg
        self.log = log or sys.stderr
        self.out_dir = os.path.abspath(os.path.join(cfg.out_root, datetime.now().strftime("%Y%m%d-%H%M%S")))
        self.work = os.path.join(self.out_dir, "work")
        self.records: dict[str, Record] = {}
        self.corpora: dict[str, dict[str, Any]] = {}
        self.checks: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.peer_ok: dict[str, bool] = {}

    def say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=self.log, flush=True)

    def record(self, phase: str, corpus_name: str, method: str, codec: str = "", variant: str = "",
               workers: int | None = None) -> Record:
        r = Record(phase, corpus_name, method, codec, variant, workers)
        return self.records.setdefault(r.key, r)

    def path(self, *parts: str) -> str:
        """A path under the work directory, its folder created."""
        p = os.path.join(self.work, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"check": what, "ok": bool(ok), "detail": detail})
        if not ok:
            self.say(f"CHECK FAILED: {what} {detail}")

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        load = {"start": os.getloadavg()}
        if load["start"][0] > 1.5:
            self.say(f"WARNING: load average {load['start'][0]:.1f} on {os.cpu_count()} cores: other "
                     "processes compete for the CPU and every figure will be low and noisy")
        os.makedirs(self.work, exist_ok=True)
        self.say(f"h5batch bench ({self.cfg.mode}) -> {self.out_dir}")
        specs = self._corpora()
        for name in writers.PEERS if self.cfg.peers else ():
            ok, why = writers.available(name)
            self.peer_ok[name] = ok
            if not ok:
                self.skipped.append(f"peer {name}: not importable ({why}); install requirements-peers.txt")
                self.say(self.skipped[-1])
        for phase in (self._convert_phase, self._check_phase, self._read_phase):
            for spec in specs:
                phase(spec)
        if self.cfg.s3:
            self._s3_phase(specs[0])
        load["end"] = os.getloadavg()
        results = {"meta": self._meta(time.perf_counter() - t0, load), "config": asdict(self.cfg),
                   "corpora": self.corpora, "main_corpus": specs[0]["corpus"].name,
                   "records": [r.to_dict() for r in self.records.values()], "checks": self.checks,
                   "skipped": self.skipped, "out_dir": self.out_dir}
        if not self.cfg.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        return results

    def _meta(self, seconds: float, load: dict[str, Any]) -> dict[str, Any]:
        import h5py
        import psutil

        versions = {"h5batch": __version__, "numpy": np.__version__, "h5py": h5py.version.version,
                    "hdf5": h5py.version.hdf5_version}
        for name in ("torch", "dask", *self.peer_ok):
            ok, v = writers.available(name)
            if ok:
                versions[name] = v
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return {"h5batch": __version__, "commit": git.stdout.strip() if git.returncode == 0 else None,
                "mode": self.cfg.mode, "seconds": seconds,
                "finished": datetime.now(UTC).isoformat(timespec="seconds"), "load_average": load,
                "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
                            "platform": platform.platform(), "python": platform.python_version()},
                "versions": versions, "note": "warm page cache: every input and output file is read from memory"}

    def _s3_phase(self, spec: dict[str, Any]) -> None:
        from . import s3

        missing = [why for ok, why in map(writers.available, ("moto", "obstore")) if not ok]
        h5 = self.path("h5", f"{spec['corpus'].name}-{DEFAULT_CODEC}.h5")
        if missing or not os.path.exists(h5):
            self.skipped.append(f"s3 rows: {'; '.join(missing) or 'no h5batch output of the main corpus'}")
            return
        lit = self.path("litdata", spec["corpus"].name, "x")
        self.say("s3: reads from moto's server on loopback")
        s3.measure_rows(self, spec["corpus"].name, h5, lit if self.peer_ok.get("litdata") else None, self.cfg.reps)

    # ---------------------------------------------------------------- corpora

    def _corpora(self) -> list[dict[str, Any]]:
        c = self.cfg
        self.say(f"corpora in {c.cache} (generated once)")
        scaled = corpus.paired_audio(c.cache, c.pairs * c.scale, c.rate) if c.scale > 1 else None
        specs = [self._spec(corpus.paired_audio(c.cache, c.pairs, c.rate), c.codecs, c.read_samples, scaled,
                            peers=True)]
        if c.images:
            specs.append(self._spec(corpus.images(c.cache, c.images), c.image_codecs, 256))
        if c.real:
            reals = corpus.real_corpora(c.shared)
            if not reals:
                self.skipped.append(f"real corpora: none found in {c.shared}")
            specs += [self._spec(rc, (DEFAULT_CODEC,), 0) for rc in reals]
        return specs

    def _spec(self, cp: corpus.Corpus, codecs: tuple[str, ...], read_samples: int,
              scaled: corpus.Corpus | None = None, peers: bool = False) -> dict[str, Any]:
        m = cp.manifest()
        for x in filter(None, (cp, scaled)):
            n = len(m.items) if x is cp else x.extra["pairs"]
            self.corpora[x.name] = {"root": x.root, "kind": x.kind, "samples": n, "files": n * len(x.fields),
                                    "fields": list(x.fields), "real": x.real, "notes": x.notes}
        return {"corpus": cp, "codecs": codecs, "read_samples": read_samples, "scaled": scaled, "peers": peers,
                "manifest": m, "items": corpus.item_paths(m), "fields": tuple(cp.job("x.h5").fields.items()),
                "train": [k for k, it in enumerate(m.items) if it.split == "train"]}

    # ------------------------------------------------------------ conversions

    def _convert_rows(self, spec: dict[str, Any]) -> list[Row]:
        cp, items, fields = spec["corpus"], spec["items"], spec["fields"]
        rows: list[Row] = []

        def h5batch(codec: str, src: corpus.Corpus, variant: str = "") -> Row:
            out = self.path("h5", f"{src.name}-{codec}.h5")
            job_file = self.path("jobs", f"{src.name}-{codec}.yaml")
            with open(job_file, "w") as f:
                json.dump(src.job_dict(out, codec), f, indent=1)  # JSON is YAML
            run = partial(measure.run, writers.convert_argv(job_file))
            return self.record("convert", cp.name, "h5batch", codec, variant), out, run

        def script(method: str, codec: str, fn: Callable[..., dict[str, Any]], out: str, *args: Any) -> Row:
            run = partial(measure.call, fn, items, fields, out, *args, scratch=self.work)
            return self.record("convert", cp.name, method, codec), out, run

        rows += [h5batch(codec, cp) for codec in spec["codecs"]]
        rows.append(script("naive", "gzip", writers.naive_convert, self.path("naive", f"{cp.name}.h5")))
        if spec["scaled"] is not None:
            rows.append(h5batch(DEFAULT_CODEC, spec["scaled"], f"x{self.cfg.scale}"))
        if spec["peers"] and self.peer_ok.get("webdataset"):
            p = self.cfg.processes
            rows.append(script(f"webdataset-{p}p", "", writers.wds_convert, self.path("wds", cp.name, "x"),
                               p, max(16, len(items) // 16)))
        if spec["peers"] and self.peer_ok.get("litdata"):
            rows.append(script("litdata", "", writers.litdata_convert, self.path("litdata", cp.name, "x"),
                               self.cfg.processes))
        return rows

    def _convert_phase(self, spec: dict[str, Any]) -> None:
        name = spec["corpus"].name
        rows = self._convert_rows(spec)
        rounds = [False] * self.cfg.warmup + [True] * self.cfg.reps
        for k, timed in enumerate(rounds):
            which = f"round {k + 1 - self.cfg.warmup}/{self.cfg.reps}" if timed else "untimed round"
            self.say(f"convert {name}: {which} ({len(rows)} configurations)")
            for rec, out, run in rows[k % len(rows):] + rows[:k % len(rows)]:
                writers.remove_output(out)
                os.sync()  # else the previous output's writeback lands in this run
                r = run()
                s = r["result"]  # the summary of `h5batch convert --json`, or what a script returns
                rec.info["path"] = out
                if timed:
                    rec.runs.append({"seconds": r["wall"], "work_seconds": s["seconds"], "cpu_seconds": r["cpu_seconds"],
                                     "items": s["samples"] if "samples" in s else sum(s["counts"].values()),
                                     "peak_rss": r["peak_rss"], "output_bytes": writers.dir_bytes(out)})

    # ------------------------------------------------------------ correctness

    def _check_phase(self, spec: dict[str, Any]) -> None:
        cp, m = spec["corpus"], spec["manifest"]
        self.say(f"check {cp.name}: decoding the source in this process for reference")
        ref = corpus.decode_items(cp, m)
        self.corpora[cp.name]["sample_bytes"] = sum(a.nbytes for v in ref.values() for a in v) / max(len(m.items), 1)
        for rec in [r for r in self.records.values() if r.phase == "convert" and r.corpus == cp.name]:
            path = rec.info.get("path")
            if path is None or rec.variant:
                continue
            if rec.method == "h5batch":
                rec.info["field_codecs"] = field_codecs(path)
                self.check(f"{cp.name}: h5batch {rec.codec} output equals the decoded source", h5_equal(path, m, ref))
            elif rec.method == "naive":
                got = {name: writers.naive_read_all(path, name) for name in ref}
                ok = all(len(got[k]) == len(ref[k]) and all(map(np.array_equal, got[k], ref[k])) for k in ref)
                self.check(f"{cp.name}: naive output equals the decoded source", ok)
            else:
                build = loaders.webdataset if rec.method.startswith("webdataset") else loaders.litdata
                rec.info["verify"] = v = loaders.verify(build(path, list(ref), 2, self.cfg.batch_size, keys=True), ref)
                self.check(f"{cp.name}: {rec.method} holds every sample once, equal to the source", v["ok"],
                           json.dumps(v))
        if cp.fixed:
            spec["memmap"] = loaders.write_memmaps({k: [v[i] for i in spec["train"]] for k, v in ref.items()},
                                                   os.path.dirname(self.path("memmap", cp.name, "x")))

    # ------------------------------------------------------------------ reads

    def _read_rows(self, spec: dict[str, Any], nw: int) -> list[tuple[Record, Callable[..., Any], dict[str, Any]]]:
        cp = spec["corpus"]
        names, fixed, n = list(cp.fields), cp.fixed, len(spec["train"])
        rows: list[tuple[Record, Callable[..., Any], dict[str, Any]]] = []

        def add(method: str, codec: str, variant: str, build: Callable[..., Any], **args: Any) -> None:
            rows.append((self.record("read", cp.name, method, codec, variant, nw), build,
                         {**args, "workers": nw, "batch": self.cfg.batch_size}))

        def converted(method: str, codec: str = "") -> str | None:
            rec = self.records.get("/".join(filter(None, ("convert", cp.name, method, codec))))
            return rec.info.get("path") if rec is not None and rec.runs else None

        orders = [(codec, "chunk-shuffle") for codec in spec["codecs"]]
        # torch's default collate (PLAIN) cannot stack variable lengths
        orders += [(DEFAULT_CODEC, o) for o in ("random", PLAIN, LOADER) if fixed or o != PLAIN]
        for codec, order in orders:
            if (path := converted("h5batch", codec)) is not None:
                add("h5batch", codec, order, loaders.h5, path=path, order=order, seed=self.cfg.seed)
        if (path := converted("naive", "gzip")) is not None:
            add("naive", "gzip", "random", loaders.naive, path=path, names=names, n=n, fixed=fixed)
        add("raw-files", "", "random", loaders.raw, items=[spec["items"][k] for k in spec["train"]],
            fields=spec["fields"], fixed=fixed)
        if "memmap" in spec:
            add("memmap", "", "random", loaders.memmap, folder=spec["memmap"])
        for rec in [r for r in self.records.values() if r.phase == "convert" and r.corpus == cp.name]:
            if rec.info.get("verify", {}).get("ok") and rec.method.startswith("webdataset"):
                add("webdataset", "", "shard+buffer", loaders.webdataset, path=rec.info["path"], names=names)
            elif rec.info.get("verify", {}).get("ok") and rec.method == "litdata":
                add("litdata", "", "default", loaders.litdata, path=rec.info["path"], names=names)
        return rows

    def _read_phase(self, spec: dict[str, Any]) -> None:
        cp, n = spec["corpus"], max(len(spec["train"]), 1)
        if not spec["train"]:
            return
        epochs = max(MIN_EPOCHS, -(-spec["read_samples"] // n))
        rows = [row for nw in self.cfg.workers for row in self._read_rows(spec, nw)]
        for rec, _, _ in rows:
            rec.info.update(samples_per_epoch=n, epochs=epochs)
        os.sync()  # the conversions' outputs, written back now rather than during the reads
        for k in range(self.cfg.reps):
            self.say(f"read {cp.name}: round {k + 1}/{self.cfg.reps} ({len(rows)} configurations)")
            for rec, build, args in rows[k % len(rows):] + rows[:k % len(rows)]:
                r = measure.call(measure.read_row, build, args, epochs, self.cfg.seed, self.cfg.consume,
                                 scratch=self.work)
                s = r["result"]
                rec.runs.append({"seconds": s["seconds"], "items": s["samples"], "cpu_seconds": s["cpu_seconds"],
                                 "peak_rss": r["peak_rss"], "wall": r["wall"]})


def h5_equal(path: str, manifest: Any, ref: dict[str, list[np.ndarray]]) -> bool:
    """Every sample of the h5batch file at ``path``, read back with ``H5Dataset``, equals the
    decoded source (``ref``, in manifest order: splits in turn)."""
    from ..torch import H5Dataset

    splits = [it.split for it in manifest.items]
    for split in dict.fromkeys(splits):
        rows = [k for k, s in enumerate(splits) if s == split]  # the split's samples, in file order
        with H5Dataset(path, split, as_float=False) as ds:
            if len(ds) != len(rows) or any(not np.array_equal(ds[j][name].numpy(), ref[name][k])
                                           for j, k in enumerate(rows) for name in ref):
                return False
    return True


def field_codecs(path: str) -> dict[str, str]:
    """The codec each field of the file's first split was stored with (``auto`` resolves per
    field, the same in every split), as ``h5batch inspect`` reads it."""
    from ..tools.inspect import describe

    first = next(iter(describe(path)["splits"].values()), {"fields": {}})
    return {name: str(st["codec"]) for name, st in first["fields"].items() if st["codec"]}
