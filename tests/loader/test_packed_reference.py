"""``PackedLoader`` batches against a plain packing of the same plan: each document's tokens
(none for an empty or a null one, which is skipped and counted) laid end to end in plan
order and cut into rows and batches, keys, passed columns and document outputs worked out
token by token; and a resume inside a document continues that packing."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from flashfeed.dataset import Dataset
from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader.tokens.packed import PackedLoader
from flashfeed.loader.tokens.segments import DOC_OUTPUTS, IGNORE_INDEX

from support.parquet_corpus import write_parquet_corpus


def _plain(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in batch.items()}


def _reference(
    docs: list[list[int] | None],
    plan: list[int],
    keys: list[str],
    tags: list[str],
    *,
    B: int,
    L: int,
    pad: int,
    drop_last: bool,
) -> list[dict[str, Any]]:
    """The batches of the plain packing of documents ``plan`` (see the module)."""
    stream = [(d, o, t) for d in plan if docs[d] for o, t in enumerate(docs[d] or [])]
    batches = []
    for lo in range(0, len(stream), B * L):
        part = stream[lo : lo + B * L]
        if len(part) < B * L and drop_last:
            break
        out: dict[str, Any] = {n: [] for n in ("tokens", "__key__", "tag", *DOC_OUTPUTS)}
        lens: list[int] = []
        for r in range(B):
            row = part[r * L : (r + 1) * L]
            segs: list[list[tuple[int, int, int]]] = []
            for item in row:
                if not segs or segs[-1][-1][0] != item[0]:
                    segs.append([])
                segs[-1].append(item)
            out["tokens"].append([t for _, _, t in row] + [pad] * (L - len(row)))
            out["__key__"].append([keys[s[0][0]] for s in segs])
            out["tag"].append([tags[s[0][0]] for s in segs])
            out["document_ids"].append([d for d, _, _ in row] + [-1] * (L - len(row)))
            out["document_offsets"].append([o for _, o, _ in row] + [-1] * (L - len(row)))
            pos, lab = [], []
            for s in segs:
                pos += list(range(len(s)))
                lab += [IGNORE_INDEX] + [t for _, _, t in s[1:]]
            out["position_ids"].append(pos + list(range(L - len(row))))
            out["labels"].append(lab + [IGNORE_INDEX] * (L - len(row)))
            lens += [len(s) for s in segs] + ([L - len(row)] if len(row) < L else [])
        out["cu_seqlens"] = np.concatenate([[0], np.cumsum(lens)]).tolist()
        out["max_seqlen"] = max(lens)
        batches.append(out)
    return batches


@pytest.mark.parametrize("seed", range(8))
def test_batches_are_the_plain_packing_of_the_plan(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = int(rng.choice([1, 7, 32]))
    B = int(rng.choice([1, 3, 8]))
    n = int(rng.integers(40, 160))
    docs: list[list[int] | None] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            docs.append(None)  # null: skipped, counted
        elif kind < 0.2:
            docs.append([])  # empty: no tokens
        else:  # from one token to several rows' worth
            docs.append(rng.integers(0, 70_000, int(rng.integers(1, 3 * L + 5))).tolist())
    tags = [f"tag{i}" for i in range(n)]
    prefix = str(tmp_path / "corpus")
    write_parquet_corpus(
        prefix,
        {"ids": docs, "tag": tags},
        files=2,
        row_group_size=int(rng.choice([5, 16, 50])),
        types={"ids": pa.list_(pa.int32() if seed % 2 else pa.int64())},
    )
    index_in_place(prefix)
    drop_last = bool(seed % 3 == 0)
    kw: dict[str, Any] = dict(
        batch_size=B,
        seq_len=L,
        column="ids",
        outputs=DOC_OUTPUTS,
        columns=("tag",),
        drop_last=drop_last,
        seed=seed,
        pad_id=7,
        decode_ahead=int(seed % 2) * 2,
        max_open=int(rng.choice([1, 16])),
    )
    manifest = Dataset.open(prefix).manifest
    first = np.concatenate([[0], np.cumsum(manifest.shard_samples)])
    keys = []
    for d in range(n):
        shard = int(np.searchsorted(first, d, side="right") - 1)
        keys.append(f"{manifest.shard_path(shard)}/{d - first[shard]}")

    loader = PackedLoader(prefix, **kw)
    plan = loader.position.rank_plan()
    order = plan.samples[: len(plan.samples) - len(plan.repeated)].tolist()
    assert sorted(order) == list(range(n))  # one rank: every document once
    want = _reference(docs, order, keys, tags, B=B, L=L, pad=7, drop_last=drop_last)
    got, states = [], []
    for b in loader:
        got.append(_plain(b))
        states.append(loader.state_dict())
    assert got == want
    assert loader.skipped == {"null": sum(d is None for d in docs)}

    inside = [k for k, s in enumerate(states[:-1]) if s["doc_offset"] > 0]
    assert inside or L == 1  # with rows of one token, a batch never stops inside a document
    for k in inside[:2]:  # a resume inside a document continues the same packing
        again = PackedLoader(prefix, **kw)
        again.load_state_dict(states[k])
        assert [_plain(b) for b in again] == want[k + 1 :]


def test_a_batch_keeps_its_own_keys_after_later_batches(tmp_path: Path) -> None:
    """A batch's ``__key__`` is made when first read, from its own (unit, row) pairs: read
    after the epoch it equals what was read batch by batch, it pickles, and it indexes as
    the list of lists it stands for."""
    prefix = str(tmp_path / "corpus")
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 900, int(rng.integers(1, 30))).tolist() for _ in range(120)]
    write_parquet_corpus(prefix, {"ids": docs}, files=2, row_group_size=16)
    index_in_place(prefix)
    kw: dict[str, Any] = dict(batch_size=3, seq_len=16, column="ids", seed=1)
    eager = [b["__key__"].tolist() for b in PackedLoader(prefix, **kw)]
    late = list(PackedLoader(prefix, **kw))
    assert [b["__key__"] for b in late] == eager
    assert len(eager) > 2 and all(eager[1])  # a middle batch: each row holds documents
    keys = late[1]["__key__"]
    assert len(keys) == 3 and keys[0] == eager[1][0] and keys[1:] == eager[1][1:]
    assert list(keys) == eager[1] and pickle.loads(pickle.dumps(keys)) == eager[1]
    assert keys != eager[0]
