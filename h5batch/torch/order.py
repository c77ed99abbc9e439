"""The chunk-local epoch order shared by h5batch's samplers: a pure function of ``(seed, epoch)``.

Reading one sample of a compressed chunk decodes the whole chunk, so an epoch is cut into
*windows* of at most ``window`` chunk groups; the samples of a window are emitted together,
and a reader whose cache holds a window decodes each chunk about once per epoch.

Which chunks share a window, and how a window's samples are ordered, decide how well batches
mix. Samples are stored in manifest order (for class-folder corpora, class by class), so a
chunk usually holds one class, and a batch drawn from a window holds at most ``window``
chunks' classes. Two mixings:

* ``"stratified"`` (the default): the chunks, rotated by a random offset, are dealt to the
  ``M`` windows in turn (window ``j`` gets chunks ``j, j + M, j + 2M, ...``), so each window
  is spread evenly over the whole file, like the corpus. Within the window every chunk's
  samples are spread evenly (a sample of rank
  ``j`` in its chunk of ``m``, ranks random, gets the key ``(j + u) / m``, ``u`` uniform), so
  any run of ``b`` consecutive samples holds about ``b / window`` from each chunk, whatever
  the batch size: batch label histograms are closer to the corpus' than under a full random
  permutation, whose multinomial noise the even spreading removes.
* ``"random"``: windows of ``window`` consecutive
  chunks of a random chunk permutation, samples uniformly shuffled within a window.

Both put every sample exactly once in an epoch and a chunk's samples in one window.
"""

from __future__ import annotations

import numpy as np

SEED_TAG = 0x43485546  # mixed into the seed so this stream is not shared with other users
MIXINGS = ("stratified", "random")


def check_mixing(mixing: str) -> str:
    if mixing not in MIXINGS:
        raise ValueError(f"mixing must be one of {', '.join(MIXINGS)}, got {mixing!r}")
    return mixing


def epoch_rng(seed: int, epoch: int, tag: int = SEED_TAG) -> np.random.Generator:
    """The generator of one epoch's order: same ``(seed, epoch)``, same stream, any process."""
    return np.random.default_rng([tag, int(epoch), int(seed)])


def chunk_order(starts: np.ndarray, n: int, window: int, rng: np.random.Generator,
                mixing: str = "stratified") -> np.ndarray:
    """One epoch's order of ``range(n)`` (int64) by chunk groups beginning at ``starts``."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.append(starts, n))
    groups = len(starts)
    if mixing == "random":
        win = np.empty(groups, dtype=np.int64)
        win[rng.permutation(groups)] = np.arange(groups) // window
    else:
        win = _stratified_windows(groups, window, rng)
    windows = int(win.max()) + 1
    place = np.empty(windows, dtype=np.int64)
    place[rng.permutation(windows)] = np.arange(windows)
    # The samples grouped by window (in window order), each window's groups back to back.
    by_window = np.argsort(place[win], kind="stable")
    gs = sizes[by_window]
    samples = np.repeat(starts[by_window] - (np.cumsum(gs) - gs), gs) + np.arange(n)
    if mixing == "random":
        key = rng.random(n)
    else:
        # A random rank within each group, then the key that spreads a group over its window.
        rank = np.empty(n, dtype=np.float64)
        rank[_sort_within(gs, rng.random(n))] = np.arange(n) - np.repeat(np.cumsum(gs) - gs, gs)
        key = (rank + rng.random(n)) / np.repeat(gs, gs)
    window_sizes = np.bincount(place[win], weights=sizes, minlength=windows).astype(np.int64)
    return samples[_sort_within(window_sizes, key)].astype(np.int64)


def _sort_within(sizes: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The permutation that sorts ``key`` (in [0, 1)) within consecutive blocks of ``sizes``.

    Blocks stay in place. Many short sorts (one padded-matrix row per block) are faster than
    one sort of everything; very uneven block sizes fall back to the one sort.
    """
    n, blocks = len(key), len(sizes)
    widest = int(sizes.max())
    first = np.cumsum(sizes) - sizes
    block = np.repeat(np.arange(blocks), sizes)
    if blocks * widest > 4 * n + 4096:
        return np.argsort(block + key)
    mat = np.full((blocks, widest), np.inf)
    mat[block, np.arange(n) - first[block]] = key
    perm = np.argsort(mat, axis=1)
    return (perm + first[:, None])[perm < sizes[:, None]]


def _stratified_windows(groups: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """Window of every chunk group: evenly strided over the (randomly rotated) file.

    With ``M = ceil(groups / window)`` windows, the group at rotated position ``p`` goes to
    window ``p mod M``: each window holds groups ``M`` apart, one from every stretch of ``M``
    consecutive groups (not dealt at random: neighbours across a stretch boundary, usually of
    one class, could then share a window).
    """
    windows = -(-groups // window)
    pos = (np.arange(groups) + rng.integers(groups)) % groups
    return (pos % windows).astype(np.int64)
