"""The ground truth the document kernel (``loader/tokens/docrows.py``) is checked against: a batch's
segments, every output by a plain walk over them token by token, and open shards as
``DocRows`` reads them, made from rows and their segments."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from flashfeed.loader.tokens.segments import IGNORE_INDEX

__all__ = ["RefShard", "Segments", "random_batch", "walk"]


@dataclass(frozen=True)
class Segments:
    """A batch's segments, row after row: ``counts[r]`` segments in row ``r``, their
    ``lengths``, documents ``ids`` and where in their document they start (``starts``)."""

    counts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray
    starts: np.ndarray | None = None

    def row(self, r: int) -> np.ndarray:
        """Row ``r``'s segments as (length, document, start) rows."""
        a = int(np.sum(self.counts[:r]))
        b = a + int(self.counts[r])
        starts = self.starts if self.starts is not None else np.zeros(len(self.ids), np.int64)
        return np.stack([self.lengths[a:b], self.ids[a:b], starts[a:b]], axis=1).astype(np.int64)


def random_batch(
    rng: np.random.Generator, rows: int, seq: int, dtype: str
) -> tuple[Segments, np.ndarray]:
    """``rows`` rows of ``seq`` tokens: each a few segments of random length, some padded,
    some full, some padding only."""
    counts, lengths = [], []
    for _ in range(rows):
        left, c = seq, 0
        while left > 0 and rng.random() > 0.15:
            n = int(rng.integers(1, left + 1))
            lengths.append(n)
            left -= n
            c += 1
        counts.append(c)
    s = len(lengths)
    seg = Segments(
        np.array(counts, np.int64), np.array(lengths, np.int64), rng.integers(0, 10**9, s),
        rng.integers(0, 10**6, s),
    )  # fmt: skip
    info = np.iinfo(dtype)
    tokens = rng.integers(0, min(info.max, 2**31 - 1), (rows, seq)).astype(dtype)
    return seg, tokens


def walk(seg: Segments, tokens: np.ndarray) -> dict[str, list]:
    """Every output by a plain loop over the rows' segments, token by token."""
    rows, seq = tokens.shape
    ref: dict[str, list] = {n: [] for n in ("position_ids", "document_ids", "labels")}
    ref["document_offsets"], cu, j = [], [0], 0
    for r in range(rows):
        pos, doc, lab, off = [], [], [], []
        for _ in range(int(seg.counts[r])):
            n, d = int(seg.lengths[j]), int(seg.ids[j])
            first = int(seg.starts[j]) if seg.starts is not None else 0
            for k in range(n):
                at = len(pos)
                pos.append(k)
                doc.append(d)
                lab.append(IGNORE_INDEX if k == 0 else int(tokens[r, at]))
                off.append(first + k)
            cu.append(cu[-1] + n)
            j += 1
        if len(pos) < seq:
            pad = seq - len(pos)
            pos += list(range(pad))
            doc += [-1] * pad
            lab += [IGNORE_INDEX] * pad
            off += [-1] * pad
            cu.append(cu[-1] + pad)
        for name, got in zip(ref, (pos, doc, lab, off), strict=True):
            ref[name].append(got)
    ref["cu_seqlens"] = cu
    ref["max_seqlen"] = int(np.diff(cu).max()) if rows else 0  # type: ignore[assignment]
    return ref


class RefShard:
    """An open shard as ``DocRows`` reads it (``openshard.OpenShard``'s fields): per record
    batch its token rows and a segment table (offsets as Arrow keeps them, int32; rows of
    (length, document, start))."""

    def __init__(self, number: int, batches: list[tuple[np.ndarray, list[np.ndarray]]]):
        self.view = SimpleNamespace(columns={"tokens": [t for t, _ in batches]})
        sizes = [len(t) for t, _ in batches]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.firsts = (np.int64(number) << 32) + starts
        self.starts = starts
        self._segs = []
        for _, rows in batches:
            offsets = np.zeros(len(rows) + 1, np.int32)
            np.cumsum([len(r) for r in rows], out=offsets[1:])
            table = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
            self._segs.append((offsets, table.reshape(-1, 3).astype(np.int64)))
        self.rows = [r for _, rows in batches for r in rows]  # every row's segments

    def segments(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return self._segs

    def row(self, row: int) -> np.ndarray:
        """Row ``row``'s tokens, from the record batch that holds it."""
        c = int(np.searchsorted(self.starts, row, side="right")) - 1
        return self.view.columns["tokens"][c][row - self.starts[c]]

    @classmethod
    def of(cls, seg: Segments, tokens: np.ndarray, number: int = 0) -> RefShard:
        """One record batch: ``tokens``' rows with the segments ``seg`` gives them."""
        return cls(number, [(tokens, [seg.row(r) for r in range(len(tokens))])])
