"""Render a benchmark run: ``results.json``, ``results.md`` (tables + targets), PNG plots.

Everything here works from the results dict of :class:`~h5batch.bench.suite.Bench` (or the
JSON file it was saved to), so a report can be re-rendered without re-running. Size: one
renderer of one results dict (tables, targets, plots), kept together so they agree."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from typing import Any

from . import first_epoch, longfile, memstate
from .records import (
    DEFAULT_CODEC,
    MEMMAP_ROWWISE,
    MEMMAP_STRICT,
    PLAIN,
    RW_BOUND,
    STRICT_STORAGES,
    strict_variant,
)

MB = 1e6
#: Baselines read again with h5batch's decoder and batch assembly (``FloatCollate``: recycled
#: shared memory, threaded filling) instead of the way their users read them; h5batch against
#: these rows measures the storage layout alone (:func:`layout_only`).
STRICT_RAW = "raw-files+h5batch-collate"
STRICT_LITDATA = "litdata+h5batch-collate"


# ---------------------------------------------------------------------------
# Looking things up in the records
# ---------------------------------------------------------------------------


def _find(results: dict[str, Any], **want: Any) -> dict[str, Any] | None:
    for r in results["records"]:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    if want.get("method") == MEMMAP_ROWWISE:  # its name in runs before issue 19
        return _find(results, **{**want, "method": "memmap"})
    return None


def _rate(rec: dict[str, Any] | None) -> float | None:
    return rec["rate"]["median"] if rec and rec["runs"] else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _records(results: dict[str, Any], phase: str, corpus: str) -> list[dict[str, Any]]:
    return [r for r in results["records"] if r["phase"] == phase and r["corpus"] == corpus and r["runs"]]


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------


def _bounds(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[float, float] | None:
    """The ratio a/b at its worst and best over the repetitions (a's min over b's max, a's
    max over b's min); None with fewer than two repetitions of either."""
    if not a or not b or not a["runs"] or not b["runs"]:
        return None
    ra, rb = a["rate"], b["rate"]
    if min(ra.get("n", 1), rb.get("n", 1)) < 2 or not rb.get("min") or not rb.get("max"):
        return None
    return ra["min"] / rb["max"], ra["max"] / rb["min"]


def _target(name: str, value: float | None, threshold: float, detail: str,
            bounds: tuple[float, float] | None = None) -> dict[str, Any]:
    """``within_spread``: the threshold lies between the ratio's worst and best repetition,
    so the verdict could flip on another run (quick mode, 2 repetitions, is often there)."""
    within = bounds is not None and bounds[0] <= threshold <= bounds[1]
    return {"target": name, "value": value, "threshold": threshold,
            "met": None if value is None else value >= threshold, "detail": detail,
            "bounds": bounds, "within_spread": within}


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of docs/benchmarks.md with its measured ratio and whether it is met.

    Targets are judged on the paired-audio corpus, h5batch's default codec; reads use the
    default :class:`~h5batch.torch.ChunkShuffleSampler`, conversions the already-started
    cluster (start-up excluded; the cold figure is in the table beside it).
    """
    c = results["main_corpus"]
    out: list[dict[str, Any]] = []
    workers = results["config"]["workers"]

    def judged(name: str, a: dict[str, Any] | None, b: dict[str, Any] | None, threshold: float,
               note: str = "") -> dict[str, Any]:
        ra, rb = _rate(a), _rate(b)
        return _target(name, _ratio(ra, rb), threshold, _pair(ra, rb) + note, _bounds(a, b))

    for nw in workers:
        h = _find(results, phase="read", corpus=c, method="h5batch", codec=DEFAULT_CODEC,
                  variant="chunk-shuffle", workers=nw)
        for base, method, thr in (("naive HDF5", "naive", 10.0), ("raw files", "raw-files", 2.0),
                                  ("memmap int16 row-wise", MEMMAP_ROWWISE, 0.5)):
            b = _find(results, phase="read", corpus=c, method=method, workers=nw)
            out.append(judged(f"read >= {thr:g}x {base} (num_workers={nw})", h, b, thr))
            if method == "raw-files":  # the plain path (DataLoader(ds, shuffle=True)) too
                out.append(judged(f"plain DataLoader >= 2x raw files (num_workers={nw})", _find(
                    results, phase="read", corpus=c, variant=PLAIN, workers=nw), b, 2.0))
    hc = _find(results, phase="convert", corpus=c, method="h5batch", codec=DEFAULT_CODEC, variant="")
    gz = _find(results, phase="convert", corpus=c, method="h5batch", codec="gzip", variant="")
    naive = _find(results, phase="convert", corpus=c, method="naive")
    floor = _find(results, phase="convert", corpus=c, method="floor")
    out.append(judged(f"conversion {DEFAULT_CODEC} >= 10x naive", hc, naive, 10.0))
    out.append(judged(f"conversion {DEFAULT_CODEC} >= 0.8x decode-only floor", hc, floor, 0.8))
    out.append(judged("conversion gzip >= 2.5x naive", gz, naive, 2.5))
    if results["config"].get("peers"):
        nproc = results["config"]["dask_workers"]
        w = _find(results, phase="convert", corpus=c, method=f"webdataset-{nproc}p")
        out.append(judged(f"conversion >= 1.0x WebDataset {nproc} processes", hc, w, 1.0))
        for nw in workers:
            h = _find(results, phase="read", corpus=c, method="h5batch", codec=DEFAULT_CODEC,
                      variant="chunk-shuffle", workers=nw)
            best: dict[str, Any] | None = None
            for r in results["records"]:
                if (r["phase"] == "read" and r["corpus"] == c and r["workers"] == nw and r["runs"]
                        and r["method"] in ("webdataset", "litdata")):
                    if best is None or _rate(r) > _rate(best):
                        best = r
            label = f" ({best['method']} {best['variant']})" if best else ""
            out.append(judged(f"read >= 1.5x best peer (num_workers={nw})", h, best, 1.5, label))
    out += strict_targets(results, judged)
    out += writer_targets(results, judged)
    out += cold_targets(results, judged)
    out += memory_targets(results)
    return out


#: conversion rows judged against the best peer writer and the read+write bound: the warm
#: cluster (start-up excluded) and ``cluster.kind: auto`` as ``h5batch convert`` runs it cold
WRITER_ROWS = (("h5batch", "warm cluster"), ("h5batch-auto", "cold, kind auto as `h5batch convert` runs"))


def writer_targets(results: dict[str, Any], judged: Any) -> list[dict[str, Any]]:
    """Conversion >= 2x the best peer writer (the fastest WebDataset or LitData row) and
    >= 0.8x the read+write bound (:data:`~h5batch.bench.records.RW_BOUND`), warm and cold."""
    c = results["main_corpus"]
    out: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    for r in _records(results, "convert", c):
        if r["method"].startswith(("webdataset-", "litdata-")) and (best is None or _rate(r) > _rate(best)):
            best = r
    bound = _find(results, phase="convert", corpus=c, method=RW_BOUND)
    for method, what in WRITER_ROWS:
        h = _find(results, phase="convert", corpus=c, method=method, codec=DEFAULT_CODEC, variant="")
        if h is None or not h["runs"]:
            continue
        if best is not None:
            out.append(judged(f"conversion ({what}) >= 2x best peer writer", h, best, 2.0,
                              f" ({best['method']})"))
        if bound is not None and bound["runs"]:
            out.append(judged(f"conversion ({what}) >= 0.8x read+write bound", h, bound, 0.8))
    return out


def cold_targets(results: dict[str, Any], judged: Any) -> list[dict[str, Any]]:
    """Whole commands in fresh interpreters (``bench/cli_cold.py``): FSDD's ``h5batch
    convert`` >= 3x the naive recipe run the same way, and the demo job's conversion seconds
    under 1 s (judged as ``1 s / seconds >= 1``, its spread over the repetitions)."""
    out: list[dict[str, Any]] = []
    h = _find(results, phase="convert", corpus="fsdd", method="h5batch-cli")
    if h is not None:
        naive = _find(results, phase="convert", corpus="fsdd", method="naive-cli")
        out.append(judged("FSDD whole command >= 3x the naive recipe's (fresh interpreters)", h, naive, 3.0))
    demo = _find(results, phase="convert", corpus="demo", method="h5batch-cli")
    if demo is not None and demo["runs"]:
        secs = sorted(r["internal_seconds"] for r in demo["runs"])
        med = secs[len(secs) // 2] if len(secs) % 2 else (secs[len(secs) // 2 - 1] + secs[len(secs) // 2]) / 2
        bounds = (1.0 / secs[-1], 1.0 / secs[0]) if len(secs) > 1 else None
        out.append(_target("demo job's conversion < 1 s (make convert; 1 s / its seconds)", 1.0 / med, 1.0,
                           f"{med:.2f} s median ({secs[0]:.2f}-{secs[-1]:.2f} s), whole command "
                           f"{demo['seconds']['median']:.2f} s" if "seconds" in demo else f"{med:.2f} s median",
                           bounds))
    return out


def memory_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per long recording (``bench/longfile.py``): the tree's peak RSS above the baseline at
    most ``longfile.TARGET`` decoded samples, judged as ``TARGET / measured >= 1`` like the
    demo's seconds, its range over the rounds; a peak at or under the baseline (a small
    sample within the RSS noise) counts as none above it."""
    out = []
    for r in results["records"]:
        if r["phase"] != "memory" or not r["runs"]:
            continue
        over = sorted(max(longfile.over(x), 1e-9) for x in r["runs"])
        med, run, t = statistics.median(over), r["runs"][0], longfile.TARGET
        out.append(_target(f"long recording {r['corpus']} ({run['minutes']:g} min): peak RSS above the baseline "
                           f"<= {t:g}x the decoded sample ({t:g}x / measured)", t / med, 1.0,
                           f"{med:.2f}x the {run['bytes'] / 1e6:,.0f} MB sample ({over[0]:.2f}-{over[-1]:.2f}x)",
                           (t / over[-1], t / over[0]) if len(over) > 1 else None))
    return out


def strict_targets(results: dict[str, Any], judged: Any) -> list[dict[str, Any]]:
    """h5batch's ``ds.loader`` (default codec) on each storage of ``bench/strict.py`` against
    the strict limit: >= 0.7x in process, >= 1.5x with workers (where the limit pays torch's
    copy into shared memory)."""
    c = results["main_corpus"]
    out: list[dict[str, Any]] = []
    for nw in results["config"]["workers"]:
        limit = _find(results, phase="read", corpus=c, method=MEMMAP_STRICT, workers=nw)
        if limit is None:
            continue
        thr = 0.7 if nw == 0 else 1.5
        for dtype, fixed in STRICT_STORAGES:
            h = _find(results, phase="read", corpus=c, method="h5batch", codec=DEFAULT_CODEC,
                      variant=strict_variant(dtype, fixed), workers=nw)
            what = f"{dtype} {'fixed' if fixed else 'variable'}"
            out.append(judged(f"read {what} >= {thr:g}x strict memmap (num_workers={nw})", h, limit, thr))
    return out


def layout_only(results: dict[str, Any]) -> list[dict[str, Any]]:
    """h5batch against the baselines given h5batch's own batch assembly, for information.

    The targets compare with raw files and peers read the way their users read them; these
    ratios say how much of the lead is the storage layout alone. They have no threshold: the
    strict raw-file row is itself close to the memmap limit at ``num_workers=2``.
    """
    c = results["main_corpus"]
    out: list[dict[str, Any]] = []
    for nw in results["config"]["workers"]:
        h = _rate(_find(results, phase="read", corpus=c, method="h5batch", codec=DEFAULT_CODEC,
                        variant="chunk-shuffle", workers=nw))
        mm = _rate(_find(results, phase="read", corpus=c, method=MEMMAP_ROWWISE, workers=nw))
        for label, method in (("raw files", STRICT_RAW), ("LitData batch_decode=0", STRICT_LITDATA)):
            b = _rate(_find(results, phase="read", corpus=c, method=method, workers=nw))
            if b is None:
                continue
            out.append({"comparison": f"read vs {label} + h5batch's collate (num_workers={nw})",
                        "value": _ratio(h, b), "detail": _pair(h, b),
                        "baseline_vs_memmap": _ratio(b, mm)})
    return out


def _pair(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "not measured"
    return f"{a:,.0f} vs {b:,.0f} samples/s"


# ---------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _spread(rec: dict[str, Any]) -> str:
    s = rec["rate"]
    return f"±{100 * s['spread'] / 2:.0f}%" if s["n"] > 1 else "—"


def _label(r: dict[str, Any]) -> str:
    m = r["method"]
    names = {"h5batch": "h5batch (warm cluster)", "h5batch-cold": "h5batch (cold: incl. cluster start-up)",
             "h5batch-auto": "h5batch (cluster.kind auto, as `h5batch convert` runs)",
             "floor": "decode-only floor (same cluster)",
             RW_BOUND: "read+write bound (floor x read / (read + write), bench.physics)", "naive": "naive recipe (1 process, dataset per sample)",
             "h5batch-cli": "h5batch convert (whole command, fresh interpreter, job defaults)",
             "naive-cli": "naive recipe (whole script, fresh interpreter)"}
    text = names.get(m, m)
    if r["variant"]:
        text += f" [{r['variant']}]"
    return text


def _codec_cell(r: dict[str, Any]) -> str:
    """The codec column; ``auto`` shows what it chose per field (e.g. ``auto → none``)."""
    codec = r["codec"] or "—"
    chosen = r["runs"][0].get("field_codecs") if r["runs"] else None
    if codec == "auto" and chosen:
        names = sorted({c.split("-")[0] if c.startswith("none") else c.split("+")[0] for c in chosen.values()})
        codec += " → " + ", ".join(names)
    return codec


def convert_table(results: dict[str, Any], corpus: str) -> list[str]:
    recs = _records(results, "convert", corpus)
    if not recs:
        return []
    naive = _rate(_find(results, phase="convert", corpus=corpus, method="naive"))
    floor = _rate(_find(results, phase="convert", corpus=corpus, method="floor"))
    rows = ["| method | codec | samples/s | spread | files/s | MB/s decoded | x naive | x floor "
            "| MB on disk | peak RSS MB (added) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        rate = _rate(r)
        files = r["runs"][0].get("files", 0) / r["runs"][0]["items"] if r["runs"][0]["items"] else 0
        out_b = r["info"].get("output_bytes")
        rss = r["peak_rss"]["median"] / MB
        added = r["rss_added"]["median"] / MB
        rows.append(f"| {_label(r)} | {_codec_cell(r)} | {_fmt(rate)} | {_spread(r)} | {_fmt(rate * files)} "
                    f"| {_fmt(r['mb_per_s']['median'])} | {_x(_ratio(rate, naive))} | {_x(_ratio(rate, floor))} "
                    f"| {_fmt(out_b / MB if out_b else None, 1)} | {rss:,.0f} ({added:+,.0f}) |")
    return rows


def rounds_table(results: dict[str, Any], corpus: str) -> list[str]:
    """Each round of the conversion rows judged against the peers: its wall time beside its
    own CPU-seconds and the machine's CPU time by state over the run (``/proc/stat``). Reason:
    a round that took 3x its usual time at its usual CPU waited for something outside its
    processes; the machine's idle, busy, iowait and steal seconds say what."""
    keep = ("h5batch-auto", "h5batch", "webdataset-2p", "litdata-fork")
    recs = [r for r in _records(results, "convert", corpus)
            if r["method"] in keep and (r["method"] != "h5batch" or r["codec"] == "auto") and not r.get("variant")
            and any(run.get("machine") for run in r["runs"])]
    if not recs:
        return []
    rows = ["| method | round | wall s | own CPU-s | machine busy | idle | iowait | steal |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(recs, key=lambda r: keep.index(r["method"])):
        for k, run in enumerate(r["runs"], 1):
            m = run.get("machine") or {}
            rows.append(f"| {_label(r)} | {k} | {run['seconds']:.3f} | {run.get('cpu_seconds', 0):.2f} "
                        + " ".join(f"| {m[x]:.2f}" if x in m else "| —" for x in ("busy", "idle", "iowait", "steal"))
                        + " |")
    return rows


def read_table(results: dict[str, Any], corpus: str) -> list[str]:
    recs = _records(results, "read", corpus)
    if not recs:
        return []
    rows = ["| layout | codec | order | workers | samples/s | spread | MB/s | x naive | x raw files | x memmap row-wise "
            "| x strict memmap | peak RSS MB (added) |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(recs, key=lambda r: (r["workers"], _order(r["method"]), r["codec"], r["variant"])):
        nw = r["workers"]
        rate = _rate(r)
        base = {m: _rate(_find(results, phase="read", corpus=corpus, method=m, workers=nw))
                for m in ("naive", "raw-files", MEMMAP_ROWWISE, MEMMAP_STRICT)}
        rows.append(f"| {r['method']} | {r['codec'] or '—'} | {r['variant']} | {nw} | {_fmt(rate)} | {_spread(r)} "
                    f"| {_fmt(r['mb_per_s']['median'])} | {_x(_ratio(rate, base['naive']))} "
                    f"| {_x(_ratio(rate, base['raw-files']))} | {_x(_ratio(rate, base[MEMMAP_ROWWISE]))} "
                    f"| {_x(_ratio(rate, base[MEMMAP_STRICT]))} "
                    f"| {r['peak_rss']['median'] / MB:,.0f} ({r['rss_added']['median'] / MB:+,.0f}) |")
    return rows


def _order(method: str) -> int:
    order = ["h5batch", "naive", "raw-files", STRICT_RAW, MEMMAP_ROWWISE, "memmap", MEMMAP_STRICT, "webdataset",
             "litdata", STRICT_LITDATA]
    return order.index(method) if method in order else len(order)


def scaling(results: dict[str, Any]) -> dict[str, Any] | None:
    """x1 vs x``scale`` cold conversions of the paired-audio corpus (default codec)."""
    c = results["main_corpus"]
    scale = results["config"]["scale"]
    a = _find(results, phase="convert", corpus=c, method="h5batch-cold", codec=DEFAULT_CODEC, variant="")
    b = _find(results, phase="convert", corpus=c, method="h5batch-cold", codec=DEFAULT_CODEC, variant=f"x{scale}")
    if not (a and b and a["runs"] and b["runs"]):
        return None
    return {"scale": scale,
            "seconds": (a["seconds"]["median"], b["seconds"]["median"]),
            "time_ratio": b["seconds"]["median"] / a["seconds"]["median"],
            "peak_rss": (a["peak_rss"]["median"], b["peak_rss"]["median"]),
            "peak_rss_ratio": b["peak_rss"]["median"] / a["peak_rss"]["median"],
            "rss_added": (a["rss_added"]["median"], b["rss_added"]["median"]),
            "rss_added_ratio": (b["rss_added"]["median"] / a["rss_added"]["median"]
                                if a["rss_added"]["median"] > 0 else None),
            "rate": (_rate(a), _rate(b))}


def startup(results: dict[str, Any], corpus: str) -> float | None:
    warm = _find(results, phase="convert", corpus=corpus, method="h5batch", codec=DEFAULT_CODEC, variant="")
    cold = _find(results, phase="convert", corpus=corpus, method="h5batch-cold", codec=DEFAULT_CODEC, variant="")
    if not (warm and cold and warm["runs"] and cold["runs"]):
        return None
    return cold["seconds"]["median"] - warm["seconds"]["median"]


def markdown(results: dict[str, Any]) -> str:
    meta, cfg = results["meta"], results["config"]
    m = meta["machine"]
    lines = [f"# h5batch bench ({cfg['mode']}), {meta['finished']}", "",
             f"{m['affinity']} cores, {m['memory_gb']} GB, Python {m['python']}, {meta['seconds']:.0f} s in all. "
             f"Median of {cfg['reps']} repetitions (after a warm-up); spread = half the min-max range. "
             f"{meta['note']}.", ""]
    load = meta.get("load_average") or {}
    if load:
        start, end = load.get("start", [0])[0], load.get("end", [0])[0]
        lines += [f"Load average (1 min) at start {start:.1f}, at end {end:.1f}"
                  + (f" — **other processes were using the {m['affinity']} cores when the run started: "
                     "figures are low and noisy**" if start > 0.75 * m["affinity"] else "")
                  + " (the bench itself keeps about 2 cores busy).", ""]
    memory = meta.get("memory") or {}
    if memory.get("start"):
        worst = max(p["ratio"] for p in memory.values())
        lines += ["Memory (`python -m h5batch.bench.memstate`), at start: " + memstate.describe(memory["start"])
                  + (f"; at end: {memstate.describe(memory['end'])}" if memory.get("end") else "")
                  + (f" — **writes into memory that sat free took up to {worst:.1f}x as long: this machine "
                     "returns free memory to its host, and every conversion figure is noisy**" if worst >= 1.5 else "")
                  + ".", ""]
    fe = meta.get("first_epoch")
    if fe:
        lines += ["Reading a file of many chunks (`python -m h5batch.bench.first_epoch`): " + first_epoch.describe(fe)
                  + (" — **the first epoch is far slower than the second: the reader spends it finding chunks**"
                     if fe["ratio"] >= 2 else "") + ".", ""]
    lines += ["## Targets", "",
              "Judged on the medians; the range is the ratio at its worst and best repetition. "
              "*within the spread*: the threshold lies in that range, so another run could turn the verdict.",
              "", "| target | measured | range | status | detail |", "|---|---:|---:|---|---|"]
    for t in results.get("targets") or targets(results):
        status = "not measured" if t["met"] is None else ("**met**" if t["met"] else "**MISSED**")
        if t.get("within_spread"):
            status += " (within the spread)"
        lo_hi = t.get("bounds")
        span = f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}x" if lo_hi else "—"
        lines.append(f"| {t['target']} | {_x(t['value'])} | {span} | {status} | {t['detail']} |")
    lines.append("")
    extra = results.get("layout_only") or layout_only(results)
    if extra:
        lines += ["Storage layout alone (for information, no target): h5batch against the same baselines "
                  "read with h5batch's decoder and batch assembly instead of their users' way.", "",
                  "| comparison | h5batch / baseline | detail | baseline / memmap |", "|---|---:|---|---:|"]
        lines += [f"| {e['comparison']} | {_x(e['value'])} | {e['detail']} | {_x(e['baseline_vs_memmap'])} |"
                  for e in extra] + [""]
    for name, info in results["corpora"].items():
        conv, read = convert_table(results, name), read_table(results, name)
        if not conv and not read:
            continue
        lines += [f"## {name}", "", f"{info['notes']}; {info['samples']} samples, {info['files']} files.", ""]
        if conv:
            lines += ["### Conversion", ""] + conv + [""]
            s = startup(results, name)
            if s is not None:
                lines += [f"Cluster start-up and teardown cost {s:.1f} s per conversion (cold minus warm median).", ""]
            rounds = rounds_table(results, name)
            if rounds:
                lines += ["Rounds of the rows judged against the peers (the machine's CPU seconds by state over "
                          "each run: a round that waited at its usual CPU shows where):", ""] + rounds + [""]
        if read:
            consumed = ("; every batch consumed: each tensor summed in the main process" if cfg.get("consume")
                        else "")
            lines += [f"### Read (DataLoader, batch {cfg['batch_size']}, shuffle on; {_epoch(results, name)} "
                      f"timed after a warm-up epoch; MB/s of decoded samples, delivered as float32{consumed})",
                      ""] + read + [""]
    sc = results.get("scaling") or scaling(results)
    if sc:
        lines += [f"## Scaling: corpus x1 vs x{sc['scale']} (cold, default codec)", "",
                  f"| | x1 | x{sc['scale']} | ratio |", "|---|---:|---:|---:|",
                  f"| seconds | {sc['seconds'][0]:.1f} | {sc['seconds'][1]:.1f} | {sc['time_ratio']:.2f} |",
                  f"| samples/s | {sc['rate'][0]:,.0f} | {sc['rate'][1]:,.0f} | {sc['rate'][1] / sc['rate'][0]:.2f} |",
                  f"| peak RSS of the process tree (MB) | {sc['peak_rss'][0] / MB:,.0f} | {sc['peak_rss'][1] / MB:,.0f} "
                  f"| {sc['peak_rss_ratio']:.2f} |",
                  f"| RSS added over idle (MB) | {sc['rss_added'][0] / MB:,.0f} | {sc['rss_added'][1] / MB:,.0f} "
                  f"| {_fmt(sc['rss_added_ratio'], 2)} |", ""]
    lines += longfile.markdown(results)
    lines += (results.get("sampling") or {}).get("markdown", [])  # bench/sampling.py renders it
    checks = results.get("checks") or []
    if checks:
        bad = [c for c in checks if not c["ok"]]
        lines += ["## Correctness", "", f"{len(checks) - len(bad)} of {len(checks)} checks passed."]
        lines += [f"- FAILED: {c['check']} {c['detail']}" for c in bad] + [""]
    if results.get("skipped"):
        lines += ["## Skipped", ""] + [f"- {s}" for s in results["skipped"]] + [""]
    v = meta["versions"]
    lines += ["Versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v)), ""]
    return "\n".join(lines)


def _epoch(results: dict[str, Any], corpus: str) -> str:
    for r in _records(results, "read", corpus):
        e, n = r["info"].get("epochs", 1), r["info"].get("samples_per_epoch", "?")
        return f"{e} epoch{'s' if e != 1 else ''} of {n} samples"
    return "?"


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------


def _bars(ax: Any, labels: list[str], series: dict[str, list[dict[str, Any] | None]]) -> None:
    import numpy as np

    y = np.arange(len(labels))
    h = 0.8 / max(1, len(series))
    for k, (name, recs) in enumerate(series.items()):
        med = [(_rate(r) or 0) for r in recs]
        lo = [m - (r["rate"]["min"] if r and r["runs"] else 0) for m, r in zip(med, recs)]
        hi = [(r["rate"]["max"] if r and r["runs"] else 0) - m for m, r in zip(med, recs)]
        ax.barh(y + k * h, med, height=h, xerr=[lo, hi], label=name, capsize=2)
    ax.set_yticks(y + h * (len(series) - 1) / 2)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("samples/s (median, min-max)")
    ax.grid(axis="x", alpha=0.3)


def plots(results: dict[str, Any], out_dir: str) -> list[str]:
    """Write the PNG plots; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []
    for name in results["corpora"]:
        recs = _records(results, "read", name)
        if not recs:
            continue
        configs: list[tuple[str, str, str]] = []
        for r in recs:
            c = (r["method"], r["codec"], r["variant"])
            if c not in configs:
                configs.append(c)
        configs.sort(key=lambda c: (_order(c[0]), c[1], c[2]))
        series = {f"num_workers={nw}": [_find(results, phase="read", corpus=name, method=c[0], codec=c[1],
                                              variant=c[2], workers=nw) for c in configs]
                  for nw in results["config"]["workers"]}
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(configs) + 1.5))
        _bars(ax, [" ".join(p for p in c if p) for c in configs], series)
        ax.set_title(f"Read throughput, {name} (DataLoader batch {results['config']['batch_size']})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fn = f"read_{name}.png"
        fig.savefig(os.path.join(out_dir, fn), dpi=110)
        plt.close(fig)
        files.append(fn)
    for name in results["corpora"]:
        recs = _records(results, "convert", name)
        if not recs:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.4 * len(recs) + 1.5))
        _bars(ax, [f"{r['method']} {r['codec']} {r['variant']}".strip() for r in recs], {"convert": recs})
        ax.set_title(f"Conversion throughput, {name}")
        fig.tight_layout()
        fn = f"convert_{name}.png"
        fig.savefig(os.path.join(out_dir, fn), dpi=110)
        plt.close(fig)
        files.append(fn)
    sc = results.get("scaling") or scaling(results)
    if sc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        xs = ["x1", f"x{sc['scale']}"]
        a1.bar(xs, sc["seconds"], color=["tab:blue", "tab:orange"])
        a1.axhline(sc["seconds"][0] * sc["scale"], ls="--", color="grey", label="linear")
        a1.set_ylabel("seconds")
        a1.set_title("conversion time")
        a1.legend(fontsize=8)
        a2.bar(xs, [v / MB for v in sc["peak_rss"]], color=["tab:blue", "tab:orange"])
        a2.set_ylabel("MB")
        a2.set_title("peak RSS, process tree")
        fig.suptitle("Scaling, cold conversion, default codec")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "scaling.png"), dpi=110)
        plt.close(fig)
        files.append("scaling.png")
    return files


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write(results: dict[str, Any], out_dir: str | None = None) -> dict[str, str]:
    """Add targets and scaling to ``results``, write JSON, markdown and plots; return the paths."""
    out_dir = out_dir or results["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    results["targets"] = targets(results)
    results["layout_only"] = layout_only(results)
    results["scaling"] = scaling(results)
    pngs = plots(results, out_dir)
    results["plots"] = pngs
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "results.md")}
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=1, default=_json_default)
    md = markdown(results)
    md += "\n" + "\n".join(f"![{p}]({p})" for p in pngs) + "\n"
    with open(paths["markdown"], "w") as f:
        f.write(md)
    for p in pngs:
        paths[p] = os.path.join(out_dir, p)
    return paths


def _json_default(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Iterable):
        return list(o)
    return str(o)
