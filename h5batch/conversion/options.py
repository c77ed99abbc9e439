"""What a caller chooses about a conversion run, and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ConvertOptions:
    """Run-time choices that do not change the output's content."""

    resume: bool = True  # continue a matching partial output
    restart: bool = False  # discard a partial output even if it does not match
    overwrite: bool = False
    # auto, bar, log or none (conversion.progress.MODES); auto: a bar on a terminal, log lines
    # otherwise. Older callers' None and True mean auto, False none.
    progress: str | bool | None = "auto"
    log: Any = None  # file object for messages (default stderr)


@dataclass
class ConvertSummary:
    """What a conversion did (figures for the summary line and for benchmarks)."""

    path: str
    counts: dict[str, int]
    rejects: int  # every input listed in the rejects file, ``excluded`` ones included
    inputs: int
    seconds: float
    bytes_decoded: int
    output_bytes: int
    resumed_from: int = 0
    rejects_file: str = ""
    warnings: int = 0  # input files whose decoder warned (their messages are in warnings_file)
    warnings_file: str = ""
    cluster: str = ""
    dashboard: str | None = None
    ok: bool = True
    excluded: int = 0  # rejects of stage "excluded" (source.exclude, unlisted samples): not failures
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(self.counts.values())
