"""Elastic resume at loader level: what a re-split keeps, what drop_last drops (and says it
drops), ShardDataset under a changed number of workers, and the misuses that must fail."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

from flashfeed.loader import ShardDataset, TokenLoader
from flashfeed.loader.telemetry.ledger import check_exactly_once, read_dropped, read_ledger

from support.loader_helpers import (
    image_keys,
    make_image_dataset,
    make_token_dataset,
    run_epochs,
    token_keys,
)

SIZES = [37, 50, 29, 44, 61, 23]  # 244 rows, uneven on purpose
BATCH = 4


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("el") / "ds")
    make_token_dataset(prefix, SIZES, seq_len=4)
    return prefix


def _elastic_run(prefix, ledger, *, before, after, stop, drop_last):
    """``before`` ranks take ``stop`` batches of epoch 0, then ``after`` ranks load rank 0's
    state and finish the epoch; every rank is its own loader, in lock-step."""

    def make(rank, world):
        return TokenLoader(
            prefix,
            batch_size=BATCH,
            rank=rank,
            world_size=world,
            seed=5,
            drop_last=drop_last,
            ledger_dir=ledger,
        )

    states = []
    for r in range(before):
        state, seen = run_epochs(make(r, before), [0], stop_after=stop)
        assert seen == stop
        states.append(state)
    finals = []
    for r in range(after):
        loader = make(r, after)
        loader.load_state_dict(states[0])
        run_epochs(loader, [0])
        finals.append(loader.state_dict())
    return states[0], finals


@pytest.mark.parametrize("before,after,stop", [(2, 3, 5), (3, 2, 7), (2, 5, 1), (4, 3, 9)])
def test_without_drop_last_an_elastic_resume_loses_nothing(tokens, tmp_path, before, after, stop):
    ledger = str(tmp_path / "ledger")
    _elastic_run(tokens, ledger, before=before, after=after, stop=stop, drop_last=False)
    check = check_exactly_once(ledger, token_keys(tokens), epochs=[0])[0]
    assert check.missing == [] and check.unknown == 0 and check.dropped == 0
    # ranks that come out short repeat a few of their own samples: fewer than the world size
    extra = sum(n - 1 for n in check.duplicates.values())
    assert check.delivered == sum(SIZES) + extra and extra < after
    assert read_dropped(ledger) == {}


@pytest.mark.parametrize("before,after,stop", [(2, 3, 5), (3, 2, 7), (2, 5, 1), (4, 3, 9)])
def test_with_drop_last_the_dropped_are_few_and_recorded(tokens, tmp_path, before, after, stop):
    ledger = str(tmp_path / "ledger")
    _, finals = _elastic_run(tokens, ledger, before=before, after=after, stop=stop, drop_last=True)
    check = check_exactly_once(ledger, token_keys(tokens), epochs=[0])[0]
    assert check.ok, str(check)  # delivered or recorded as dropped, each exactly once
    assert check.dropped < after * BATCH
    if (before, after, stop) == (4, 3, 9):  # 100 left over 3 ranks: 1 surplus, 3 x 1 partial
        assert check.dropped == 4
    assert check.delivered + check.dropped == sum(SIZES)
    # the state names the same number; the ledger's dropped are never among the delivered
    assert {f["dropped"] for f in finals} == {check.dropped}
    delivered = set(read_ledger(ledger)[0])
    assert len(delivered) == check.delivered


def test_set_epoch_while_iterating_raises(tokens):
    loader = TokenLoader(tokens, batch_size=BATCH)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="set_epoch"):
        loader.set_epoch(3)
    it.close()
    loader.set_epoch(3)
    assert loader.epoch == 3


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("el-img") / "ds")
    make_image_dataset(prefix, [30, 25, 35, 30], size=8)
    return prefix


def _keep_key(sample):
    return {"__key__": sample["__key__"], "label": sample["cls"]}


@pytest.mark.parametrize("first,second", [(2, 3), (3, 1), (0, 2)])
def test_shard_dataset_resumes_exactly_when_workers_change(images, tmp_path, first, second):
    ledger = str(tmp_path / "ledger")

    def make():
        ds = ShardDataset(images, batch_size=5, transform=_keep_key, seed=2, ledger_dir=ledger)
        return ds

    loader = make().loader(num_workers=first)
    for k, _ in enumerate(loader):
        if k == 6:
            break
    state = loader.state_dict()
    resumed = make().loader(num_workers=second)
    resumed.load_state_dict(state)
    assert sum(1 for _ in resumed) == 24 - 7  # 120 samples, batches of 5
    check = check_exactly_once(ledger, image_keys(images), epochs=[0])[0]
    assert check.ok, str(check)


def test_shard_dataset_in_a_plain_dataloader_with_workers_is_refused(images):
    ds = ShardDataset(images, batch_size=5, transform=_keep_key)
    plain = DataLoader(ds, batch_size=5, num_workers=2)
    with pytest.raises(RuntimeError, match=r"ShardDataset\.loader\(num_workers"):
        next(iter(plain))


def test_shard_dataset_in_a_plain_dataloader_without_workers_keeps_its_position(images, tmp_path):
    ledger = str(tmp_path / "ledger")
    ds = ShardDataset(images, batch_size=5, transform=_keep_key, seed=1, ledger_dir=ledger)
    plain = DataLoader(ds, batch_size=5, num_workers=0)
    for k, _ in enumerate(plain):
        if k == 3:
            break
    state = ds.state_dict()
    assert state["samples_consumed"] == 20
    again = ShardDataset(images, batch_size=5, transform=_keep_key, seed=1, ledger_dir=ledger)
    again.load_state_dict(state)
    rest = sum(len(b["label"]) for b in DataLoader(again, batch_size=5, num_workers=0))
    assert rest == 100
    assert check_exactly_once(ledger, image_keys(images), epochs=[0])[0].ok
    assert np.all(np.asarray(state["segments"]) >= 0)
