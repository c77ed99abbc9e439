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
    # Internals (pre-flight, the codec's reasoning, batch size) in the log too; the command
    # line says them only with -v.
    verbose: bool = True


class Say:
    """The run's voice: ``say(text)`` for what people read, ``say.detail(text)`` for the
    internals, said only where ``verbose``."""

    def __init__(self, log: Any, verbose: bool):
        self.log, self.verbose = log, verbose

    def __call__(self, text: str) -> None:
        print(text, file=self.log, flush=True)

    def detail(self, text: str) -> None:
        if self.verbose:
            self(text)


def detail(say, text: str) -> None:
    """``text`` said as an internal (:meth:`Say.detail`); a plain callable says it."""
    getattr(say, "detail", say)(text)


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
