"""Progress: a tqdm bar on a terminal, plain periodic log lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """Counts items done, rejects and decoded bytes; shows files/s, MB/s and ETA."""

    def __init__(self, total: int, initial: int = 0, enabled: bool | None = None, log: Any = None,
                 every: float = 10.0):
        self.log = log or sys.stderr
        self.total, self.done, self.rejects, self.nbytes = total, initial, 0, 0
        self.t0 = time.monotonic()
        self.start_done = initial
        self.every = every
        self.last = self.t0
        tty = hasattr(self.log, "isatty") and self.log.isatty()
        self.bar = None
        if enabled is None:
            enabled = tty
        if enabled and tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="file", file=self.log, smoothing=0.1,
                            dynamic_ncols=True)
        self.plain = bool(enabled) and self.bar is None or (enabled is None and not tty)
        self.quiet = enabled is False

    def update(self, n: int, rejects: int = 0, nbytes: int = 0) -> None:
        self.done += n
        self.rejects, self.nbytes = rejects, nbytes
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(f"{self._mbps(now):.1f} MB/s, {self.rejects} rejects", refresh=False)
        elif not self.quiet and now - self.last >= self.every:
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
