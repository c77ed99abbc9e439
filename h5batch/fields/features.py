"""Built-in features of an audio field: ``features: log_mel`` (or a mapping of settings).

The stored sample is exactly this librosa call on the decoded audio ``x`` (as float32 in
[-1, 1]: int16 PCM divided by 32768), transposed to ``(frames, n_mels)`` float32::

    S = librosa.feature.melspectrogram(y=x, sr=sample_rate, n_fft=n_fft, hop_length=hop_length,
                                       n_mels=n_mels, fmin=fmin, fmax=fmax, power=2.0)
    D = librosa.power_to_db(S, ref=1.0, amin=amin, top_db=top_db)
    sample = np.ascontiguousarray(D.T, dtype=np.float32)

Rules, and why:

* ``sample_rate`` comes from the field (it must be set: the mel filters depend on it, and
  a corpus of mixed rates needs ``resample: true``), so every sample's frames mean the same.
* librosa's defaults are kept where they decide the numbers (``center=True`` with constant
  padding, Slaney mel scale and norm): ``frames = 1 + samples // hop_length``, so a field with
  ``length`` stores a fixed ``(1 + length // hop_length, n_mels)``.
* librosa is a decisive package (:data:`h5batch.conversion.preflight.DECISIVE`): workers
  must run the driver's version, or a batch's features would depend on its worker.
* Defaults are Whisper's front end at 16 kHz: 25 ms windows (400), 10 ms hops (160), 80 mels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, DecodeError


@dataclass(frozen=True)
class LogMel:
    """Settings of ``features: {type: log_mel, ...}`` (``features: log_mel`` takes these defaults)."""

    type: Literal["log_mel"] = "log_mel"
    n_fft: int = 400
    hop_length: int = 160
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float | None = None  # None: sample_rate / 2
    top_db: float | None = 80.0  # floor at the peak minus top_db; None: no floor but amin
    amin: float = 1e-10  # power floor before the log


def settings(fc: Any) -> LogMel:
    """The field's :class:`LogMel` (``features: log_mel`` is the defaults)."""
    f = fc.features
    return f if isinstance(f, LogMel) else LogMel()


def validate(fc: Any, file: str, key: str) -> None:
    """Checks of an audio field with ``features`` (ConfigError naming the key)."""
    s = settings(fc)
    k = f"{key}.features"
    if fc.sample_rate is None:
        raise ConfigError(file, f"{key}.sample_rate", "is required with features (the mel filters depend on it)")
    if fc.channels == "keep":
        raise ConfigError(file, f"{key}.channels", "features are computed on one channel: use mono or first")
    for name in ("n_fft", "hop_length", "n_mels"):
        if getattr(s, name) <= 0:
            raise ConfigError(file, f"{k}.{name}", f"must be positive, got {getattr(s, name)}")
    nyquist = fc.sample_rate / 2
    if not 0 <= s.fmin < (s.fmax if s.fmax is not None else nyquist) <= nyquist:
        raise ConfigError(file, f"{k}.fmax" if s.fmax is not None else f"{k}.fmin",
                          f"need 0 <= fmin < fmax <= sample_rate / 2 = {nyquist:g}, got fmin {s.fmin}, fmax {s.fmax}")
    if s.amin <= 0:
        raise ConfigError(file, f"{k}.amin", f"must be > 0, got {s.amin}")
    if s.top_db is not None and s.top_db < 0:
        raise ConfigError(file, f"{k}.top_db", f"must be >= 0, got {s.top_db}")


def fixed_shape(fc: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """``((frames, n_mels), float32)`` for a field of fixed ``length``, else None."""
    if fc.length is None:
        return None
    s = settings(fc)
    return (1 + int(fc.length) // s.hop_length, s.n_mels), np.dtype(np.float32)


def log_mel(x: np.ndarray, sample_rate: int, s: LogMel) -> np.ndarray:
    """The documented librosa call on a 1-D float32 signal: ``(frames, n_mels)`` float32."""
    import librosa

    S = librosa.feature.melspectrogram(y=x, sr=sample_rate, n_fft=s.n_fft, hop_length=s.hop_length,
                                       n_mels=s.n_mels, fmin=s.fmin, fmax=s.fmax, power=2.0)
    D = librosa.power_to_db(S, ref=1.0, amin=s.amin, top_db=s.top_db)
    return np.ascontiguousarray(D.T, dtype=np.float32)


def compute(path: str, fc: Any, a: np.ndarray) -> np.ndarray:
    """The field's features of decoded audio ``a`` (``(frames,)`` int16 or float32)."""
    x = a.astype(np.float32) / np.float32(32768.0) if a.dtype == np.int16 else a.astype(np.float32, copy=False)
    try:
        return log_mel(np.ascontiguousarray(x.reshape(-1)), int(fc.sample_rate), settings(fc))
    except Exception as e:  # librosa.ParameterError and the like: this file's fault
        raise DecodeError(path, f"log_mel features failed: {type(e).__name__}: {e}") from e


def packages(fc: Any) -> set[str]:
    return {"librosa"} if getattr(fc, "features", None) is not None else set()
