"""The benchmark run: conversions, reads, memory, scaling and peers, side by side.

Order of a run (each phase interleaves its configurations within every repetition, so slow
drift of the machine hits all of them alike):

1. corpora: generated once into the cache directory, real ones used when present;
2. conversions, per corpus: a warm-up round on a small corpus, then ``reps`` rounds of
   h5batch (every codec, on a LocalCluster started once: start-up excluded), h5batch cold
   (``kind: local``, the cluster started inside ``convert``: start-up included), the
   decode-only floor (``bench.decode_only`` on the same cluster; for WAV corpora with the
   read+write bound of ``bench.physics`` measured right after it), the naive recipe, the
   x``scale`` corpus (cold) and the peers;
3. correctness: every output is compared with the source decoded in this process;
4. reads through a DataLoader (batch 64, shuffle on), per corpus: for each configuration a
   warm-up epoch, then the timed epochs; every configuration reads the same samples; rows at
   ``num_workers=0`` each in a fresh interpreter (``bench.fresh_reads``).
"""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from .. import __version__
from ..codecs import choices
from ..conversion.options import ConvertOptions
from ..conversion.pipeline import convert
from ..conversion.plan import make_tasks
from . import baselines, cli_cold, corpus, peers, physics, sampling, strict
from .checks import CheckPhase
from .decode_only import decode_only
from .fresh_reads import Zygote
from .measure import Sample, timed
from .reads import ReadPhase
from .records import DEFAULT_CODEC, RW_BOUND, Record

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
    batch_size: int = 64
    peers: bool = False
    real: bool = False  # include ../shared/corpora
    shared: str = os.path.join("..", "shared", "corpora")
    cache: str = os.path.join("data", "bench")
    out_root: str = os.path.join("bench", "results")
    keep: bool = False  # keep converted outputs (else deleted at the end)
    warmup: bool = True  # a warm-up conversion round on a small corpus before the timed rounds
    consume: bool = False  # reads: sum every tensor of every batch in the main process (measure.drain)
    fresh_reads: bool = True  # reads at num_workers=0: each measurement in a new interpreter (bench.fresh_reads)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quick_config(**over: Any) -> BenchConfig:
    return BenchConfig(**over)


def full_config(**over: Any) -> BenchConfig:
    base = dict(mode="full", pairs=4096, images=400, reps=3, codecs=ALL_CODECS,
                image_codecs=("auto", "blosc2-lz4", "gzip"), read_samples=2048,
                peers=True, real=True)
    base.update(over)
    return BenchConfig(**base)


def _field_codecs(path: str) -> dict[str, str]:
    """What each field of the first split was stored with (``auto`` resolves per field)."""
    import h5py

    with h5py.File(path, "r") as f:
        # The file's first split (not the first group: rejects, inventory, ... sort before it).
        splits = [k for k in json.loads(f.attrs.get("splits", "[]")) if k in f]
        split = splits[0] if splits else None
        if split is None:
            return {}
        return {name: str(node.attrs.get("codec", "")) for name, node in f[split].items() if "codec" in node.attrs}


def _say(log: Any, text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=log, flush=True)


class Bench(CheckPhase, ReadPhase):
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
        jobs = self._corpora()
        peer_ok = self._peers_available() if self.cfg.peers else {}
        zygote = Zygote()  # the 0-worker reads fork from it: made before a cluster alters os.environ
        self._start_cluster()
        try:
            for spec in jobs:
                self._convert_phase(spec, peer_ok if spec["peers"] else {})
            strict.convert_storages(self, jobs[0])  # the strict limit's storages, untimed
            self._demo_phase()
        finally:
            self._stop_cluster()
        for spec in jobs:
            self._check_phase(spec, peer_ok if spec["peers"] else {})
            spec.pop("reference", None)  # free it: forked loader workers would inherit it
        gc.collect()
        with zygote:
            for spec in jobs:
                self._read_phase(spec, peer_ok if spec["peers"] else {}, zygote)
        sampling_results = sampling.phase(self.folder("sampling"), self.say, self.skipped, self.cfg.pairs < 512)
        self.load["end"] = os.getloadavg()
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
                "load_average": self.load,
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

    # ------------------------------------------------------------ conversion

    def _convert_plan(self, spec: dict[str, Any], peer_ok: dict[str, bool], warmup: bool) -> list[tuple[str, Callable[[], None]]]:
        cp = spec["warm"] if warmup else spec["corpus"]
        m = cp.manifest()
        items = corpus.item_paths(m)
        job = cp.job(self.path("h5", "x.h5"))
        fields = tuple(job.fields.items())
        n, nfiles = len(items), sum(len(p) for p in items)
        name = spec["corpus"].name
        plan: list[tuple[str, Callable[[], None]]] = []
        addr = {"kind": "address", "address": self.cluster.scheduler_address, "workers": self.cfg.dask_workers}

        def h5(codec: str, cold: bool = False, scaled: bool = False, auto: bool = False) -> Callable[[], None]:
            # auto: what `h5batch convert` does with no --workers (cluster.kind auto decides)
            def run() -> None:
                src = spec["scaled"] if scaled else cp
                out = self.path("h5", f"{src.name}-{codec}{'-cold' if cold else ''}{'-auto' if auto else ''}.h5")
                cold_cl = {"kind": "local", "workers": self.cfg.dask_workers}  # auto: 1 worker = in the driver
                cl = {"kind": "auto"} if auto else cold_cl if cold else addr
                j = src.job(out, codec, cl)
                remove_output(out)
                sample, s = timed(lambda: convert(j, ConvertOptions(overwrite=True, restart=True, progress="none",
                                                                    log=io.StringIO())),
                                  lambda s: s.samples, lambda s: s.bytes_decoded)
                sample.extra.update(files=s.inputs, output_bytes=s.output_bytes, rejects=s.rejects,
                                    internal_seconds=s.seconds, field_codecs=_field_codecs(s.path))
                if not warmup:
                    method = "h5batch-auto" if auto else "h5batch-cold" if cold else "h5batch"
                    variant = f"x{self.cfg.scale}" if scaled else ""
                    rec = self.record("convert", name, method, codec, variant)
                    rec.runs.append(sample)
                    rec.info.update(path=out, samples=s.samples, files=s.inputs, output_bytes=s.output_bytes)
            return run

        def floor() -> None:
            tasks = make_tasks(job, m, "bench-floor", "")
            sample, res = timed(lambda: self.client.gather(self.client.map(decode_only, tasks, pure=False)),
                                lambda r: sum(a for a, _ in r), lambda r: sum(b for _, b in r))
            sample.extra["files"] = nfiles
            if not warmup:
                self.record("convert", name, "floor").runs.append(sample)
                wavs = [p for ps in items for p in ps]
                if wavs and all(p.endswith(".wav") for p in wavs):
                    rw_bound(sample, wavs)

        def rw_bound(floor_run: Sample, wavs: list[str]) -> None:
            # bench.physics' read+write bound, measured beside the floor it scales: a row of
            # floor x read / (read + write), the most any converter reaches on these cores.
            # Writes of twice the decoded bytes, 64 MiB-1 GiB: enough to time, cheap for a mini run.
            nbytes = min(1 << 30, max(64 << 20, int(2 * floor_run.nbytes))) >> 20 << 20
            b = physics.bound_ratio(wavs, os.path.dirname(self.path("physics", "x")), nbytes, reps=2)
            run = Sample(seconds=floor_run.seconds / b["ratio"], items=floor_run.items,
                         nbytes=floor_run.nbytes, peak_rss=floor_run.peak_rss,
                         baseline_rss=floor_run.baseline_rss, extra=dict(b))
            self.record("convert", name, RW_BOUND).runs.append(run)

        def naive() -> None:
            out = self.path("naive", f"{cp.name}.h5")
            remove_output(out)
            sample, r = timed(lambda: baselines.naive_convert(items, fields, out),
                              lambda r: r["samples"], lambda r: r["bytes_decoded"])
            sample.extra.update(files=nfiles, output_bytes=r["output_bytes"])
            if not warmup:
                rec = self.record("convert", name, "naive", "gzip")
                rec.runs.append(sample)
                rec.info.update(path=out, output_bytes=r["output_bytes"])

        def wds(procs: int) -> Callable[[], None]:
            def run() -> None:
                out = self.folder("wds", f"{cp.name}-p{procs}")
                maxcount = max(16, n // 16)
                remove_output(out)
                sample, r = timed(lambda: peers.wds_convert(items, fields, out, procs, maxcount),
                                  lambda r: r["samples"], lambda r: r["bytes_decoded"])
                sample.extra.update(files=nfiles, output_bytes=r["output_bytes"], shards=r["shards"])
                if not warmup:
                    rec = self.record("convert", name, f"webdataset-{procs}p")
                    rec.runs.append(sample)
                    rec.info.update(path=out, output_bytes=r["output_bytes"])
            return run

        def lit(start: str | None) -> Callable[[], None]:
            def run() -> None:
                label = start or "spawn"
                out = self.folder("litdata", f"{cp.name}-{label}")
                nbytes = cp.extra["length"] * 2 * len(fields) * n if cp.kind == "audio" else 0
                remove_output(out)
                sample, r = timed(lambda: peers.litdata_convert(items, fields, out, self.cfg.dask_workers, start),
                                  lambda r: r["samples"], nbytes)
                sample.extra.update(files=nfiles, output_bytes=r["output_bytes"])
                if not warmup:
                    rec = self.record("convert", name, f"litdata-{label}")
                    rec.runs.append(sample)
                    rec.info.update(path=out, output_bytes=r["output_bytes"])
            return run

        def cli(method: str) -> Callable[[], None]:
            # Whole commands in fresh interpreters (cli_cold): real corpora, the user's first run.
            def run() -> None:
                out = self.path("cli", f"{cp.name}-{method}.h5")
                remove_output(out)
                if method == "naive-cli":
                    sample, r = timed(lambda: cli_cold.run_naive(items, fields, out, self.path("cli")),
                                      lambda r: r[1]["samples"], lambda r: r[1]["bytes_decoded"])
                    extra = {"files": nfiles, "output_bytes": r[1]["output_bytes"]}
                else:
                    job_file = cli_cold.write_job(self.path("cli", f"{cp.name}.job.yaml"), f"bench-{cp.name}",
                                                  cp.root, cp.source, cp.fields, out)
                    sample, r = timed(lambda: cli_cold.run_convert(job_file, out),
                                      lambda r: sum(r[1]["counts"].values()), lambda r: r[1]["bytes_decoded"])
                    extra = {"files": nfiles, "output_bytes": r[1]["output_bytes"],
                             "internal_seconds": r[1]["seconds"], "field_codecs": _field_codecs(out)}
                sample.extra.update(extra)
                if not warmup:
                    rec = self.record("convert", name, method, "auto" if method == "h5batch-cli" else "gzip")
                    rec.runs.append(sample)
                    rec.info.update(path=out, output_bytes=extra["output_bytes"])
            return run

        for codec in spec["codecs"]:
            plan.append((f"h5batch {codec}", h5(codec)))
        plan.append((f"h5batch {DEFAULT_CODEC} cold", h5(DEFAULT_CODEC, cold=True)))
        plan.append((f"h5batch {DEFAULT_CODEC} auto", h5(DEFAULT_CODEC, auto=True)))
        plan.append(("floor", floor))
        plan.append(("naive", naive))
        if cp.real:
            plan += [("h5batch CLI cold", cli("h5batch-cli")), ("naive CLI", cli("naive-cli"))]
        if spec["scaled"] is not None and not warmup:
            plan.append((f"h5batch x{self.cfg.scale} cold", h5(DEFAULT_CODEC, cold=True, scaled=True)))
        if peer_ok.get("webdataset"):
            plan += [("webdataset 1p", wds(1)), (f"webdataset {self.cfg.dask_workers}p", wds(self.cfg.dask_workers))]
        if peer_ok.get("litdata"):
            plan += [("litdata spawn", lit(None)), ("litdata fork", lit("fork"))]
        return plan

    def _demo_phase(self) -> None:
        """``make convert``'s demo job as a whole command (cli_cold): its conversion seconds."""
        job = cli_cold.demo_job()
        if job is None:
            self.skipped.append("demo job: jobs/demo.yaml not found (installed package)")
            return
        root, out = self.folder("demo-corpus"), self.path("cli", "demo.h5")
        cli_cold.run_demo(job, root, out)  # warm-up; generates the corpus
        rec = self.record("convert", "demo", "h5batch-cli", "auto")
        for rep in range(self.cfg.reps):
            self.say(f"convert demo (whole command): round {rep + 1}/{self.cfg.reps}")
            os.sync()
            remove_output(out)
            sample, (_, s) = timed(lambda: cli_cold.run_demo(job, root, out),
                                   lambda r: sum(r[1]["counts"].values()), lambda r: r[1]["bytes_decoded"])
            sample.extra.update(internal_seconds=s["seconds"], output_bytes=s["output_bytes"])
            rec.runs.append(sample)

    def _convert_phase(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> None:
        name = spec["corpus"].name
        if spec["warm"] is not None:
            self.say(f"convert {name}: warm-up round on {spec['warm'].name}")
            for _, fn in self._convert_plan(spec, peer_ok, warmup=True):
                fn()
        plan = self._convert_plan(spec, peer_ok, warmup=False)
        for rep in range(self.cfg.reps):
            # Rotate the order each round so no configuration always runs first or last.
            k = rep % len(plan)
            self.say(f"convert {name}: round {rep + 1}/{self.cfg.reps} ({len(plan)} configurations)")
            for _, fn in plan[k:] + plan[:k]:
                # Every conversion writes hundreds of MB: without a sync the kernel writes the
                # previous run's output back (and throttles writers) during the next one.
                os.sync()
                fn()


def remove_output(path: str) -> None:
    """Remove the previous round's output before a timed conversion.

    Every method would otherwise spend part of its time dropping the previous output's
    cached pages (unlink, ``O_TRUNC``, ``rmtree``: ~0.05 s per 500 MB here), which is not
    conversion work and which a first conversion does not pay.
    """
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


