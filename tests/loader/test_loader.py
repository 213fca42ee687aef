"""The DALI image Loader on CPU: plan order, int64 labels, exact resume proven by ledgers."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
import torch

from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader
from flashfeed.loader.telemetry.ledger import check_exactly_once
from flashfeed.plan.plan import PlanOptions, Topology, plan_epoch

from support.loader_helpers import label_of, make_image_dataset, resume_scenario

SIZES = [60, 60, 60, 60]  # 240 samples: divisible by 2 and 3 ranks x batch 4


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("img") / "ds")
    make_image_dataset(prefix, SIZES, size=16)
    return prefix


def _keys(prefix: str) -> list[str]:
    ds = Dataset.open(prefix)
    return [f"{s.path}/{e.key}" for i, s in enumerate(ds.shards) for e in ds.read_index(i)]


def test_batches_follow_the_plan_with_int64_labels(images):
    loader = Loader(images, batch_size=8, image_size=16, rank=1, world_size=2, seed=3)
    keys = _keys(images)
    plan = plan_epoch(SIZES, options=PlanOptions(seed=3), epoch=0, topology=Topology(2)).per_rank[1]
    expected = [label_of(keys[i].rsplit("/", 1)[1], 10) for i in plan]
    got = []
    for batch in loader:
        assert batch["image"].shape == (8, 3, 16, 16) and batch["image"].dtype == torch.float32
        assert batch["label"].dtype == torch.int64 and batch["label"].shape == (8,)
        got += batch["label"].tolist()
    assert got == expected[: len(got)] and len(got) == 120
    assert len(loader) == 15


def test_eval_images_are_the_planned_samples(images):
    # the synthetic images are flat colours chosen by label: the pixels prove the pairing
    loader = Loader(images, batch_size=16, image_size=16, shuffle=False, train=False)
    batch = next(iter(loader))
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    pixels = (batch["image"] * std + mean).mean(dim=(1, 2, 3))
    base = (batch["label"] * 37 % 200).float() + 20
    assert torch.all((pixels - base).abs() < 8), (pixels, base)


def test_json_labels_and_a_custom_pipeline(tmp_path):
    from nvidia.dali import fn

    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, [10, 7], size=16, label_ext="json", classes=3)

    def shapes(nodes):
        decoded = fn.decoders.image(nodes["image"], device="cpu")
        return {"shape": decoded.shape(), "label": nodes["label"]}

    loader = Loader(prefix, batch_size=4, pipeline=shapes, shuffle=False, drop_last=False)
    assert len(loader) == 5
    batches = list(loader)
    assert len(batches) == 5
    labels = torch.cat([b["label"] for b in batches])
    assert labels.dtype == torch.int64 and labels.tolist() == [n % 3 for n in range(17)]
    assert batches[0]["shape"].tolist()[0] == [16, 16, 3]
    assert len(batches[-1]["label"]) == 1  # the short last batch is delivered


def _factory(prefix, **kw):
    def make(rank, world, ledger_dir):
        return Loader(
            prefix,
            batch_size=4,
            image_size=16,
            rank=rank,
            world_size=world,
            seed=5,
            ledger_dir=ledger_dir,
            py_workers=0,
            **kw,
        )

    return make


def _assert_exactly_once(ledger, keys):
    checks = check_exactly_once(ledger, keys, epochs=[0, 1])
    assert all(c.ok for c in checks.values()), [str(c) for c in checks.values()]


@pytest.mark.parametrize(
    "before,after,stop",
    [(2, 2, 7), (2, 3, 6), (3, 2, 4), (2, 2, 30), (2, 3, 30)],
    ids=["same-mid", "grow-mid", "shrink-mid", "same-end", "grow-end"],
)
def test_interrupted_and_resumed_equals_uninterrupted(images, tmp_path, before, after, stop):
    full, resumed = resume_scenario(
        _factory(images), tmp_path, before=before, after=after, stop=stop
    )
    _assert_exactly_once(full, _keys(images))
    _assert_exactly_once(resumed, _keys(images))
    assert {e: sorted(h) for e, h in full.items()} == {e: sorted(h) for e, h in resumed.items()}


def test_resume_with_uneven_sizes_never_repeats(tmp_path):
    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, [23, 31, 17], size=16)
    full, resumed = resume_scenario(_factory(prefix), tmp_path, before=2, after=3, stop=5)
    for e in (0, 1):
        assert max(Counter(resumed[e]).values()) == 1
        # at most one short batch per rank plus the plan's surplus stays undelivered
        assert 71 - len(resumed[e]) < 3 * 4 + 3
        assert len(set(full[e]) - set(resumed[e])) <= 3 * 4 + 3


def test_state_resumes_the_same_batches_with_parallel_reader(images):
    first = Loader(images, batch_size=8, image_size=16, shuffle=False, train=False, py_workers=2)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    rest = [b["label"] for b in it]
    again = Loader(images, batch_size=8, image_size=16, shuffle=False, train=False, py_workers=2)
    again.load_state_dict(state)
    assert len(again) == len(rest) == 27
    for a, b in zip(rest, (b["label"] for b in again), strict=True):
        assert torch.equal(a, b)
    assert state["samples_consumed"] == 24 and state["epoch"] == 0


def test_epochs_advance_without_set_epoch_and_reshuffle(images):
    loader = Loader(images, batch_size=60, image_size=16, py_workers=0)
    a = torch.cat([b["label"] for b in loader])
    b = torch.cat([b["label"] for b in loader])
    assert loader.epoch == 1 and len(a) == len(b) == 240
    assert not torch.equal(a, b) and sorted(a.tolist()) == sorted(b.tolist())


def test_a_missing_shard_is_named(images, tmp_path):
    import shutil

    copy = str(tmp_path / "ds")
    shutil.copytree(images, copy)
    os.remove(os.path.join(copy, "shards", "000002.tar"))
    with pytest.raises(CorruptShardError, match=r"shards/000002\.tar.*missing"):
        for _ in Loader(copy, batch_size=8, image_size=16, py_workers=0):
            pass


def test_a_corrupt_shard_is_named(images, tmp_path):
    import shutil

    copy = str(tmp_path / "ds")
    shutil.copytree(images, copy)
    path = os.path.join(copy, "shards", "000001.tar")
    data = bytearray(open(path, "rb").read())
    data[2000:2010] = b"X" * 10
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptShardError, match=r"shards/000001\.tar.*checksum"):
        for _ in Loader(copy, batch_size=8, image_size=16, py_workers=0):
            pass


def test_stats_split_the_waits(images, tmp_path):
    log = tmp_path / "stats.jsonl"
    loader = Loader(images, batch_size=16, image_size=16, stats_log=str(log))
    n = sum(1 for _ in loader)
    s = loader.stats()
    assert s["batches"] == n == 15 and s["samples"] == 240
    assert s["samples_per_s"] > 0 and s["wait_s"]["decode"] > 0
    assert set(s["wait_fraction"]) == {"storage", "decode", "h2d", "total"}
    assert 0 < s["wait_fraction"]["total"] <= 1.0 + 1e-6
    assert s["cache"]["hits"] >= 4
    lines = log.read_text().splitlines()
    assert len(lines) == 15 and '"decode"' in lines[0]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"batch_size": 4, "num_threads": 0}, "num_threads"),
        ({"batch_size": 4, "rank": 2, "world_size": 2}, r"rank must be in \[0, 2\)"),
        ({"batch_size": 4, "device": "tpu"}, "device must be"),
        ({"batch_size": 4, "fields": {}}, "fields must be"),
    ],
)
def test_bad_options_are_clear_errors(images, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Loader(images, **kwargs)


def test_a_state_from_another_dataset_is_refused(images, tmp_path):
    other = str(tmp_path / "other")
    make_image_dataset(other, [5, 5], size=16)
    state = Loader(other, batch_size=2).state_dict()
    with pytest.raises(ValueError, match="another dataset"):
        Loader(images, batch_size=2).load_state_dict(state)


def test_rank_and_world_size_come_from_the_environment(monkeypatch, images):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    loader = Loader(images, batch_size=4)
    assert (loader.ctx.rank, loader.ctx.world_size, loader.ctx.ranks_per_node) == (2, 4, 2)
    assert np.array_equal(
        loader.position.remaining(),
        plan_epoch(SIZES, options=PlanOptions(), epoch=0, topology=Topology(4, 2)).per_rank[2],
    )


def test_one_pipeline_serves_every_epoch_until_a_pass_is_left_early(images):
    keys = _keys(images)
    labels_of = np.array([label_of(k.rsplit("/", 1)[1], 10) for k in keys])
    loader = Loader(images, batch_size=16, image_size=16, py_workers=1, seed=2)
    for epoch in range(2):
        got = torch.cat([b["label"] for b in loader]).numpy()
        assert np.array_equal(
            got,
            labels_of[
                plan_epoch(
                    SIZES, options=PlanOptions(seed=2), epoch=epoch, topology=Topology()
                ).per_rank[0]
            ],
        )
    assert loader.runner.builds == 1
    it = iter(loader)
    first = next(it)["label"].numpy()
    del it  # left early: the batches in flight are run out, the pipeline serves on
    rest = torch.cat([b["label"] for b in loader]).numpy()
    expected = labels_of[
        plan_epoch(SIZES, options=PlanOptions(seed=2), epoch=2, topology=Topology()).per_rank[0]
    ]
    assert np.array_equal(np.concatenate([first, rest]), expected)
    assert loader.runner.builds == 1 and loader.runner.abandoned == 1
    loader.close()
    assert not os.path.exists(loader.runner.pass_dir)


def test_context_precedence_explicit_then_environment_then_single_process():
    from flashfeed.loader.distributed import cuda_device_index, resolve_context

    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert resolve_context(env=env) == resolve_context(rank=5, world_size=8, ranks_per_node=4)
    assert resolve_context(rank=0, world_size=2, env=env).rank == 0
    assert resolve_context(env={}).world_size == 1
    assert cuda_device_index(env, device_count=2) == 1
    with pytest.raises(ValueError, match="WORLD_SIZE must be an integer"):
        resolve_context(env={"RANK": "0", "WORLD_SIZE": "two"})


@pytest.mark.parametrize("py_workers", [0, 1])
def test_a_bad_label_is_named_also_from_a_reader_process(tmp_path, py_workers):
    import io

    from PIL import Image

    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_tar_shard

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="JPEG")
    samples = [
        (f"k{i}", {"jpg": buf.getvalue(), "cls": b"abc" if i == 5 else b"1"}) for i in range(8)
    ]
    prefix = str(tmp_path / "ds")
    info = write_tar_shard(prefix, shard_name(0, "tar"), samples)
    commit_manifest(
        prefix, Manifest(name="x", shard_format="webdataset", schema={}, shards=(info,))
    )
    loader = Loader(prefix, batch_size=4, image_size=8, shuffle=False, py_workers=py_workers)
    with pytest.raises(CorruptShardError, match=r"shards/000000\.tar sample 'k5': label \.cls"):
        for _ in loader:
            pass


def test_extra_fields_pass_through_as_raw_bytes(tmp_path):
    import io
    import json

    from PIL import Image

    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.shardio import shard_name, write_tar_shard

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="JPEG")
    meta = [json.dumps({"id": "x" * i}).encode() for i in range(6)]
    samples = [(f"k{i}", {"jpg": buf.getvalue(), "cls": b"2", "json": meta[i]}) for i in range(6)]
    prefix = str(tmp_path / "ds")
    info = write_tar_shard(prefix, shard_name(0, "tar"), samples)
    commit_manifest(
        prefix, Manifest(name="x", shard_format="webdataset", schema={}, shards=(info,))
    )
    fields = {"image": "jpg", "label": "cls", "meta": "json"}
    loader = Loader(prefix, batch_size=3, image_size=8, shuffle=False, fields=fields)
    batches = list(loader)
    assert [b["label"].tolist() for b in batches] == [[2, 2, 2], [2, 2, 2]]
    got = [bytes(t.numpy()) for b in batches for t in b["meta"]]
    assert got == meta
