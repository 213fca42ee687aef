"""The batch kernel of ``loader/docrows.py``: rows located by (shard, row) in a table of
several shards of several record batches, each read where it lies, give the outputs the
per-row kernel (``docfill.py``, checked against a per-token walk in test_docfill.py) gives
for the same rows gathered first; bad rows and bad segments are refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flashfeed.errors import CorruptShardError
from flashfeed.loader.docrows import DocRows, row_outputs
from flashfeed.loader.segments import DOC_OUTPUTS, Segments, document_outputs


class _Shard:
    """An open shard as ``DocRows`` reads it: token rows and a segment table per record
    batch (offsets as Arrow keeps them, int32)."""

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


def _row_segments(rng: np.random.Generator, seq: int) -> np.ndarray:
    """One row's segments as (length, document, start) rows: a few, padded or full."""
    out, left = [], seq
    while left > 0 and rng.random() > 0.2:
        n = int(rng.integers(1, left + 1))
        out.append((n, int(rng.integers(0, 10**9)), int(rng.integers(0, 10**6))))
        left -= n
    return np.array(out, np.int64).reshape(-1, 3)


def _shards(rng: np.random.Generator, seq: int, dtype: str) -> dict[int, _Shard]:
    shards = {}
    for number, sizes in ((3, (5, 1, 7)), (0, (4,)), (9, (6, 2))):
        batches = []
        for n in sizes:
            tokens = rng.integers(0, 30000, (n, 2 * seq)).astype(dtype)
            rows = tokens[:, :seq] if n == 7 else np.ascontiguousarray(tokens[:, :seq])
            batches.append((rows, [_row_segments(rng, seq) for _ in range(n)]))
        shards[number] = _Shard(number, batches)
    return shards


@pytest.mark.parametrize("dtype, wide", [("uint16", "int64"), ("int32", "int32")])
@pytest.mark.parametrize("outputs", [DOC_OUTPUTS, ("labels", "cu_seqlens"), ("max_seqlen",)])
def test_rows_located_in_the_kernel_equal_the_rows_gathered_first(dtype, wide, outputs):
    rng = np.random.default_rng(len(outputs))
    seq = 33
    shards = _shards(rng, seq, dtype)
    table = DocRows(shards)
    assert not shards[3].view.columns["tokens"][2].flags.c_contiguous  # a copy is read
    for batch in range(20):
        pick = rng.integers(0, 3, 1 + batch)
        numbers = np.array([(3, 0, 9)[p] for p in pick])
        rows = np.array([rng.integers(0, len(shards[s].rows)) for s in numbers])
        got_tokens = np.full((len(rows), seq), 5, wide)
        got = row_outputs(
            table, numbers, rows, outputs, got_tokens, lambda s, d: np.full(s, 7, d),
            where=lambda: "batch x",
        )  # fmt: skip
        segs = [shards[s].rows[r] for s, r in zip(numbers, rows, strict=True)]
        flat = np.concatenate(segs)
        seg = Segments(np.array([len(x) for x in segs]), flat[:, 0], flat[:, 1], flat[:, 2])
        tokens = np.stack([_row(shards[s], r) for s, r in zip(numbers, rows, strict=True)])
        want = document_outputs(seg, seq, tokens, outputs, lambda s, d: np.empty(s, d))
        assert got_tokens.tolist() == tokens.astype(wide).tolist()
        assert set(got) == set(want)
        for name, value in want.items():
            if isinstance(value, np.ndarray):
                assert got[name].dtype == value.dtype, name
                assert got[name].tolist() == value.tolist(), name
            else:
                assert got[name] == value, name


def _row(shard: _Shard, row: int) -> np.ndarray:
    c = int(np.searchsorted(shard.starts, row, side="right")) - 1
    return shard.view.columns["tokens"][c][row - shard.starts[c]]


def test_bad_rows_and_segments_are_refused():
    rng = np.random.default_rng(3)
    shards = _shards(rng, 8, "uint16")

    def run(numbers, rows, outputs=("labels",)):  # a table made after each change
        buf = np.empty((len(rows), 8), np.int64)
        return row_outputs(
            DocRows(shards), np.array(numbers), np.array(rows), outputs, buf,
            lambda s, d: np.empty(s, d), where=lambda: "a batch of shard x",
        )  # fmt: skip

    rows4 = r"shard x: row 4 of shard number 0 is not within its record batch of 4 rows"
    with pytest.raises(IndexError, match=rows4):
        run([3, 0], [0, 4])  # shard 0 holds 4 rows
    # a segment table whose offsets end before the row: it is not within them
    off, tab = shards[9].segments()[1]
    shards[9]._segs[1] = (off[:1], tab)
    with pytest.raises(IndexError, match=r"row 7 of shard number 9 is not within its segment"):
        run([9], [7])  # shard 9's row 7: row 1 of its second record batch
    shards[9]._segs[1] = (off, tab)
    # segments longer than the row, and an empty segment
    for bad in (np.array([[5, 1, 0], [4, 2, 0]]), np.array([[0, 1, 0]])):
        shards[0]._segs[0] = (np.array([0, len(bad), len(bad), len(bad), len(bad)]), bad)
        with pytest.raises(CorruptShardError, match=r"a batch of shard x: .*do not fit the rows"):
            run([0], [0])
    assert run([0], [1])["labels"].shape == (1, 8)  # the other rows still read
    shards[3]._segs = [(o, t[:, :2]) for o, t in shards[3]._segs]  # no starts
    with pytest.raises(ValueError, match=r"shape \(\d+, 2\): one width for all"):
        run([3], [0])
    del shards[0], shards[9]
    with pytest.raises(ValueError, match="document_offsets needs the segments' starts"):
        run([3], [0], ("document_offsets",))
    assert run([3], [0])["labels"].shape == (1, 8)
