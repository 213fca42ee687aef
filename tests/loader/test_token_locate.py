"""Rows of shards written in several record batches: every delivered row holds what its key
names (the gather finds each row's record batch), over one dataset and over a mixture whose
batches span many shards, through a resume; per-source statistics count what was delivered."""

from __future__ import annotations

import numpy as np
import pytest

from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import make_token_dataset

SEQ = 16  # int32: 64 bytes a row; 1 KiB record batches hold 16 rows
SIZES = {"a": [70, 33, 16, 1], "b": [50, 17], "c": [90]}  # 1 to 6 record batches a shard


def _corpora(tmp_path) -> dict[str, str]:
    out = {}
    for name, sizes in SIZES.items():
        out[name] = str(tmp_path / name)
        make_token_dataset(out[name], sizes, seq_len=SEQ, batch_bytes=1 << 10)
    return out


def _check(batches) -> list[str]:
    keys = []
    for batch in batches:
        for key, row in zip(batch["__key__"], batch["tokens"].numpy(), strict=True):
            n = int(key.rsplit("/t", 1)[1])  # row n of a source holds 7n, 7n+1, ...
            assert row.tolist() == (n * 7 + np.arange(SEQ)).tolist(), key
            keys.append(key)
    return keys


def test_rows_of_every_record_batch_hold_what_their_keys_name(tmp_path):
    corpora = _corpora(tmp_path)
    loader = TokenLoader(corpora["a"], batch_size=8, seed=3, window=4, drop_last=False)
    keys = _check(loader)
    assert sorted(keys) == sorted(set(keys)) and len(keys) == sum(SIZES["a"])
    mix = Mixture(tuple(Source(p, len(SIZES[n]), n) for n, p in corpora.items()), length=240)
    loader = TokenLoader(mix, batch_size=12, seed=1, max_open=2)  # shards closed, reopened
    keys = _check(loader)
    assert len(keys) == 240
    per = loader.stats()["sources"]
    for name in SIZES:
        assert per[name]["samples"] == sum(k.startswith(name + ":") for k in keys)


def test_resumed_mixture_rows_and_source_counts_follow_the_new_deal(tmp_path):
    corpora = _corpora(tmp_path)
    # 50 samples a source, none repeated: what both ranks read before is never read again
    mix = Mixture(tuple(Source(p, 1.0, n) for n, p in corpora.items()), length=150)
    head = []
    for rank in range(2):
        first = TokenLoader(mix, batch_size=6, seed=4, world_size=2, rank=rank)
        it = iter(first)
        head += _check([next(it) for _ in range(5)])
        state = first.state_dict()
        it.close()
    # another world size: a new deal of what is left; the counts follow its order
    rest = TokenLoader(mix, batch_size=6, seed=4, world_size=1, rank=0)
    rest.load_state_dict(state)
    tail = _check(rest)
    assert not set(head) & set(tail) and len(set(head + tail)) == len(head + tail) == 150
    per = rest.stats()["sources"]
    for name in SIZES:
        assert per[name]["samples"] == sum(k.startswith(name + ":") for k in tail) > 0


class _Counting(TokenLoader):
    """Counts the shards it maps (each open of a shard's file)."""

    opens = 0

    def _open_view(self, shard):
        self.opens += 1
        return super()._open_view(shard)


def test_a_many_source_mixture_maps_each_shard_about_once_an_epoch(tmp_path):
    srcs = []
    for k in range(6):  # 6 sources x 12 shards, read in windows of 4 shards a source
        prefix = str(tmp_path / f"s{k}")
        make_token_dataset(prefix, [20 + k] * 12, seq_len=SEQ)
        srcs.append(Source(prefix, 1.0, f"s{k}"))
    mix = Mixture(tuple(srcs), length=1440)
    loader = _Counting(mix, batch_size=32, seed=2, window=4)
    assert loader.max_open == 48  # 6 sources, two windows of 4 shards each at a boundary
    for _ in range(2):
        loader.opens = 0
        assert len(_check(loader)) == 1440
        assert loader.opens <= 72, loader.opens  # no shard mapped twice in an epoch
    few = _Counting(mix, batch_size=32, seed=2, window=4, max_open=16)  # the old default
    assert len(_check(few)) == 1440  # the same rows, at a cost: shards mapped again and again
    assert few.opens > 2 * 72, few.opens
    with pytest.raises(ValueError, match=r"max_open must be None .* got 0"):
        TokenLoader(mix, batch_size=32, max_open=0)
