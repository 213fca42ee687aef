"""What this process has told its ``ShardCache`` about the future: read order and needs.

``set_future`` gives a dataset's upcoming read order (the plan's): eviction then removes the
shard read last, and a fetch ahead evicts only shards needed later than the one it fetches.
``need`` says which batch first needs which samples of a shard, so fills fetch its parts in
need order. ``ReadHints`` keeps both, per dataset, behind one lock; the cache asks it for a
shard's next use (eviction) and a fill's part priority (fetching). ``set_mixture_future``
gives the merged read order of a mixture's sources: their next uses then share one clock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from flashfeed.runtime.files import atomic_write_json

from .fetch.needorder import SPECULATIVE, URGENT, PartPriority, ShardNeed
from .layout import DatasetDir
from .policy import FutureOrder, MixtureFuture

__all__ = ["ReadHints"]


class ReadHints:
    """The read order and the sample needs given to one cache in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[str, FutureOrder] = {}
        self._mixtures: dict[str, MixtureFuture] = {}  # each source's key -> its mixture's
        self._needs: dict[tuple[str, int], ShardNeed] = {}

    def advance(self, key: str, shard: int) -> None:
        """A read of ``shard`` of the dataset ``key``: its position in the order moves on."""
        with self._lock:
            mixture = self._mixtures.get(key)
            if mixture is not None:
                mixture.advance(key, shard)
                return
            future = self._futures.get(key)
            if future is not None:
                future.advance(shard)

    def set_future(self, d: DatasetDir, shards_in_order: Sequence[int], *, active: int) -> None:
        """A new pass over ``d``'s dataset: its read order, recorded beside its shards for
        ``cache status``; the needs of the last pass are forgotten."""
        order = FutureOrder(shards_in_order, active=active)
        with self._lock:
            self._futures[d.key] = order
            self._mixtures.pop(d.key, None)
            self._needs = {k: v for k, v in self._needs.items() if k[0] != d.key}
        atomic_write_json(d.future_path, {"order": order.order, "updated": time.time()})

    def set_mixture_future(
        self, dirs: Sequence[DatasetDir], order: Sequence[tuple[int, int]], *, active: int
    ) -> None:
        """A new pass over a mixture of ``dirs``' datasets: ``order`` holds (source number,
        shard) in the merged read order. Each source's part is recorded beside its shards;
        the needs of the last pass are forgotten."""
        keys = [d.key for d in dirs]
        for s, _ in order:
            if not 0 <= s < len(dirs):
                raise ValueError(f"source number must be in [0, {len(dirs)}), got {s}")
        mixture = MixtureFuture([(keys[s], i) for s, i in order], keys=keys, active=active)
        with self._lock:
            for key in keys:
                self._futures.pop(key, None)
                self._mixtures[key] = mixture
            self._needs = {k: v for k, v in self._needs.items() if k[0] not in mixture.sources}
        now = time.time()
        for d in dirs:
            atomic_write_json(d.future_path, {"order": mixture.shards(d.key), "updated": now})

    def set_need(self, key: str, shard: int, need: ShardNeed) -> None:
        with self._lock:
            self._needs[(key, shard)] = need

    def next_use(self, key: str, shard: int) -> float:
        """When ``shard`` is read next in the given order; infinity when no order says."""
        with self._lock:
            mixture = self._mixtures.get(key)
            if mixture is not None:
                return mixture.next_use(key, shard)
            future = self._futures.get(key)
            return future.next_use(shard) if future is not None else math.inf

    def priority(self, key: str, shard: int, *, speculative: bool) -> PartPriority:
        """The order of a fill's parts: by need when one was given, else a read's parts
        before a fetch ahead's."""
        with self._lock:
            need = self._needs.get((key, shard))
        return PartPriority(need, default=SPECULATIVE if speculative else URGENT)
