"""A dataset read in place checks each shard on its first use; the shards first needed by one
ask of the read-ahead are checked side by side, and a bad one among them still fails the
pass naming it."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader
from flashfeed.loader.passorder import PassOrder
from flashfeed.loader.readahead import StreamFeeder
from flashfeed.loader.sources import LocalShardSource

from support.loader_helpers import make_image_dataset


class MeetingSource(LocalShardSource):
    """Its checks wait (up to 5 s) until two of them run at once, and count the most that
    ever did: checks made one after another never meet."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset)
        self.active = 0
        self.most = 0
        self.threads: set[str] = set()
        self.met = threading.Event()
        self.guard = threading.Lock()

    def local_path(self, shard: int) -> str:
        with self.guard:
            self.active += 1
            self.most = max(self.most, self.active)
            self.threads.add(threading.current_thread().name)
            if self.active >= 2:
                self.met.set()
        try:
            self.met.wait(5.0)
            return super().local_path(shard)
        finally:
            with self.guard:
                self.active -= 1


def _feeder(source: LocalShardSource, shards: int) -> StreamFeeder:
    # batch 0 reads one sample of every shard
    order = PassOrder(np.arange(shards), np.arange(shards), np.zeros(shards, np.int64), shards, 1)
    return StreamFeeder(
        source,
        order,
        shard_bytes=[1] * shards,
        shard_samples=[1] * shards,
        lookahead=0,
        readahead=0,
        budget=0,
    )


def test_the_shards_of_one_ask_are_checked_side_by_side(tmp_path: Path) -> None:
    root = str(tmp_path / "ds")
    make_image_dataset(root, [2, 2, 2, 2])
    source = MeetingSource(Dataset.open(root))
    feeder = _feeder(source, 4)
    try:
        feeder.ask(0)
        feeder.wait_ready(0)
        assert source.most >= 2  # two checks ran at once
        assert len(source.threads) >= 2  # this thread's and the read-ahead's
        assert source.stats()["hits"] == 4
        paths = [source.local_path(s) for s in range(4)]  # checked once, kept
        assert paths == [str(Path(root) / s.path) for s in Dataset.open(root).shards]
    finally:
        feeder.close()


def test_a_lone_shard_is_checked_in_the_asking_thread(tmp_path: Path) -> None:
    root = str(tmp_path / "ds")
    make_image_dataset(root, [2])
    source = MeetingSource(Dataset.open(root))
    source.met.set()  # nothing to meet
    feeder = _feeder(source, 1)
    try:
        feeder.ask(0)
        assert source.threads == {threading.current_thread().name}
    finally:
        feeder.close()


def test_a_bad_shard_among_those_checked_side_by_side_fails_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [4, 4, 4, 4])
    bad = Dataset.open(str(root)).shards[2].path
    data = bytearray((root / bad).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    (root / bad).write_bytes(bytes(data))
    loader = Loader(str(root), batch_size=16, image_size=16, device="cpu", window=4)
    try:
        with pytest.raises(CorruptShardError, match=bad):
            for _ in loader:
                pass
    finally:
        loader.close()
