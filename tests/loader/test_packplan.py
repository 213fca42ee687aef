"""``pack_run``: a batch's layout of a run of documents, by numpy steps or by a loop (a few
documents), the same either way, and what it consumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader.tokens import packplan
from flashfeed.loader.tokens.packed import PackedLoader
from flashfeed.loader.tokens.packplan import PackedRun, pack_run
from flashfeed.loader.tokens.segments import DOC_OUTPUTS

from support.parquet_corpus import write_parquet_corpus


def _layout(left: np.ndarray, first: np.ndarray, need: int, L: int, small: int) -> PackedRun:
    old = packplan.SMALL_RUN
    packplan.SMALL_RUN = small
    try:
        r = pack_run(left, first, need=need, seq_len=L)
    finally:
        packplan.SMALL_RUN = old
    return r


@pytest.mark.parametrize("seed", range(40))
def test_numpy_and_loop_agree_and_tile_the_batch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    left = rng.integers(0, 50, n) * (rng.random(n) > 0.2)  # some documents give nothing
    first = rng.integers(0, 5, n)
    L = int(rng.integers(1, 40))
    need = L * int(rng.integers(1, 5))
    a = _layout(left, first, need, L, 0)
    b = _layout(left, first, need, L, 10**9)
    assert a == b
    # the pieces lie back to back from the batch's first token, each row's segments too
    assert a.at == np.concatenate([[0], np.cumsum(a.size)[:-1]]).tolist()[: len(a.at)]
    assert a.filled == sum(a.size) == min(need, int(left.sum()))
    flat = [r * L + c for r, c in zip(a.row, a.col, strict=True)]
    assert flat == np.concatenate([[0], np.cumsum(a.length)[:-1]]).tolist()[: len(flat)]
    assert all(0 < k <= L - c for k, c in zip(a.length, a.col, strict=True))
    # consumed: every document before the stop; the one stopped inside continues
    if a.offset:
        k = a.consumed
        assert a.doc[-1] == k and a.offset == first[k] + a.size[-1] < first[k] + left[k]
    elif a.filled == need:
        assert left[a.consumed - 1] > 0 and int(left[: a.consumed].sum()) == need
    else:
        assert a.consumed == n


def test_bad_sizes_one_line() -> None:
    with pytest.raises(ValueError, match="need and seq_len must be >= 1, got 0 and 4"):
        pack_run(np.zeros(1, np.int64), np.zeros(1, np.int64), need=0, seq_len=4)


def test_many_short_documents_a_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of dozens of documents (the numpy layout): the same batches and states as the
    loop's, every document once and whole, and a resume inside a row continues them."""
    rng = np.random.default_rng(9)
    docs = [rng.integers(1, 999, int(rng.integers(0, 6))).tolist() for _ in range(900)]
    prefix = str(tmp_path / "short")
    write_parquet_corpus(prefix, {"ids": docs}, files=2, row_group_size=100,
                         types={"ids": pa.list_(pa.int32())})  # fmt: skip
    index_in_place(prefix)
    kw: dict[str, Any] = dict(batch_size=2, seq_len=50, column="ids", outputs=DOC_OUTPUTS,
                              drop_last=False, seed=4)  # fmt: skip

    def run(small: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        monkeypatch.setattr(packplan, "SMALL_RUN", small)
        loader = PackedLoader(prefix, **kw)
        batches, states = [], []
        for b in loader:
            batches.append({k: v.tolist() if hasattr(v, "tolist") else v for k, v in b.items()})
            states.append(loader.state_dict())
        return batches, states

    wide, wide_states = run(0)
    assert max(len(set(k for row in b["__key__"] for k in row)) for b in wide) > 24
    assert (wide, wide_states) == run(10**9)
    got: dict[int, list[int]] = {}
    for b in wide:
        for toks, ids, offs in zip(b["tokens"], b["document_ids"], b["document_offsets"],
                                   strict=True):  # fmt: skip
            for t, d, o in zip(toks, ids, offs, strict=True):
                if d >= 0:
                    assert o == len(got.setdefault(d, []))
                    got[d].append(t)
    assert got == {i: d for i, d in enumerate(docs) if d}
    monkeypatch.setattr(packplan, "SMALL_RUN", 0)
    first = PackedLoader(prefix, **kw)
    it = iter(first)
    k = 0
    while k < len(wide) and (k == 0 or first.state_dict()["doc_offset"] == 0):
        next(it)  # until it stops inside a document
        k += 1
    state = first.state_dict()
    assert state["doc_offset"] > 0
    again = PackedLoader(prefix, **kw)
    again.load_state_dict(state)
    rest = [b["tokens"].tolist() for b in again]
    assert rest == [b["tokens"] for b in wide[k:]]
