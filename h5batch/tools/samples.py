"""Single samples of an output as training sees them, for ``inspect --sample`` and ``preview``.

Rule: a sample is read with :class:`h5batch.torch.H5Dataset` (stored values, ``as_float=False``),
so what a person looks at is what a training script gets: encoded fields decoded, text as
``str``, rows removed by ``h5batch sync`` (tombstones) skipped. Sample ``i`` is the ``i``-th
sample the reader yields; :func:`file_rows` maps it to its row in the file (where its
``checksum`` and ``source`` live). Per-split statistics (labels, lengths) read the small index
arrays of the live rows only (:func:`h5batch.tools.index.live_rows`).

A path that is not an h5batch output, or a split it does not have, raises
:class:`SampleError` (exit code 2) naming the file and the split.
"""

from __future__ import annotations

import json
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from ..errors import EXIT_BAD_INPUT, H5batchError

__all__ = ["SampleError", "check_output", "describe_value", "file_rows", "open_split", "pick_splits",
           "sample_record", "spread"]


class SampleError(H5batchError, ValueError):
    """The file or split cannot be read as asked (exit code 2: bad arguments)."""

    exit_code = EXIT_BAD_INPUT


def check_output(path: str, sharded: bool = False) -> list[str]:
    """The splits of the h5batch output ``path``; :class:`SampleError` when it is none
    (``sharded``: a sharded output is one, h5batch/shards.py)."""
    from .index import open_output

    with open_output(path, SampleError, sharded) as f:
        return [s for s in json.loads(f.attrs.get(fmt.ATTR_SPLITS, "[]")) if s in f]


def pick_splits(path: str, splits: list[str], wanted: list[str] | None) -> list[str]:
    """``wanted`` (all when None) checked against the file's ``splits``."""
    for s in wanted or []:
        if s not in splits:
            raise SampleError(f"{path}: no split {s!r} (splits: {', '.join(splits) or 'none'})")
    return list(dict.fromkeys(wanted)) if wanted else splits


def open_split(path: str, split: str) -> Any:
    """``H5Dataset(path, split, as_float=False, with_source=...)``: stored values, as trained on."""
    from ..torch import H5Dataset

    with h5py.File(path, "r") as f:
        has_source = fmt.SOURCE in f[split]
    return H5Dataset(path, split, as_float=False, with_source=has_source)


def file_rows(f: h5py.File, path: str, split: str) -> np.ndarray:
    """File row of every sample the reader yields (tombstoned rows left out), int64."""
    from .index import live_rows
    from .views import num_samples

    n = num_samples(f[split])
    live = live_rows(f, path, split, n)
    return np.arange(n, dtype=np.int64) if live is None else live


def spread(total: int, n: int) -> list[int]:
    """``min(n, total)`` indices of ``range(total)`` spread evenly, first and last included;
    the same arguments always give the same indices."""
    k = max(0, min(int(n), int(total)))
    return np.linspace(0, total - 1, k).round().astype(np.int64).tolist()


def _names(node: Any, key: str) -> list[str]:
    return [str(v) for v in np.atleast_1d(node.attrs[key])] if key in node.attrs else []


def _plain(v: Any) -> Any:
    """A numpy scalar as a Python number printed at its own precision: a float32 as its
    shortest repr (-14.312, not -14.312000274658203)."""
    return float(str(v)) if isinstance(v, np.floating) and v.dtype.itemsize < 8 else v.item()


def describe_value(value: Any, node: Any) -> dict[str, Any]:
    """What one field of one sample holds, JSON-able: ``text`` for a string, ``value`` (with
    category or column names) for value fields, ``on`` for multilabel, else ``shape``,
    ``dtype``, ``min``, ``max`` of the array."""
    modality = str(node.attrs.get("modality", ""))
    if isinstance(value, str):
        return {"modality": modality, "text": value}
    a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    out: dict[str, Any] = {"modality": modality, "shape": list(a.shape), "dtype": str(a.dtype)}
    if modality == "multilabel":
        names = _names(node, "names")
        out["on"] = [names[k] if k < len(names) else str(k) for k in np.flatnonzero(a.reshape(-1))]
        return out
    if modality == "value":
        cats, names = _names(node, "categories"), _names(node, "names")
        flat = [_plain(v) for v in a.reshape(-1)]
        if cats:
            flat = [cats[int(c)] if 0 <= int(c) < len(cats) else int(c) for c in flat]
        out["value"] = dict(zip(names, flat)) if names and len(names) == len(flat) else (
            flat[0] if a.ndim == 0 else flat)
        return out
    if a.size:
        out["min"], out["max"] = _plain(a.min()), _plain(a.max())
    sr = node.attrs.get("sample_rate")
    if modality == "audio" and sr and str(node.attrs.get("axes", "time")).startswith("time"):
        out["seconds"] = round(a.shape[0] / int(sr), 4)
        out["sample_rate"] = int(sr)
    return out


def sample_record(path: str, split: str, i: int) -> dict[str, Any]:
    """Everything about sample ``i`` of ``split``: file row, label and its name, source
    path(s), checksum row (crc32 per field of files) and one :func:`describe_value` per field."""
    ds = open_split(path, split)
    n = len(ds)
    if not -n <= i < n:
        raise SampleError(f"{path}: split {split!r} has {n} samples; no sample {i}")
    i %= n
    s = ds[i]
    with h5py.File(path, "r") as f:
        g = f[split]
        row = int(file_rows(f, path, split)[i])
        rec: dict[str, Any] = {"path": path, "split": split, "sample": i, "row": row, "samples": n}
        if "label" in s:
            lab = int(s["label"])
            rec["label"] = lab
            rec["label_name"] = ds.class_names[lab] if 0 <= lab < len(ds.class_names) else None
        if "source" in s:
            rec["source"] = list(s["source"]) if isinstance(s["source"], tuple) else [s["source"]]
        if fmt.CHECKSUM in g:
            ck = g[fmt.CHECKSUM]
            names = json.loads(ck.attrs.get("fields", "[]"))
            vals = np.atleast_1d(ck[row]).tolist()
            rec["checksum"] = {names[k] if k < len(names) else str(k): f"{int(v):08x}"
                               for k, v in enumerate(vals)}
            rec["checksum_algorithm"] = str(ck.attrs.get("algorithm", "crc32"))
        rec["fields"] = {name: describe_value(s[name], g[name]) for name in ds.field_names}
        for name, d in rec["fields"].items():  # a padded clip lasts its true length (<field>_lengths)
            true = rec["fields"].get(f"{name}_lengths", {}).get("value")
            if "seconds" in d and true is not None:
                d["seconds"] = round(int(true) / d["sample_rate"], 4)
    return rec


def render_record(rec: dict[str, Any]) -> str:
    """The text ``h5batch inspect OUT.h5 --sample I`` prints."""
    lines = [f"{rec['path']} [{rec['split']}] sample {rec['sample']} of {rec['samples']} (file row {rec['row']})"]
    if "label" in rec:
        lines.append(f"label: {rec['label']} ({rec['label_name']})")
    for p in rec.get("source", []):
        lines.append(f"source: {p}")
    if "checksum" in rec:
        lines.append(f"checksum ({rec['checksum_algorithm']}): "
                     + ", ".join(f"{k}={v}" for k, v in rec["checksum"].items()))
    for name, d in rec["fields"].items():
        if "text" in d:
            what = repr(d["text"])
        elif "on" in d:
            what = f"{d['shape']} {d['dtype']}: {', '.join(d['on']) or '(none)'}"
        elif "value" in d:
            what = f"{d['value']!r} ({d['dtype']})"
        else:
            what = f"shape {tuple(d['shape'])} {d['dtype']}"
            if "min" in d:
                what += f", min {d['min']}, max {d['max']}"
            if "seconds" in d:
                what += f", {d['seconds']} s at {d['sample_rate']} Hz"
        lines.append(f"  {name} ({d['modality']}): {what}")
    return "\n".join(lines)
