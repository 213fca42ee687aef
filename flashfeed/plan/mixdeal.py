"""The interleave of a mixture: which source each slot of a rank's sequence draws from.

A pure, vectorised function of the weight curve, the deal's start (a global sample count),
the world size and seeded phases; it does not depend on the rank, so every rank deals the
same pattern and all ranks consume each source in lock-step.

The weight curve ``w_s(g)`` (normalised weights at global sample ``g``; linear in ramps,
constant between changes) integrates to ``F_s(g)``. A rank's slot ``t`` of a deal that
starts at ``g0`` on ``W`` ranks stands for global samples ``g0 + t W``, so by slot ``t``
source ``s`` is owed ``A_s(t) = (F_s(g0 + t W) - F_s(g0)) / W`` samples. Its ``j``-th pick
has the ideal time where ``A_s`` reaches ``j + phase_s``; the slots go to the picks in order
of ideal time (one stable sort). Each source's count over any stretch of slots is then
within ``1 + w_max (n - 2) + n (w_max - w_min)`` samples of what its weights owe it (``n``
sources, its share between ``w_min`` and ``w_max``; about two for most mixtures): shares
hold at every scale of time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WeightCurve", "deal_order", "whole_batches"]


class WeightCurve:
    """Normalised weights as a function of the global sample count, and their integral."""

    def __init__(self, xs: np.ndarray, rows: np.ndarray) -> None:
        starts, a, b = [], [], []
        for k in range(len(xs)):
            end = float(xs[k + 1]) if k + 1 < len(xs) else np.inf
            if end <= xs[k]:
                continue  # a jump: zero-length piece
            starts.append(float(xs[k]))
            a.append(rows[k])
            b.append((rows[k + 1] - rows[k]) / (end - xs[k]) if np.isfinite(end) else rows[k] * 0)
        self.x = np.asarray(starts, dtype=np.float64)
        self.a = np.vstack(a)
        self.b = np.vstack(b)
        lengths = np.diff(self.x)[:, None]
        grow = self.a[:-1] * lengths + self.b[:-1] * lengths**2 / 2
        self.f = np.vstack([np.zeros((1, self.a.shape[1])), np.cumsum(grow, axis=0)])

    @property
    def num_sources(self) -> int:
        return int(self.a.shape[1])

    def weights(self, g: float) -> np.ndarray:
        """The normalised weights at global sample ``g``."""
        k = int(np.searchsorted(self.x, g, side="right")) - 1
        return np.asarray(self.a[k] + self.b[k] * (g - self.x[k]))

    def integral(self, g: np.ndarray | float) -> np.ndarray:
        """``F_s(g)`` for every source: shape ``g.shape + (sources,)``."""
        g = np.asarray(g, dtype=np.float64)
        k = np.searchsorted(self.x, g, side="right") - 1
        d = (g - self.x[k])[..., None]
        return np.asarray(self.f[k] + self.a[k] * d + self.b[k] * d * d / 2)

    def inverse(self, s: int, y: np.ndarray) -> np.ndarray:
        """The first ``g`` where ``F_s(g) = y`` (inf where source ``s`` never gets there)."""
        f = self.f[:, s]
        # one piece (weights constant throughout): every pick in it, no lookup per pick
        k = 0 if len(f) == 1 else np.maximum(np.searchsorted(f, y, side="right") - 1, 0)
        d = np.asarray(y - f[k], dtype=np.float64)
        a, b = self.a[k, s], self.b[k, s]
        den = a + np.sqrt(np.maximum(a * a + 2 * b * d, 0.0))
        step = np.where(d > 0, np.inf, 0.0)  # where den is 0: never, or already there
        np.divide(2 * d, den, out=step, where=den > 0)  # no mask gather and scatter
        return np.asarray(self.x[k] + step)

    def owed(
        self, start: float, width: int, t: np.ndarray | float, at: np.ndarray | None = None
    ) -> np.ndarray:
        """``A_s(t)``: samples of each source a rank owes by slot ``t`` of a deal that starts
        at global sample ``start`` on ``width`` ranks (``at``: ``integral(start)``, if known)."""
        t = np.asarray(t, dtype=np.float64)
        base = self.integral(start) if at is None else at
        return np.asarray((self.integral(start + t * width) - base) / width)


def _picks(
    curve: WeightCurve,
    start: float,
    width: int,
    phases: np.ndarray,
    s: int,
    n: int,
    at: np.ndarray,
) -> np.ndarray:
    """Ideal times (in slots) of source ``s``'s first ``n`` picks (``at``: the curve's
    integral at ``start``, computed once per deal)."""
    base = float(at[s])
    y = base + width * (np.arange(n, dtype=np.float64) + phases[s])
    return np.asarray((curve.inverse(s, y) - start) / width)


def deal_order(
    curve: WeightCurve,
    *,
    start: float,
    width: int,
    phases: np.ndarray,
    slots: int | None = None,
    until: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The source of each slot of a deal (int32 labels, one per slot), and which pick fills
    each slot. ``slots``: deal that many; ``until=(s, n)``: deal until source ``s``'s ``n``-th
    pick (it is the last slot; n >= 1). Costs a sort of as many picks as slots (plus one per
    source); ties go to the source listed first. Which pick fills each slot: ``order[t]`` is pick
    ``order[t] - starts[s]`` of source ``s = labels[t]`` (the sources' picks numbered end to
    end, source ``s``'s from ``starts[s]``). A rank's ids per slot are then one gather from
    its sources' picks laid end to end, not a sort of the slots by source."""
    sources = curve.num_sources
    at = curve.integral(start)
    empty = np.zeros(0, np.int32), np.zeros(0, np.intp), np.zeros(sources + 1, np.int64)
    if until is not None:
        s, n = until
        last = float(_picks(curve, start, width, phases, s, n, at)[-1])
        if not np.isfinite(last):
            raise ValueError(
                f"source #{s} has weight 0 from global sample {start:.0f} on: an epoch that "
                f"waits until its {n} samples are read never ends"
            )
        horizon = last + sources + 2
    else:
        if slots is None or slots < 0:
            raise ValueError(f"deal needs slots >= 0 or until=, got slots={slots!r}")
        if slots == 0:
            return empty
        horizon = float(slots + sources + 2)
    owed = curve.owed(start, width, horizon, at)
    times, labels, counts = [], [], [0] * sources
    for s in range(sources):
        n = int(np.floor(owed[s] - phases[s])) + 1 if owed[s] >= phases[s] else 0
        if n:
            times.append(_picks(curve, start, width, phases, s, n, at))
            labels.append(np.full(n, s, np.int32))
            counts[s] = n
    if not times:
        return empty
    order = np.argsort(np.concatenate(times), kind="stable")
    merged = np.concatenate(labels)[order]
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if until is not None:
        s, n = until
        slot = int(np.flatnonzero(merged == s)[n - 1])
        return merged[: slot + 1], order[: slot + 1], starts
    return merged[:slots], order[:slots], starts


def whole_batches(
    dealt: tuple[np.ndarray, np.ndarray, np.ndarray],
    curve: WeightCurve,
    *,
    start: float,
    width: int,
    phases: np.ndarray,
    until: tuple[int, int],
    batch: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An ``until=(s, n)`` deal (``dealt``: it ends on source ``s``'s ``n``-th pick) filled
    up to whole batches of ``batch`` slots with the other sources' picks that follow: a last
    partial batch dropped would take source ``s``'s last samples with it. Unchanged if
    nothing can fill it (every other source's weight 0 from there on)."""
    labels = dealt[0]
    target = -(-len(labels) // batch) * batch
    if target == len(labels):
        return dealt
    s, n = until
    slots, kept = target, -1
    for _ in range(24):
        slots *= 2
        more, order, starts = deal_order(curve, start=start, width=width, phases=phases,
                                         slots=slots)  # fmt: skip
        keep = np.flatnonzero((more != s) | (order < starts[s] + n))
        if len(keep) >= target:
            keep = keep[:target]
            return more[keep], order[keep], starts
        if len(keep) == kept:
            break  # the other sources have nothing more to give
        kept = len(keep)
    return dealt
