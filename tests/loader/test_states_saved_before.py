"""Resume states written by the loaders before the mixture accounting changed (cycle losses,
batch-aligned deals, sources read without repeats) still load and continue: the fixture
``data/mixture_states_before.json`` was saved by that code, with the keys it delivered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashfeed.loader import TokenLoader
from flashfeed.mixture import load_mixture

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
