"""A benchmark run rendered: its targets, ``results.json``, ``results.md`` and PNG plots.

Everything here works from the results dict of :class:`~h5batch.bench.suite.Bench` (or the
``results.json`` it was saved to), so a report can be rendered again without measuring.
Targets are ratios of two rows of the same run, on the main (paired-audio) corpus and the
default codec unless they say otherwise; see docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .suite import DEFAULT_CODEC, LOADER, PLAIN

MB = 1e6
PEER_READS = ("webdataset", "litdata")


def find(results: dict[str, Any], **want: Any) -> dict[str, Any] | None:
    """The first record with every field of ``want`` and at least one run."""
    for r in results["records"]:
        if r["runs"] and all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def rate(rec: dict[str, Any] | None) -> float | None:
    return rec["rate"]["median"] if rec and rec["runs"] else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _records(results: dict[str, Any], phase: str, corpus: str) -> list[dict[str, Any]]:
    return [r for r in results["records"] if r["phase"] == phase and r["corpus"] == corpus and r["runs"]]


def judged(name: str, a: dict[str, Any] | None, b: dict[str, Any] | None, threshold: float,
           note: str = "") -> dict[str, Any]:
    """Target ``rate(a) / rate(b) >= threshold`` on the medians. ``bounds``: the ratio at its
    worst and best repetition (a's min over b's max and the reverse); ``within_spread``: the
    threshold lies between them, so another run could turn the verdict."""
    ra, rb = rate(a), rate(b)
    value = ratio(ra, rb)
    bounds = None
    if a and b and min(a["rate"].get("n", 1), b["rate"].get("n", 1)) > 1 and b["rate"]["min"]:
        bounds = (a["rate"]["min"] / b["rate"]["max"], a["rate"]["max"] / b["rate"]["min"])
    detail = "not measured" if value is None else f"{ra:,.0f} vs {rb:,.0f} samples/s{note}"
    return {"target": name, "value": value, "threshold": threshold, "met": None if value is None else value >= threshold,
            "detail": detail, "bounds": bounds,
            "within_spread": bounds is not None and bounds[0] <= threshold <= bounds[1]}


def _best(results: dict[str, Any], phase: str, corpus: str, methods: tuple[str, ...],
          workers: int | None = None) -> dict[str, Any] | None:
    recs = [r for r in _records(results, phase, corpus) if r["method"].startswith(methods) and r["workers"] == workers]
    return max(recs, key=rate, default=None)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of docs/benchmarks.md with its measured ratio and whether it is met."""
    c, peers = results["main_corpus"], results["config"].get("peers")
    out: list[dict[str, Any]] = []
    for nw in results["config"]["workers"]:
        def read(method: str, **want: Any) -> dict[str, Any] | None:
            return find(results, phase="read", corpus=c, method=method, workers=nw, **want)  # noqa: B023

        h, raw = read("h5batch", variant="chunk-shuffle", codec=DEFAULT_CODEC), read("raw-files")
        out.append(judged(f"read >= 10x naive HDF5 (num_workers={nw})", h, read("naive"), 10.0))
        out.append(judged(f"read >= 2x raw files (num_workers={nw})", h, raw, 2.0))
        out.append(judged(f"plain DataLoader >= 2x raw files (num_workers={nw})", read("h5batch", variant=PLAIN), raw,
                          2.0))
        thr = 0.7 if nw == 0 else 1.5  # with workers the limit pays torch's copy into shared memory
        out.append(judged(f"ds.loader >= {thr:g}x the memmap limit (num_workers={nw})", read("h5batch", variant=LOADER),
                          read("memmap"), thr))
        if peers:
            best = _best(results, "read", c, PEER_READS, nw)
            label = f" ({best['method']} {best['variant']})" if best else ""
            out.append(judged(f"read >= 1.5x the best peer (num_workers={nw})", h, best, 1.5, label))

    def conv(corpus: str, method: str, **want: Any) -> dict[str, Any] | None:
        return find(results, phase="convert", corpus=corpus, method=method, variant="", **want)

    h = conv(c, "h5batch", codec=DEFAULT_CODEC)
    out.append(judged("conversion >= 10x naive", h, conv(c, "naive"), 10.0))
    out.append(judged("conversion gzip >= 2.5x naive", conv(c, "h5batch", codec="gzip"), conv(c, "naive"), 2.5))
    if peers:
        best = _best(results, "convert", c, ("webdataset", "litdata"))
        out.append(judged("conversion >= 2x the best peer writer", h, best, 2.0, f" ({best['method']})" if best else ""))
    s3_first = {m: find(results, phase="s3", corpus=c, method=m, variant="first epoch") for m in ("h5batch", "litdata")}
    if s3_first["h5batch"]:
        out.append(judged("s3:// first epoch >= 1.5x LitData", s3_first["h5batch"], s3_first["litdata"], 1.5))
    if "fsdd" in results["corpora"]:
        out.append(judged("FSDD conversion >= 3x naive", conv("fsdd", "h5batch"), conv("fsdd", "naive"), 3.0))
    return out


# ---------------------------------------------------------------------------- markdown


def _fmt(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _x(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


def _spread(rec: dict[str, Any]) -> str:
    s = rec["rate"]
    return f"±{100 * s['spread'] / 2:.0f}%" if s["n"] > 1 else "—"


def _median(rec: dict[str, Any], key: str) -> float | None:
    vals = sorted(r[key] for r in rec["runs"] if r.get(key) is not None)
    return vals[len(vals) // 2] if vals else None


def _codec(r: dict[str, Any]) -> str:
    """The codec column; ``auto`` shows what it chose per field (``auto → none``)."""
    chosen = r["info"].get("field_codecs")
    if r["codec"] == "auto" and chosen:
        return "auto → " + ", ".join(sorted({v.split("-")[0] if v.startswith("none") else v.split("+")[0]
                                              for v in chosen.values()}))
    return r["codec"] or "—"


def convert_table(results: dict[str, Any], corpus: str) -> list[str]:
    recs = _records(results, "convert", corpus)
    if not recs:
        return []
    naive = rate(find(results, phase="convert", corpus=corpus, method="naive"))
    rows = ["| writer | codec | corpus | samples/s | spread | wall s | own work s | CPU-s | x naive | MB on disk "
            "| peak RSS MB |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        out = _median(r, "output_bytes")
        rows.append(f"| {r['method']} | {_codec(r)} | {r['variant'] or 'x1'} | {_fmt(rate(r))} | {_spread(r)} "
                    f"| {r['seconds']['median']:.2f} | {_fmt(_median(r, 'work_seconds'), 2)} "
                    f"| {_fmt(_median(r, 'cpu_seconds'), 2)} | {_x(ratio(rate(r), naive))} "
                    f"| {_fmt(None if out is None else out / MB, 1)} | {r['peak_rss']['median'] / MB:,.0f} |")
    return rows


def read_table(results: dict[str, Any], corpus: str) -> list[str]:
    recs = _records(results, "read", corpus)
    if not recs:
        return []
    per_sample = results["corpora"][corpus].get("sample_bytes", 0)
    rows = ["| layout | codec | order | workers | samples/s | spread | MB/s | x naive | x raw files | x memmap "
            "| peak RSS MB |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    order = ["h5batch", "naive", "raw-files", "memmap", *PEER_READS]
    for r in sorted(recs, key=lambda r: (r["workers"], order.index(r["method"]) if r["method"] in order else 99)):
        v = rate(r)
        times = [_x(ratio(v, rate(find(results, phase="read", corpus=corpus, method=m, workers=r["workers"]))))
                 for m in ("naive", "raw-files", "memmap")]  # x naive, x raw files, x memmap
        rows.append(f"| {r['method']} | {r['codec'] or '—'} | {r['variant']} | {r['workers']} | {_fmt(v)} "
                    f"| {_spread(r)} | {_fmt(v * per_sample / MB)} | {' | '.join(times)} "
                    f"| {r['peak_rss']['median'] / MB:,.0f} |")
    return rows


def s3_table(results: dict[str, Any]) -> list[str]:
    """The object-storage rows (``--s3``, :mod:`.s3`): medians of the runs."""
    recs = [r for r in results["records"] if r["phase"] == "s3" and r["runs"]]
    return ["| reader | epoch | samples/s | GETs | fetched / stored |", "|---|---|---:|---:|---:|"] + [
        f"| {r['method']} | {r['variant']} | {_fmt(rate(r))} | {_fmt(_median(r, 'gets'))} "
        f"| {_fmt(_median(r, 'fetched_over_stored'), 3)} |" for r in recs] if recs else []


def markdown(results: dict[str, Any]) -> str:
    meta, cfg = results["meta"], results["config"]
    m = meta["machine"]
    start, end = (meta["load_average"].get(k, [0])[0] for k in ("start", "end"))
    lines = [f"# h5batch bench ({cfg['mode']}), {meta['finished']}", "",
             f"Commit {meta.get('commit') or '?'}; {m['affinity']} cores, {m['memory_gb']} GB, Python {m['python']}; "
             f"{meta['seconds']:.0f} s in all. Median of {cfg['reps']} repetitions; spread = half the min-max "
             f"range. {meta['note']}. Load average (1 min) {start:.1f} at the start, {end:.1f} at the end"
             + (" — **other processes were using the cores: figures are low and noisy**"
                if start > 0.75 * m["affinity"] else "") + ".", "",
             "## Targets", "",
             "Judged on the medians; range: the ratio at its worst and best repetition; *within the spread*: the "
             "threshold lies in that range, so another run could turn the verdict.", "",
             "| target | measured | range | status | detail |", "|---|---:|---:|---|---|"]
    for t in results.get("targets") or targets(results):
        status = "not measured" if t["met"] is None else ("**met**" if t["met"] else "**MISSED**")
        status += " (within the spread)" if t["within_spread"] else ""
        span = f"{t['bounds'][0]:.2f}-{t['bounds'][1]:.2f}x" if t["bounds"] else "—"
        lines.append(f"| {t['target']} | {_x(t['value'])} | {span} | {status} | {t['detail']} |")
    lines.append("")
    for name, info in results["corpora"].items():
        conv, read = convert_table(results, name), read_table(results, name)
        if not conv and not read:
            continue
        lines += [f"## {name}", "", f"{info['notes']}; {info['samples']} samples, {info['files']} files.", ""]
        if conv:
            lines += ["### Conversion (each a whole command in a new interpreter, timed from outside)", ""] + conv + [""]
        if read:
            ep = next(r["info"] for r in _records(results, "read", name))
            lines += [f"### Read (DataLoader, batch {cfg['batch_size']}, shuffle on; {ep['epochs']} epochs of "
                      f"{ep['samples_per_epoch']} samples timed after an untimed one; MB/s of decoded samples, "
                      f"delivered as float32{'; every batch summed' if cfg.get('consume') else ''})", ""] + read + [""]
    if s3_table(results):
        lines += ["## Object storage (`--s3`: moto's server on loopback; batch 64, 2 workers; GETs and bytes from "
                  "moto's request recorder; moto copies the whole object per GET)", ""] + s3_table(results) + [""]
    checks = results.get("checks") or []
    if checks:
        bad = [c for c in checks if not c["ok"]]
        lines += ["## Correctness", "", f"{len(checks) - len(bad)} of {len(checks)} checks passed."]
        lines += [f"- FAILED: {c['check']} {c['detail']}" for c in bad] + [""]
    if results.get("skipped"):
        lines += ["## Skipped", ""] + [f"- {s}" for s in results["skipped"]] + [""]
    v = meta["versions"]
    return "\n".join(lines + ["Versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v)), ""])


# ------------------------------------------------------------------------------- plots


def plots(results: dict[str, Any], out_dir: str) -> list[str]:
    """One bar chart per corpus and phase (median, min-max); returns the file names. Drawn
    with matplotlib's object API, so no backend or pyplot state of the process changes."""
    import numpy as np
    from matplotlib.figure import Figure

    files: list[str] = []
    for phase in ("read", "convert"):
        for name in results["corpora"]:
            recs = _records(results, phase, name)
            if not recs:
                continue
            labels = [" ".join(str(x) for x in (r["method"], r["codec"], r["variant"],
                                                "" if r["workers"] is None else f"w{r['workers']}") if x)
                      for r in recs]
            med = np.array([rate(r) for r in recs])
            err = [med - [r["rate"]["min"] for r in recs], [r["rate"]["max"] for r in recs] - med]
            fig = Figure(figsize=(9, 0.35 * len(recs) + 1.5))
            ax = fig.subplots()
            ax.barh(np.arange(len(recs)), med, xerr=err, capsize=2)
            ax.set_yticks(np.arange(len(recs)), labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("samples/s (median, min-max)")
            ax.grid(axis="x", alpha=0.3)
            ax.set_title(f"{'Read' if phase == 'read' else 'Conversion'} throughput, {name}")
            fig.tight_layout()
            fn = f"{phase}_{name}.png"
            fig.savefig(os.path.join(out_dir, fn), dpi=110)
            files.append(fn)
    return files


def write(results: dict[str, Any], out_dir: str | None = None) -> dict[str, str]:
    """Judge the targets, write ``results.json``, ``results.md`` and the plots; their paths."""
    out_dir = out_dir or results["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    results["targets"] = targets(results)
    results["plots"] = plots(results, out_dir)
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "results.md")}
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=1)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(results) + "\n" + "\n".join(f"![{p}]({p})" for p in results["plots"]) + "\n")
    return {**paths, **{p: os.path.join(out_dir, p) for p in results["plots"]}}
