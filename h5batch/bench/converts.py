"""The conversion phase of a benchmark run: every writer on the same corpus, rounds interleaved.

Rule: a row that times a fresh start (h5batch cold and ``kind: auto``, the naive recipe,
WebDataset, LitData: what a command or a script does) runs in a child forked for it from a
conversion :class:`~h5batch.bench.zygote.Zygote`, a clean interpreter with h5py, Dask and the
converters imported and no thread: h5batch's rows from one without torch, as ``h5batch
convert`` runs (:mod:`.convert_child`), the others from one with torch, which the peers and
the naive recipe's module import. Reasons, measured: in the bench's own process
(torch, a live Dask client, ~1 GB of heap) ``kind: auto`` took 0.40-1.33 s against ~0.33 s in
a clean one, WebDataset in 2 processes 0.77-0.80 s against 0.55-0.62 s; and with the client's
threads alive ``convert`` starts its writer from a fork server, which ``h5batch convert``
does not. In the child, an untimed warm-up on the small corpus goes first, except for the
rows on a Dask cluster (see :meth:`ConvertPhase._convert_plan`). The zygote samples the
child tree's peak RSS from outside it. The rows that time a long-lived session stay in the
bench's process: h5batch on the bench's warm cluster (every codec; its writer's fork server
warm, as in a notebook's second conversion), the decode-only floor and the read+write bound.
Whole commands (:mod:`.cli_cold`) run in fresh interpreters.

Before the timed rounds, one untimed round on the main corpus: in full runs every method's
first round on it was 2-4x slower than its others (the machine's first writes of that much
data), which widened every spread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import h5py

from ..conversion.plan import make_tasks
from . import baselines, cli_cold, corpus, peers, physics
from .convert_child import convert_row, h5batch_convert, remove_output
from .decode_only import decode_only
from .measure import PeakRss, Sample, timed
from .records import DEFAULT_CODEC, RW_BOUND
from .zygote import Zygote

Plan = list[tuple[str, Callable[[bool], None]]]  # (label, run(timed))


class ConvertPhase:
    """Mixed into :class:`~h5batch.bench.suite.Bench` (its records, config, cluster and log)."""

    convert_zygote: Zygote | None = None  # h5batch's rows; None: in the bench's process (cfg.fresh_converts off)
    peer_zygote: Zygote | None = None  # the peers' and the naive recipe's rows (torch imported)

    def _run_row(self, what: str, fn: Callable[..., dict[str, Any]], args: tuple, warm: tuple | None,
                 warm_out: str, nbytes: float | None = None, fresh: bool = True,
                 peer: bool = False) -> tuple[Sample, dict]:
        job = {"fn": fn, "args": args, "warm": warm, "warm_out": warm_out}
        zygote = self.peer_zygote if peer else self.convert_zygote
        fresh = fresh and zygote is not None
        if fresh:
            r = zygote.call(convert_row, job, f"conversion row {what}")
        else:
            with PeakRss() as mem:
                r = convert_row(job)
            r.update(peak_rss=mem.peak, baseline_rss=mem.baseline)
        res = r["result"]
        sample = Sample(r["seconds"], int(res["samples"]), float(res["bytes_decoded"] if nbytes is None else nbytes),
                        int(r["peak_rss"]), int(r["baseline_rss"]),
                        {"cpu_seconds": r["cpu_seconds"], "fresh_process": fresh,
                         "torch_imported": r["torch_imported"], "machine": r.get("machine", {})})
        return sample, res

    def _convert_plan(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> Plan:
        cp, small = spec["corpus"], spec["warm"]
        m = cp.manifest()
        items = corpus.item_paths(m)
        small_items = corpus.item_paths(small.manifest()) if small is not None else None
        job = cp.job(self.path("h5", "x.h5"))
        fields = tuple(job.fields.items())
        n, nfiles = len(items), sum(len(p) for p in items)
        name = cp.name
        plan: Plan = []
        addr = {"kind": "address", "address": self.cluster.scheduler_address, "workers": self.cfg.dask_workers}

        def h5(codec: str, cold: bool = False, scaled: bool = False, auto: bool = False) -> Callable[[bool], None]:
            # auto: what `h5batch convert` does with no --workers (cluster.kind auto decides)
            method = "h5batch-auto" if auto else "h5batch-cold" if cold else "h5batch"

            def run(timed_round: bool) -> None:
                src = spec["scaled"] if scaled else cp
                out = self.path("h5", f"{src.name}-{codec}{'-cold' if cold else ''}{'-auto' if auto else ''}.h5")
                cold_cl = {"kind": "local", "workers": self.cfg.dask_workers}  # auto: 1 worker = in the driver
                cl = {"kind": "auto"} if auto else cold_cl if cold else addr
                warm_out = self.path("h5", f"warm-{method}-{codec}.h5")
                # Only kind auto is warmed up in its child: a run on a Dask cluster leaves the
                # client's threads behind, and the timed run would then start its writer from a
                # fork server, which `h5batch convert` does not (the preload stands in).
                warm = (small.job(warm_out, codec, cl),) if small is not None and auto else None
                remove_output(out)
                sample, s = self._run_row(f"{method} {codec} {src.name}", h5batch_convert,
                                          (src.job(out, codec, cl),), warm, warm_out, fresh=cold or auto)
                sample.extra.update(files=s["files"], output_bytes=s["output_bytes"], rejects=s["rejects"],
                                    internal_seconds=s["internal_seconds"], field_codecs=field_codecs(s["path"]))
                if timed_round:
                    rec = self.record("convert", name, method, codec, f"x{self.cfg.scale}" if scaled else "")
                    rec.runs.append(sample)
                    rec.info.update(path=out, samples=s["samples"], files=s["files"], output_bytes=s["output_bytes"])
            return run

        def floor(timed_round: bool) -> None:
            tasks = make_tasks(job, m, "bench-floor", "")
            sample, res = timed(lambda: self.client.gather(self.client.map(decode_only, tasks, pure=False)),
                                lambda r: sum(a for a, _ in r), lambda r: sum(b for _, b in r))
            sample.extra["files"] = nfiles
            if timed_round:
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

        def other(method: str, codec: str, fn: Callable[..., dict[str, Any]], out: str, args: tuple = (),
                  nbytes: float | None = None) -> Callable[[bool], None]:
            # a peer or the naive recipe: fn(items, fields, out, *args)
            def run(timed_round: bool) -> None:
                warm_out = out + "-warm"
                warm = (small_items, fields, warm_out, *args) if small_items is not None else None
                remove_output(out)
                sample, r = self._run_row(f"{method} {name}", fn, (items, fields, out, *args), warm, warm_out,
                                          nbytes, peer=True)
                sample.extra.update(files=nfiles, output_bytes=r["output_bytes"],
                                    **({"shards": r["shards"]} if "shards" in r else {}))
                if timed_round:
                    rec = self.record("convert", name, method, codec)
                    rec.runs.append(sample)
                    rec.info.update(path=out, output_bytes=r["output_bytes"])
            return run

        def cli(method: str) -> Callable[[bool], None]:
            # Whole commands in fresh interpreters (cli_cold): real corpora, the user's first run.
            def run(timed_round: bool) -> None:
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
                             "internal_seconds": r[1]["seconds"], "field_codecs": field_codecs(out)}
                sample.extra.update(extra)
                if timed_round:
                    rec = self.record("convert", name, method, "auto" if method == "h5batch-cli" else "gzip")
                    rec.runs.append(sample)
                    rec.info.update(path=out, output_bytes=extra["output_bytes"])
            return run

        for codec in spec["codecs"]:
            plan.append((f"h5batch {codec}", h5(codec)))
        plan.append((f"h5batch {DEFAULT_CODEC} cold", h5(DEFAULT_CODEC, cold=True)))
        plan.append((f"h5batch {DEFAULT_CODEC} auto", h5(DEFAULT_CODEC, auto=True)))
        plan.append(("floor", floor))
        plan.append(("naive", other("naive", "gzip", baselines.naive_convert, self.path("naive", f"{name}.h5"))))
        if cp.real:
            plan += [("h5batch CLI cold", cli("h5batch-cli")), ("naive CLI", cli("naive-cli"))]
        if spec["scaled"] is not None:
            plan.append((f"h5batch x{self.cfg.scale} cold", h5(DEFAULT_CODEC, cold=True, scaled=True)))
        if peer_ok.get("webdataset"):
            for procs in (1, self.cfg.dask_workers):
                plan.append((f"webdataset {procs}p",
                              other(f"webdataset-{procs}p", "", peers.wds_convert, self.folder("wds", f"{name}-p{procs}"),
                                    (procs, max(16, n // 16)))))
        if peer_ok.get("litdata"):
            nbytes = cp.extra["length"] * 2 * len(fields) * n if cp.kind == "audio" else 0
            for start in (None, "fork"):
                label = start or "spawn"
                plan.append((f"litdata {label}",
                             other(f"litdata-{label}", "", peers.litdata_convert, self.folder("litdata", f"{name}-{label}"),
                                   (self.cfg.dask_workers, start), nbytes)))
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
        plan = self._convert_plan(spec, peer_ok)
        rounds = [False] * bool(self.cfg.warmup) + [True] * self.cfg.reps
        for rep, timed_round in enumerate(rounds):
            # Rotate the order each round so no configuration always runs first or last.
            k = rep % len(plan)
            which = f"round {rep + 1 - bool(self.cfg.warmup)}/{self.cfg.reps}" if timed_round else "warm-up round"
            self.say(f"convert {name}: {which} ({len(plan)} configurations)")
            for _, fn in plan[k:] + plan[:k]:
                # Every conversion writes hundreds of MB: without a sync the kernel writes the
                # previous run's output back (and throttles writers) during the next one.
                os.sync()
                fn(timed_round)


def field_codecs(path: str) -> dict[str, str]:
    """The codec each field of the file's first split was stored with (``auto`` resolves
    per field, the same in every split)."""
    with h5py.File(path, "r") as f:
        # The file's first split (not the first group: rejects, inventory, ... sort before it).
        splits = [k for k in json.loads(f.attrs.get("splits", "[]")) if k in f]
        split = splits[0] if splits else None
        if split is None:
            return {}
        return {name: str(node.attrs.get("codec", "")) for name, node in f[split].items() if "codec" in node.attrs}
