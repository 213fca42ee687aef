"""What a loader reads of its dataset's manifest: shard names on demand, samples per shard,
the version (digest) a resume state must have been saved on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from flashfeed.dataset import Dataset

from .mixsource import MixtureDataset

__all__ = ["ShardNames", "check_version", "dataset_id", "shard_samples"]


class ShardNames(Sequence[str]):
    """Shard paths by number, read from the manifest's columnar table on demand: a loader
    for a million-shard dataset builds no list of a million strings (nor pickles one into
    each reader process)."""

    def __init__(self, dataset: Dataset | MixtureDataset) -> None:
        self._manifest = dataset.manifest

    def __len__(self) -> int:
        return int(self._manifest.num_shards)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._manifest.shard_path(j) for j in range(*i.indices(len(self)))]
        return self._manifest.shard_path(i)


def shard_samples(dataset: Dataset) -> np.ndarray:
    """Samples per shard as one array, from the manifest's columnar table."""
    return np.asarray(dataset.manifest.shard_samples, dtype=np.int64)


def dataset_id(dataset: Dataset) -> str:
    return str(dataset.manifest.digest)


def check_version(state: Any, dataset: Dataset) -> None:
    """A state saved on another version of this dataset (its ``"dataset"``: the version it
    was saved on) is refused naming both, with the way to continue on the recorded one."""
    if isinstance(state, dict) and state.get("kind") == "mixture":
        return  # the position refuses it, naming the mixture's sources
    saved = state.get("dataset") if isinstance(state, dict) else None
    current = dataset_id(dataset)
    if not (isinstance(saved, str) and saved and saved != current):
        return
    url = state.get("url")
    if isinstance(url, str) and url != dataset.url:
        raise ValueError(
            f"the state belongs to another dataset: it was saved reading {url} (version "
            f"{saved}), this loader reads {dataset.url} (version {current})"
        )
    if url is None:
        raise ValueError(
            f"the state was saved on version {saved}, and {dataset.url} holds version "
            f"{current}: it belongs to another dataset, or to another version of this one "
            f"(continue on that with dataset_version={saved!r})"
        )
    raise ValueError(
        f"the state was saved on version {saved} of {dataset.url}, which holds version "
        f"{current} now: start this version afresh, or continue on the recorded one with "
        f"dataset_version={saved!r} (read from the node cache, or from the store if it "
        "still holds its shards)"
    )
