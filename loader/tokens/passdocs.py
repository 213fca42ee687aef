"""A ``PackedLoader`` pass's documents as arrays: each one's length and start in its unit
(known once its unit is read: filled for every place of the unit in the pass at once), and
what a resume on another world size left to skip or continue."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PassDocs"]


class PassDocs:
    """Documents ``ids`` (rows ``rows`` of units ``shards``) of one pass of ``loader``."""

    def __init__(self, loader: Any, ids: np.ndarray, shards: np.ndarray, rows: np.ndarray):
        self.loader, self.ids, self.shards, self.rows = loader, ids, shards, rows
        n = len(ids)
        self.lens = np.full(n, -1, np.int64)  # -1: its unit not read yet
        self.starts = np.zeros(n, np.int64)
        self._order = np.argsort(shards, kind="stable")
        self._units, at = np.unique(shards[self._order], return_index=True)
        self._bounds = np.append(at, n)
        skip = loader.skip
        self.skipped = (
            np.isin(ids, np.fromiter(skip, np.int64, len(skip))) if skip else np.zeros(n, bool)
        )
        self.first = np.zeros(n, np.int64)  # the token each document starts at
        for d, o in loader.resume_at.items():
            self.first[ids == d] = o

    def _fill(self, unit: int) -> None:
        got = self.loader._unit(unit)
        i = int(np.searchsorted(self._units, unit))
        where = self._order[self._bounds[i] : self._bounds[i + 1]]
        r = self.rows[where]
        self.starts[where] = got.offsets[r]
        self.lens[where] = got.offsets[r + 1] - got.offsets[r]

    def fill(self, p: int, end: int, off: int) -> None:
        """The lengths of documents ``p`` to ``end`` known: their units read, but for the
        documents to skip (document ``p`` is not skipped when ``off`` > 0: it was begun)."""
        need = (self.lens[p:end] < 0) & ~self.skipped[p:end]
        if off > 0:
            need[0] = self.lens[p] < 0
        for unit in np.unique(self.shards[p:end][need]).tolist():
            self._fill(unit)

    def begun(self, p: int, consumed: int, offset: int, *, started_inside: bool) -> None:
        """What the resume left to continue is used up for the documents this batch began
        (``consumed`` from ``p``, and one more when it stops ``offset`` tokens inside it)."""
        resume = self.loader.resume_at
        if not resume:
            return
        lo, hi = p + (1 if started_inside else 0), p + consumed + (1 if offset else 0)
        for d in self.ids[lo:hi][~self.skipped[lo:hi]].tolist():
            resume.pop(d, None)
