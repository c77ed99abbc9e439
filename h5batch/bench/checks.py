"""The correctness phase of a benchmark run: every output is compared with the source
decoded in this process, so no row's speed comes from a wrong or partial result."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import baselines, corpus, peers, strict
from .records import close_loader


class CheckPhase:
    """Mixed into :class:`~h5batch.bench.suite.Bench` (uses its records, config and log)."""

    def _check(self, what: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"check": what, "ok": bool(ok), "detail": detail})
        if not ok:
            self.say(f"CHECK FAILED: {what} {detail}")

    def _check_phase(self, spec: dict[str, Any], peer_ok: dict[str, bool]) -> None:
        import h5py

        cp = spec["corpus"]
        self.say(f"check {cp.name}: decoding the source in this process for reference")
        ref = corpus.decode_items(cp, spec["manifest"])
        spec["reference"] = ref
        spec["sample_bytes"] = corpus.sample_nbytes(ref)
        self.corpora[cp.name]["sample_bytes"] = spec["sample_bytes"]
        for rec in self.records.values():
            if rec.phase != "convert" or rec.corpus != cp.name or "path" not in rec.info or rec.variant:
                continue
            if rec.method.startswith("h5batch"):
                with h5py.File(rec.info["path"], "r") as f:
                    ok = all(_equal_h5(f, m_split_items(spec["manifest"]), name, ref[name])
                             for name in cp.fields)
                self._check(f"{cp.name}: h5batch {rec.codec} output equals the decoded source", ok)
            elif rec.method == "naive":
                ok = all(_equal_list(baselines.naive_read_all(rec.info["path"], name), ref[name])
                         for name in cp.fields)
                self._check(f"{cp.name}: naive output equals the decoded source", ok)
        if cp.fixed:
            train = train_count(spec["manifest"])
            spec["memmap"] = baselines.write_memmaps({k: v[:train] for k, v in ref.items()},
                                                     self.folder("memmap", cp.name))
            strict.prepare(self, spec, ref, train)
        names = list(cp.fields)
        n = len(spec["manifest"].items)
        for rec in list(self.records.values()):
            if rec.phase != "convert" or rec.corpus != cp.name or "path" not in rec.info:
                continue
            loader = None
            if rec.method.startswith("webdataset"):
                loader = peers.wds_loader(rec.info["path"], names, 2, self.cfg.batch_size, keys=True)
            elif rec.method.startswith("litdata"):
                loader = peers.litdata_loader(rec.info["path"], names, 2, self.cfg.batch_size, keys=True)
            if loader is None:
                continue
            v = peers.verify(loader, ref, n)
            close_loader(loader)
            rec.info["verify"] = v
            self._check(f"{cp.name}: {rec.method} holds every sample once, equal to the source",
                        v["ok"], json.dumps(v))


def train_count(manifest: Any) -> int:
    return sum(1 for it in manifest.items if it.split == "train")

def m_split_items(manifest: Any) -> list[tuple[str, int]]:
    """``(split, count)`` in output order."""
    out: list[tuple[str, int]] = []
    for it in manifest.items:
        if out and out[-1][0] == it.split:
            out[-1] = (it.split, out[-1][1] + 1)
        else:
            out.append((it.split, 1))
    return out

def _equal_h5(f: Any, splits: list[tuple[str, int]], name: str, ref: Any) -> bool:
    from .. import format as fmt

    got: list[np.ndarray] = []
    for split, count in splits:
        obj = f[split][name]
        if isinstance(obj, type(f)) or hasattr(obj, "keys"):  # variable-shape group
            values = obj[fmt.VALUES][...]
            offsets = obj[fmt.OFFSETS][...]
            shapes = obj[fmt.SHAPES][...]
            got += [values[offsets[i]:offsets[i + 1]].reshape(shapes[i]) for i in range(count)]
        else:
            got += list(obj[...])
    return _equal_list(got, ref)

def _equal_list(got: list[np.ndarray], ref: Any) -> bool:
    if len(got) != len(ref):
        return False
    return all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(got, ref))
