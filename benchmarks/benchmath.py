"""Small pure helpers of the benchmark report: spreads and ratios of rounds, number
formatting, and the rule that a result may not exceed the limit that bounds it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["OverLimitError", "check_limit", "fmt", "ratio", "report_row", "spread"]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Ratio of medians, and the min-max of per-round ratios (rounds were interleaved)."""
    per = [x / y for x, y in zip(a, b, strict=False) if y] or [0.0]
    return {"ratio": statistics.median(a) / statistics.median(b), "min": min(per), "max": max(per)}


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


class OverLimitError(ValueError):
    """A result above the physical limit that bounds it: the limit was not measured with the
    product's shapes, or the run was disturbed. Such a row is a measurement error, never a
    result: the page shows it as refused, never as more than 100% of its limit."""


def check_limit(value: float, limit: float | None, what: str) -> float | None:
    """``value / limit`` (None without a limit); raises ``OverLimitError`` above 1."""
    if not limit:
        return None
    frac = value / limit
    if frac > 1.0:
        raise OverLimitError(
            f"{what}: {fmt(value)} is {100 * frac:.0f}% of its limit {fmt(limit)}; a limit "
            "bounds what it limits, so this is a measurement error: re-measure the limit with "
            "the product's shapes (or the run was disturbed)"
        )
    return frac


def report_row(
    area: str,
    what: str,
    mine: dict[str, float],
    unit: str,
    ref: str = "",
    ref_v: dict[str, float] | None = None,
    r: dict[str, float] | None = None,
    limit: str = "",
    limit_v: float | None = None,
) -> dict[str, Any]:
    """One row of the report: a measured value, its reference and ratio, and its limit
    (a value above the limit is refused, named, not reported as a win)."""
    refused = None
    try:
        check_limit(mine["median"], limit_v, f"{area} {what} vs {limit}")
    except OverLimitError as exc:
        refused = str(exc)
    return {
        "area": area,
        "measure": what,
        "value": mine,
        "unit": unit,
        "reference": ref,
        "reference_value": ref_v,
        "ratio": r,
        "limit": limit,
        "limit_value": limit_v,
        "of_limit": mine["median"] / limit_v if limit_v else None,
        "refused": refused,
    }
