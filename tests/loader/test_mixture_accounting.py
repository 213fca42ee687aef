"""Every sample of a mixture is accounted for, from the delivered keys and the ledger: what a
cycle leaves unread (a world size that does not divide a source, an elastic change) is in
``state["dropped"]`` and the ledger's dropped ids, a cycle reads no key twice with or
without ``drop_last``, ``until=`` reads its source's whole pass whatever the batch, and the
schedule's clock counts the samples delivered."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from flashfeed.dataset import Dataset
from flashfeed.loader import TokenLoader
from flashfeed.loader.telemetry.ledger import read_dropped, read_ledger
from flashfeed.loader.telemetry.mixledger import check_mixture
from flashfeed.plan.mixture import Change, Mixture, Source

from support.loader_helpers import make_token_dataset

SIZES = {"small": [20, 20, 20], "big": [100, 100, 100]}  # 60 and 300: 7 ranks divide neither


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixacc")
    out = {}
    for name, sizes in SIZES.items():
        out[name] = str(root / name)
        make_token_dataset(out[name], sizes, seq_len=4)
    return out


def _all_keys(corpora) -> dict[str, list[str]]:
    """Each source's keys in dataset order: a dropped id is an offset into them laid end to
    end in the mixture's order."""
    out = {}
    for name in SIZES:
        ds, keys, n = Dataset.open(corpora[name]), [], 0
        for s in ds.shards:
            keys += [f"{name}:{s.path}/t{j:07d}" for j in range(n, n + s.samples)]
            n += s.samples
        out[name] = keys
    return out


def _mix(corpora, weights=None, **kw) -> Mixture:
    weights = weights or {"small": 1.0, "big": 1.0}
    return Mixture(tuple(Source(corpora[n], w, n) for n, w in weights.items()), **kw)


def _run(mix, world, *, ledger=None, batch=4, epochs=(0,), **kw):
    """Every rank's delivered keys per epoch, and each rank's last state."""
    keys: dict[int, list[str]] = {}
    states = []
    for rank in range(world):
        loader = TokenLoader(mix, batch_size=batch, rank=rank, world_size=world, seed=9,
                             ledger_dir=ledger, **kw)  # fmt: skip
        for e in epochs:
            loader.set_epoch(e)
            for b in loader:
                assert len(b["__key__"]) == batch or not kw.get("drop_last", True)
                keys.setdefault(e, []).extend(b["__key__"])
        states.append(loader.state_dict())
        loader.close()
    return keys, states


def _dropped_keys(ledger, corpora) -> dict[int, list[str]]:
    order = [k for name in SIZES for k in _all_keys(corpora)[name]]
    return {e: [order[i] for i in ids] for e, ids in read_dropped(ledger).items()}


@pytest.mark.parametrize("drop_last", [True, False])
def test_until_reads_its_source_once_and_names_what_7_ranks_leave(corpora, tmp_path, drop_last):
    ledger = str(tmp_path / "ledger")
    keys, states = _run(_mix(corpora, until="small"), 7, ledger=ledger, drop_last=drop_last)
    small = Counter(k for k in keys[0] if k.startswith("small:"))
    dropped = _dropped_keys(ledger, corpora).get(0, [])
    assert max(small.values()) == 1  # once per cycle, padded or not
    # the 4 samples 7 ranks cannot share are dropped, named in the ledger and the state
    assert len(small) == 56 and sorted(dropped) == sorted(
        set(_all_keys(corpora)["small"]) - set(small)
    )
    assert all(s["dropped"] == 4 for s in states)
    assert len(read_ledger(ledger)[0]) == len(keys[0])


@pytest.mark.parametrize("drop_last", [True, False])
def test_every_cycle_is_accounted_for_at_7_ranks(corpora, tmp_path, drop_last):
    ledger = str(tmp_path / "ledger")
    keys, states = _run(_mix(corpora, until="big"), 7, ledger=ledger, drop_last=drop_last)
    dropped = Counter(_dropped_keys(ledger, corpora).get(0, []))
    got = Counter(keys[0])
    # big once (6 of its 300 dropped); small read in cycles: each key delivered or dropped
    # once per cycle, so every key of it c or c + 1 times
    big = [k for k in _all_keys(corpora)["big"]]
    assert [got[k] + dropped[k] for k in big] == [1] * 300
    assert sum(dropped[k] for k in big) == 300 % 7  # one node of 7 ranks: 42 each
    small = [got[k] + dropped[k] for k in _all_keys(corpora)["small"]]
    assert max(small) - min(small) <= 1 and min(small) >= 4
    assert max(got[k] for k in _all_keys(corpora)["small"]) <= max(small)
    assert all(s["dropped"] == sum(dropped.values()) for s in states)


def test_an_elastic_change_names_what_the_new_split_leaves(corpora, tmp_path):
    ledger = str(tmp_path / "ledger")
    mix = _mix(corpora, {"small": 1.0, "big": 3.0}, until="big")
    head, states = [], []
    for rank in range(2):
        loader = TokenLoader(mix, batch_size=4, rank=rank, world_size=2, seed=4,
                             ledger_dir=ledger)  # fmt: skip
        it = iter(loader)
        for _ in range(11):
            head += next(it)["__key__"]
        states.append(loader.state_dict())
        it.close()
    tail, after = [], []
    for rank in range(7):
        loader = TokenLoader(mix, batch_size=4, rank=rank, world_size=7, seed=4,
                             ledger_dir=ledger)  # fmt: skip
        loader.load_state_dict(json.loads(json.dumps(states[0])))
        tail += [k for b in loader for k in b["__key__"]]
        after.append(loader.state_dict())
    got = Counter(head + tail)
    dropped = Counter(_dropped_keys(ledger, corpora).get(0, []))
    big = _all_keys(corpora)["big"]
    assert [got[k] + dropped[k] for k in big] == [1] * 300  # big once, across the change
    assert 0 < sum(dropped[k] for k in big) < 7
    assert all(s["dropped"] == sum(dropped.values()) for s in after)
    checks = check_mixture(ledger, _all_keys(corpora), {"small": 1, "big": 3})[0]
    assert checks["big"].dropped == sum(dropped[k] for k in big)
    assert checks["big"].missing == checks["big"].dropped


@pytest.mark.parametrize(("world", "batch"), [(1, 7), (2, 4), (2, 7), (3, 5)])
def test_until_delivers_the_whole_pass_with_drop_last(corpora, world, batch):
    keys, states = _run(_mix(corpora, until="small"), world, batch=batch)
    small = Counter(k for k in keys[0] if k.startswith("small:"))
    assert len(small) == 60 and max(small.values()) == 1  # every batch full (``_run``)
    assert all(s["dropped"] == 0 for s in states)


def test_the_schedules_clock_counts_delivered_samples(corpora):
    # small off, then from global sample 200 on only small: epoch 0 delivers 192 (2 ranks,
    # batches of 16), so epoch 1's first 8 samples (4 per rank) come before the change
    schedule = (Change(0, {"small": 0.0}), Change(200, {"small": 1.0, "big": 0.0}))
    mix = _mix(corpora, schedule=schedule, length=200)
    keys, _ = _run(mix, 2, batch=16, epochs=(0, 1))
    assert len(keys[0]) == len(keys[1]) == 192
    assert all(k.startswith("big:") for k in keys[0])
    for rank in range(2):
        mine = keys[1][rank * 96 : (rank + 1) * 96]
        assert [k.split(":")[0] for k in mine[:5]] == ["big"] * 4 + ["small"]
        assert all(k.startswith("small:") for k in mine[4:])


def test_until_with_nothing_to_fill_its_last_batch_names_what_it_drops(corpora, tmp_path):
    ledger = str(tmp_path / "ledger")
    mix = _mix(corpora, until="small", schedule=(Change(0, {"big": 0.0}),))
    keys, states = _run(mix, 1, ledger=ledger, batch=7)  # 60 = 8 batches of 7 and 4
    dropped = _dropped_keys(ledger, corpora)[0]
    assert len(keys[0]) == 56 and all(k.startswith("small:") for k in keys[0])
    assert sorted(keys[0] + dropped) == sorted(_all_keys(corpora)["small"])
    assert states[0]["dropped"] == 4
