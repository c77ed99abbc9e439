"""What a caller chooses about a conversion run, what it is told while it runs, and what it
gets back.

The progress of a conversion (:class:`Progress`): a tqdm bar, plain periodic log lines, or nothing.

The mode is what the user asked for (``h5batch convert --progress``), and only ``auto``
looks at the stream: a bar on a terminal, log lines otherwise (a bar's carriage returns
make a log file unreadable). ``log`` prints log lines even on a terminal, for a session
that is being recorded or a terminal that cannot redraw; ``bar`` draws the bar even into a
file. Log lines come every ``every`` seconds and once more at the end, so even a short run
leaves one line saying how far it got.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

MODES = ("auto", "bar", "log", "none")


@dataclass
class ConvertOptions:
    """Run-time choices that do not change the output's content."""

    resume: bool = True  # continue a matching partial output
    restart: bool = False  # discard a partial output even if it does not match
    overwrite: bool = False
    # auto, bar, log or none (:data:`MODES`); auto: a bar on a terminal, log lines
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



def progress_mode(value: str | bool | None) -> str:
    """A mode of :data:`MODES` from a mode or from the older boolean setting of
    :attr:`ConvertOptions.progress`:
    ``None`` is ``auto``, ``True`` is ``auto`` too (a bar on a terminal, log lines otherwise),
    ``False`` is ``none``."""
    if value is None or value is True:
        return "auto"
    if value is False:
        return "none"
    if value not in MODES:
        raise ValueError(f"progress must be one of {', '.join(MODES)}, got {value!r}")
    return value


class Progress:
    """Counts items done, rejects and decoded bytes; shows files/s, MB/s and ETA."""

    def __init__(self, total: int, initial: int = 0, mode: str | bool | None = "auto", log: Any = None,
                 every: float = 10.0):
        self.log = log or sys.stderr
        self.total, self.done, self.rejects, self.nbytes = total, initial, 0, 0
        self.t0 = time.monotonic()
        self.start_done = initial
        self.every = every
        self.last = self.t0
        mode = progress_mode(mode)
        if mode == "auto":
            mode = "bar" if hasattr(self.log, "isatty") and self.log.isatty() else "log"
        self.mode = mode
        self.bar = None
        if mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="file", file=self.log, smoothing=0.1,
                            dynamic_ncols=True)

    def update(self, n: int, rejects: int = 0, nbytes: int = 0) -> None:
        self.done += n
        self.rejects, self.nbytes = rejects, nbytes
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(f"{self._mbps(now):.1f} MB/s, {self.rejects} rejects", refresh=False)
        elif self.mode == "log" and now - self.last >= self.every:
            self.last = now
            self._line(now)

    def _mbps(self, now: float) -> float:
        return self.nbytes / 1e6 / max(now - self.t0, 1e-9)

    def _line(self, now: float) -> None:
        rate = (self.done - self.start_done) / max(now - self.t0, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        print(f"[h5batch] {self.done}/{self.total} files ({100 * self.done / max(self.total, 1):.0f}%), "
              f"{rate:.0f} files/s, {self._mbps(now):.1f} MB/s decoded, {self.rejects} rejects, "
              f"ETA {eta:.0f}s", file=self.log, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "log":
            self._line(time.monotonic())
