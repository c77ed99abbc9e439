"""The demo corpus: every sample is a tone (WAV) and a picture (PNG) of one shape class.

It is what ``jobs/demo.yaml`` (``source.generate: demo``, the default job of ``make
convert``) converts: two modalities, a variable-length field and a fixed-shape one, three
classes and two splits, small enough to make when a conversion starts.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageDraw

from ..argcheck import integer
from .common import (
    TAG_DEMO,
    SynthSummary,
    fades,
    png_bytes,
    sample_rng,
    stem_width,
    to_int16,
    wav_bytes,
    write_corpus,
)

__all__ = ["DEMO_CLASSES", "DEMO_SAMPLE_RATE", "DEMO_SPLITS", "make_demo_corpus"]

DEMO_CLASSES: tuple[str, ...] = ("circle", "square", "triangle")
DEMO_SPLITS: tuple[str, ...] = ("train", "test")
DEMO_SAMPLE_RATE = 16000


def _demo_waveform(
    cls: str, rng: np.random.Generator, sample_rate: int = DEMO_SAMPLE_RATE
) -> np.ndarray:
    """Class-specific tone, shape (n,), int16, n/sample_rate in [0.5, 1.5] s.

    circle = steady sine, square = band-limited square wave,
    triangle = rising linear chirp (f0 -> 2 f0); gaussian noise at ~-34 dB
    and a peak between 50 % and 90 % of int16 full scale.
    """
    n = int(round(rng.uniform(0.5, 1.5) * sample_rate))
    t = np.arange(n) / sample_rate
    f0 = rng.uniform(220.0, 660.0)  # Hz
    phase = rng.uniform(0.0, 2 * np.pi)
    if cls == "circle":
        x = np.sin(2 * np.pi * f0 * t + phase)
    elif cls == "square":
        # Sum of odd harmonics below 0.45*fs: square-ish without aliasing.
        ks = np.arange(1, int(0.45 * sample_rate / f0) + 1, 2)
        x = (np.sin(np.outer(ks, 2 * np.pi * f0 * t + phase)) / ks[:, None]).sum(axis=0)
    elif cls == "triangle":
        duration = n / sample_rate
        inst_phase = 2 * np.pi * (f0 * t + 0.5 * f0 * t**2 / duration)  # f(t) = f0 (1 + t/T)
        x = np.sin(inst_phase + phase)
    else:  # pragma: no cover - guarded by DEMO_CLASSES
        raise ValueError(cls)
    x = x / np.max(np.abs(x)) * fades(n, sample_rate, 0.01)
    x = x + rng.normal(0.0, 0.02, n)
    return to_int16(x, rng.uniform(0.5, 0.9))


def _demo_image(cls: str, rng: np.random.Generator) -> Image.Image:
    """RGB image, 40..96 px per side, one filled shape on a flat background.

    The shape colour is forced away from the background, so every image has
    exactly two colours (no anti-aliasing) and the shape is always visible.
    """
    w, h = (int(v) for v in rng.integers(40, 97, size=2))
    bg = rng.integers(0, 256, size=3)
    fg = rng.integers(0, 256, size=3)
    if int(np.abs(fg - bg).sum()) < 150:
        fg = (bg + 128) % 256  # every channel differs by exactly 128
    img = Image.new("RGB", (w, h), tuple(int(c) for c in bg))
    draw = ImageDraw.Draw(img)
    r = rng.uniform(0.25, 0.45) * min(w, h)  # circumradius, px
    cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
    fill = tuple(int(c) for c in fg)
    if cls == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:  # a square or a triangle, turned by up to its symmetry angle
        sides = {"square": 4, "triangle": 3}[cls]
        draw.regular_polygon((cx, cy, r), sides, rotation=rng.uniform(0.0, 360.0 / sides), fill=fill)
    return img


def make_demo_corpus(
    root: str | os.PathLike[str],
    per_class: int = 100,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> SynthSummary:
    """Small two-modality corpus: every sample is a WAV and a PNG of one class.

    Layout ``root/<split>/<class>/<class>_<NNNN>.wav`` and ``.png`` (same
    stem), splits ``train``/``test``, classes ``circle``/``square``/
    ``triangle``.  Of each class's indices ``0..per_class-1`` the last
    ``round(per_class * test_fraction)`` go to ``test``.

    Parameters
    ----------
    root : path
        Corpus root (created).
    per_class : int
        Samples per class (3 * per_class samples, 6 * per_class files).
    test_fraction : float
        Fraction of each class in ``test``, in [0, 1].
    seed : int
        Non-negative seed.

    Returns
    -------
    SynthSummary
        ``counts[split][class]`` = samples (each sample is 2 files).

    Notes
    -----
    Audio: mono PCM_16 WAV, 16000 Hz, 0.5-1.5 s, int16 peak 50-90 % of full
    scale.  Image: RGB PNG, width and height each in 40..96 px.
    """
    per_class = integer("per_class", per_class, 1)
    seed = integer("seed", seed)
    test_fraction = float(test_fraction)
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be in [0, 1], got {test_fraction}")
    n_train = per_class - int(round(per_class * test_fraction))
    width = stem_width(per_class)

    def make(key: tuple[int, int]) -> list[tuple[str, bytes]]:
        ci, i = key
        cls = DEMO_CLASSES[ci]
        rng = sample_rng(seed, TAG_DEMO, ci, i)
        png = png_bytes(_demo_image(cls, rng))
        wav = wav_bytes(_demo_waveform(cls, rng), DEMO_SAMPLE_RATE)
        stem = f"{'train' if i < n_train else 'test'}/{cls}/{cls}_{i:0{width}d}"
        return [(stem + ".png", png), (stem + ".wav", wav)]

    args = {"per_class": per_class, "test_fraction": test_fraction, "seed": seed}
    dirs = [(split, cls) for cls in DEMO_CLASSES for split in DEMO_SPLITS]
    keys = [(ci, i) for ci in range(len(DEMO_CLASSES)) for i in range(per_class)]
    return write_corpus(root, "demo", args, dirs, keys, make)
