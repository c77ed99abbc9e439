"""Encoded vs decoded photos: bytes on disk, conversion speed and DataLoader read speed of
``store: encoded`` against ``store: decoded``, and against WebDataset and LitData holding
the same JPEG bytes.

``python benchmarks/encoded.py --out DIR`` converts ``../shared/corpora/images`` (an
ImageFolder of JPEG photos) when present, else a generated corpus
(:func:`h5batch.generate.make_image_corpus`), with every image decoded at ``--size`` (shorter
side resized, centre crop):

* h5batch ``store: decoded`` (pixels, ``codec: auto``), ``store: encoded`` (the source JPEG
  bytes), ``store: encoded`` + ``transcode: {format: jpeg, quality: 90, max_size: 256}``;
* WebDataset shards and a LitData ``optimize`` output holding the source JPEG bytes.

Every reader decodes a JPEG with the same function (the image kind's decoder through
:func:`h5batch.fields.encoded.decode_bytes`, i.e. Pillow with EXIF, draft and resize), in
its DataLoader workers, so the arrays are identical and only storage and pipeline differ
(``tests/test_encoded.py`` holds h5batch's encoded and decoded outputs equal).

Conversions are timed end to end: ``h5batch convert`` in a child process (Python and Dask
start-up included), the peers in this process (LitData starts its own workers). Reads: one warm-up epoch,
then ``--epochs`` timed epochs, ``--reps`` times interleaved (best kept), batch ``--batch`` (16: with batches of 64 the 165 photos
of the shared corpus are 3 batches an epoch, too few to keep 2 workers busy), shuffled, at 0
and 2 DataLoader workers. BEWARE:
on a small corpus the fixed costs (cluster start, worker start) weigh heavily.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from h5batch.bench.writers import available, dir_bytes
from h5batch.fields import KINDS
from h5batch.fields.encoded import decode_bytes
from h5batch.fields.image import ImageField

SHARED_IMAGES = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "images"
TRANSCODE = {"format": "jpeg", "quality": 90, "max_size": 256}


def _corpus(out: Path, count: int) -> Path:
    if SHARED_IMAGES.is_dir():
        return SHARED_IMAGES
    from h5batch.generate import make_image_corpus

    root = out / "corpus"
    make_image_corpus(root, n_per_class=max(1, count // 2))
    return root


def _files(root: Path) -> list[tuple[str, int]]:
    """``(path, class index)`` of every training JPEG/PNG, sorted."""
    classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir())
    return [(str(p), k) for k, c in enumerate(classes) for p in sorted((root / "train" / c).iterdir())
            if p.suffix.lower() in (".jpg", ".jpeg", ".png")]


class Decode:
    """JPEG bytes -> the array ``store: decoded`` would hold (picklable)."""

    def __init__(self, size: int):
        self.fc = ImageField(size=[size, size])

    def __call__(self, data: Any) -> np.ndarray:
        return decode_bytes(KINDS["image"], self.fc, np.frombuffer(data, dtype=np.uint8))


# ---------------------------------------------------------------------------------- h5batch


def _h5_convert(root: Path, out: Path, name: str, size: int, workers: int, extra: dict[str, Any]) -> dict[str, Any]:
    """``h5batch convert`` in a child process, as a user runs it (its start-up included)."""
    import subprocess

    import h5py
    import yaml

    path = out / f"{name}.h5"
    job = {"name": name, "source": {"root": str(root), "splits": ["train"]},
           "fields": {"image": {"type": "image", "extensions": [".jpg", ".jpeg", ".png"], "size": [size, size],
                                **extra}},
           "output": {"path": str(path), "codec": "auto"}}
    (out / f"{name}.yaml").write_text(yaml.safe_dump(job, sort_keys=False))
    cmd = [sys.executable, "-m", "h5batch.cli", "convert", str(out / f"{name}.yaml"), "--workers", str(workers),
           "--overwrite", "--progress", "none"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    with h5py.File(path, "r") as f:
        samples = int(f["train"].attrs["num_samples"])
    return {"samples": samples, "seconds": seconds, "bytes": os.path.getsize(path), "path": str(path)}


def _h5_loader(path: str, workers: int, batch: int) -> Any:
    from torch.utils.data import DataLoader

    from h5batch.torch import ChunkShuffleSampler, H5Dataset, collate

    ds = H5Dataset(path, "train", as_float=False)
    return DataLoader(ds, batch_size=batch, sampler=ChunkShuffleSampler(ds, seed=0), num_workers=workers,
                      collate_fn=collate, persistent_workers=workers > 0)


# ---------------------------------------------------------------------------------- peers


def _wds_convert(files: Sequence[tuple[str, int]], out: Path) -> dict[str, Any]:
    import webdataset as wds

    d = out / "wds"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0 = time.perf_counter()
    # 8+ shards: split_by_worker hands out whole shards, so one shard would feed one worker only.
    with wds.ShardWriter(str(d / "shard-%06d.tar"), maxcount=max(1, min(256, len(files) // 8)), verbose=0) as sink:
        for i, (p, label) in enumerate(files):
            sink.write({"__key__": f"{i:08d}", "jpg": Path(p).read_bytes(), "cls": label})
    return {"samples": len(files), "seconds": time.perf_counter() - t0, "bytes": dir_bytes(str(d)), "path": str(d)}


class _WdsSample:
    def __init__(self, decode: Decode):
        self.decode = decode

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {"image": torch.from_numpy(np.require(self.decode(s["jpg"]), requirements="W")), "label": int(s["cls"])}


def _wds_loader(path: str, size: int, workers: int, batch: int) -> Any:
    import torch
    import webdataset as wds

    shards = sorted(str(p) for p in Path(path).glob("*.tar"))
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), workersplitter=wds.split_by_worker,
                         empty_check=False, seed=0)
          .shuffle(1000).map(_WdsSample(Decode(size))).batched(batch, partial=True))
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


class _LitFn:
    def __call__(self, item: tuple[int, str, int]) -> dict[str, Any]:
        i, p, label = item
        return {"index": i, "image": Path(p).read_bytes(), "label": label}


def _lit_convert(files: Sequence[tuple[str, int]], out: Path, workers: int) -> dict[str, Any]:
    import litdata

    d = out / "litdata"
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    litdata.optimize(fn=_LitFn(), inputs=[(i, p, k) for i, (p, k) in enumerate(files)], output_dir=str(d),
                     num_workers=workers, chunk_bytes="64MB", verbose=False, reorder_files=False, mode="overwrite")
    return {"samples": len(files), "seconds": time.perf_counter() - t0, "bytes": dir_bytes(str(d)), "path": str(d)}


class _LitSample:
    def __init__(self, decode: Decode):
        self.decode = decode

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        import torch

        return {"image": torch.from_numpy(np.require(self.decode(s["image"]), requirements="W")), "label": int(s["label"])}


def _lit_loader(path: str, size: int, workers: int, batch: int, cache: Path) -> Any:
    import litdata

    ds = litdata.StreamingDataset(path, shuffle=True, seed=0, transform=_LitSample(Decode(size)),
                                  cache_dir=str(cache))
    return litdata.StreamingDataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)


# ---------------------------------------------------------------------------------- reads


def _read(make: Callable[[], Any], epochs: int) -> tuple[float, tuple[int, ...]]:
    """Samples per second over ``epochs`` timed epochs after a warm-up one; a batch's shape."""
    loader = make()
    shape: tuple[int, ...] = ()
    for b in loader:  # warm-up: workers started, files in the page cache
        shape = tuple(b["image"].shape)
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for b in loader:
            n += len(b["image"])
    rate = n / (time.perf_counter() - t0)
    del loader
    return rate, shape


def run(out: Path, size: int = 224, count: int = 256, workers: Sequence[int] = (0, 2), epochs: int = 2,
        batch: int = 16, reps: int = 3, convert_workers: int = 2, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure everything; returns ``{"corpus", "rows": [...]}`` (also written to ``out/encoded.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    root = _corpus(out, count)
    files = _files(root)
    source_bytes = sum(os.path.getsize(p) for p, _ in files)
    say(f"corpus {root}: {len(files)} training images, {source_bytes / 1e6:.1f} MB of JPEG/PNG; decoded at {size}x{size}")
    convs: dict[str, dict[str, Any]] = {}
    for name, extra in (("decoded", {}), ("encoded", {"store": "encoded"}),
                        ("encoded+jpeg90@256", {"store": "encoded", "transcode": TRANSCODE})):
        convs[name] = _h5_convert(root, out, name.replace("+", "_").replace("@", "_"), size, convert_workers, extra)
        say(f"h5batch {name}: {convs[name]['seconds']:.1f} s, {convs[name]['bytes'] / 1e6:.1f} MB")
    have = {p: available(p)[0] for p in ("webdataset", "litdata")}
    if have["webdataset"]:
        convs["webdataset (jpeg bytes)"] = _wds_convert(files, out)
    if have["litdata"]:
        convs["litdata (jpeg bytes)"] = _lit_convert(files, out, convert_workers)
    missing = [p for p, ok in have.items() if not ok]
    if missing:
        say(f"peers not installed (see requirements-peers.txt): {', '.join(missing)}")
    makers: dict[str, Callable[[int], Any]] = {
        name: (lambda w, p=c["path"]: _h5_loader(p, w, batch)) for name, c in convs.items() if name.startswith(("decoded", "encoded"))}
    if "webdataset (jpeg bytes)" in convs:
        makers["webdataset (jpeg bytes)"] = lambda w: _wds_loader(convs["webdataset (jpeg bytes)"]["path"], size, w, batch)
    if "litdata (jpeg bytes)" in convs:
        makers["litdata (jpeg bytes)"] = lambda w: _lit_loader(convs["litdata (jpeg bytes)"]["path"], size, w, batch,
                                                                  out / f"litcache-{w}")
    rows = {name: {"storage": name, "samples": conv["samples"], "bytes": conv["bytes"],
                   "convert_s": round(conv["seconds"], 2),
                   "convert_per_s": round(conv["samples"] / conv["seconds"], 1)} for name, conv in convs.items()}
    # Repetitions interleave the configurations (drift of a shared machine hits all alike);
    # each reports its best repetition (the least disturbed one).
    for _ in range(reps):
        for name in convs:
            for w in workers:
                rate, shape = _read(lambda n=name, w=w: makers[n](w), epochs)
                key = f"read_per_s_w{w}"
                rows[name][key] = max(rows[name].get(key, 0.0), round(rate, 1))
                rows[name]["batch_shape"] = list(shape)
    for row in rows.values():
        say(json.dumps(row))
    rows = list(rows.values())
    result = {"corpus": str(root), "images": len(files), "source_bytes": source_bytes, "size": size, "batch": batch,
              "python": sys.version.split()[0], "cpus": os.cpu_count(), "rows": rows}
    (out / "encoded.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict[str, Any]) -> str:
    """The Markdown table of a :func:`run` result (docs/benchmarks.md)."""
    ws = sorted(int(k.rsplit("w", 1)[1]) for k in result["rows"][0] if k.startswith("read_per_s_w"))
    head = ("| storage | MB on disk | convert s (images/s) | "
            + " | ".join(f"read images/s, {w} workers" for w in ws) + " |")
    lines = [head, "|" + "---|" * (3 + len(ws))]
    for r in result["rows"]:
        reads = " | ".join(f"{r[f'read_per_s_w{w}']:.0f}" for w in ws)
        lines.append(f"| {r['storage']} | {r['bytes'] / 1e6:.1f} | {r['convert_s']:.1f} ({r['convert_per_s']:.0f}) | {reads} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/encoded.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="working folder (outputs, encoded.json)")
    ap.add_argument("--size", type=int, default=224, help="decoded size, pixels (default 224)")
    ap.add_argument("--count", type=int, default=256, help="generated images when there is no shared corpus")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per read (default 2)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="DataLoader workers (default 0 2)")
    ap.add_argument("--reps", type=int, default=3, help="read repetitions, best kept (default 3)")
    ap.add_argument("--batch", type=int, default=16, help="batch size (default 16: a small corpus still "
                    "gives every worker many batches)")
    args = ap.parse_args(argv)
    result = run(args.out, args.size, args.count, args.workers, args.epochs, args.batch, args.reps)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
