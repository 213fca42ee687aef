"""``ShardDataset``: the plan as a torch ``IterableDataset``, for your own CPU transforms.

Each sample is a dict ``{"__key__", "__shard__", "__index__", field: bytes | int64 label}``
passed through ``transform``; ``__key__`` is ``<shard path>/<sample key>``, read from the
shard with the sample (as in every flashfeed loader's batches), ``__shard__`` the shard path.
Under a ``DataLoader`` with ``num_workers=W`` worker ``w`` produces batches ``w, w+W, ...``
of the plan, so the loader's round-robin yields the plan's batches in order.
``ShardDataLoader`` (``ShardDataset.loader()``) counts what the consumer received, which is
what ``state_dict()`` must describe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from flashfeed.dataset import Dataset
from flashfeed.lifeline import tie_to_parent

from .base import PlannedLoader
from .distributed import resolve_context
from .fields import KEY, FieldSpec, parse_fields
from .labels import parse_label
from .passplan import PassPlan, ShardFeeder, make_pass
from .position import PlanOptions
from .reader import ShardReader
from .sources import ShardSource, open_dataset, open_source
from .stats import BatchTiming, StatsRecorder

__all__ = ["ShardDataLoader", "ShardDataset", "collate_samples"]

Transform = Callable[[dict[str, Any]], Any]


def collate_samples(samples: list[Any]) -> Any:
    """``default_collate`` that keeps bytes and strings as lists instead of failing."""
    if samples and isinstance(samples[0], Mapping):
        return {k: collate_samples([s[k] for s in samples]) for k in samples[0]}
    if samples and isinstance(samples[0], (bytes, str, memoryview)):
        return list(samples)
    return default_collate(samples)


class ShardDataset(PlannedLoader, IterableDataset):
    """This rank's samples of a webdataset dataset, in plan order; resumable.

    ``batch_size`` must match the ``DataLoader``'s (``loader()`` sets both); ``fields=None``
    yields every member of a sample, labels (``.cls``/``.json``...) parsed to int64.
    """

    def __init__(
        self,
        dataset: str | Dataset,
        *,
        batch_size: int = 1,
        transform: Transform | None = None,
        fields: Mapping[str, str | Sequence[str]] | None = None,
        cache_dir: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        ranks_per_node: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        window: int = 4,
        readahead: int = 4,
        cache: Any = None,
        source: ShardSource | None = None,
        storage_options: dict[str, Any] | None = None,
        ledger_dir: str | None = None,
        stats_log: str | None = None,
        prometheus_port: int | None = None,
        prometheus_addr: str = "127.0.0.1",
    ) -> None:
        ds = open_dataset(dataset, storage_options, cache_dir=cache_dir, cache=cache)
        if ds.manifest.shard_format != "webdataset":
            raise ValueError(f"{ds.url} holds {ds.manifest.shard_format} shards, not webdataset")
        if transform is not None and not callable(transform):
            raise ValueError(f"transform must be callable, got {type(transform).__name__}")
        PlannedLoader.__init__(
            self,
            ds,
            ctx=resolve_context(rank=rank, world_size=world_size, ranks_per_node=ranks_per_node),
            batch_size=batch_size,
            options=PlanOptions(seed=seed, shuffle=shuffle, drop_last=drop_last, window=window),
            source=source
            or open_source(ds, cache_dir=cache_dir, cache=cache, storage_options=storage_options),
            ledger_dir=ledger_dir,
            stats_log=stats_log,
            prometheus_port=prometheus_port,
            prometheus_addr=prometheus_addr,
        )
        self.transform = transform
        self.specs: tuple[FieldSpec, ...] | None = parse_fields(fields) if fields else None
        self.readahead = readahead
        self._driven = False
        self._trainer_pid: int | None = None

    def _pass_plan(self) -> PassPlan:
        return make_pass(
            self.position.remaining(),
            self.position.shard_sizes,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["recorder"] = StatsRecorder(rank=self.ctx.rank)  # workers neither log nor export
        state["ledger"] = None
        return state

    def __len__(self) -> int:
        """Samples the next pass yields (over all workers)."""
        return min(PlannedLoader.__len__(self) * self.batch_size, len(self.position.remaining()))

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None and not self._driven:
            raise RuntimeError(
                "a ShardDataset in a plain torch DataLoader with num_workers > 0 cannot keep "
                "its position (each worker holds a copy; nobody counts what the consumer "
                "received): use ShardDataset.loader(num_workers=...) instead, whose "
                "state_dict() resumes exactly"
            )
        if info is None and not self._driven:
            return self._pass_iter(self._samples(self._begin_pass(), 0, 1, in_process=True))
        # under a ShardDataLoader, which counts deliveries itself; in a worker, the position
        # is the one the main process had at iter(DataLoader)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:  # a DataLoader worker dies with the trainer, however it dies
            # the trainer's pid was taken before the fork: a worker that starts after the
            # trainer died must not tie itself to whoever adopted it
            tie_to_parent(self._trainer_pid or os.getppid(), kernel_signal=False)
        return self._samples(self._pass_plan(), worker, workers, in_process=False)

    def _sample(self, reader: ShardReader, plan: PassPlan, j: int) -> dict[str, Any]:
        shard, row = int(plan.shards[j]), int(plan.rows[j])
        name = self.shard_names[shard]
        sample: dict[str, Any] = {"__shard__": name, "__index__": int(plan.ids[j])}
        if self.specs is not None:
            key, values = reader.fields(shard, row, self.specs)
            sample.update(
                {
                    s.name: (np.int64(v) if s.is_label else v.tobytes())
                    for s, v in zip(self.specs, values, strict=True)
                }
            )
        else:
            key, members = reader.members(shard, row)
            for ext, data in members.items():
                is_label = ext in ("cls", "json") or ext.endswith(("cls", "label"))
                sample[ext] = (
                    parse_label(data.tobytes(), ext, where=f"shard {name} sample {key!r}")
                    if is_label
                    else data.tobytes()
                )
        sample[KEY] = f"{name}/{key}"
        return sample

    def _samples(
        self, plan: PassPlan, worker: int, workers: int, *, in_process: bool
    ) -> Generator[Any, None, None]:
        reader = ShardReader(self.source, self.shard_names)
        feeder = ShardFeeder(self.source, plan, lookahead=1, readahead=self.readahead)
        epoch = self.position.epoch
        try:
            for k in range(worker, plan.num_batches, workers):
                storage = feeder.ensure(k)
                sl = plan.batch_slice(k)
                for j in range(sl.start, sl.stop):
                    t0 = time.perf_counter()
                    sample = self._sample(reader, plan, j)
                    out = self.transform(sample) if self.transform else sample
                    if in_process:
                        self._delivered(epoch, sample, storage, time.perf_counter() - t0)
                        storage = 0.0
                    yield out
            if in_process:
                self._end_epoch()
        finally:
            reader.close()

    def _delivered(self, epoch: int, sample: dict[str, Any], storage: float, work: float) -> None:
        if self.ledger is not None:
            self.ledger.record(epoch, [sample[KEY]])
        self.position.advance(1)
        self.recorder.record(
            BatchTiming(
                t=time.time(),
                rank=self.ctx.rank,
                epoch=epoch,
                batch=self.position.consumed - 1,
                samples=1,
                storage=storage,
                decode=work,
                h2d=0.0,
                step=0.0,
            )
        )

    def loader(self, **kwargs: Any) -> ShardDataLoader:
        """A ``DataLoader`` over this dataset whose batches follow the plan and whose
        ``state_dict()`` counts what it delivered."""
        return ShardDataLoader(self, **kwargs)


class ShardDataLoader:
    """``torch.utils.data.DataLoader`` over a ``ShardDataset`` with the loader protocol:
    ``set_epoch``, ``state_dict``/``load_state_dict``, ``stats``, ledger of delivered keys.

    With ``ledger_dir``, the transform must keep ``__key__`` (dict samples): the ledger is
    written from the keys the consumer receives.
    """

    def __init__(self, dataset: ShardDataset, *, num_workers: int = 0, **kwargs: Any) -> None:
        for bad in ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"):
            if bad in kwargs:
                raise ValueError(f"{bad}= is fixed by the plan: set it on the ShardDataset instead")
        if kwargs.get("persistent_workers"):
            raise ValueError(
                "persistent_workers=True would keep each worker's copy of the plan position "
                "from the first pass; ShardDataLoader needs fresh workers every pass"
            )
        kwargs.setdefault("collate_fn", collate_samples)
        self.dataset = dataset
        self.loader = DataLoader(
            dataset, batch_size=dataset.batch_size, num_workers=num_workers, **kwargs
        )

    def __len__(self) -> int:
        return PlannedLoader.__len__(self.dataset)

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        return self.dataset.stats()

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        ds._refuse_second_pass()
        if ds._finished:
            ds.position.next_epoch()
            ds._finished = False
        epoch = ds.position.epoch
        ds._driven = True
        ds._trainer_pid = os.getpid()
        try:
            it = iter(self.loader)  # workers copy the position as it is now
        finally:
            ds._driven = False
        return ds._pass_iter(self._deliver(it, epoch))

    def _deliver(self, it: Iterator[Any], epoch: int) -> Generator[Any, None, None]:
        ds = self.dataset
        k = 0
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait = time.perf_counter() - t0
            n = _batch_len(batch)
            if ds.ledger is not None:
                ds.ledger.record(epoch, _batch_keys(batch, n))
            ds.position.advance(n)
            ds.recorder.record(
                BatchTiming(time.time(), ds.ctx.rank, epoch, k, n, 0.0, wait, 0.0, 0.0)
            )
            k += 1
            yield batch
        ds._end_epoch()


def _batch_keys(batch: Any, n: int) -> list[str]:
    """The ``__key__`` of a delivered batch, for the ledger."""
    keys = batch.get(KEY) if isinstance(batch, Mapping) else None
    if not isinstance(keys, (list, tuple)) or len(keys) != n:
        raise ValueError(
            f"ledger_dir needs every batch to carry {KEY!r} (a list of {n} <shard>/<key> "
            "strings): keep it in the transform's output"
        )
    return [str(k) for k in keys]


def _batch_len(batch: Any) -> int:
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()))
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0])
    return len(batch)
