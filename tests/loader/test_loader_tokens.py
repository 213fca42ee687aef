"""TokenLoader: zero-copy rows from mapped Arrow shards, in plan order, resumable."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashfeed.dataset import Dataset
from flashfeed.loader import TokenLoader
from flashfeed.loader.telemetry.ledger import check_exactly_once
from flashfeed.loader.tokens.arrowcols import open_arrow_view
from flashfeed.plan.plan import PlanOptions, Topology, plan_epoch

from support.loader_helpers import make_token_dataset, resume_scenario

SIZES = [40, 40, 40, 40, 40, 40]  # 240 rows


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("tok") / "ds")
    make_token_dataset(prefix, SIZES, seq_len=16)
    return prefix


def test_rows_come_in_plan_order_as_int64(tokens):
    loader = TokenLoader(tokens, batch_size=8, rank=1, world_size=2, seed=4)
    plan = plan_epoch(SIZES, options=PlanOptions(seed=4), epoch=0, topology=Topology(2)).per_rank[1]
    got = torch.cat([b["tokens"] for b in loader])
    assert got.dtype == torch.int64 and got.shape == (120, 16)
    expected = plan[:, None] * 7 + np.arange(16)[None, :]
    assert np.array_equal(got.numpy(), expected)


def test_stored_width_and_scalar_columns(tmp_path):
    prefix = str(tmp_path / "ds")
    make_token_dataset(prefix, [5, 6], seq_len=4, dtype="uint16")
    loader = TokenLoader(prefix, batch_size=3, dtype=None, shuffle=False, drop_last=False)
    batches = list(loader)
    assert [b["tokens"].shape[0] for b in batches] == [3, 3, 3, 2]
    assert batches[0]["tokens"].dtype == torch.uint16
    assert batches[0]["tokens"][1].to(torch.int64).tolist() == [7, 8, 9, 10]


def test_shard_columns_are_views_of_the_mapped_file(tokens):
    from flashfeed.dataset import Dataset

    ds = Dataset.open(tokens)
    path = ds.shard_url(0)
    view = open_arrow_view(path, ("tokens",), name="x")
    arr = view.columns["tokens"][0]
    assert arr.shape == (40, 16) and not arr.flags.owndata and not arr.flags.writeable


def _keys(prefix):
    """``<shard>/<key>`` of every row: ``make_token_dataset`` keys row n ``t<n>``."""
    ds = Dataset.open(prefix)
    starts = np.cumsum([0, *(s.samples for s in ds.shards)])
    return [
        f"{s.path}/t{n:07d}"
        for i, s in enumerate(ds.shards)
        for n in range(starts[i], starts[i + 1])
    ]


def _factory(prefix):
    def make(rank, world, ledger_dir):
        return TokenLoader(
            prefix, batch_size=4, rank=rank, world_size=world, seed=9, ledger_dir=ledger_dir
        )

    return make


@pytest.mark.parametrize(
    "before,after,stop",
    [(2, 2, 11), (2, 3, 3), (3, 2, 8), (2, 2, 30), (3, 2, 20)],
    ids=["same-mid", "grow-mid", "shrink-mid", "same-end", "shrink-end"],
)
def test_interrupted_and_resumed_equals_uninterrupted(tokens, tmp_path, before, after, stop):
    full, resumed = resume_scenario(
        _factory(tokens), tmp_path, before=before, after=after, stop=stop
    )
    keys = _keys(tokens)
    for ledger in (full, resumed):
        checks = check_exactly_once(ledger, keys, epochs=[0, 1])
        assert sorted(checks) == [0, 1] and all(c.ok for c in checks.values()), checks
    assert {e: sorted(h) for e, h in full.items()} == {e: sorted(h) for e, h in resumed.items()}


def test_stats_report_bandwidth(tokens):
    loader = TokenLoader(tokens, batch_size=16)
    for _ in loader:
        pass
    s = loader.stats()
    assert s["samples"] == 240 and s["bytes"] == 240 * 16 * 8 and s["gb_per_s"] > 0
    assert s["wait_s"]["decode"] > 0 and s["cache"]["kind"] == "local"


def test_bad_options(tokens, tmp_path):
    from support.loader_helpers import make_image_dataset

    with pytest.raises(ValueError, match="dtype must be"):
        TokenLoader(tokens, batch_size=4, dtype="float32")
    with pytest.raises(ValueError, match="columns must be"):
        TokenLoader(tokens, batch_size=4, columns="tokens")
    images = str(tmp_path / "img")
    make_image_dataset(images, [3], size=8)
    with pytest.raises(ValueError, match="TokenLoader reads arrow"):
        TokenLoader(images, batch_size=4)
    from flashfeed.errors import CorruptShardError

    with pytest.raises(CorruptShardError, match=r"shards/\d{6}\.arrow.*no column"):
        next(iter(TokenLoader(tokens, batch_size=4, columns=("ids",))))


def test_a_state_saved_after_an_exhausted_epoch(tokens):
    loader = TokenLoader(tokens, batch_size=16, seed=1)
    assert sum(1 for _ in loader) == 15
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["finished"]
    # without set_epoch the next pass is the next epoch, as for the uninterrupted loader
    auto = TokenLoader(tokens, batch_size=16, seed=1)
    auto.load_state_dict(state)
    assert len(auto) == 15 and sum(1 for _ in auto) == 15 and auto.epoch == 1
    # set_epoch(0) asks for what is left of epoch 0: nothing; then epoch 1 in full
    explicit = TokenLoader(tokens, batch_size=16, seed=1)
    explicit.load_state_dict(state)
    explicit.set_epoch(0)
    assert len(explicit) == 0 and list(explicit) == []
    explicit.set_epoch(1)
    a = torch.cat([b["tokens"] for b in explicit])
    uninterrupted = TokenLoader(tokens, batch_size=16, seed=1)
    uninterrupted.set_epoch(1)
    assert torch.equal(a, torch.cat([b["tokens"] for b in uninterrupted]))


def test_shards_of_different_row_lengths_are_refused_naming_both(tmp_path):
    import pyarrow as pa

    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_arrow_shard

    prefix = str(tmp_path / "ds")
    infos = []
    for i, length in enumerate((4, 4, 5)):
        values = pa.array(np.arange(6 * length, dtype=np.int32))
        table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(values, length)})
        infos.append(write_arrow_shard(prefix, shard_name(i, "arrow"), table))
    commit_manifest(prefix, Manifest(name="t", shard_format="arrow", schema={},
                                     shards=tuple(infos)))  # fmt: skip
    loader = TokenLoader(prefix, batch_size=3, shuffle=False)
    with pytest.raises(ValueError, match="sequences must have one length") as err:
        list(loader)
    assert infos[2].path in str(err.value) and infos[0].path in str(err.value)
    assert "(5,)" in str(err.value) and "(4,)" in str(err.value)
