"""Measures of a sampler's order: how well batches mix, and how local its reads are (used by
``sampling.py`` and the sampler tests; not installed).

``batch_label_kl`` is the shuffle-quality figure of ``docs/reader.md`` and ``sampling.py``: the
mean, over batches, of the KL divergence (bits) of a batch's label histogram from the corpus'.
A batch that holds the corpus' class proportions scores 0; a full random permutation of a
10-class corpus scores about 0.10 with batches of 64 (multinomial noise), a batch of a single
class ``log2(10) = 3.3``. ``chunks_touched`` counts the distinct chunk groups a sequence of
batches reads: with a cache holding a window, about the chunks a reader decodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def batch_label_kl(batches: Iterable[Sequence[int]] | np.ndarray, labels: Sequence[int] | np.ndarray,
                   batch_size: int | None = None) -> float:
    """Mean KL divergence in bits, batch label histogram vs the corpus', over ``batches``.

    ``batches`` is a sequence of index batches, or a flat order with ``batch_size`` (its last,
    incomplete batch is left out). ``labels`` holds every sample's class (ints >= 0); the
    corpus histogram is that of all of ``labels``.
    """
    labels = _labels(labels)
    if batch_size is not None:
        flat = np.asarray(batches, dtype=np.int64)
        full = len(flat) // batch_size * batch_size
        batches = flat[:full].reshape(-1, batch_size)
    return label_batches_kl((labels[np.asarray(b, dtype=np.int64)] for b in batches), labels)


def label_batches_kl(label_batches: Iterable[Sequence[int]], labels: Sequence[int] | np.ndarray) -> float:
    """The same from the batches' labels themselves (e.g. ``batch["label"]`` of a loader)."""
    labels = _labels(labels)
    classes = int(labels.max()) + 1
    q = np.bincount(labels, minlength=classes) / labels.size
    scores = []
    for b in label_batches:
        b = np.asarray(b, dtype=np.int64)
        if not b.size:
            continue
        p = np.bincount(b, minlength=classes) / b.size
        m = p > 0
        scores.append(float(np.sum(p[m] * np.log2(p[m] / q[m]))))
    if not scores:
        raise ValueError("no batches to score")
    return float(np.mean(scores))


def _labels(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim != 1 or not labels.size or labels.min() < 0:
        raise ValueError("labels must be a non-empty 1-D array of ints >= 0")
    return labels


def chunks_touched(batches: Iterable[Sequence[int]], chunk_starts: Sequence[int] | np.ndarray) -> int:
    """Distinct chunk groups (starting at ``chunk_starts``) that ``batches`` read."""
    starts = np.asarray(chunk_starts, dtype=np.int64)
    seen: set[int] = set()
    for b in batches:
        seen.update(np.searchsorted(starts, np.asarray(b, dtype=np.int64), side="right").tolist())
    return len(seen)
