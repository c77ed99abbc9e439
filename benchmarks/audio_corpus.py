"""The flat audio corpus of ``sync.py`` and ``sampling.py``: one huge folder of FSDD-style
``<label>_<speaker>_<index>.wav`` (the tests borrow it as ``benchmarks.audio_corpus``).

It is made for scale (100,000 files and more): discovery of a flat directory and the
per-file cost of decoding many short recordings are what it exercises. Each file is derived
from one base waveform per (label, speaker) with a few vector operations and written with a
hand-made 16-bit PCM header, byte-identical to what soundfile writes.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from h5batch.argcheck import integer
from h5batch.generate.common import (
    INT16_FULL_SCALE,
    TAG_AUDIO,
    SynthSummary,
    atomic_write,
    begin,
    finish,
    json_normalise,
    positive_float,
    sample_rng,
)

__all__ = ["FSDD_SPEAKERS", "make_audio_corpus", "pcm16_header"]

# Speaker names of the Free Spoken Digit Dataset, so file names look the same.
FSDD_SPEAKERS: tuple[str, ...] = ("george", "jackson", "lucas", "nicolas", "theo", "yweweler")


def pcm16_header(n_frames: int, sample_rate: int) -> bytes:
    """44-byte canonical RIFF/WAVE header for mono 16-bit PCM, byte-identical to
    libsndfile's ``subtype="PCM_16"``, so these files are the ones soundfile would write.
    """
    data_bytes = 2 * n_frames
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", 36 + data_bytes, b"WAVE",
        b"fmt ", 16, 1, 1, sample_rate, 2 * sample_rate, 2, 16,
        b"data", data_bytes,
    )  # fmt: skip


def _utterance(
    rng: np.random.Generator, seed: int, label: int, f0: float, n: int, sample_rate: int
) -> np.ndarray:
    """Base "spoken digit" for one (label, speaker), shape (n,), float32, peak 1.

    Three partials of the speaker's pitch ``f0`` whose harmonic numbers and
    pitch glide depend on the label, under an attack/decay envelope.
    """
    t = np.arange(n, dtype=np.float64) / sample_rate
    duration = max(n / sample_rate, 1e-9)
    # Seeded by (seed, label) only, so every speaker says the same "word".
    lab = sample_rng(seed, TAG_AUDIO, 1, label, 0)
    harmonics = lab.integers(1, 9, 3)
    weights = lab.uniform(0.3, 1.0, 3)
    glide = lab.uniform(-0.3, 0.3)  # relative pitch change over the utterance
    phase = 2 * np.pi * f0 * (t + 0.5 * glide * t**2 / duration)
    x = weights @ np.sin(np.outer(harmonics, phase) + rng.uniform(0.0, 2 * np.pi, 3)[:, None])
    env = np.minimum(1.0, t / 0.03) * np.exp(-t / (0.6 * duration))  # 30 ms attack, decay
    x *= env
    x /= max(float(np.max(np.abs(x))), 1e-12)
    return x.astype(np.float32)


def make_audio_corpus(
    root: str | os.PathLike[str],
    n_files: int,
    seconds: float = 2.0,
    sample_rate: int = 16000,
    classes: int = 10,
    seed: int = 0,
) -> SynthSummary:
    """Flat folder of ``<label>_<speaker>_<index>.wav`` files, FSDD-style, fast.

    File ``k`` gets ``label = k % classes``, speaker ``FSDD_SPEAKERS[(k // classes) % 6]`` and
    ``index = k // (classes * 6)``: balanced labels, unique names. All files sit in ``root``:
    one huge directory is the layout being benchmarked.

    Parameters
    ----------
    root : path
        Corpus root (created).
    n_files : int
        Number of WAV files (100,000+ is the intended scale).
    seconds : float
        Maximum duration; each file lasts uniformly between ``seconds / 2`` and ``seconds``.
    sample_rate : int
        Hz.
    classes : int
        Number of labels ``0..classes-1``.
    seed : int
        Non-negative seed.

    Returns
    -------
    SynthSummary
        ``counts["all"][str(label)]`` = files.

    Notes
    -----
    Mono 16-bit PCM with the canonical 44-byte header (byte-identical to soundfile's PCM_16).
    Each file derives from one base waveform per (label, speaker) with a random length, gain and
    noise slice; peaks stay below ~92 % of full scale.
    """
    n_files = integer("n_files", n_files)
    classes = integer("classes", classes, 1)
    seed = integer("seed", seed)
    sample_rate = integer("sample_rate", sample_rate, 1)
    seconds = positive_float("seconds", seconds)
    max_n = int(round(seconds * sample_rate))
    if max_n < 2:
        raise ValueError(f"seconds * sample_rate rounds to {max_n} frames")
    min_n = max(1, int(round(max_n / 2)))
    root = Path(root)
    args = json_normalise(
        {
            "n_files": n_files,
            "seconds": seconds,
            "sample_rate": sample_rate,
            "classes": classes,
            "seed": seed,
        }
    )
    done = begin(root, "audio", args)
    if done is not None:
        return done

    n_spk = len(FSDD_SPEAKERS)
    shared = sample_rng(seed, TAG_AUDIO, 0, 0, 0)
    # Speaker pitches (Hz) and one noise table shared by all files; files take
    # random slices of it, which is far cheaper than fresh noise per file.
    speaker_f0 = shared.uniform(90.0, 260.0, n_spk)
    noise_span = 1 << 16
    # Clipped to +-4 sigma so the peak bound below is a guarantee, not a likelihood.
    noise = np.clip(shared.standard_normal(max_n + noise_span, dtype=np.float32), -4.0, 4.0)
    fade_len = min(int(0.01 * sample_rate), min_n)
    fade = np.linspace(1.0, 0.0, fade_len, endpoint=False, dtype=np.float32)  # end-of-file fade-out
    buf = np.empty(max_n, dtype=np.float32)

    counts = {"all": {str(lab): 0 for lab in range(classes)}}
    n_bytes = 0
    period = classes * n_spk
    # Generate per (label, speaker) so only one base waveform is alive at a time.
    for spk in range(n_spk):
        for label in range(classes):
            first = spk * classes + label
            count = len(range(first, n_files, period))
            if count == 0:
                continue
            rng = sample_rng(seed, TAG_AUDIO, 2, label, spk)
            base = _utterance(rng, seed, label, float(speaker_f0[spk]), max_n, sample_rate)
            # All per-file randomness in a few vectorised draws.
            lengths = rng.integers(min_n, max_n + 1, count)
            gains = (
                rng.uniform(0.3, 0.85, count) * INT16_FULL_SCALE
            )  # peak <= 0.85*(1+0.02*4) < 0.92
            noise_gains = gains * rng.uniform(0.003, 0.02, count)
            offsets = rng.integers(0, noise_span, count)
            prefix = f"{label}_{FSDD_SPEAKERS[spk]}_"
            for j in range(count):
                n = int(lengths[j])
                x = buf[:n]
                np.multiply(base[:n], np.float32(gains[j]), out=x)
                o = int(offsets[j])
                x += noise[o : o + n] * np.float32(noise_gains[j])
                x[n - fade_len :] *= fade
                pcm = x.astype(np.int16)  # |x| < 32767 by construction: no wrap-around
                counts["all"][str(label)] += 1
                n_bytes += atomic_write(
                    root / f"{prefix}{j}.wav", (pcm16_header(n, sample_rate), pcm.data)
                )
    return finish(SynthSummary(root, "audio", args, counts, n_files, n_bytes))
