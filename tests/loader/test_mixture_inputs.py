"""What a mixture loader is given: a dict like ``load_mixture``'s, lengths that leave no
batch (refused by value, never a silent empty pass), relative source paths read after a
``chdir`` (resolved at construction), and the dataset commands on a mixture file."""

from __future__ import annotations

import json
import os

import pytest

from flashfeed.cli.app import main
from flashfeed.loader import TokenLoader
from flashfeed.plan.mixture import Mixture, Source, load_mixture

from support.loader_helpers import make_token_dataset

SIZES = {"small": [20, 20, 20], "big": [100, 100, 100]}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixin")
    out = {}
    for name, sizes in SIZES.items():
        out[name] = str(root / name)
        make_token_dataset(out[name], sizes, seq_len=4)
    return out


def _form(corpora, **kw) -> dict:
    return {"sources": [{"url": corpora[n], "weight": 1, "name": n} for n in SIZES], **kw}


def _keys(loader) -> list[str]:
    try:
        return [k for batch in loader for k in batch["__key__"]]
    finally:
        loader.close()


def test_a_loader_takes_the_dict_load_mixture_takes(corpora):
    keys = _keys(TokenLoader(_form(corpora, length=40), batch_size=4, seed=1))
    assert len(keys) == 40 and {k.split(":")[0] for k in keys} == {"small", "big"}
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lenght'\]"):
        TokenLoader(_form(corpora, lenght=40), batch_size=4)


def test_a_length_below_one_batch_is_refused_naming_it(corpora):
    with pytest.raises(ValueError, match=r"length=10.*batch"):
        TokenLoader(load_mixture(_form(corpora, length=10)), batch_size=4, rank=0, world_size=3)
    with pytest.raises(ValueError, match=r"length=2\b"):
        TokenLoader(
            load_mixture(_form(corpora, length=2)), batch_size=1, drop_last=False, world_size=3
        )
    # one batch per rank is enough
    keys = _keys(
        TokenLoader(load_mixture(_form(corpora, length=12)), batch_size=4, rank=2, world_size=3)
    )
    assert len(keys) == 4


def test_resuming_with_a_length_below_what_was_consumed_is_refused(corpora):
    first = TokenLoader(load_mixture(_form(corpora, length=200)), batch_size=5, seed=2)
    it = iter(first)
    for _ in range(10):
        next(it)
    state = first.state_dict()
    it.close()
    assert state["samples_consumed"] == 50
    shorter = TokenLoader(load_mixture(_form(corpora, length=30)), batch_size=5, seed=2)
    with pytest.raises(ValueError, match=r"length=30.*50 samples"):
        shorter.load_state_dict(state)
    # a length that still leaves a batch continues with it
    longer = TokenLoader(load_mixture(_form(corpora, length=60)), batch_size=5, seed=2)
    longer.load_state_dict(state)
    assert len(_keys(longer)) == 10


def test_relative_sources_read_after_a_chdir(corpora, tmp_path, monkeypatch):
    root = os.path.dirname(corpora["small"])
    monkeypatch.chdir(root)
    mix = Mixture((Source("small", 1), Source("big", 1)), length=40)
    loader = TokenLoader(mix, batch_size=4, seed=3)
    single = TokenLoader("big", batch_size=4, seed=3)
    monkeypatch.chdir(tmp_path)
    keys = _keys(loader)
    assert len(keys) == 40 and {k.split(":")[0] for k in keys} == {"small", "big"}
    assert len(_keys(single)) == 300


def test_dataset_commands_on_a_mixture_file(corpora, tmp_path, capsys):
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(_form(corpora, length=40)))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "small" in out and "big" in out and "60" in out and "300" in out
    assert main(["inspect", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {s: summary["sources"][s]["samples"] for s in SIZES} == {"small": 60, "big": 300}
    assert main(["verify", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok: ") == 2 and "small" in out and "big" in out
    cache = tmp_path / "cache"
    cache.mkdir()
    assert main(["cache", "status", str(cache), "--dataset", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [d["source"] for d in report["datasets"]] == ["small", "big"]
    assert [d["shards"] for d in report["datasets"]] == [3, 3]
    assert main(["cache", "status", str(cache), "--dataset", str(path)]) == 0
    assert "small" in capsys.readouterr().out


def test_states_of_one_kind_are_refused_by_a_loader_of_the_other_naming_both(corpora):
    mix = TokenLoader(_form(corpora, length=40), batch_size=4, seed=1)
    one = TokenLoader(corpora["small"], batch_size=4, seed=1)
    try:
        next(iter(mix))
        next(iter(one))
        with pytest.raises(ValueError, match=r"mixture of sources \['small', 'big'\].*one dataset"):
            one.load_state_dict(mix.state_dict())
        with pytest.raises(ValueError, match=r"belongs to one dataset.*mixture \['small', 'big'\]"):
            mix.load_state_dict(one.state_dict())
    finally:
        mix.close()
        one.close()
