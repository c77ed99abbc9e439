"""The benchmark run: conversions, reads, memory, scaling and peers, side by side.

Order of a run (each phase interleaves its configurations within every repetition, so slow
drift of the machine hits all of them alike):

1. corpora: generated once into the cache directory, real ones used when present;
2. conversions, per corpus (``bench.converts``): an untimed warm-up round, then ``reps``
   rounds of h5batch (every codec, on a LocalCluster started once: start-up excluded),
   h5batch cold (``kind: local``, the cluster started inside ``convert``: start-up
   included), ``kind: auto``, the decode-only floor (``bench.decode_only`` on the same
   cluster; for WAV corpora with the read+write bound of ``bench.physics`` measured right
   after it), the naive recipe, the x``scale`` corpus (cold) and the peers; each row that
   times a fresh start in a clean process of its own (``bench.zygote``);
3. correctness: every output is compared with the source decoded in this process;
4. reads through a DataLoader (batch 64, shuffle on), per corpus: for each configuration a
   warm-up epoch, then the timed epochs; every configuration reads the same samples; rows at
   ``num_workers=0`` each in a fresh interpreter (``bench.fresh_reads``);
5. full mode: the memory of converting 2-hour recordings (``bench.longfile``), then the
   sampler's figures and the first epoch of a file of many chunks.
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from .. import __version__
from ..codecs import choices
from . import corpus, first_epoch, longfile, memstate, peers, sampling, strict
from .checks import CheckPhase
from .converts import ConvertPhase
from .reads import ReadPhase
from .records import DEFAULT_CODEC, Record
from .zygote import CONVERT_PRELOAD, PEER_CONVERT_PRELOAD, Zygote

ALL_CODECS = choices()  # auto first, then every registered codec (h5batch/codecs/)


@dataclass
class BenchConfig:
    """What one ``h5batch bench`` run measures. See :func:`quick_config` / :func:`full_config`."""

    mode: str = "quick"
    pairs: int = 1024  # paired-audio samples of the x1 corpus (read corpus too)
    rate: int = corpus.AUDIO_RATE  # Hz of the generated paired audio (2 s clips)
    images: int = 64  # generated images
    scale: int = 4  # the scaling corpus is scale x pairs
    reps: int = 2
    codecs: tuple[str, ...] = ("auto", "blosc2-lz4", "gzip")
    image_codecs: tuple[str, ...] = ("auto",)
    random_all_codecs: bool = False  # also read every codec in full random order (else default codec only)
    read_samples: int = 512  # timed samples per read measurement (whole epochs, at least one)
    workers: tuple[int, ...] = (0, 2)  # DataLoader num_workers
    dask_workers: int = 2
    long_minutes: float = 0.0  # long recordings' memory (bench.longfile): their length; 0: not measured
    batch_size: int = 64
    peers: bool = False
    real: bool = False  # include ../shared/corpora
    shared: str = os.path.join("..", "shared", "corpora")
    cache: str = os.path.join("data", "bench")
    out_root: str = os.path.join("bench", "results")
    keep: bool = False  # keep converted outputs (else deleted at the end)
    warmup: bool = True  # an untimed conversion round first; in each child, a warm-up on a small corpus
    consume: bool = False  # reads: sum every tensor of every batch in the main process (measure.drain)
    fresh_reads: bool = True  # reads at num_workers=0: each measurement in a new interpreter (bench.fresh_reads)
    fresh_converts: bool = True  # conversions: each in a child of a clean interpreter (bench.converts)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quick_config(**over: Any) -> BenchConfig:
    return BenchConfig(**over)


def full_config(**over: Any) -> BenchConfig:
    base = dict(mode="full", pairs=4096, images=400, reps=3, codecs=ALL_CODECS,
                image_codecs=("auto", "blosc2-lz4", "gzip"), read_samples=2048,
                peers=True, real=True, long_minutes=120.0)
    base.update(over)
    return BenchConfig(**base)


def _say(log: Any, text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=log, flush=True)


class Bench(CheckPhase, ConvertPhase, ReadPhase):
    """One benchmark run; :meth:`run` returns the results dict that :mod:`report` renders."""

    def __init__(self, cfg: BenchConfig, log: Any = None):
        self.cfg = cfg
        self.log = log or sys.stderr
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out_dir = os.path.abspath(os.path.join(cfg.out_root, stamp))
        self.work = os.path.join(self.out_dir, "work")
        self.records: dict[str, Record] = {}
        self.corpora: dict[str, dict[str, Any]] = {}
        self.checks: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.cluster = None
        self.client = None

    # ------------------------------------------------------------------ helpers

    def say(self, text: str) -> None:
        _say(self.log, text)

    def record(self, phase: str, corpus_name: str, method: str, codec: str = "", variant: str = "",
               workers: int | None = None) -> Record:
        r = Record(phase, corpus_name, method, codec, variant, workers)
        return self.records.setdefault(r.key, r)

    def path(self, *parts: str) -> str:
        """A file path under the work directory (its folder created)."""
        p = os.path.join(self.work, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def folder(self, *parts: str) -> str:
        """A folder path under the work directory (its parent created, itself not)."""
        return self.path(*parts)

    def _start_cluster(self) -> None:
        from distributed import Client, LocalCluster

        t0 = time.perf_counter()
        self.cluster = LocalCluster(n_workers=self.cfg.dask_workers, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)
        self.client = Client(self.cluster)
        self.cluster_start_seconds = time.perf_counter() - t0

    def _stop_cluster(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        self.client = self.cluster = None

    # ------------------------------------------------------------------- run

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.load = {"start": os.getloadavg()}
        if self.load["start"][0] > 1.5:
            self.say(f"WARNING: load average {self.load['start'][0]:.1f} on {os.cpu_count()} cores: other "
                     "processes compete for the CPU and every figure will be low and noisy")
        os.makedirs(self.work, exist_ok=True)
        self.say(f"h5batch bench ({self.cfg.mode}) -> {self.out_dir}")
        self.memory = {"start": self._memory_probe()}
        self.say(f"memory: {memstate.describe(self.memory['start'])}")
        jobs = self._corpora()
        peer_ok = self._peers_available() if self.cfg.peers else {}
        # The zygotes are made before a cluster alters os.environ (see bench.zygote).
        zygote = Zygote()  # the 0-worker reads fork from it
        self.convert_zygote = Zygote(preload=CONVERT_PRELOAD) if self.cfg.fresh_converts else None
        self.peer_zygote = Zygote(preload=PEER_CONVERT_PRELOAD) if self.cfg.fresh_converts else None
        self._start_cluster()
        try:
            for spec in jobs:
                self._convert_phase(spec, peer_ok if spec["peers"] else {})
            strict.convert_storages(self, jobs[0])  # the strict limit's storages, untimed
            self._demo_phase()
        finally:
            self._stop_cluster()
            for z in (self.convert_zygote, self.peer_zygote):
                if z is not None:
                    z.close()
        for spec in jobs:
            self._check_phase(spec, peer_ok if spec["peers"] else {})
            spec.pop("reference", None)  # free it: forked loader workers would inherit it
        gc.collect()
        with zygote:
            for spec in jobs:
                self._read_phase(spec, peer_ok if spec["peers"] else {}, zygote)
        longfile.bench_phase(self)  # full mode: memory of 2-hour recordings
        sampling_results = sampling.phase(self.folder("sampling"), self.say, self.skipped, self.cfg.pairs < 512)
        # A file of many chunks (the main corpus, one row per chunk): its first epoch (bench.first_epoch).
        self.first_epoch = first_epoch.probe(self.cfg.cache, self.folder("first-epoch"), self.cfg.pairs, self.cfg.rate)
        self.say(f"reading: {first_epoch.describe(self.first_epoch)}")
        self.load["end"] = os.getloadavg()
        self.memory["end"] = self._memory_probe()
        self.say(f"memory at the end: {memstate.describe(self.memory['end'])}")
        results = {
            "meta": self._meta(time.perf_counter() - t0),
            "config": self.cfg.to_dict(),
            "corpora": self.corpora,
            "main_corpus": jobs[0]["corpus"].name,
            "image_corpus": jobs[1]["corpus"].name,
            "records": [r.to_dict() for r in self.records.values()],
            "checks": self.checks,
            "skipped": self.skipped,
            "out_dir": self.out_dir,
            "sampling": sampling_results,
        }
        if not self.cfg.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        return results

    def _memory_probe(self) -> dict[str, Any]:
        """bench.memstate's probe (what writing into memory free for a second costs here);
        a smaller one outside full mode, whose figures nobody compares."""
        if self.cfg.mode == "full":
            return memstate.probe(self.work)
        return memstate.probe(self.work, **memstate.SMALL)

    def _meta(self, seconds: float) -> dict[str, Any]:
        import psutil

        from ..conversion.plan import versions

        v = versions()
        for name in ("torch", "webdataset", "litdata"):
            ok, ver = peers.available(name) if name != "torch" else (True, __import__("torch").__version__)
            if ok:
                v[name] = ver
        return {"h5batch": __version__, "mode": self.cfg.mode, "seconds": seconds,
                "finished": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
                            "platform": platform.platform(), "python": platform.python_version()},
                "versions": v, "cluster_start_seconds": getattr(self, "cluster_start_seconds", None),
                "load_average": self.load, "memory": self.memory,
                "first_epoch": getattr(self, "first_epoch", None),
                "note": "warm page cache: every input and output file is read from memory"}

    def _peers_available(self) -> dict[str, bool]:
        out = {}
        for name in peers.PEERS:
            ok, why = peers.available(name)
            out[name] = ok
            if not ok:
                msg = f"peer {name} skipped: not importable ({why}); install requirements-peers.txt"
                self.skipped.append(msg)
                self.say(msg)
        return out

    # --------------------------------------------------------------- corpora

    def _corpora(self) -> list[dict[str, Any]]:
        c = self.cfg
        self.say(f"corpora in {c.cache} (generated once)")
        main = corpus.paired_audio(c.cache, c.pairs, c.rate)
        big = corpus.paired_audio(c.cache, c.pairs * c.scale, c.rate)
        warm = corpus.paired_audio(c.cache, max(16, min(64, c.pairs // 8)), c.rate) if c.warmup else None
        imgs = corpus.images(c.cache, c.images)
        warm_img = corpus.images(c.cache, 16) if c.warmup else None
        specs = [
            {"corpus": main, "warm": warm, "codecs": c.codecs, "scaled": big, "peers": True,
             "read_samples": c.read_samples},
            {"corpus": imgs, "warm": warm_img, "codecs": c.image_codecs, "scaled": None, "peers": False,
             "read_samples": 128},
        ]
        if c.real:
            reals = corpus.real_corpora(c.shared)
            if not reals:
                self.skipped.append(f"real corpora: none found in {c.shared}")
            for rc in reals:
                specs.append({"corpus": rc, "warm": None, "codecs": (DEFAULT_CODEC,), "scaled": None,
                              "peers": False, "read_samples": 0})
        for s in specs:
            for key in ("corpus", "scaled"):
                if s[key] is None:
                    continue
                cp = s[key]
                m = cp.manifest()
                if key == "corpus":
                    s["manifest"] = m
                self.corpora[cp.name] = {"root": cp.root, "kind": cp.kind, "samples": len(m.items),
                                         "files": sum(len(it.paths) for it in m.items),
                                         "fields": list(cp.fields), "real": cp.real, "notes": cp.notes}
        return specs
