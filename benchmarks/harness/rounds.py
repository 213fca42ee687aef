"""The one rounds runner: peers measured side by side in interleaved rounds whose order
rotates by one every round, so no peer always runs first (beside a cold page cache, after a
conversion) or last; then the median and best of each peer's rounds."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["best_median", "rotated", "run_rounds"]

T = TypeVar("T")


def rotated(names: Sequence[str], r: int) -> list[str]:
    """Round ``r``'s order: each round starts one name later."""
    names = list(names)
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def run_rounds(
    sides: Mapping[str, Callable[[], T]],
    rounds: int,
    *,
    before_round: Callable[[int], None] | None = None,
    after_each: Callable[[int, str, T], None] | None = None,
) -> dict[str, list[T]]:
    """Each side's result per round, ``rounds`` interleaved rounds in rotated order.
    ``before_round(r)`` resets shared state (a restarted server, an emptied cache) outside
    every timer; ``after_each(r, name, result)`` reports progress."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not sides:
        raise ValueError("sides must name at least one peer")
    out: dict[str, list[T]] = {name: [] for name in sides}
    for r in range(rounds):
        if before_round is not None:
            before_round(r)
        for name in rotated(list(sides), r):
            got = sides[name]()
            out[name].append(got)
            if after_each is not None:
                after_each(r, name, got)
    return out


def best_median(values: Sequence[float], *, higher_is_better: bool = True) -> dict[str, Any]:
    """``median``, ``best`` (max for a rate, min for a time) and the ``rounds`` themselves."""
    if not values:
        raise ValueError("values must hold at least one round")
    best = max(values) if higher_is_better else min(values)
    return {"median": statistics.median(values), "best": best, "rounds": list(values)}
