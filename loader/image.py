"""``Loader``: plan -> shards (local or node cache) -> DALI decode/augment -> torch batches."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from flashfeed.dataset import Dataset
from flashfeed.mixture import Mixture

from .base import Made, PlannedLoader
from .convert import DeviceCopier, HostPool, to_keys, to_torch
from .dali_runner import DaliRunner, collect_dropped_pipelines, cuda_initialized, py_start_method
from .fields import KEY, parse_fields
from .parts import SharedKeywords, loader_parts
from .passorder import PassOrder
from .pipeline import AugmentOptions, PipelineFn, build_pipeline, cuda_device, decode_device
from .reader import BatchSource, ShardReader
from .spawncheck import SpawnError, check_spawnable_main, spawn_failure_hint

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Batch", "Loader"]

#: one batch: output name -> tensor (a list of per-sample tensors for ragged raw fields),
#: and ``"__key__"``: each sample's ``<shard>/<key>``, carried through DALI with it
Batch = dict[str, torch.Tensor | list[torch.Tensor] | list[str]]


class Loader(PlannedLoader):
    """Batches of a WebDataset-format dataset, decoded by DALI in the order of the plan.

    ``device``: ``"gpu"`` (nvJPEG "mixed" decode; needs a CUDA build of torch), ``"cpu"``, or
    ``"auto"``. ``reader_start``: how DALI starts its ``py_workers`` reader processes,
    ``"fork"``, ``"spawn"``, or ``"auto"``: spawn when decode runs on the GPU or this process
    has already initialised CUDA (DALI cannot fork then), fork otherwise; a spawning loader
    built by a script without an ``if __name__ == "__main__":`` guard raises ``SpawnError``
    (``spawncheck.py``). Every loader's
    keywords (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.

    >>> loader = Loader("s3://b/imagenet", batch_size=256, cache_dir="/nvme/ff")  # doctest: +SKIP
    >>> for batch in loader:                                                      # doctest: +SKIP
    ...     batch["image"].shape, batch["label"].dtype  # (256, 3, 224, 224), torch.int64
    ...     batch["__key__"][0]                         # 'shards/000042.tar/n01440764_10026'
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture,
        *,
        batch_size: int,
        image_size: int = 224,
        train: bool | None = None,
        device: str = "auto",
        pipeline: PipelineFn | None = None,
        fields: Mapping[str, str | Sequence[str]] | None = None,
        num_threads: int = 2,
        py_workers: int = 1,
        reader_start: str = "auto",
        prefetch: int = 2,
        **shared: Unpack[SharedKeywords],
    ) -> None:
        created = time.perf_counter()
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if py_workers < 0:
            raise ValueError(f"py_workers must be >= 0, got {py_workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        parts = loader_parts("Loader", dataset, shard_format="webdataset", keywords=shared)
        opened = time.perf_counter()
        self.specs = parse_fields(fields)
        self.device_kind = decode_device(device)
        # decided now, before the caller's next CUDA call could change the answer
        self.py_start_method = py_start_method(
            reader_start,
            decode_on_gpu=self.device_kind == "gpu",
            cuda_initialized=cuda_initialized(),
        )
        if self.py_start_method == "spawn" and py_workers:
            check_spawnable_main("Loader", reader_start=reader_start)
        self.augment = AugmentOptions(
            image_size=image_size,
            train=parts.options.shuffle if train is None else train,
            device=self.device_kind,
        )
        super().__init__(parts, batch_size=batch_size)
        self.user_pipeline = pipeline
        self.num_threads = num_threads
        self.py_workers = py_workers
        self.prefetch = prefetch
        # decode_device() made sure a "gpu" loader has a CUDA torch
        self.torch_device = cuda_device() if self.device_kind == "gpu" else None
        self.copier = DeviceCopier(self.torch_device) if self.torch_device is not None else None
        self.host_pool = HostPool()  # CPU batches: reused once nothing refers to them
        self.runner = DaliRunner(self._build, self._source)
        #: start-up seconds, filled in up to the first batch: ``stats()["startup"]``
        self.startup: dict[str, float] = {
            "construction_s": time.perf_counter() - created,
            "manifest_s": opened - created,
        }
        self._created = created
        self._build_timings: dict[str, float] = {}

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        return self._pass_iter(self._run(self.begin_pass()))

    def _build(self, batch_source: BatchSource) -> tuple[Any, list[str]]:
        if self.py_workers:
            collect_dropped_pipelines(self.runner)
        try:
            return self._build_pipeline(batch_source)
        except RuntimeError as exc:
            if self.py_start_method == "spawn" and "Workers initialization failed" in str(exc):
                raise SpawnError(spawn_failure_hint()) from exc
            raise

    def _build_pipeline(self, batch_source: BatchSource) -> tuple[Any, list[str]]:
        return build_pipeline(
            batch_source,
            specs=self.specs,
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            py_workers=self.py_workers,
            augment=self.augment,
            user_fn=self.user_pipeline,
            seed=self._aug_seed(),
            prefetch=self.prefetch,
            py_start_method=self.py_start_method,
            device_id=self.torch_device.index or 0 if self.torch_device is not None else 0,
            timings=self._build_timings,
        )

    def _source(self, pass_dir: str) -> BatchSource:
        reader = ShardReader(self.source, self.shard_names)
        return BatchSource(reader, batch_size=self.batch_size, specs=self.specs, pass_dir=pass_dir)

    def _lookahead(self) -> int:
        return self.prefetch + 1  # DALI asks for up to ``prefetch`` batches ahead of a run

    def _run(self, order: PassOrder) -> Generator[Batch, None, None]:
        feeder = self.stream(order, lookahead=self._lookahead())
        try:
            # the first batches' fetches start, then the pipeline builds while they run: a
            # built pipeline takes no sample before the first run(), after wait_ready(0)
            feeder.ask(0)
            startup = self.runner.start(order) if order.num_batches else 0.0
            storage = feeder.wait_ready(0)
            if "first_batch_s" not in self.startup and order.num_batches:
                reader = self._build_timings.get("reader_start_s", 0.0)
                self.startup["pipeline_build_s"] = max(startup - reader, 0.0)
                self.startup["reader_start_s"] = reader
                self.startup["first_fetch_s"] = storage
            yield from self._deliver_batches(
                order, feeder, lambda k: self._make(startup if k == 0 else 0.0), storage=storage
            )
            if order.num_batches:
                self.runner.finish()
            self._end_epoch()
        except GeneratorExit:  # left early: keep the pipeline (and its readers) for the next
            self.runner.abandon()
            raise
        finally:
            feeder.close()

    def _make(self, startup: float) -> Made[Batch]:
        """The pipeline's next batch as torch tensors (``startup``: seconds the pipeline
        took to start, counted as this batch's decode time)."""
        t1 = time.perf_counter()
        outputs = self.runner.run()
        t2 = time.perf_counter()
        out = dict(zip(self.runner.names, outputs, strict=True))
        keys = to_keys(out.pop(KEY))
        batch, h2d = self._to_batch(out, outputs)
        batch[KEY] = keys
        t3 = time.perf_counter()
        if "first_batch_s" not in self.startup:
            self.startup["first_decode_s"] = t2 - t1
            self.startup["first_batch_s"] = t3 - self._created
        return Made(batch, keys, t2 - t1 + startup, h2d if h2d is not None else t3 - t2)

    def _to_batch(self, out: dict[str, Any], outputs: Any) -> tuple[Batch, float | None]:
        """The batch as torch tensors, and on a GPU the seconds the GPU spent copying (from
        CUDA events, for batches whose copies have finished; None on the CPU)."""
        copier = self.copier
        if copier is not None:
            copier.begin()
        batch: Batch = {
            n: to_torch(o, self._out_device(n), copier, self.host_pool) for n, o in out.items()
        }
        label = batch.get("label")
        if isinstance(label, torch.Tensor) and label.ndim > 1:
            batch["label"] = label.reshape(-1)
        if copier is None:
            return batch, None
        copier.end(keep=[outputs])  # DALI's buffers go back once the copies are done
        return batch, copier.take_h2d()

    def _out_device(self, name: str) -> torch.device | None:
        return self.torch_device

    def _aug_seed(self) -> int:
        o = self.position.options
        return hash((o.seed, self.position.epoch, self.ctx.rank, self.position.consumed))

    def stats(self) -> dict[str, Any]:
        """``PlannedLoader.stats()`` plus ``"startup"``: seconds of construction (of which
        ``manifest_s``: opening the dataset and its source), then on the first pass's path
        to its first batch: ``pipeline_build_s`` (the DALI graph, the pass file),
        ``reader_start_s`` (``pipe.build()``: executor and reader processes),
        ``first_fetch_s`` (the wait left for the first batch's bytes), ``first_decode_s``,
        and ``first_batch_s`` from ``Loader(...)`` to the first batch in hand."""
        out = super().stats()
        out["startup"] = dict(self.startup)
        return out

    def close(self) -> None:
        """Stop the DALI pipeline and its reader processes; close the stats log."""
        if self.copier is not None:
            self.copier.flush()
        self.runner.close()
        super().close()
