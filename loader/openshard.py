"""The token loader's open shards: a shard's view and what the row gather and the document
outputs look up in it, made once per open (``TokenLoader`` keeps the ``max_open`` most
recently read)."""

from __future__ import annotations

import numpy as np

from .tokens.arrowcols import ArrowShardView

__all__ = ["OpenShard", "default_max_open"]


def default_max_open(sources: int, window: int) -> int:
    """Shards kept open by default: every source reads a window of ``window`` shards at a
    time, and two windows meet at a boundary, so fewer than ``2 * sources * window`` would
    close shards still being read (a mixture's batches would reopen them over and over)."""
    return max(16, 2 * sources * window)


class OpenShard:
    """A viewed shard and what the gather looks up in it row by row, made once per open:
    where its record batches start, and its document columns as one table per record
    batch (made when first needed, and again for record batches that land later)."""

    def __init__(self, shard: int, view: ArrowShardView) -> None:
        self.view = view
        self.shard = shard
        self._where()

    def _where(self) -> None:
        view = self.view
        self._starts = view.starts
        #: several record batches (else every row is in record batch 0 at its own number)
        self.several = len(view.starts) > 1
        #: ``(shard << 32) + first row`` of each record batch, and its number (``RowTable``)
        firsts = np.asarray(view.starts if len(view.starts) else [0], np.int64)
        self.firsts = (np.int64(self.shard) << 32) + firsts
        self.numbers = np.arange(len(firsts), dtype=np.int64)
        self._segs: list[tuple[np.ndarray, np.ndarray]] | None = None
        self._made_from: list[object] = []  # the doc_lens view each table was made from

    def segments(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per record batch: the shared offsets of the document columns, and a ``(segments,
        k)`` int64 table of ``doc_lens``, ``doc_ids`` (and ``doc_starts`` when read), so a
        row's segments are one slice of one table."""
        if self._segs is None:
            n = len((self.view.lists or {}).get("doc_lens", []))
            self._segs = [self._table(c) for c in range(n)]
        return self._segs

    def landed(self) -> None:
        """Record batches landed in the view (a shard still arriving): tables for them; all
        made again when a shard walked as it lands has located more of them."""
        if self.view.starts is not self._starts:
            self._where()
        if self._segs is None:
            return
        for c, lens in enumerate((self.view.lists or {}).get("doc_lens", [])):
            if lens is not self._made_from[c]:
                self._segs[c] = self._table(c)

    def _table(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        lists = self.view.lists or {}
        chunks = [lists[n][c] for n in ("doc_lens", "doc_ids", "doc_starts") if n in lists]
        end = int(chunks[0].offsets[-1]) if len(chunks[0].offsets) else 0
        table = np.stack([v.values[:end] for v in chunks], axis=1).astype(np.int64)
        if c < len(self._made_from):
            self._made_from[c] = chunks[0]
        else:
            self._made_from.append(chunks[0])
        return chunks[0].offsets, table
