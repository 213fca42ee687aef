"""A mixture's samples per source in every batch's stats-log line are those of the batch's
delivered keys: counted many batches ahead at once, across those stretches, a short last
batch, a mid-epoch resume (a position not on a stretch's edge) and the next epoch."""

from __future__ import annotations

import json
from collections import Counter

from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import make_token_dataset

SIZES = {"a": [70, 33, 16, 1], "b": [50, 17], "c": [90]}  # 277 samples


def _mixture(tmp_path) -> Mixture:
    sources = []
    for w, (name, sizes) in enumerate(SIZES.items(), start=1):
        make_token_dataset(str(tmp_path / name), sizes, seq_len=8)
        sources.append(Source(str(tmp_path / name), w, name))
    return Mixture(tuple(sources), length=277)


def _lines(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def _per_batch(batches) -> list[dict[str, int]]:
    return [dict(Counter(k.split(":", 1)[0] for k in b["__key__"])) for b in batches]


def test_each_batchs_source_counts_are_its_keys_sources(tmp_path):
    mix = _mixture(tmp_path)
    log = tmp_path / "stats.jsonl"
    loader = TokenLoader(mix, batch_size=3, drop_last=False, seed=5, stats_log=str(log))
    got = _per_batch(loader)  # 93 batches: more than one stretch counted ahead, 1 at the end
    loader.set_epoch(1)
    got += _per_batch(loader)
    loader.close()
    lines = _lines(log)
    assert len(got) == len(lines) == 2 * 93 and sum(got[92].values()) == 1
    assert [line["sources"] for line in lines] == got
    assert sum(n for g in got for n in g.values()) == 2 * 277


def test_source_counts_follow_a_resume_mid_stretch(tmp_path):
    mix = _mixture(tmp_path)
    first = TokenLoader(mix, batch_size=4, seed=2)
    it = iter(first)
    for _ in range(7):  # 28 samples: not a multiple of the resumed loader's batch
        next(it)
    state = first.state_dict()
    it.close()
    log = tmp_path / "rest.jsonl"
    rest = TokenLoader(mix, batch_size=5, seed=2, stats_log=str(log))
    rest.load_state_dict(state)
    got = _per_batch(rest)
    rest.close()
    assert len(got) == (277 - 28) // 5
    assert [line["sources"] for line in _lines(log)] == got
