"""Argument checks shared by the public Python entry points (sampler, corpus generators)."""

from __future__ import annotations

import operator
from typing import Any


def integer(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``, else a TypeError/ValueError naming ``name``.

    ``operator.index`` rejects floats such as 10.0 instead of silently truncating them.
    """
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def rank_of(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)`` checked: ``world_size >= 1`` and ``0 <= rank < world_size``
    (the distributed samplers' common arguments)."""
    w = integer("world_size", world_size, 1)
    r = integer("rank", rank, 0)
    if r >= w:
        raise ValueError(f"rank must be in [0, world_size={w}), got {r}")
    return r, w
