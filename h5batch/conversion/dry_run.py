"""``convert --dry-run``: what a conversion would do, with nothing written.

Discovery and the plan's decisions only: samples per split and class, the rejects
discovery finds (decoding finds more), the codec the trial chooses and the output size it
implies. Rule: no file is created, not even the lock, the rejects list or the warnings
log; a ``source.generate`` corpus that is missing is not generated (the report says it
would be). The trial decodes its samples on the engine the job names, as a run would.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from ..config import JobConfig
from ..format import PARTIAL_SUFFIX, STAGE_EXCLUDED
from ..layouts import discover, resolved_job
from .auto import resolve
from .cluster import open_engine
from .generate import needs_generating
from .trial import on_engine

TOP_REASONS = 5


def dry_run(job: JobConfig, say) -> dict[str, Any]:
    """The report of a dry run of ``job`` (a JSON-ready mapping); ``say`` gets the
    engine's and the trial's lines, as a run's log would."""
    src = job.source
    out: dict[str, Any] = {"dry_run": True, "output": job.output.path}
    if needs_generating(job):
        out["would_generate"] = {"corpus": src.generate, "root": src.root}
        return out
    manifest = discover(job)
    job = resolved_job(job, manifest)
    per: dict[str, Counter] = {s: Counter() for s in manifest.splits}
    for it in manifest.items:
        per[it.split][it.label or ""] += 1
    excluded = [r for r in manifest.rejects if r.stage == STAGE_EXCLUDED]
    rejects = [r for r in manifest.rejects if r.stage != STAGE_EXCLUDED]
    out.update(samples=len(manifest.items),
               splits={s: dict(sorted(c.items())) for s, c in per.items()},
               classes=len(manifest.class_names),
               rejects=len(rejects), excluded=len(excluded),
               reasons=dict(Counter(r.reason for r in rejects).most_common(TOP_REASONS)),
               excluded_reasons=dict(Counter(r.reason for r in excluded).most_common(TOP_REASONS)))
    if manifest.items:
        with open_engine(job) as conn:
            say(f"decoding on {conn.description}")
            auto = resolve(job, manifest, run_trial=on_engine(conn, say))
        n = len(manifest.items)
        size = 0
        codecs = {}
        for name, choice in auto.codecs.items():
            ratio = choice.ratio if choice.codec.name != "none" and choice.ratio else 1.0
            size += int(auto.field_bytes.get(name, 0) * n / ratio)
            codecs[name] = choice.codec.label()
        out.update(codecs=codecs, batch_size=auto.batch_size, estimated_bytes=size)
    final = job.output.path
    out["existing"] = ("complete" if os.path.exists(final) else
                       "partial" if os.path.exists(final + PARTIAL_SUFFIX) else None)
    return out


def describe(report: dict[str, Any]) -> list[str]:
    """The report in words, a line each."""
    if "would_generate" in report:
        g = report["would_generate"]
        return [f"dry run: would generate the {g['corpus']!r} corpus in {g['root']} first; "
                "discovery needs its files, so a dry run stops here"]
    lines = [f"dry run: {report['samples']} samples, {report['classes']} classes, "
             f"{report['rejects']} rejects found by discovery, {report['excluded']} excluded"]
    for split, classes in report["splits"].items():
        shown = ", ".join(f"{c or '(no label)'} {n}" for c, n in list(classes.items())[:12])
        more = f", ... ({len(classes) - 12} more classes)" if len(classes) > 12 else ""
        lines.append(f"  {split}: {sum(classes.values())} ({shown}{more})")
    for title, reasons in (("rejects", report["reasons"]), ("excluded", report["excluded_reasons"])):
        lines += [f"  {title}: {n} x {reason}" for reason, n in reasons.items()]
    if "codecs" in report:
        lines.append(f"  codecs: {', '.join(f'{k} {v}' for k, v in report['codecs'].items())}; "
                     f"estimated output {report['estimated_bytes'] / 1e6:,.1f} MB")
    if report["existing"]:
        lines.append(f"  {report['output']} exists ({report['existing']}): a run resumes a partial "
                     "output of this job, answers that a finished one is complete, else needs --overwrite")
    lines.append("nothing written")
    return lines
