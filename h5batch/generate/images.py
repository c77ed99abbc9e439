"""The image corpus: an ImageFolder tree of textured JPEG photos-alike.

``h5batch bench`` converts and reads it (resized to a fixed size). The images have
realistic sizes and entropy (gradients, gratings, shapes and pixel noise), so JPEG decoding
costs what it costs on photographs, and each class has its own hue and favourite shape, so
the classes are learnable.
"""

from __future__ import annotations

import colorsys
import io
import math
import os
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
from PIL import Image, ImageDraw

from ..argcheck import integer
from .common import (
    TAG_IMAGES,
    SynthSummary,
    check_name,
    sample_rng,
    split_counts,
    stem_width,
    write_corpus,
)

__all__ = ["make_image_corpus"]

_SHAPE_KINDS = ("ellipse", "rectangle", "polygon")


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    """HSV in [0, 1] -> RGB, shape (3,), float32 in [0, 255]."""
    return (
        np.array(
            colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0)), np.float32
        )
        * 255
    )


def _textured_image(
    rng: np.random.Generator, class_index: int, n_classes: int, min_side: int, max_side: int
) -> Image.Image:
    """RGB image with a gradient, gratings, shapes and pixel noise.

    Size: width uniform in [min_side, max_side], height = width * aspect with
    aspect log-uniform in [1/2, 2] (clipped to the same bounds).  The class
    sets the dominant hue and the most frequent shape kind, so classes are
    learnable; the noise (sigma 3-8 grey levels) keeps JPEGs at realistic
    sizes instead of a few kB.
    """
    w = int(rng.integers(min_side, max_side + 1))
    aspect = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
    h = int(min(max(round(w * aspect), min_side), max_side))
    hue = class_index / n_classes + rng.normal(0.0, 0.04)
    y = (np.arange(h, dtype=np.float32) / max(h - 1, 1))[:, None]  # shape (h, 1)
    x = (np.arange(w, dtype=np.float32) / max(w - 1, 1))[None, :]  # shape (1, w)

    # Linear gradient between a dark and a light colour of the class hue.
    c0 = _hsv(hue, rng.uniform(0.3, 0.8), rng.uniform(0.2, 0.5))
    c1 = _hsv(hue + rng.uniform(-0.08, 0.08), rng.uniform(0.3, 0.8), rng.uniform(0.6, 1.0))
    theta = rng.uniform(0.0, 2 * np.pi)
    g = x * np.float32(math.cos(theta)) + y * np.float32(math.sin(theta))
    g = (g - g.min()) / max(float(g.max() - g.min()), 1e-6)
    img = c0 + (c1 - c0) * g[..., None]  # shape (h, w, 3)

    # A few low-frequency gratings: smooth "texture" on top of the gradient.
    for _ in range(3):
        freq = rng.uniform(1.0, 8.0)  # cycles across the image
        phi = rng.uniform(0.0, 2 * np.pi)
        alpha = rng.uniform(0.0, 2 * np.pi)
        wave = np.sin(
            (x * np.float32(math.cos(alpha)) + y * np.float32(math.sin(alpha)))
            * np.float32(2 * np.pi * freq)
            + np.float32(phi)
        )
        img += wave[..., None] * (rng.uniform(-15.0, 15.0, 3).astype(np.float32))
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")

    draw = ImageDraw.Draw(pil)
    own_kind = _SHAPE_KINDS[class_index % len(_SHAPE_KINDS)]
    for _ in range(int(rng.integers(3, 9))):
        kind = (
            own_kind if rng.random() < 0.7 else _SHAPE_KINDS[int(rng.integers(len(_SHAPE_KINDS)))]
        )
        colour = _hsv(hue + rng.normal(0.0, 0.15), rng.uniform(0.2, 1.0), rng.uniform(0.2, 1.0))
        fill = tuple(int(c) for c in colour)
        sx, sy = rng.uniform(0.05, 0.4) * w, rng.uniform(0.05, 0.4) * h
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        outline = (0, 0, 0) if rng.random() < 0.5 else None
        if kind == "ellipse":
            draw.ellipse([cx - sx, cy - sy, cx + sx, cy + sy], fill=fill, outline=outline, width=2)
        elif kind == "rectangle":
            draw.rectangle(
                [cx - sx, cy - sy, cx + sx, cy + sy], fill=fill, outline=outline, width=2
            )
        else:
            angles = np.sort(rng.uniform(0.0, 2 * np.pi, int(rng.integers(3, 7))))
            pts = [(float(cx + sx * math.cos(a)), float(cy + sy * math.sin(a))) for a in angles]
            draw.polygon(pts, fill=fill, outline=outline)

    arr = np.asarray(pil, dtype=np.float32)
    sigma = np.float32(rng.uniform(3.0, 8.0))
    arr = arr + rng.standard_normal(arr.shape, dtype=np.float32) * sigma
    return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8), "RGB")


_CLASSES = ("ants_like", "bees_like")
_MIN_SIDE, _MAX_SIDE = 160, 640


def make_image_corpus(
    root: str | os.PathLike[str],
    n_per_class: int = 50,
    splits: Mapping[str, float] = MappingProxyType({"train": 0.8, "val": 0.2}),
    seed: int = 0,
) -> SynthSummary:
    """ImageFolder corpus ``root/<split>/<class>/<class>_<NNNN>.jpg``: RGB JPEGs, quality 90,
    classes ``ants_like`` and ``bees_like``, width and height each in 160..640 px.

    Parameters
    ----------
    root : path
        Corpus root (created).
    n_per_class : int
        Images per class, over all splits.
    splits : mapping str -> float
        Split name -> weight (normalised).  Each class's indices are cut into
        consecutive blocks in the mapping's order, sized by largest remainder.
    seed : int
        Non-negative seed.

    Returns
    -------
    SynthSummary
        ``counts[split][class]`` = images.
    """
    n_per_class = integer("n_per_class", n_per_class)
    seed = integer("seed", seed)
    split_items = [(check_name("split", k), float(v)) for k, v in splits.items()]
    if (
        not split_items
        or any(not math.isfinite(v) or v < 0 for _, v in split_items)
        or sum(v for _, v in split_items) <= 0
    ):
        raise ValueError(
            f"splits must map names to non-negative weights with a positive sum, got {dict(splits)!r}"
        )
    args = {
        "n_per_class": n_per_class,
        "classes": _CLASSES,
        # A list of pairs, not a dict: the order decides which indices go where.
        "splits": [[k, v] for k, v in split_items],
        "min_side": _MIN_SIDE,
        "max_side": _MAX_SIDE,
        "fmt": "JPEG",  # fixed now; still in the marker, so corpora made before are reused
        "quality": 90,
        "seed": seed,
    }
    per_split = split_counts(n_per_class, [v for _, v in split_items])
    # split_of[i] = split name of class-local index i
    split_of = [name for (name, _), c in zip(split_items, per_split, strict=True) for _ in range(c)]
    width = stem_width(n_per_class)

    def make(key: tuple[int, int]) -> list[tuple[str, bytes]]:
        ci, i = key
        rng = sample_rng(seed, TAG_IMAGES, ci, i)
        img = _textured_image(rng, ci, len(_CLASSES), _MIN_SIDE, _MAX_SIDE)
        buf = io.BytesIO()
        # Explicit settings: output must not depend on Pillow defaults changing.
        img.save(buf, format="JPEG", quality=90, subsampling=2, optimize=False, progressive=False)
        cls = _CLASSES[ci]
        return [(f"{split_of[i]}/{cls}/{cls}_{i:0{width}d}.jpg", buf.getvalue())]

    dirs = [(name, cls) for cls in _CLASSES for name, _ in split_items]
    keys = [(ci, i) for ci in range(len(_CLASSES)) for i in range(n_per_class)]
    return write_corpus(root, "images", args, dirs, keys, make)
