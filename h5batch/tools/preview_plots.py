"""The pictures and sounds of ``h5batch preview``: histograms, waveforms, spectrograms,
thumbnails (PNG) and clips (WAV), each written to one file.

Rule: matplotlib through its object API (``Figure`` + the Agg canvas, never ``pyplot``), so
no display is needed and no global figure state is kept (:class:`Waveforms` keeps its one
figure in the object); each function writes one complete file. Reason: the
page must open anywhere from the file system, so every asset is a plain PNG or a 16-bit PCM
WAV, the formats every browser decodes.

Spectrograms are a NumPy STFT (Hann window, dB) saved with a colour map, one pixel per bin
and frame, no axes: hundreds of them cost little, and the page scales them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

COLOR = "#3b6ea5"
THUMB_MAX = 256  # longest side of an image thumbnail, px (smaller images are kept as they are)
FIGSIZE_CHART = (5.0, 2.6)  # inches at DPI: the page shows charts at 500 px
DPI = 100
PNG_LEVEL = 1  # zlib level of every PNG: higher levels cost many times the time for a few bytes
MARGINS = {"left": 0.12, "right": 0.98, "bottom": 0.17, "top": 0.9}  # tight_layout draws each chart again


def _figure(size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str) -> None:
    fig.savefig(path, format="png", pil_kwargs={"compress_level": PNG_LEVEL})


def _save_chart(fig, ax, path: str, xlabel: str, title: str) -> None:
    """Label a histogram's axes, title it and write it."""
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("samples", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    fig.subplots_adjust(**MARGINS)
    _save(fig, path)


def histogram(path: str, values: Sequence[float], xlabel: str, title: str) -> None:
    """A histogram of ``values`` (at most 40 bins)."""
    v = np.asarray(values, dtype=np.float64)
    fig = _figure(FIGSIZE_CHART)
    ax = fig.add_subplot()
    if v.size:
        bins = max(1, min(40, len(np.unique(v))))
        ax.hist(v, bins=bins, color=COLOR, edgecolor="white", linewidth=0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _save_chart(fig, ax, path, xlabel, title)


def size_histogram(path: str, widths: Sequence[int], heights: Sequence[int], title: str) -> None:
    """Image widths and heights (px), two histograms on one axis."""
    w, h = np.asarray(widths, dtype=np.float64), np.asarray(heights, dtype=np.float64)
    fig = _figure(FIGSIZE_CHART)
    ax = fig.add_subplot()
    if w.size:
        bins = max(1, min(40, len(np.unique(np.concatenate([w, h])))))
        ax.hist([w, h], bins=bins, color=[COLOR, "#d08c3a"], label=["width", "height"])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    _save_chart(fig, ax, path, "pixels", title)


def mono(x: np.ndarray) -> np.ndarray:
    """Float64 mono of a ``(T,)`` or ``(T, C)`` clip, scaled to [-1, 1] for int16."""
    a = np.asarray(x)
    scale = 32768.0 if a.dtype == np.int16 else 1.0
    a = a.astype(np.float64) / scale
    return a.mean(axis=1) if a.ndim == 2 else a.reshape(-1)


class Waveforms:
    """Draws clip waveforms, 300 x 80 px, on one figure kept for all of them (a new figure
    and axes cost more than the drawing). One per :func:`h5batch.tools.preview.build_preview`
    call, never shared between threads."""

    def __init__(self) -> None:
        self.fig = _figure((3.0, 0.8))
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        (self.line,) = self.ax.plot([0.0], [0.0], color=COLOR, linewidth=0.5)
        self.ax.set_ylim(-1, 1)
        self.ax.axis("off")

    def draw(self, path: str, x: np.ndarray, sample_rate: int) -> None:
        """One clip: its samples, or for a longer clip the min and max of 600 columns (2 a
        pixel) joined as one zigzag line: it looks like the filled envelope, and drawing 1,200
        points instead of every sample is what makes a waveform cheap (Agg's path drawing)."""
        y = mono(x)
        seconds = max(len(y), 1) / sample_rate
        if len(y) > 2400:
            cols = np.array_split(y, 600)
            y = np.ravel([[c.min(), c.max()] for c in cols])
        t = np.linspace(0, seconds, max(len(y), 1))
        self.line.set_data(t, y if len(y) else [0.0])
        self.ax.set_xlim(0, seconds)
        _save(self.fig, path)


def spectrogram(path: str, x: np.ndarray, sample_rate: int) -> None:
    """Log-magnitude STFT (dB, 60 dB range) as an image, low frequencies at the bottom."""
    y = mono(x)
    n_fft = 256 if sample_rate <= 16000 else 512
    hop = max(1, n_fft // 4)
    if len(y) < n_fft:
        y = np.pad(y, (0, n_fft - len(y)))
    frames = 1 + (len(y) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    spec = np.abs(np.fft.rfft(y[idx] * np.hanning(n_fft), axis=1)) ** 2
    db = 10 * np.log10(np.maximum(spec, 1e-12))
    db = np.clip(db, db.max() - 60, None)
    image_of(path, db.T[::-1])


def image_of(path: str, m: np.ndarray) -> None:
    """A 2-D array as a colour-mapped PNG (rows top to bottom)."""
    from matplotlib.image import imsave

    m = np.asarray(m, dtype=np.float64)
    lo, hi = (float(m.min()), float(m.max())) if m.size else (0.0, 1.0)
    imsave(path, m if m.size else np.zeros((1, 1)), cmap="magma", vmin=lo, vmax=hi if hi > lo else lo + 1,
           format="png", pil_kwargs={"compress_level": PNG_LEVEL})


def thumbnail(path: str, img: np.ndarray) -> None:
    """An ``(H, W, C)`` (C 1, 3 or 4) or ``(H, W)`` image as a PNG of at most THUMB_MAX px
    a side. uint8 is kept as it is; other dtypes are stretched to 0..255."""
    from PIL import Image

    a = np.asarray(img)
    if a.dtype != np.uint8:
        f = a.astype(np.float64)
        lo, hi = (f.min(), f.max()) if f.size else (0.0, 1.0)
        a = ((f - lo) / (hi - lo if hi > lo else 1) * 255).round().astype(np.uint8)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim == 3 and a.shape[2] not in (3, 4):  # e.g. channels first or many bands: first band
        a = a[:, :, 0]
    im = Image.fromarray(np.ascontiguousarray(a))
    im.thumbnail((THUMB_MAX, THUMB_MAX))
    im.save(path, format="PNG", compress_level=PNG_LEVEL)


def write_wav(path: str, x: np.ndarray, sample_rate: int) -> None:
    """A 16-bit PCM WAV of the clip (``(T,)`` or ``(T, C)``): int16 as it is; float (in
    [-1, 1], as h5batch stores it) times 32768, rounded and clipped (the inverse of ``as_float``)."""
    import soundfile as sf

    a = np.asarray(x)
    if a.dtype != np.int16:
        a = np.clip(np.round(a.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)
    sf.write(path, a, int(sample_rate), subtype="PCM_16", format="WAV")
