"""``ShardDataset``: the plan as a torch ``IterableDataset``, for your own CPU transforms.

Each sample is a dict ``{"__key__", "__shard__", "__index__", field: bytes | int64 label}``
passed through ``transform``; ``__key__`` is ``<shard path>/<sample key>``, read from the
shard with the sample (as in every flashfeed loader's batches), ``__shard__`` the shard path.
Under a ``DataLoader`` with ``num_workers=W`` worker ``w`` produces batches ``w, w+W, ...``
of the plan, so the loader's round-robin yields the plan's batches in order. The first
epoch streams: a sample is served as soon as its bytes have arrived in the node cache, while
the rest of its shard is still being fetched (``StreamFeeder``, as in ``Loader``).
``ShardDataLoader`` (``ShardDataset.loader()``) counts what the consumer received, which is
what ``state_dict()`` must describe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture
from flashfeed.runtime.lifeline import tie_to_parent

from .base import PlannedLoader
from .image.fields import KEY, FieldSpec, parse_fields
from .image.labels import parse_label
from .parts import SharedKeywords, loader_parts
from .passorder import PassOrder
from .shardreader import ShardReader
from .telemetry.stats import StatsRecorder

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
    yields every member of a sample, labels (``.cls``/``.json``...) parsed to int64. Every
    loader's keywords (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture | Mapping[str, Any],
        *,
        batch_size: int = 1,
        transform: Transform | None = None,
        fields: Mapping[str, str | Sequence[str]] | None = None,
        **shared: Unpack[SharedKeywords],
    ) -> None:
        if transform is not None and not callable(transform):
            raise ValueError(f"transform must be callable, got {type(transform).__name__}")
        parts = loader_parts("ShardDataset", dataset, shard_format="webdataset", keywords=shared)
        PlannedLoader.__init__(self, parts, batch_size=batch_size)
        self.transform = transform
        self.specs: tuple[FieldSpec, ...] | None = parse_fields(fields) if fields else None
        self._driven = False
        self._trainer_pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["recorder"] = StatsRecorder(rank=self.ctx.rank)  # workers neither log nor export
        state["ledger"] = None
        state["_feeder"] = None  # a worker streams its share through a feeder of its own
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
            return self._pass_iter(self._samples(self.begin_pass(), 0, 1, in_process=True))
        # under a ShardDataLoader, which counts deliveries itself; in a worker, the position
        # is the one the main process had at iter(DataLoader)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:  # a DataLoader worker dies with the trainer, however it dies
            # the trainer's pid was taken before the fork: a worker that starts after the
            # trainer died must not tie itself to whoever adopted it
            tie_to_parent(self._trainer_pid or os.getppid(), kernel_signal=False)
        # the main process began this pass (``ShardDataLoader.__iter__``): this copy of the
        # loader, in a worker or driven in-process, reads its share of the same pass
        return self._samples(self.begin_pass(), worker, workers, in_process=False)

    def _sample(self, reader: ShardReader, order: PassOrder, j: int) -> dict[str, Any]:
        shard, row = int(order.shards[j]), int(order.rows[j])
        name = self.shard_names[shard]
        sample: dict[str, Any] = {"__shard__": name, "__index__": int(order.ids[j])}
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
        self, order: PassOrder, worker: int, workers: int, *, in_process: bool
    ) -> Generator[Any, None, None]:
        reader = ShardReader(self.source, self.shard_names)
        feeder = self.stream(order, lookahead=1)
        epoch = self.position.epoch
        try:
            for k in range(worker, order.num_batches, workers):
                storage = feeder.wait_ready(k)
                sl = order.batch_slice(k)
                for j in range(sl.start, sl.stop):
                    t0 = time.perf_counter()
                    sample = self._sample(reader, order, j)
                    out = self.transform(sample) if self.transform else sample
                    if in_process:
                        work = time.perf_counter() - t0
                        self.deliver(
                            1,
                            keys=[sample[KEY]],
                            epoch=epoch,
                            batch=self.position.consumed,
                            storage=storage,
                            decode=work,
                        )
                        storage = 0.0
                    yield out
            feeder.finish()  # samples served while their shard arrived: checked here
            if in_process:
                self._end_epoch()
        finally:
            feeder.close()
            reader.close()

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
        ds.begin_pass()
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
            keys = _batch_keys(batch, n) if ds.ledger is not None else None
            ds.deliver(n, keys=keys, epoch=epoch, batch=k, decode=wait)
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
