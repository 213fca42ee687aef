"""The batch kernel of ``loader/tokens/docrows.py``, the one ``TokenLoader`` calls: its outputs equal
a plain per-token walk (``support.docref``) of random rows for every mix of outputs and token
types, and of rows located by (shard, row) in a table of several shards of several record
batches, each read where it lies; bad rows and bad segments are refused."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed.errors import CorruptShardError
from flashfeed.loader.tokens.docrows import DocRows, row_outputs
from flashfeed.loader.tokens.segments import DOC_OUTPUTS
from flashfeed.loader.tokens.tokens import docrows

from support.docref import RefShard, Segments, random_batch, walk


def _outputs(shard: RefShard, outputs, tokens_out: np.ndarray, rows=None, where="batch x"):
    rows = np.arange(len(tokens_out)) if rows is None else rows
    return row_outputs(
        DocRows({0: shard}), np.zeros(len(rows), np.int64), rows, outputs, tokens_out,
        lambda s, d: np.full(s, 7, d), where=lambda: where,
    )  # fmt: skip


def _same(got: dict, ref: dict, outputs) -> None:
    assert set(got) == set(outputs)
    for name in outputs:
        value = got[name]
        assert (value.tolist() if isinstance(value, np.ndarray) else value) == ref[name], name
        if isinstance(value, np.ndarray):
            assert value.dtype == (np.int32 if name == "cu_seqlens" else np.int64), name


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint32"])
@pytest.mark.parametrize(
    "outputs",
    [DOC_OUTPUTS, ("labels",), ("position_ids", "cu_seqlens"), ("document_ids", "max_seqlen")],
)
def test_the_kernel_equals_a_per_token_walk(dtype, outputs, stream, monkeypatch):
    # streamed: every batch written with stores that bypass the cache, as a big batch is
    monkeypatch.setattr(docrows, "cache_bytes", lambda: 0 if stream else 1 << 62)
    assert docrows.streams(1) is stream
    rng = np.random.default_rng(len(outputs) * 31 + len(dtype))
    for rows, seq in ((1, 1), (5, 7), (16, 64), (3, 300)):
        seg, tokens = random_batch(rng, rows, seq, dtype)
        wide = np.full(tokens.shape, 7, np.int64)
        order = rng.permutation(rows)  # asked for shuffled, as a plan asks: walked in that order
        got = _outputs(RefShard.of(seg, tokens), outputs, wide, order)
        assert wide.tolist() == tokens[order].astype(np.int64).tolist()
        _same(got, walk(_take(seg, order), tokens[order]), outputs)


def _take(seg: Segments, rows) -> Segments:
    """The segments of rows ``rows`` of ``seg``, in that order."""
    flat = np.concatenate([seg.row(int(r)) for r in rows])
    return Segments(seg.counts[rows], flat[:, 0], flat[:, 1], flat[:, 2])


def test_a_batch_of_no_rows_gives_empty_outputs():
    seg, tokens = random_batch(np.random.default_rng(1), 3, 4, "uint16")
    out = _outputs(
        RefShard.of(seg, tokens), ("position_ids", "cu_seqlens", "max_seqlen"),
        np.zeros((0, 4), np.int64),
    )  # fmt: skip
    assert out["position_ids"].shape == (0, 4)
    assert out["cu_seqlens"].tolist() == [0] and out["max_seqlen"] == 0


@pytest.mark.parametrize(
    ("counts", "lengths", "says"),
    [
        ([2, 1], [3, 3, 2], "segments of 6 tokens in a row of 4"),  # row 0 overfull
        ([1, 1], [4, 0], "segments of 0 tokens"),  # an empty segment
        ([1, 1], [4, -2], "segments of 0 tokens"),  # a negative length
    ],
)
def test_segments_that_do_not_fit_are_refused(counts, lengths, says):
    seg = Segments(np.array(counts), np.array(lengths), np.arange(len(lengths)))
    tokens = np.zeros((2, 4), np.uint16)
    with pytest.raises(CorruptShardError, match=f"shard x: .*do not fit the rows.*{says}"):
        _outputs(RefShard.of(seg, tokens), ("labels",), np.empty((2, 4), np.int64),
                 where="shard x")  # fmt: skip


def _row_segments(rng: np.random.Generator, seq: int) -> np.ndarray:
    """One row's segments as (length, document, start) rows: a few, padded or full."""
    out, left = [], seq
    while left > 0 and rng.random() > 0.2:
        n = int(rng.integers(1, left + 1))
        out.append((n, int(rng.integers(0, 10**9)), int(rng.integers(0, 10**6))))
        left -= n
    return np.array(out, np.int64).reshape(-1, 3)


def _shards(rng: np.random.Generator, seq: int, dtype: str) -> dict[int, RefShard]:
    shards = {}
    for number, sizes in ((3, (5, 1, 7)), (0, (4,)), (9, (6, 2))):
        batches = []
        for n in sizes:
            tokens = rng.integers(0, 30000, (n, 2 * seq)).astype(dtype)
            rows = tokens[:, :seq] if n == 7 else np.ascontiguousarray(tokens[:, :seq])
            batches.append((rows, [_row_segments(rng, seq) for _ in range(n)]))
        shards[number] = RefShard(number, batches)
    return shards


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streamed"])
@pytest.mark.parametrize("dtype, wide", [("uint16", "int64"), ("int32", "int32")])
@pytest.mark.parametrize("outputs", [DOC_OUTPUTS, ("labels", "cu_seqlens"), ("max_seqlen",)])
def test_rows_located_in_the_kernel_equal_the_rows_gathered_first(
    dtype, wide, outputs, stream, monkeypatch
):
    monkeypatch.setattr(docrows, "cache_bytes", lambda: 0 if stream else 1 << 62)
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
        tokens = np.stack([shards[s].row(r) for s, r in zip(numbers, rows, strict=True)])
        assert got_tokens.tolist() == tokens.astype(wide).tolist()
        _same(got, walk(seg, tokens), outputs)


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
