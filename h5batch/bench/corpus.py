"""The corpora the benchmark converts and reads, their jobs, and the decoded reference.

Generated corpora (``h5batch.generate``) live under a cache directory and are made once: the
generators skip a root whose marker matches their arguments. Real corpora
(``../shared/corpora``) are used as they are when present.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import generate
from ..config import JobConfig, job_from_dict
from ..fields import decode_field
from ..layouts import discover
from ..manifest import Manifest

AUDIO_SECONDS = 2.0
AUDIO_RATE = 16000  # Hz, the default; ``h5batch bench --rate`` picks another
IMAGE_SIZE = (224, 224)


AUDIO_LENGTH = int(AUDIO_SECONDS * AUDIO_RATE)  # 32000: every default pair is (32000,) int16 x 2


@dataclass(frozen=True)
class Corpus:
    """A corpus plus the job settings (``source`` and ``fields``) that read it.

    ``fixed`` says whether every field has one shape (the memmap limit and torch's default
    collate need that); ``real`` marks corpora that were not generated.
    """

    name: str
    root: str
    kind: str  # audio | image
    source: dict[str, Any]
    fields: dict[str, dict[str, Any]]
    fixed: bool = True
    real: bool = False
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def job_dict(self, out_path: str, codec: str = "auto") -> dict[str, Any]:
        """The job of ``h5batch convert``: the corpus, its fields and the output; every
        other setting (the cluster above all) left at its default, as a user's job file."""
        return {"name": f"bench-{self.name}", "source": {"root": self.root, **self.source},
                "fields": self.fields, "output": {"path": out_path, "codec": codec}}

    def job(self, out_path: str, codec: str = "auto") -> JobConfig:
        return job_from_dict(self.job_dict(out_path, codec), file=f"<bench {self.name}>")

    def manifest(self) -> Manifest:
        return discover(self.job(os.path.join(self.root, "unused.h5")))


def _audio_field(rate: int, **keys: Any) -> dict[str, Any]:
    return {"type": "audio", "extensions": [".wav"], "sample_rate": rate, "dtype": "int16", **keys}


def paired_audio(cache: str | os.PathLike[str], pairs: int, rate: int = AUDIO_RATE) -> Corpus:
    """``pairs`` noisy/clean pairs of 2 s at ``rate`` Hz (generate.make_paired_audio), fixed
    length ``2 * rate`` int16 samples. Named ``paired_audio_<pairs>`` at the default 16 kHz,
    ``paired_audio_<pairs>_<rate/1000>k`` otherwise."""
    length = int(round(AUDIO_SECONDS * rate))  # samples in one clip (fields.<name>.length)
    name = f"paired_audio_{pairs}" if rate == AUDIO_RATE else f"paired_audio_{pairs}_{rate / 1000:g}k"
    root = Path(cache) / name
    generate.make_paired_audio(root, n_train=pairs, n_test=0, seconds=AUDIO_SECONDS, sample_rate=rate)
    return Corpus(
        name=name, root=str(root), kind="audio",
        source={"layout": "paired_folders", "splits": ["train"]},
        fields={"data": _audio_field(rate, folder="data", length=length),
                "target": _audio_field(rate, folder="label", length=length)},
        notes=f"{pairs} pairs of 2 s {rate / 1000:g} kHz 16-bit wav (noisy + clean), "
              f"2 x {2 * length / 1000:g} kB decoded per sample",
        extra={"pairs": pairs, "rate": rate, "length": length})


def images(cache: str | os.PathLike[str], count: int) -> Corpus:
    """``count`` textured JPEGs of 160-640 px (generate.make_image_corpus), resized to 224x224."""
    per_class = max(1, count // 2)
    name = f"images_{2 * per_class}"
    root = Path(cache) / name
    generate.make_image_corpus(root, n_per_class=per_class, splits={"train": 1.0})
    return Corpus(
        name=name, root=str(root), kind="image",
        source={"layout": "class_folders", "splits": ["train"]},
        fields={"image": {"type": "image", "extensions": [".jpg"], "mode": "RGB", "size": list(IMAGE_SIZE)}},
        notes=f"{2 * per_class} JPEGs 160-640 px, resized + centre-cropped to 224x224 RGB (150 kB decoded)")


def real_corpora(shared: str | os.PathLike[str]) -> list[Corpus]:
    """The corpora of ``shared`` (``../shared/corpora``) that are present."""
    shared = Path(shared)
    out: list[Corpus] = []
    if (shared / "fsdd").is_dir():
        out.append(Corpus(
            name="fsdd", root=str(shared / "fsdd"), kind="audio", real=True, fixed=False,
            source={"layout": "pattern", "pattern": r"(?P<label>\d)_(?P<speaker>[a-z]+)_(?P<index>\d+)\.wav",
                    "split": {"group": "index", "ranges": {"train": [0, 1000]}, "default": "train"},
                    "splits": ["train"]},
            fields={"audio": _audio_field(8000)},
            notes="Free Spoken Digit Dataset: 3000 wav, 8 kHz, variable length (~0.5 s)"))
    if (shared / "images").is_dir():
        out.append(Corpus(
            name="hymenoptera", root=str(shared / "images"), kind="image", real=True,
            source={"layout": "class_folders", "splits": ["train", "val"]},
            fields={"image": {"type": "image", "extensions": [".jpg", ".jpeg", ".png"], "mode": "RGB",
                              "size": list(IMAGE_SIZE)}},
            notes="ants vs bees photos (both splits), resized + centre-cropped to 224x224"))
    return out


def item_paths(manifest: Manifest) -> list[tuple[str, ...]]:
    """Absolute paths of each sample's files, in manifest order."""
    return [tuple(os.path.join(manifest.root, p) for p in it.paths) for it in manifest.items]


def decode_items(corpus: Corpus, manifest: Manifest) -> dict[str, list[np.ndarray]]:
    """Every sample of ``corpus`` decoded in this process, ``{field: [array per sample]}`` in
    manifest order (the order of the h5batch output, splits concatenated): the reference
    every output is checked against."""
    job = corpus.job(os.path.join(corpus.root, "unused.h5"))
    out: dict[str, list[np.ndarray]] = {n: [] for n in job.fields}
    for it in manifest.items:
        for (name, fc), rel in zip(job.fields.items(), it.paths):
            out[name].append(decode_field(os.path.join(manifest.root, rel), fc))
    return out


def to_float(a: np.ndarray) -> np.ndarray:
    """A stored sample as float32, scaled like ``H5Dataset(as_float=True)``: int16 ``x / 32768``,
    uint8 ``x / 255``, anything else as it is."""
    out = a.astype(np.float32)
    out /= np.float32({np.dtype(np.int16): 32768.0, np.dtype(np.uint8): 255.0}.get(a.dtype, 1.0))
    return out
