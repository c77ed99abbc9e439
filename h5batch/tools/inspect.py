"""``h5batch inspect``: what an output file holds, in a form a person can read."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from .. import shards
from .compact import dataset_bytes


def _storage(ds: h5py.Dataset) -> dict[str, Any]:
    """Shape, chunks, filters and bytes of a dataset; of a virtual one (a sharded output,
    h5batch/shards.py): its shards' chunks and filters, and the bytes they store."""
    if ds.is_virtual:
        folder = os.path.dirname(os.path.abspath(ds.file.filename))
        with contextlib.ExitStack() as stack:
            parts = [stack.enter_context(h5py.File(os.path.join(folder, vs.file_name), "r"))[vs.dset_name]
                     for vs in ds.virtual_sources()]
            out = _storage(parts[0])
            out.update(shape=list(ds.shape), stored_bytes=sum(int(p.id.get_storage_size()) for p in parts),
                       raw_bytes=int(ds.size * ds.dtype.itemsize))
            return out
    plist = ds.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    stored = ds.id.get_storage_size()
    return {"shape": list(ds.shape), "dtype": str(ds.dtype), "chunks": list(ds.chunks) if ds.chunks else None,
            "filters": filters, "codec": ds.attrs.get("codec", ""),
            "codec_choice": str(ds.attrs.get("codec_choice", "")), "stored_bytes": int(stored),
            "raw_bytes": int(ds.size * ds.dtype.itemsize)}


def _codec_of(filters: list[int]) -> str:
    """For a dataset without a ``codec`` attribute: its filter ids and the registered codecs
    that store that pipeline."""
    from ..codecs import for_filters

    return f"filters {filters} ({'/'.join(for_filters(filters)) or 'no registered codec'})"


def describe(path: str) -> dict[str, Any]:
    """A JSON-able description of an h5batch file."""
    import hdf5plugin  # noqa: F401  (registers plugin filters for reading)

    out: dict[str, Any] = {"path": path, "file_bytes": os.path.getsize(path)}
    with h5py.File(path, "r") as f:
        a = f.attrs
        out["format"] = int(a.get(fmt.ATTR_FORMAT, 0))
        out["complete"] = bool(a.get(fmt.ATTR_COMPLETE, False))
        if shards.is_sharded(f):  # checked first: the datasets below read through them
            shards.check(path, f)
            out["shards"] = [vars(r) for r in shards.records(f)]
        out["created"] = str(a.get(fmt.ATTR_CREATED, ""))
        out["versions"] = json.loads(a.get(fmt.ATTR_VERSIONS, "{}"))
        out["job"] = json.loads(a.get(fmt.ATTR_JOB, "{}"))
        out["inputs"] = int(a.get(fmt.ATTR_INPUTS, 0))
        out["class_names"] = [s.decode() if isinstance(s, bytes) else s for s in f[fmt.CLASS_NAMES][...]] if fmt.CLASS_NAMES in f else []
        fields = json.loads(a.get(fmt.ATTR_FIELDS, "[]"))
        out["splits"] = {}
        raw_total = stored_total = 0
        for split in json.loads(a.get(fmt.ATTR_SPLITS, "[]")):
            if split not in f:
                continue
            g = f[split]
            rows = int(g[fmt.SOURCE].shape[0]) if fmt.SOURCE in g else 0
            # Rows `h5batch sync` removed stay in the file; they are not samples any more.
            dead = int(g[fmt.TOMBSTONES].shape[0]) if fmt.TOMBSTONES in g else 0
            info: dict[str, Any] = {"samples": rows - dead, "tombstoned": dead, "fields": {}}
            for name in fields:
                if name not in g:
                    continue
                node = g[name]
                if isinstance(node, h5py.Group):
                    st = _storage(node[fmt.VALUES])
                    st["codec"] = node.attrs.get("codec", st["codec"])
                    st["codec_choice"] = str(node.attrs.get("codec_choice", ""))
                    shapes = node[fmt.SHAPES][...]
                    st.update(kind="variable", modality=node.attrs.get("modality", ""),
                              min_shape=shapes.min(axis=0).tolist() if len(shapes) else None,
                              max_shape=shapes.max(axis=0).tolist() if len(shapes) else None)
                    if node.attrs.get("store") == "encoded":  # bytes the reader decodes (fields/encoded.py)
                        st["encoded"] = str(node.attrs.get("encoded_format", "source"))
                else:
                    st = _storage(node)
                    st.update(kind="fixed", modality=node.attrs.get("modality", ""), sample_shape=list(node.shape[1:]))
                if "sample_rate" in node.attrs:
                    st["sample_rate"] = int(node.attrs["sample_rate"])
                for key in ("categories", "names"):  # value / multilabel fields (fields/value.py)
                    if key in node.attrs:
                        st[key] = [str(v) for v in np.atleast_1d(node.attrs[key])]
                if st["modality"] == "text" and info["samples"]:  # the first string, as a taste
                    offs = node[fmt.OFFSETS]
                    first = bytes(node[fmt.VALUES][int(offs[0]):int(offs[1])]).decode("utf-8", "replace")
                    st["first"] = first if len(first) <= 60 else first[:57] + "..."
                raw_total += st["raw_bytes"]
                stored_total += st["stored_bytes"]
                info["fields"][name] = st
            if fmt.LABEL in g and g[fmt.LABEL].shape[0]:
                counts = np.bincount(g[fmt.LABEL][...], minlength=len(out["class_names"]))
                info["label_counts"] = {out["class_names"][i] if i < len(out["class_names"]) else str(i): int(c)
                                        for i, c in enumerate(counts)}
            out["splits"][split] = info
        out["raw_bytes"] = raw_total
        out["stored_bytes"] = stored_total
        out["compression_ratio"] = raw_total / stored_total if stored_total else None
        rej = f.get(fmt.REJECTS)
        out["dataset_bytes"] = dataset_bytes(f)
        out["synced"] = str(a.get("synced", ""))  # h5batch.writer.sync.ATTR_SYNCED: when the last sync ended
        out["rejects"] = []
        if rej is not None and rej["path"].shape[0]:
            out["rejects"] = [{"path": p, "stage": s, "reason": r} for p, s, r in
                              zip(rej["path"].asstr()[...], rej["stage"].asstr()[...], rej["reason"].asstr()[...])]
    return out


def sample(path: str, i: int, split: str | None = None) -> dict[str, Any]:
    """Sample ``i`` of ``split`` (default ``train``, else the first split) as the reader yields
    it (:func:`h5batch.tools.samples.sample_record`); a bad file, split or index raises
    :class:`~h5batch.tools.samples.SampleError`."""
    from .samples import check_output, pick_splits, sample_record

    splits = check_output(path, sharded=True)
    if split is None:
        split = "train" if "train" in splits else (splits[0] if splits else "train")
    return sample_record(path, pick_splits(path, splits, [split])[0], i)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n}"


def render(d: dict[str, Any], max_rejects: int = 20) -> str:
    """The text shown by ``h5batch inspect``."""
    lines = [f"{d['path']}  ({_human(d['file_bytes'])} on disk, format v{d['format']}, "
             f"{'complete' if d['complete'] else 'INCOMPLETE'}, created {d['created']})"]
    if d.get("shards"):
        lines.append(f"shards: {len(d['shards'])} files beside it, "
                     f"{_human(sum(r['bytes'] for r in d['shards']))}: "
                     + ", ".join(f"{r['path']} (host {r['host']})" for r in d["shards"]))
    job = d.get("job", {})
    if job:
        lines.append(f"job: {job.get('name')}  layout={job.get('source', {}).get('layout')}  "
                     f"root={job.get('source', {}).get('root')}  codec={job.get('output', {}).get('codec')}")
    if d["class_names"]:
        lines.append(f"classes ({len(d['class_names'])}): {', '.join(d['class_names'][:20])}"
                     + (" ..." if len(d["class_names"]) > 20 else ""))
    for split, info in d["splits"].items():
        dead = info.get("tombstoned", 0)
        lines.append(f"[{split}] {info['samples']} samples"
                     + (f" (+ {dead} rows removed by sync, still on disk until a fresh convert)" if dead else ""))
        for name, st in info["fields"].items():
            shape = (f"sample shape {tuple(st['sample_shape'])}" if st["kind"] == "fixed"
                     else f"variable shape {tuple(st['min_shape'] or ())}..{tuple(st['max_shape'] or ())}")
            ratio = st["raw_bytes"] / st["stored_bytes"] if st["stored_bytes"] else 0
            sr = f", {st['sample_rate']} Hz" if st.get("sample_rate") else ""
            if st.get("encoded"):
                shape = f"stored encoded ({st['encoded']} bytes, decoded when read), {shape} bytes"
            lines.append(f"  {name}: {st['modality']} {st['kind']}, {shape}, {st['dtype']}{sr}; chunks {tuple(st['chunks'] or ())}, "
                         f"codec {st['codec'] or _codec_of(st['filters'])}; {_human(st['raw_bytes'])} -> {_human(st['stored_bytes'])} ({ratio:.2f}x)")
            for key in ("categories", "names"):
                if st.get(key):
                    more = " ..." if len(st[key]) > 12 else ""
                    lines.append(f"    {key} ({len(st[key])}): {', '.join(st[key][:12])}{more}")
            if "first" in st:
                lines.append(f"    first: {st['first']!r}")
            if st.get("codec_choice"):
                lines.append(f"    why this codec: {st['codec_choice']}")
        if "label_counts" in info:
            lines.append("  labels: " + ", ".join(f"{k}={v}" for k, v in info["label_counts"].items()))
    ratio = d["compression_ratio"]
    lines.append(f"total: {_human(d['raw_bytes'])} of samples stored in {_human(d['stored_bytes'])}"
                 + (f" (compression ratio {ratio:.2f}x)" if ratio else ""))
    # Space beyond the datasets: HDF5's own metadata (small), or what a sync or an older
    # h5batch left unused; compact is worth suggesting only for the latter.
    other = d["file_bytes"] - d["dataset_bytes"]
    if d.get("synced") or other > max(1 << 20, d["dataset_bytes"] // 20):
        why = f"what syncs replaced (last sync {d['synced']})" if d.get("synced") else "unused space"
        lines.append(f"space: {_human(d['dataset_bytes'])} in datasets, {_human(other)} else: metadata and "
                     f"{why}, which `h5batch compact` gives back")
    n_samples = sum(i["samples"] for i in d["splits"].values())
    excluded = sum(r["stage"] == fmt.STAGE_EXCLUDED for r in d["rejects"])
    lines.append(f"inputs: {d['inputs']} files discovered; {n_samples} samples; "
                 f"{fmt.rejects_words(len(d['rejects']) - excluded, excluded)}")
    for r in d["rejects"][:max_rejects]:
        lines.append(f"  reject [{r['stage']}] {r['path']}: {r['reason']}")
    if len(d["rejects"]) > max_rejects:
        lines.append(f"  ... {len(d['rejects']) - max_rejects} more (see the .rejects.jsonl beside the file)")
    v = d.get("versions", {})
    if v:
        lines.append("made with: " + ", ".join(f"{k} {v[k]}" for k in sorted(v)))
    return "\n".join(lines)
