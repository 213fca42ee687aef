"""Resume states written by the loaders before the mixture accounting changed (cycle losses,
batch-aligned deals, sources read without repeats) still load and continue: the fixture
``data/mixture_states_before.json`` was saved by that code, with the keys it delivered."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import load_mixture

from support.loader_helpers import make_token_dataset

SAVED = json.loads((Path(__file__).parent / "data" / "mixture_states_before.json").read_text())


@pytest.fixture
def saved_corpora(tmp_path, monkeypatch):
    """The fixture's datasets, rebuilt (the same bytes, so the same digests) under relative
    paths, as the states were saved."""
    monkeypatch.chdir(tmp_path)
    for name, sizes in SAVED["sizes"].items():
        make_token_dataset(name, sizes, seq_len=SAVED["seq_len"])
    return tmp_path


def _rest(loader) -> list[str]:
    try:
        return [k for batch in loader for k in batch["__key__"]]
    finally:
        loader.close()


def test_a_mixture_state_saved_before_continues_as_it_did(saved_corpora):
    case = SAVED["cases"][0]  # drop_last, 2 ranks: the same sequence continues
    mix = load_mixture(case["mixture"])
    for rank in range(case["world_size"]):
        loader = TokenLoader(mix, batch_size=case["batch_size"], rank=rank,
                             world_size=case["world_size"], seed=case["seed"])  # fmt: skip
        loader.load_state_dict(json.loads(json.dumps(case["state"])))
        assert _rest(loader) == case["rests"][rank]


def test_a_single_dataset_state_saved_before_continues_as_it_did(saved_corpora):
    one = SAVED["single"]
    loader = TokenLoader(one["url"], batch_size=one["batch_size"], rank=one["rank"],
                         world_size=one["world_size"], seed=one["seed"])  # fmt: skip
    loader.load_state_dict(json.loads(json.dumps(one["state"])))
    assert _rest(loader) == one["rest"]


def test_a_padded_mixture_state_saved_before_loads_and_repeats_nothing(saved_corpora):
    case = SAVED["cases"][1]  # drop_last=False on 7 ranks: a cycle used to repeat keys
    mix = load_mixture(case["mixture"])
    keys = [k for head in case["heads"] for k in head]
    for rank in range(case["world_size"]):
        loader = TokenLoader(mix, batch_size=case["batch_size"], rank=rank, drop_last=False,
                             world_size=case["world_size"], seed=case["seed"])  # fmt: skip
        loader.load_state_dict(json.loads(json.dumps(case["state"])))
        keys += _rest(loader)
    # big (300) is read past its first cycle: 294 of it once (300 // 7 per rank, no padding
    # any more), then a second cycle begins; no key twice inside a cycle
    assert len(keys) == case["length"]
    big = Counter(k for k in keys if k.startswith("big:"))
    twice = sum(n == 2 for n in big.values())
    assert max(big.values()) == 2 and twice <= sum(big.values()) - 294
