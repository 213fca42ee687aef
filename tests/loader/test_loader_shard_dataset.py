"""ShardDataset: the plan under a torch DataLoader, worker-aware and resumable."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from flashfeed.dataset import Dataset
from flashfeed.loader import ShardDataset
from flashfeed.loader.telemetry.ledger import check_exactly_once
from flashfeed.plan.plan import PlanOptions, Topology, plan_epoch

from support.loader_helpers import label_of, make_image_dataset, resume_scenario

SIZES = [60, 60, 60, 60]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    prefix = str(tmp_path_factory.mktemp("sd") / "ds")
    make_image_dataset(prefix, SIZES, size=8)
    return prefix


def to_tensor(sample):
    img = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB"))
    return {
        "image": torch.from_numpy(img.copy()).permute(2, 0, 1),
        "label": sample["cls"],
        "__key__": sample["__key__"],
        "__shard__": sample["__shard__"],
        "__index__": sample["__index__"],
    }


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_follow_the_plan(images, workers):
    ds = ShardDataset(images, batch_size=8, transform=to_tensor, rank=0, world_size=2, seed=1)
    loader = ds.loader(num_workers=workers)
    assert len(loader) == 15
    batches = list(loader)
    ids = torch.cat([b["__index__"] for b in batches]).numpy()
    assert np.array_equal(
        ids,
        plan_epoch(SIZES, options=PlanOptions(seed=1), epoch=0, topology=Topology(2)).per_rank[0],
    )
    labels = torch.cat([b["label"] for b in batches])
    assert labels.dtype == torch.int64
    keys = [k for b in batches for k in b["__key__"]]
    assert labels.tolist() == [label_of(k, 10) for k in keys]
    assert batches[0]["image"].shape == (8, 3, 8, 8)
    assert ds.state_dict()["samples_consumed"] == 240 and ds.stats()["batches"] == 15


def test_iterating_the_dataset_directly_is_resumable(images):
    ds = ShardDataset(images, seed=2, fields={"jpg": "jpg", "label": "cls"})
    it = iter(ds)
    first = [next(it)["__index__"] for _ in range(37)]
    state = ds.state_dict()
    del it
    again = ShardDataset(images, seed=2, fields={"jpg": "jpg", "label": "cls"})
    again.load_state_dict(state)
    rest = [s["__index__"] for s in again]
    assert sorted(first + rest) == list(range(240))
    sample = next(iter(ShardDataset(images, fields={"jpg": "jpg", "label": "cls"})))
    assert isinstance(sample["jpg"], bytes) and isinstance(sample["label"], np.int64)


def _factory(prefix, workers):
    def make(rank, world, ledger_dir):
        ds = ShardDataset(
            prefix, batch_size=4, rank=rank, world_size=world, seed=7, ledger_dir=ledger_dir
        )
        return ds.loader(num_workers=workers)

    return make


@pytest.mark.parametrize(
    "before,after,stop,workers",
    [(2, 2, 9, 0), (2, 3, 6, 0), (3, 2, 4, 2), (2, 2, 30, 0), (2, 3, 30, 2)],
    ids=["same-mid", "grow-mid", "shrink-mid-workers", "same-end", "grow-end-workers"],
)
def test_interrupted_and_resumed_equals_uninterrupted(
    images, tmp_path, before, after, stop, workers
):
    full, resumed = resume_scenario(
        _factory(images, workers), tmp_path, before=before, after=after, stop=stop
    )
    ds = Dataset.open(images)
    keys = [f"{s.path}/{e.key}" for i, s in enumerate(ds.shards) for e in ds.read_index(i)]
    for ledger in (full, resumed):
        checks = check_exactly_once(ledger, keys, epochs=[0, 1])
        assert all(c.ok for c in checks.values()), [str(c) for c in checks.values()]
    assert {e: sorted(h) for e, h in full.items()} == {e: sorted(h) for e, h in resumed.items()}


def test_plan_fixed_options_are_refused(images):
    ds = ShardDataset(images, batch_size=4)
    with pytest.raises(ValueError, match="batch_size= is fixed by the plan"):
        ds.loader(batch_size=8)
    with pytest.raises(ValueError, match="persistent_workers"):
        ds.loader(num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="transform must be callable"):
        ShardDataset(images, transform=3)
