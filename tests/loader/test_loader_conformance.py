"""Conformance: every loader behaves the same on a local dataset (read in place) and on the
real S3 server (through the node cache). Each test runs twice, once per ``any_prefix``.

What must hold on both: an epoch delivers every sample exactly once, its labels or tokens
are those of the delivered keys, the same seed gives the same order, and a run stopped
mid-epoch and resumed under another world size still delivers every sample exactly once.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from flashfeed.loader import Loader, ShardDataset, TokenLoader
from flashfeed.storage import is_local

from support.loader_helpers import (
    image_keys,
    label_of,
    make_image_dataset,
    make_token_dataset,
    resume_scenario,
    token_keys,
)


def _cache(prefix: str, tmp_path) -> dict:
    """A remote dataset reads through a node cache of its own; a local one in place."""
    return {} if is_local(prefix) else {"cache_dir": str(tmp_path / "cache")}


def test_image_loader_epoch_is_exactly_once_and_seeded(any_prefix, tmp_path):
    make_image_dataset(any_prefix, [10, 7, 9], size=16)
    runs = []
    for _ in range(2):
        loader = Loader(
            any_prefix, batch_size=4, image_size=16, seed=5, drop_last=False, py_workers=0,
            **_cache(any_prefix, tmp_path),
        )  # fmt: skip
        keys = []
        for batch in loader:
            assert batch["label"].tolist() == [label_of(k, 10) for k in batch["__key__"]]
            keys += batch["__key__"]
        loader.close()
        runs.append(keys)
    assert sorted(runs[0]) == sorted(image_keys(any_prefix))
    assert runs[0] == runs[1]  # the seed decides the order, wherever the bytes are


def test_token_loader_rows_match_their_keys_and_resume_exactly_once(any_prefix, tmp_path):
    make_token_dataset(any_prefix, [12, 12, 12], seq_len=4)
    delivered = []
    loader = TokenLoader(any_prefix, batch_size=6, seed=2, **_cache(any_prefix, tmp_path))
    for batch in loader:
        tokens = batch["tokens"].numpy()
        ids = tokens[:, 0] // 7  # row n holds 7n, 7n+1, ...
        assert [k.rsplit("/", 1)[1] for k in batch["__key__"]] == [f"t{n:07d}" for n in ids]
        assert (np.diff(tokens, axis=1) == 1).all()
        delivered += batch["__key__"]
    loader.close()
    assert sorted(delivered) == sorted(token_keys(any_prefix))

    def make(rank, world, ledger_dir):
        return TokenLoader(
            any_prefix, batch_size=3, rank=rank, world_size=world, seed=2,
            ledger_dir=ledger_dir, **_cache(any_prefix, tmp_path),
        )  # fmt: skip

    full, resumed = resume_scenario(make, tmp_path, before=2, after=3, stop=3)
    for ledger in (full, resumed):
        for hashes in ledger.values():
            assert len(hashes) == 36 and max(Counter(hashes).values()) == 1


def test_shard_dataset_epoch_is_exactly_once(any_prefix, tmp_path):
    make_image_dataset(any_prefix, [6, 6, 5], size=16)
    ds = ShardDataset(
        any_prefix, seed=3, shuffle=True, drop_last=False, fields={"label": "cls"},
        **_cache(any_prefix, tmp_path),
    )  # fmt: skip
    keys = []
    for sample in ds:
        assert int(sample["label"]) == label_of(sample["__key__"], 10)
        keys.append(sample["__key__"])
    assert sorted(keys) == sorted(image_keys(any_prefix))
