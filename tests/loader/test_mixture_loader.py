"""Mixtures through the real loaders: keys name their source, the ledger proves each
source's reads and shares, resume is exact, elastic resume and weight changes read nothing
twice, bad mixtures fail at construction naming both sources."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from flashfeed.dataset import Dataset
from flashfeed.format.manifest import Manifest, commit_manifest
from flashfeed.loader import TokenLoader
from flashfeed.loader.mixposition import MixPosition, plan_position
from flashfeed.loader.position import Position
from flashfeed.loader.telemetry.ledger import read_ledger
from flashfeed.loader.telemetry.mixledger import check_mixture
from flashfeed.plan.mixture import Mixture, Source

from support.loader_helpers import make_image_dataset, make_token_dataset

SIZES = {"web": [60, 50, 70, 40], "code": [30, 35], "books": [25, 20, 15]}
WEIGHTS = {"web": 3.0, "code": 2.0, "books": 1.0}
SEQ = 8


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for name, sizes in SIZES.items():
        out[name] = str(root / name)
        make_token_dataset(out[name], sizes, seq_len=SEQ)
    return out


def _mix(corpora, weights=WEIGHTS, **kw) -> Mixture:
    return Mixture(tuple(Source(corpora[n], w, n) for n, w in weights.items()), **kw)


def _keys(corpora) -> dict[str, list[str]]:
    out = {}
    for name, prefix in corpora.items():
        ds = Dataset.open(prefix)
        keys, n = [], 0
        for s in ds.shards:
            keys += [f"{name}:{s.path}/t{j:07d}" for j in range(n, n + s.samples)]
            n += s.samples
        out[name] = keys
    return out


def _rows(loader) -> tuple[list[str], list[np.ndarray]]:
    keys, rows = [], []
    for batch in loader:
        keys += batch["__key__"]
        rows += list(batch["tokens"].numpy())
    return keys, rows


def test_a_token_mixture_epoch_names_sources_and_holds_its_shares(corpora, tmp_path):
    ledger = str(tmp_path / "ledger")
    mix = _mix(corpora, length=400)
    got = {}
    for rank in range(2):
        loader = TokenLoader(mix, batch_size=10, rank=rank, world_size=2, seed=1,
                             ledger_dir=ledger)  # fmt: skip
        keys, rows = _rows(loader)
        assert len(keys) == 200
        for key, row in zip(keys, rows, strict=True):
            source, rest = key.split(":", 1)
            assert source in SIZES
            n = int(rest.rsplit("/t", 1)[1])  # the row holds what its key names
            assert row.tolist() == (n * 7 + np.arange(SEQ)).tolist()
        got[rank] = keys
        per = loader.stats()["sources"]
        for name in SIZES:  # stats count what was delivered, per source
            assert per[name]["samples"] == sum(k.startswith(name + ":") for k in keys)
            assert per[name]["samples_per_s"] > 0 and per[name]["storage_wait_s"] >= 0
    checks = check_mixture(ledger, _keys(corpora), WEIGHTS)[0]
    assert checks["unknown"] == 0
    for name in SIZES:
        c = checks[name]
        assert c.ok, str(c)
        assert abs(c.share - c.weight) < 0.01, str(c)
    # web (220 samples) is read 200 times: no key twice; books (60) over three times
    assert checks["web"].distinct == checks["web"].delivered == 200
    books = checks["books"]
    assert 1 < books.passes < 2 and books.most == 2 and books.fewest >= 1  # two cycles begun


def test_mixture_file_and_exact_resume(corpora, tmp_path):
    path = tmp_path / "mix.json"
    form = _mix(corpora, length=300).to_dict()
    path.write_text(json.dumps(form))
    full, _ = _rows(TokenLoader(str(path), batch_size=6, rank=1, world_size=2, seed=3))
    first = TokenLoader(str(path), batch_size=6, rank=1, world_size=2, seed=3)
    it = iter(first)
    head = []
    for _ in range(7):
        head += next(it)["__key__"]
    state = first.state_dict()
    it.close()
    assert state["kind"] == "mixture" and state["samples_consumed"] == 84
    again = TokenLoader(str(path), batch_size=6, rank=1, world_size=2, seed=3)
    again.load_state_dict(json.loads(json.dumps(state)))
    tail, _ = _rows(again)
    assert head + tail == full


def _stop(loader, batches):
    keys, it = [], iter(loader)
    for _ in range(batches):
        keys += next(it)["__key__"]
    state = loader.state_dict()
    it.close()
    return keys, state


def test_elastic_resume_reads_every_source_once(corpora, tmp_path):
    mix = _mix(corpora, until="code")  # read code exactly once
    ledger = str(tmp_path / "ledger")

    def make(rank, world):
        return TokenLoader(mix, batch_size=4, rank=rank, world_size=world, seed=5,
                           ledger_dir=ledger)  # fmt: skip

    keys, states = [], []
    for loader in [make(r, 2) for r in range(2)]:
        k, s = _stop(loader, 5)
        keys += k
        states.append(s)
    assert states[0] == states[1]
    for rank in range(3):
        loader = make(rank, 3)
        loader.load_state_dict(states[0])
        keys += _rows(loader)[0]
    per = {n: [k for k in keys if k.startswith(n + ":")] for n in SIZES}
    for name in ("web", "code"):
        assert len(set(per[name])) == len(per[name]), f"{name} read twice"
    total = sum(SIZES["code"])
    # every sample of code once, but for the drop_last surplus of each world size (< 2 + 3)
    # and the last partial batches
    assert total - 5 - 3 * 4 <= len(set(per["code"])) <= total
    # the ledgers of both world sizes prove the same, per source
    checks = check_mixture(ledger, _keys(corpora), WEIGHTS)[0]
    assert checks["unknown"] == 0 and sum(c.delivered for n, c in checks.items()
                                          if n != "unknown") == len(keys)  # fmt: skip
    for name in ("web", "code"):
        assert checks[name].ok and checks[name].distinct == checks[name].delivered
    assert checks["code"].missing <= 5 + 3 * 4
    assert checks["books"].most <= -(-checks["books"].delivered // checks["books"].keys) + 1


def test_weight_change_at_resume_reads_nothing_twice(corpora):
    old = _mix(corpora, length=300)
    loader = TokenLoader(old, batch_size=5, seed=2)
    head, state = _stop(loader, 10)
    new = _mix(corpora, {"web": 1.0, "code": 1.0, "books": 4.0}, length=300)
    later = TokenLoader(new, batch_size=5, seed=2)
    later.load_state_dict(state)
    tail, _ = _rows(later)
    assert len(head) + len(tail) == 300
    after = later.state_dict()
    assert after["changes"] and after["changes"][0][1] == 50  # where the new weights began
    for name in ("web", "code"):
        picked = [k for k in head + tail if k.startswith(name + ":")]
        assert len(set(picked)) == len(picked)
    assert abs(np.mean([k.startswith("books:") for k in tail]) - 4 / 6) < 0.02


def test_adding_a_source_at_resume(corpora):
    two = _mix(corpora, {"web": 1.0, "code": 1.0}, length=200)
    head, state = _stop(TokenLoader(two, batch_size=5, seed=4), 8)
    three = _mix(corpora, {"web": 1.0, "code": 1.0, "books": 2.0}, length=200)
    later = TokenLoader(three, batch_size=5, seed=4)
    later.load_state_dict(state)
    tail, _ = _rows(later)
    assert len(head) + len(tail) == 200 and not any(k.startswith("books:") for k in head)
    for name in ("web", "code"):
        picked = [k for k in head + tail if k.startswith(name + ":")]
        assert len(set(picked)) == len(picked)
    assert abs(np.mean([k.startswith("books:") for k in tail]) - 0.5) < 0.03


def test_states_of_other_mixtures_are_refused_naming_what_differs(corpora, tmp_path):
    state = _stop(TokenLoader(_mix(corpora, length=200), batch_size=4), 2)[1]
    fewer = _mix(corpora, {"web": 1.0, "code": 1.0}, length=200)
    with pytest.raises(ValueError, match=r"source 'books'.*lacks"):
        TokenLoader(fewer, batch_size=4).load_state_dict(state)
    other = str(tmp_path / "books2")
    make_token_dataset(other, [26, 20, 15], seq_len=SEQ)
    swapped = Mixture(
        (Source(corpora["web"], 3, "web"), Source(corpora["code"], 2, "code"),
         Source(other, 1, "books"))
    )  # fmt: skip
    with pytest.raises(ValueError, match="source 'books' holds other data"):
        TokenLoader(swapped, batch_size=4).load_state_dict(state)
    single = TokenLoader(corpora["web"], batch_size=4).state_dict()
    with pytest.raises(ValueError, match="belongs to one dataset"):
        TokenLoader(_mix(corpora), batch_size=4).load_state_dict(single)


def test_sources_that_one_loader_cannot_read_alike(corpora, tmp_path):
    wide = str(tmp_path / "wide")
    make_token_dataset(wide, [30, 30], seq_len=SEQ * 2)
    mix = Mixture((Source(corpora["web"], 1, "web"), Source(wide, 1, "wide")))
    with pytest.raises(ValueError, match="sources 'web' and 'wide' differ in fields"):
        TokenLoader(mix, batch_size=4)
    images = str(tmp_path / "img")
    make_image_dataset(images, [10, 10])
    mix = Mixture((Source(corpora["web"], 1, "web"), Source(images, 1, "img")))
    with pytest.raises(ValueError, match="sources 'web' and 'img' differ in shard format"):
        TokenLoader(mix, batch_size=4)
    twice = Mixture((Source(corpora["web"], 1, "a"), Source(corpora["web"] + "/.", 1, "b")))
    with pytest.raises(ValueError, match="'a' and 'b' are the same dataset"):
        TokenLoader(twice, batch_size=4)
    empty = str(tmp_path / "empty")
    schema = Dataset.open(corpora["web"]).manifest.schema
    commit_manifest(empty, Manifest(name="e", shard_format="arrow", schema=schema, shards=()))
    with pytest.raises(ValueError, match="source 'empty' has no samples"):
        TokenLoader(Mixture((Source(corpora["web"], 1, "web"), Source(empty, 1))), batch_size=4)
    typo = Mixture((Source(corpora["web"], 1, "web"), Source(corpora["web"] + "x", 1, "webx")))
    with pytest.raises(ValueError, match=r"mixture source 'webx'.*cannot be opened"):
        TokenLoader(typo, batch_size=4)


def test_a_source_deleted_mid_run_names_source_and_shard(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_token_dataset(a, [40, 40], seq_len=SEQ)
    make_token_dataset(b, [30, 30, 30], seq_len=SEQ)
    loader = TokenLoader(Mixture((Source(a), Source(b))), batch_size=4, shuffle=False)
    it = iter(loader)
    next(it)
    for f in os.listdir(os.path.join(b, "shards")):
        os.remove(os.path.join(b, "shards", f))
    with pytest.raises(Exception, match=r"source 'b'.*shards/00000\d\.arrow"):
        for _ in it:
            pass


def test_token_mixture_from_the_object_store(s3_prefix, s3_info, tmp_path, capsys):
    opts = s3_info.storage_options()
    urls = {}
    for name, sizes in (("x", [20, 25]), ("y", [30, 10, 12])):
        urls[name] = f"{s3_prefix}/{name}"
        make_token_dataset(urls[name], sizes, seq_len=SEQ, storage_options=opts)
    mix = Mixture((Source(urls["x"], 1, "x"), Source(urls["y"], 1, "y")), until="x")
    ledger = str(tmp_path / "ledger")
    log = str(tmp_path / "stats.jsonl")
    loader = TokenLoader(mix, batch_size=5, cache_dir=str(tmp_path / "cache"),
                         storage_options=opts, ledger_dir=ledger, stats_log=log)  # fmt: skip
    keys, rows = _rows(loader)
    assert {k.split(":")[0] for k in keys} == {"x", "y"}
    x = [k for k in keys if k.startswith("x:")]
    assert len(set(x)) == len(x) >= 45 - 5
    recorded = read_ledger(ledger)[0]
    assert len(recorded) == len(keys)
    assert loader.stats()["cache"]["sources"]["x"]["kind"] == "cache"
    # flashfeed top sees the mixture's rank in the node cache it reads through
    from flashfeed.monitor.status import read_statuses

    assert len(read_statuses(str(tmp_path / "cache"))) == 1
    from flashfeed.monitor.top import TopView

    frame = TopView(str(tmp_path / "cache")).frame()
    assert any(line.strip().startswith("sources: x ") and "y " in line for line in frame)
    loader.close()
    del rows
    # flashfeed report: each source's delivered samples, from the stats log
    from flashfeed.cli import main

    assert main(["report", log]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("sources: "))
    for name in ("x", "y"):
        assert f"{name} {sum(k.startswith(name + ':') for k in keys)} (" in line


def test_image_mixture_through_dali_on_cpu(tmp_path):
    from flashfeed.loader import Loader

    a, b = str(tmp_path / "cats"), str(tmp_path / "dogs")
    make_image_dataset(a, [12, 12])
    make_image_dataset(b, [10, 10, 10], classes=5)
    mix = Mixture((Source(a, 1), Source(b, 3)), length=40)
    ledger = str(tmp_path / "ledger")
    loader = Loader(mix, batch_size=4, image_size=32, device="cpu", ledger_dir=ledger, seed=1)
    try:
        keys, labels = [], []
        for batch in loader:
            assert batch["image"].shape == (4, 3, 32, 32) and batch["label"].shape == (4,)
            keys += batch["__key__"]
            labels += batch["label"].tolist()
    finally:
        loader.close()
    assert len(keys) == 40
    assert sum(k.startswith("dogs:") for k in keys) == 30
    cats = [k for k in keys if k.startswith("cats:")]
    assert len(set(cats)) == len(cats) == 10
    # each label is the one its key's source wrote (n % classes, 10 or 5 classes)
    for key, label in zip(keys, labels, strict=True):
        n = int(key.rsplit("-", 1)[1])
        assert label == n % (10 if key.startswith("cats:") else 5)
    assert len(read_ledger(ledger)[0]) == 40


def test_shard_dataset_reads_a_mixture(tmp_path):
    from flashfeed.loader import ShardDataset

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_image_dataset(a, [8, 8])
    make_image_dataset(b, [6, 6], classes=3)
    ds = ShardDataset(Mixture((Source(a, 1), Source(b, 1)), length=20))
    keys = [s["__key__"] for s in ds]
    assert len(keys) == 20 and {k.split(":")[0] for k in keys} == {"a", "b"}
    assert sum(k.startswith("a:") for k in keys) == 10


def test_the_readme_mixture_example_runs(tmp_path):
    import re
    import subprocess
    import sys

    from support import REPO

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    block = [b for b in blocks if "Mixture(" in b and "TokenLoader(mix" in b]
    assert len(block) == 1
    script = tmp_path / "mix_example.py"
    script.write_text(block[0])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["400", "50", "100"]


def test_resume_across_a_scheduled_change_is_exact(corpora):
    from flashfeed.plan.mixture import Change

    mix = _mix(corpora, length=240, schedule=(Change(120, {"books": 6.0}, ramp=40),))
    full, _ = _rows(TokenLoader(mix, batch_size=6, rank=0, world_size=2, seed=7))
    assert len(full) == 120
    # before the change (global 120 = 60 per rank) books is 1/6, after the ramp 6/11
    assert sum(k.startswith("books:") for k in full[:60]) == pytest.approx(10, abs=2)
    assert sum(k.startswith("books:") for k in full[80:]) == pytest.approx(40 * 6 / 11, abs=2)
    for stop in (8, 10, 12):  # 48, 60 and 72 samples per rank: before, at, inside the ramp
        head, state = _stop(TokenLoader(mix, batch_size=6, rank=0, world_size=2, seed=7), stop)
        again = TokenLoader(mix, batch_size=6, rank=0, world_size=2, seed=7)
        again.load_state_dict(state)
        assert head + _rows(again)[0] == full


def test_shard_data_loader_workers_read_a_mixture(tmp_path):
    from flashfeed.loader import ShardDataset

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_image_dataset(a, [8, 8])
    make_image_dataset(b, [6, 6], classes=3)
    ds = ShardDataset(Mixture((Source(a, 1), Source(b, 3)), length=24), batch_size=4,
                      transform=lambda s: {"__key__": s["__key__"]})  # fmt: skip
    loader = ds.loader(num_workers=2)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert len(keys) == 24 and sum(k.startswith("b:") for k in keys) == 18
    a_keys = [k for k in keys if k.startswith("a:")]
    assert len(set(a_keys)) == len(a_keys) == 6


def test_prometheus_labels_series_by_source(corpora):
    import urllib.request

    pytest.importorskip("prometheus_client")
    loader = TokenLoader(_mix(corpora, length=120), batch_size=6, prometheus_port=0)
    try:
        keys = [k for b in loader for k in b["__key__"]]
        port = loader.recorder.exporter.port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        loader.close()
    for name in SIZES:
        line = next(x for x in body.splitlines()
                    if x.startswith("flashfeed_source_samples_total{") and
                    f'source="{name}"' in x)  # fmt: skip
        assert float(line.rsplit(" ", 1)[1]) == sum(k.startswith(name + ":") for k in keys)
    assert "flashfeed_source_storage_wait_seconds_total{" in body


def test_mixture_states_record_the_arrival_windows_and_old_ones_keep_the_first(corpora):
    default = TokenLoader(_mix(corpora, length=200), batch_size=4)
    assert default.state_dict()["arrival_windows"] == "first"  # the default, saved
    default.close()
    chosen = TokenLoader(_mix(corpora, length=200), batch_size=4, arrival_windows="all")
    state = _stop(chosen, 2)[1]
    assert state["arrival_windows"] == "all"  # the keyword's, saved
    loader = TokenLoader(_mix(corpora, length=200), batch_size=4)
    loader.load_state_dict(state)
    assert loader.position.options.arrival_windows == "all"
    old = {k: v for k, v in state.items() if k != "arrival_windows"}  # saved before the option
    loader.load_state_dict(old)
    assert loader.position.options.arrival_windows == "first"
    assert loader.state_dict()["arrival_windows"] == "first"
    with pytest.raises(ValueError, match="state field 'arrival_windows' must be one of"):
        loader.load_state_dict({**state, "arrival_windows": "every"})


def test_one_place_picks_a_loaders_position(corpora):
    """``plan_position``: a mixture's deals for a mixture, one dataset's plan (its plan
    entries per sample counted) for a dataset; plan entries per sample refused for a
    mixture."""
    mixed = TokenLoader(_mix(corpora), batch_size=4)
    one = TokenLoader(corpora["web"], batch_size=4)
    assert isinstance(mixed.position, MixPosition) and isinstance(one.position, Position)
    ctx, options = one.ctx, one.parts.options
    clips = plan_position(one.dataset, ctx, options, per_sample=3)
    assert clips.shard_sizes.tolist() == [3 * n for n in SIZES["web"]]
    with pytest.raises(ValueError, match="several plan entries per sample need one dataset"):
        plan_position(mixed.dataset, ctx, options, per_sample=2)
