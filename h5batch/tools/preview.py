"""``h5batch preview``: a static HTML page of what an output holds, opened from the file system.

Per split: samples per class (a table with a bar per class name: the 20 largest, then one
``others`` row), audio lengths and image sizes (histograms), a grid of ``n`` decoded samples
(image thumbnails; for audio a waveform, a spectrogram and an ``<audio>`` player of the
sample as a WAV), each card with its label name and every field; a table of every shown
sample's label name, source path(s), text, value and multilabel fields and media shapes;
then the rejects with their reasons (``/rejects``, else ``OUT.rejects.jsonl``), the job and
the versions the file was made with. The page and everything it shows live in one folder
(``DIR/index.html`` and ``DIR/preview-files/``), linked by relative URLs, so the folder can
be copied anywhere and opened with ``file://``.

Rules, and why:

* samples are read with :class:`h5batch.torch.H5Dataset` (:mod:`h5batch.tools.samples`),
  decoded as training sees them, tombstoned rows skipped; counts and lengths come from the
  index arrays of the live rows (a field stored encoded has no decoded sizes in its index:
  its lengths are those of the shown samples, and the chart says so);
* durations are true ones: a clip's length is its index entry (``<field>_lengths`` for a
  padded field), its rate the per-sample ``<field>_sample_rate`` column, else the field's
  ``sample_rate`` attribute; where that is 0 (a mixed-rate corpus converted without
  ``sample_rate``) lengths are in samples and a clip has no player, never a guessed rate;
* values print at their own precision (a float32 as the shortest text of that float32);
* the ``n`` samples of a split are spread evenly over it (first and last included), so the
  same file gives the same page;
* ``preview-files/`` is ours: it is emptied before it is written (a marker file says it was
  made by preview; a folder without it is refused, never deleted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from .. import shards
from . import preview_page as pg
from . import preview_plots as plots
from .samples import (
    SampleError,
    check_output,
    describe_value,
    file_rows,
    open_split,
    pick_splits,
    spread,
)

ASSETS = "preview-files"
MARKER = ".h5batch-preview"
MEDIA = ("audio", "image")


@dataclass
class PreviewSummary:
    """What :func:`build_preview` wrote: the page, samples shown per split, asset files."""

    index: str
    shown: dict[str, int] = field(default_factory=dict)
    files: int = 0
    seconds: float = 0.0


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def _prepare(out_dir: str) -> str:
    assets = os.path.join(out_dir, ASSETS)
    if os.path.isdir(assets):
        if not os.path.exists(os.path.join(assets, MARKER)):
            raise SampleError(f"{assets}: exists and was not made by h5batch preview; choose another --html folder")
        shutil.rmtree(assets)
    os.makedirs(assets)
    open(os.path.join(assets, MARKER), "w").write("made by h5batch preview; emptied by the next preview\n")
    return assets


def read_rejects(f: h5py.File, path: str) -> tuple[list[dict[str, str]], str]:
    """The rejects (path, stage, reason) and where they were read from."""
    rej = f.get(fmt.REJECTS)
    if rej is not None and "path" in rej:
        cols = [rej[k].asstr()[...].tolist() for k in ("path", "stage", "reason")]
        return [{"path": p, "stage": s, "reason": r} for p, s, r in zip(*cols)], f"/{fmt.REJECTS} in the file"
    side = fmt.rejects_file(path)
    if os.path.isfile(side):
        with open(side) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        return [{k: str(r.get(k, "")) for k in ("path", "stage", "reason")} for r in rows], os.path.basename(side)
    return [], "no /rejects group and no .rejects.jsonl"


# ------------------------------------------------------------------ statistics


def class_counts(g: h5py.Group, rows: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    """Live samples per class name, in label order (a ``(no label)`` entry for label -1)."""
    if fmt.LABEL not in g:
        return {}
    labels = np.asarray(g[fmt.LABEL][...], dtype=np.int64)[rows]
    counts = np.bincount(labels[labels >= 0], minlength=len(names))
    out = {(names[k] if k < len(names) else str(k)): int(c) for k, c in enumerate(counts)}
    if (labels < 0).any():
        out["(no label)"] = int((labels < 0).sum())
    return out


def _stored_shapes(g: h5py.Group, name: str, rows: np.ndarray) -> np.ndarray | None:
    """``(len(rows), ndim)`` sample shapes from the index, or None for an encoded field; a
    ``<name>_lengths`` column, where the file has one, gives the true first axis of padded samples."""
    node = g[name]
    if str(node.attrs.get("store", "")) == "encoded":
        return None
    if isinstance(node, h5py.Dataset):
        shapes = np.tile(np.asarray(node.shape[1:], dtype=np.int64), (len(rows), 1))
    elif node[fmt.SHAPES].ndim == 2 and node[fmt.SHAPES].shape[1] > 1:
        shapes = np.asarray(node[fmt.SHAPES][...], dtype=np.int64)[rows]
    else:
        offs = np.asarray(node[fmt.OFFSETS][...], dtype=np.int64)
        shapes = (offs[1:] - offs[:-1])[rows][:, None]
    lengths = g.get(f"{name}_lengths")
    if isinstance(lengths, h5py.Dataset) and shapes.shape[1]:
        shapes[:, 0] = np.asarray(lengths[...], dtype=np.int64)[rows]
    return shapes


def _rates(g: h5py.Group, name: str, rows: np.ndarray) -> np.ndarray:
    """Sample rate of each of ``rows`` of an audio field: the per-sample ``<name>_sample_rate``
    column where the file has one, else the field's ``sample_rate`` attribute; 0 is unknown (a
    mixed-rate corpus converted without ``sample_rate``): lengths are then shown in samples."""
    col = g.get(f"{name}_sample_rate")
    if isinstance(col, h5py.Dataset):
        return np.asarray(col[...], dtype=np.int64)[rows]
    return np.full(len(rows), int(g[name].attrs.get("sample_rate", 0) or 0), dtype=np.int64)


def _steps(node: Any, rates: np.ndarray) -> np.ndarray:
    """Seconds per step of an audio field's first axis (a sample, or a feature frame); 0 where
    the rate is unknown."""
    hop = int(json.loads(node.attrs["features"]).get("hop_length", 1)) if "features" in node.attrs else 1
    return np.divide(hop, rates, out=np.zeros(len(rates)), where=rates > 0)


# ------------------------------------------------------------------ one sample


def _clip_html(prefix: str, rel: str, value: np.ndarray, node: Any, waves: plots.Waveforms,
               sr: int) -> tuple[str, int]:
    """Waveform, spectrogram and player of one clip (features: their image; no player when the
    sample rate is unknown). Files written."""
    if "features" in node.attrs or str(node.attrs.get("axes", "time")).startswith("frame"):
        plots.image_of(prefix + "-spec.png", np.asarray(value, dtype=np.float64).T[::-1])
        return f'<img class="spec" src="{pg.url(rel + "-spec.png")}" alt="log-mel features">', 1
    waves.draw(prefix + "-wave.png", value, max(sr, 1))
    plots.spectrogram(prefix + "-spec.png", value, sr)
    media = (f'<img class="wave" src="{pg.url(rel + "-wave.png")}" alt="waveform">'
             f'<img class="spec" src="{pg.url(rel + "-spec.png")}" alt="spectrogram">')
    if sr <= 0:
        return media + '<div class="what">sample rate unknown: no player</div>', 2
    plots.write_wav(prefix + ".wav", value, sr)
    return media + f'<audio controls preload="metadata" src="{pg.url(rel + ".wav")}"></audio>', 3


def _num(x: Any, dtype: str) -> str:
    """A value at its own precision: a float32 prints as the shortest text that reads back as
    that float32 (``-14.312``), not as its float64 expansion (``-14.312000274658203``)."""
    if isinstance(x, float) and np.dtype(dtype).kind == "f":
        return str(np.dtype(dtype).type(x))
    return str(x)


def _cell(d: dict[str, Any]) -> str:
    """One field of one sample, for a card and the table."""
    if "text" in d:
        return pg.esc(d["text"])
    if "on" in d:
        return pg.esc(", ".join(d["on"]) or "(none)")
    if "value" in d:
        v, t = d["value"], d["dtype"]
        if isinstance(v, dict):
            return pg.esc(", ".join(f"{k}={_num(x, t)}" for k, x in v.items()))
        return pg.esc(", ".join(_num(x, t) for x in v) if isinstance(v, list) else _num(v, t))
    shape = "×".join(str(s) for s in d["shape"])
    if "rate" not in d:
        return pg.esc(f"{shape} {d['dtype']}")
    if not d["step"]:
        return pg.esc(f"{shape} {d['dtype']}, {d['length']} samples, sample rate unknown")
    return pg.esc(f"{shape} {d['dtype']}, {d['length'] * d['step']:.2f} s at {d['rate']} Hz")


# ------------------------------------------------------------------ one split


def _charts(split: str, g: h5py.Group, sizes: dict[str, tuple[np.ndarray, np.ndarray | None, str]],
            counts: dict[str, int], assets: str, rel: str) -> tuple[str, int]:
    """Class counts, then one length/size chart per media field (a line when all are equal).
    ``sizes``: per media field its sample shapes, seconds per step (audio) and a note."""
    imgs, lines = [], []
    for name, (shapes, step, note) in sizes.items():
        if not shapes.size:
            continue
        out = os.path.join(assets, f"{_slug(name)}-sizes.png")
        if step is not None:
            known = bool((step > 0).all())
            v = shapes[:, 0] * step if known else shapes[:, 0]
            unit = "seconds" if known else "frames" if "features" in g[name].attrs else "samples"
            form, why = ("{:.3f} s", "") if known else ("{} " + unit, " (sample rate unknown)")
            if v.min() == v.max():
                lines.append(f"{name}: every sample {form.format(v[0])}{why}")
                continue
            plots.histogram(out, v, unit, f"{split}/{name}: length{note}")
            total = v.sum()
            total_text = "" if not known else (f", {total / 3600:.2f} h in all" if total >= 3600
                                               else f", {total / 60:.1f} min in all")
            lines.append(f"{name}: {form.format(v.min())} to {form.format(v.max())}{total_text}{note}{why}")
        elif shapes.shape[1] >= 2:
            if (shapes[:, :2] == shapes[0, :2]).all():
                lines.append(f"{name}: every image {shapes[0, 1]}×{shapes[0, 0]} px (width × height)")
                continue
            plots.size_histogram(out, shapes[:, 1], shapes[:, 0], f"{split}/{name}: image size{note}")
            lines.append(f"{name}: width {shapes[:, 1].min()} to {shapes[:, 1].max()} px, "
                         f"height {shapes[:, 0].min()} to {shapes[:, 0].max()} px{note}")
        else:
            continue
        imgs.append(f"{rel}/{_slug(name)}-sizes.png")
    tags = "".join(f'<img src="{pg.url(u)}" alt="{pg.esc(os.path.basename(u))}">' for u in imgs)
    facts = "".join(f"<li>{pg.esc(x)}</li>" for x in lines)
    return (f'<div class="charts">{pg.counts_table(split, counts) if counts else ""}{tags}</div>'
            + (f'<ul class="facts">{facts}</ul>' if facts else "")), len(imgs)


def split_section(path: str, f: h5py.File, split: str, n: int, out_dir: str) -> tuple[str, int, int]:
    """The HTML of one split; returns (html, samples shown, files written)."""
    ds = open_split(path, split)
    g = f[split]
    rows = file_rows(f, path, split)
    rel = f"{ASSETS}/{_slug(split)}"
    assets = os.path.join(out_dir, rel)
    os.makedirs(assets, exist_ok=True)
    names = ds.field_names
    modality = {k: str(g[k].attrs.get("modality", "")) for k in names}
    media = [k for k in names if modality[k] in MEDIA]
    shapes = {k: _stored_shapes(g, k, rows) for k in media}
    rates = {k: _rates(g, k, rows) for k in media if modality[k] == "audio"}
    steps = {k: _steps(g[k], r) for k, r in rates.items()}
    picked = spread(len(ds), n)
    cards, table_rows, shown, files = [], [], {k: [] for k in media}, 0
    waves = plots.Waveforms() if rates else None
    for i in picked:
        s = ds[i]
        label = int(s["label"]) if "label" in s else None
        label_name = (ds.class_names[label] if label is not None and 0 <= label < len(ds.class_names)
                      else "(no label)" if label is not None else "")
        src = s.get("source", "")
        srcs = list(src) if isinstance(src, tuple) else [src] if src else []
        cells = {k: describe_value(s[k], g[k]) for k in names}
        parts = []
        for k in names:
            if k not in media:
                parts.append(f'<div class="what">{pg.esc(k)}: {_cell(cells[k])}</div>')
                continue
            value = s[k].numpy()
            shown[k].append(value)
            prefix_rel = f"{rel}/{i:06d}-{_slug(k)}"
            prefix = os.path.join(out_dir, prefix_rel)
            if modality[k] == "image":
                plots.thumbnail(prefix + ".png", value)
                media_html, wrote = (f'<img class="thumb" src="{pg.url(prefix_rel + ".png")}" '
                                     f'alt="{pg.esc(k)} of sample {i}">'), 1
            else:  # the true length (a padded sample's `_lengths`), its own rate
                length = int(shapes[k][i, 0]) if shapes[k] is not None else len(value)
                value = value[:length]
                cells[k].update(length=length, rate=int(rates[k][i]), step=float(steps[k][i]))
                media_html, wrote = _clip_html(prefix, prefix_rel, value, g[k], waves, int(rates[k][i]))
            files += wrote
            parts.append(f'<div class="what">{pg.esc(k)}: {_cell(cells[k])}</div>{media_html}')
        if media:
            cards.append(f'<figure class="card" data-sample="{i}"><div><b>#{i}</b> {pg.esc(label_name)}</div>'
                         f'{"".join(parts)}<figcaption class="src">{pg.esc(" | ".join(srcs))}</figcaption></figure>')
        table_rows.append([str(i), str(int(rows[i])), pg.esc(label_name), "<br>".join(pg.esc(p) for p in srcs),
                           *(_cell(cells[k]) for k in names)])
    sizes = {}
    for k in media:  # an encoded field has no sizes in its index: those of the shown samples
        step = steps.get(k)
        if shapes[k] is None:
            shape = np.asarray([a.shape for a in shown[k]], dtype=np.int64).reshape(len(picked), -1)
            sizes[k] = (shape, None if step is None else step[picked], f" ({len(picked)} samples shown)")
        else:
            sizes[k] = (shapes[k], step, "")
    charts, nchart = _charts(split, g, sizes, class_counts(g, rows, ds.class_names), assets, rel)
    head = (f'<h2 id="split-{pg.esc(_slug(split))}">{pg.esc(split)}</h2>'
            f'<p class="meta">{len(ds)} samples'
            + (f" ({len(f[split][fmt.TOMBSTONES])} rows removed by sync are not counted)"
               if fmt.TOMBSTONES in g and len(g[fmt.TOMBSTONES]) else "")
            + f"; {len(picked)} shown, spread evenly over the split.</p>")
    wide = " audio" if rates else ""
    grids = f'<h3>Samples</h3><div class="grid{wide}">{"".join(cards)}</div>' if cards else ""
    fields_table = pg.table(["#", "file row", "label", "source", *names], table_rows, "samples",
                            f'data-split="{pg.esc(split)}"')
    return (head + charts + grids + "<h3>Samples shown: fields and metadata</h3>" + fields_table,
            len(picked), files + nchart)


# ------------------------------------------------------------------ the page


def build_preview(path: str, out_dir: str, splits: list[str] | None = None, n: int = 48) -> PreviewSummary:
    """Write ``out_dir/index.html`` and its files for the h5batch output ``path``.

    Parameters
    ----------
    path : str
        A complete h5batch output.
    out_dir : str
        Folder of the page (created; ``out_dir/preview-files`` is replaced).
    splits : list of str, optional
        Splits to show (default all, in file order). An unknown one raises :class:`SampleError`.
    n : int
        Samples shown per split, spread evenly over it.
    """
    t0 = time.perf_counter()
    if int(n) < 1:
        raise SampleError(f"--n must be at least 1, got {n}")
    chosen = pick_splits(path, check_output(path, sharded=True), splits)
    os.makedirs(out_dir, exist_ok=True)
    _prepare(out_dir)
    summary = PreviewSummary(os.path.join(out_dir, "index.html"))
    sections = []
    with h5py.File(path, "r") as f:
        shards.check(path, f)  # a sharded output's shards: there, unchanged (read below)
        a = f.attrs
        job = json.loads(a.get(fmt.ATTR_JOB, "{}"))
        versions = json.loads(a.get(fmt.ATTR_VERSIONS, "{}"))
        rejects, where = read_rejects(f, path)
        for split in chosen:
            body, shown, files = split_section(path, f, split, n, out_dir)
            sections.append(body)
            summary.shown[split] = shown
            summary.files += files
        nav = "".join(f'<a href="#split-{pg.esc(_slug(s))}">{pg.esc(s)}</a>' for s in chosen)
        excluded = sum(r["stage"] == fmt.STAGE_EXCLUDED for r in rejects)
        header = (f"<h1>{pg.esc(os.path.basename(path))}</h1><p class=\"meta\">job "
                  f"<b>{pg.esc(job.get('name', '?'))}</b>, format v{int(a.get(fmt.ATTR_FORMAT, 0))}, "
                  f"created {pg.esc(a.get(fmt.ATTR_CREATED, ''))}, {int(a.get(fmt.ATTR_INPUTS, 0))} inputs, "
                  f"{fmt.rejects_words(len(rejects) - excluded, excluded)} · {pg.esc(os.path.abspath(path))}</p>"
                  f'<nav>{nav}<a href="#rejects-h">rejects</a><a href="#job-h">job</a>'
                  f'<a href="#versions-h">versions</a></nav>')
    sections += ['<h2 id="rejects-h">Rejects</h2>' + pg.rejects_table(rejects, where),
                 '<h2 id="job-h">Job</h2>' + pg.job_block(job),
                 '<h2 id="versions-h">Versions</h2>' + pg.versions_table(versions)]
    with open(summary.index, "w", encoding="utf-8") as fh:
        fh.write(pg.page(f"h5batch preview: {os.path.basename(path)}", header, sections))
    summary.seconds = time.perf_counter() - t0
    return summary
