"""One row of the benchmark's tables (all repetitions of one configuration), and loader
clean-up shared by the phases."""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, field
from typing import Any

from .measure import Sample, summarize

DEFAULT_CODEC = "auto"  # the job default (h5batch/conversion/auto.py)
#: h5batch read variants: ``DataLoader(ds, batch_size, shuffle=True)`` with torch's default
#: collate (the plain path most scripts write), and ``ds.loader(...)`` (the one-call fast path)
PLAIN = "plain-dataloader"
LOADER = "ds.loader"
#: the strict read limit (bench/strict.py): ``torch.from_numpy(mm[np.sort(idx)])`` of a float32
#: memmap per batch; and the memmap baseline built like the reader (int16 converted row by row
#: on h5batch's threads into recycled shared memory), called ``memmap`` before issue 19
MEMMAP_STRICT = "memmap-strict"
MEMMAP_ROWWISE = "memmap-int16-rowwise"
#: the read+write bound on conversion (``bench.physics``): the decode-only floor scaled by
#: read / (read + write) measured beside it, the most a converter reaches on CPU-bound cores
RW_BOUND = "rw-bound"
#: (stored dtype, fixed shape) of the storages judged against the strict limit
STRICT_STORAGES = (("int16", True), ("float32", True), ("int16", False), ("float32", False))


def strict_variant(dtype: str, fixed: bool) -> str:
    """The read variant of h5batch on one strict-limit storage: ``ds.loader float32 variable``."""
    return f"{LOADER} {dtype} {'fixed' if fixed else 'variable'}"


def close_loader(loader: Any) -> None:
    """Stop a DataLoader's persistent workers now (not whenever the GC gets to it)."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    try:
        loader._iterator = None
    except AttributeError:
        pass
    gc.collect()

@dataclass
class Record:
    """All repetitions of one configuration (one row of a table)."""

    phase: str  # convert | read
    corpus: str
    method: str  # h5batch, h5batch-cold, floor, naive, webdataset-1p, ..., raw, memmap-*
    codec: str = ""
    variant: str = ""  # sampler for reads, scale for conversions
    workers: int | None = None  # DataLoader num_workers (reads)
    runs: list[Sample] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        parts = [self.phase, self.corpus, self.method, self.codec, self.variant,
                 "" if self.workers is None else f"w{self.workers}"]
        return "/".join(p for p in parts if p)

    def stat(self, what: str = "rate") -> dict[str, float]:
        return summarize(getattr(r, what) for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "runs"}
        d["key"] = self.key
        d["runs"] = [r.to_dict() for r in self.runs]
        d["rate"] = self.stat("rate")
        d["mb_per_s"] = self.stat("mbps")
        d["seconds"] = self.stat("seconds")
        d["peak_rss"] = summarize(float(r.peak_rss) for r in self.runs)
        d["rss_added"] = summarize(float(r.peak_rss - r.baseline_rss) for r in self.runs)
        return d
