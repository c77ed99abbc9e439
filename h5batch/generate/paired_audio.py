"""The paired-audio corpus: noisy/clean WAV pairs in the classic denoising layout.

``jobs/paired_audio.yaml`` (``source.generate: paired_audio``) converts it, and ``h5batch
bench`` measures every conversion and read on it: every clip has the same length, so its
fields can be stored fixed-shape or variable.
"""

from __future__ import annotations

import os

import numpy as np

from ..argcheck import integer
from .common import (
    TAG_PAIRED,
    SynthSummary,
    fades,
    positive_float,
    sample_rng,
    wav_bytes,
    write_corpus,
)

__all__ = ["make_paired_audio"]


def _paired_waveforms(
    rng: np.random.Generator, n: int, sample_rate: int
) -> tuple[np.ndarray, np.ndarray]:
    """One clean/noisy pair, each shape (n,), float64 in [-0.9, 0.9].

    Clean = 2-5 sines (80 Hz .. min(2 kHz, 0.45 fs)) under a slow amplitude
    modulation and 20 ms fades; noisy = clean + white gaussian noise at an
    SNR drawn from 0-20 dB.  Both share one scale factor so the label is
    exactly the noise-free version of the input.
    """
    t = np.arange(n) / sample_rate
    k = int(rng.integers(2, 6))
    freqs = rng.uniform(80.0, min(2000.0, 0.45 * sample_rate), k)
    amps = rng.uniform(0.2, 1.0, k)
    phases = rng.uniform(0.0, 2 * np.pi, k)
    clean = amps @ np.sin(2 * np.pi * freqs[:, None] * t + phases[:, None])
    fm = rng.uniform(0.5, 3.0)  # Hz, "syllable" rate of the envelope
    env = (0.6 + 0.4 * np.sin(2 * np.pi * fm * t + rng.uniform(0.0, 2 * np.pi))) * fades(
        n, sample_rate, 0.02
    )
    clean = clean * env
    snr_db = rng.uniform(0.0, 20.0)
    rms = float(np.sqrt(np.mean(clean**2))) if n else 0.0
    noisy = clean + rng.normal(0.0, 1.0, n) * (rms / 10 ** (snr_db / 20))
    m = max(float(np.max(np.abs(noisy))), float(np.max(np.abs(clean)))) if n else 0.0
    scale = rng.uniform(0.5, 0.9) / m if m > 0 else 0.0
    return clean * scale, noisy * scale


def make_paired_audio(
    root: str | os.PathLike[str],
    n_train: int = 64,
    n_test: int = 16,
    seconds: float = 2.0,
    sample_rate: int = 16000,
    seed: int = 0,
) -> SynthSummary:
    """Denoising corpus: ``root/<split>/data/<N>.wav`` (noisy) + ``label/<N>.wav`` (clean).

    Parameters
    ----------
    root : path
        Corpus root (created).
    n_train, n_test : int
        Pairs per split; ``N`` runs ``0..n-1`` without zero padding.
    seconds : float
        Duration of every file (all files have ``round(seconds*sample_rate)``
        frames).
    sample_rate : int
        Hz.
    seed : int
        Non-negative seed.

    Returns
    -------
    SynthSummary
        ``counts[split]`` = ``{"data": n, "label": n}``.
    """
    n_train = integer("n_train", n_train)
    n_test = integer("n_test", n_test)
    seed = integer("seed", seed)
    sample_rate = integer("sample_rate", sample_rate, 1)
    seconds = positive_float("seconds", seconds)
    n = int(round(seconds * sample_rate))
    if n < 1:
        raise ValueError(f"seconds * sample_rate rounds to {n} frames")
    args = {
        "n_train": n_train,
        "n_test": n_test,
        "seconds": seconds,
        "sample_rate": sample_rate,
        "seed": seed,
        "subtype": "PCM_16",  # every file is 16-bit PCM; corpora made so far say so
    }
    splits = ("train", "test")

    def make(key: tuple[int, int]) -> list[tuple[str, bytes]]:
        si, i = key
        clean, noisy = _paired_waveforms(sample_rng(seed, TAG_PAIRED, si, i), n, sample_rate)
        return [(f"{splits[si]}/data/{i}.wav", wav_bytes(noisy, sample_rate)),
                (f"{splits[si]}/label/{i}.wav", wav_bytes(clean, sample_rate))]

    dirs = [(split, sub) for split in splits for sub in ("data", "label")]
    keys = [(si, i) for si, count in enumerate((n_train, n_test)) for i in range(count)]
    return write_corpus(root, "paired", args, dirs, keys, make)
