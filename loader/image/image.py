"""``Loader``: plan -> shards (local or node cache) -> DALI decode/augment -> torch batches."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from flashfeed.dataset import Dataset
from flashfeed.format.manifest import Manifest
from flashfeed.plan.mixture import Mixture

from ..base import Made, PlannedLoader
from ..parts import SharedKeywords, loader_parts
from ..passorder import PassOrder
from ..position import PlanPosition, Position
from ..reader import BatchSource
from ..weakcall import weakly
from .bucketplan import BucketPlanner, bucket_options
from .convert import DeviceCopier, to_keys, to_torch
from .dali_runner import (
    DaliRunner,
    collect_dropped_pipelines,
    cuda_initialized,
    py_start_method,
)
from .fields import KEY, parse_fields
from .pipeline import (
    AugmentOptions,
    PipelineFn,
    build_pipeline,
    cuda_device,
    decode_device,
    shared_batches,
)
from .spawncheck import SpawnError, check_spawnable_main, spawn_failure_hint
from .text import TextEncoder, collate_json, collate_text, load_tokenizer
from .unitmembers import member_reader
from .video import check_clip_state, clip_draws, clip_options, require_pyav

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Batch", "Loader"]

#: one batch: output name -> tensor (a list of per-sample tensors for ragged raw fields),
#: and ``"__key__"``: each sample's ``<shard>/<key>``, carried through DALI with it
Batch = dict[str, torch.Tensor | list[torch.Tensor] | list[str] | list[Any]]


class Loader(PlannedLoader):
    """Batches of a WebDataset-format dataset, decoded by DALI in the order of the plan.

    ``device``: ``"gpu"`` (nvJPEG "mixed" decode; needs a CUDA build of torch), ``"cpu"``, or
    ``"auto"``. ``py_workers``: reader processes of DALI's parallel external source; 0
    (default; None means the same): none. The samples are views into the memory-mapped
    local or cached shards, read in this process without a copy or a hand-off, and a shard
    still arriving in the cache needs no process of its own: before each ``run()`` the pass
    waits here (counted as storage wait) until every batch DALI may ask for next has landed
    (``StreamFeeder.wait_ready``). A reader process copies every sample into shared memory
    and pickles each batch's layout: 0.054-0.067 CPU ms per image on 2 cores, where the
    callback adds about 0.003 ms; a cold first epoch from S3 ran 1.18x faster without it
    (docs/LOADER.md). ``reader_start``: how DALI starts those processes,
    ``"fork"``, ``"spawn"``, or ``"auto"``: spawn when decode runs on the GPU or this process
    has already initialised CUDA (DALI cannot fork then), fork otherwise; a spawning loader
    built by a script without an ``if __name__ == "__main__":`` guard raises ``SpawnError``
    (``spawncheck.py``). Every loader's
    keywords (``cache_dir``, ``rank``, ``seed``, ``ledger_dir``...): ``SharedKeywords``.

    ``fields``: output -> member extensions (``loader/image/fields.py``): a caption field
    (``{"caption": "txt"}``) comes out as a list of ``str`` per batch, or with ``tokenizer``
    (a ``tokenizer.json`` path) as int64 ids ``(batch, max_len)`` and ``<field>_mask`` (rule:
    ``loader/image/text.py``); ``"json:KEY"`` picks one value of a JSON member. ``optional``: fields
    a sample may lack (None in the batch, counted in ``stats()["missing"]``); a sample
    without a required field, a caption that is not UTF-8 or a JSON member without its key
    is a ``CorruptShardError`` naming the shard and the sample.

    ``buckets``: aspect-ratio buckets, a list of (height, width) or ``"auto"`` (from the
    image sizes the shard table records): each image is cropped to its nearest bucket's
    aspect ratio and resized to it, every batch holds one bucket (``loader/image/buckets.py``);
    ``max_crop``: samples whose crop would lose more of their area are skipped and counted
    (``bucket_report()``).

    A video field (``{"video": "webm;mp4"}``) needs ``frames`` (per clip) and takes
    ``stride``, ``clips_per_video`` (K clips of each video per epoch, each its own sample of
    the plan, keyed ``<key>#<j>`` when K > 1) and ``clip`` (``"random"``: each clip's start
    drawn from the seed, epoch, video and clip; ``"uniform"``: the K clips evenly spaced;
    ``"center"``: one clip, the middle): it comes out as ``(batch, frames, 3, image_size,
    image_size)`` float32 and ``<field>_start``, each clip's start in seconds
    (``loader/image/video.py``).

    >>> loader = Loader("s3://b/imagenet", batch_size=256, cache_dir="/nvme/ff")  # doctest: +SKIP
    >>> for batch in loader:                                                      # doctest: +SKIP
    ...     batch["image"].shape, batch["label"].dtype  # (256, 3, 224, 224), torch.int64
    ...     batch["__key__"][0]                         # 'shards/000042.tar/n01440764_10026'
    """

    def __init__(
        self,
        dataset: str | Dataset | Mixture | Mapping[str, Any],
        *,
        batch_size: int,
        image_size: int = 224,
        train: bool | None = None,
        device: str = "auto",
        pipeline: PipelineFn | None = None,
        fields: Mapping[str, str | Sequence[str]] | None = None,
        optional: Sequence[str] = (),
        tokenizer: str | os.PathLike[str] | Any = None,
        max_len: int = 77,
        buckets: Sequence[tuple[int, int]] | str | None = None,
        max_crop: float = 0.5,
        frames: int | None = None,
        stride: int = 1,
        clip: str = "random",
        clips_per_video: int = 1,
        num_threads: int = 2,
        py_workers: int | None = 0,
        reader_start: str = "auto",
        prefetch: int = 2,
        **shared: Unpack[SharedKeywords],
    ) -> None:
        created = time.perf_counter()
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if py_workers is not None and (
            isinstance(py_workers, bool) or not isinstance(py_workers, int) or py_workers < 0
        ):
            raise ValueError(f"py_workers must be None or an integer >= 0, got {py_workers!r}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        self.specs = parse_fields(fields, optional=optional)
        self.text = TextEncoder(load_tokenizer(tokenizer), max_len) if tokenizer else None
        if self.text is not None and not any(s.is_text for s in self.specs):
            raise ValueError(
                f"tokenizer= needs a text field (txt/text/caption members); fields= has "
                f"{[s.name for s in self.specs]}"
            )
        videos = [s.name for s in self.specs if s.is_video]
        self.clips = clip_options(
            frames, stride=stride, clip=clip, clips_per_video=clips_per_video,
            fields=[s.name for s in self.specs], videos=videos, buckets=buckets is not None,
        )  # fmt: skip
        if videos:
            require_pyav()
        per_video = self.clips.clips_per_video if self.clips is not None else 1
        # rows of Parquet or JSONL files indexed in place are samples too (``unitmembers.py``)
        parts = loader_parts(
            "Loader", dataset, shard_format=("webdataset", "parquet", "jsonl"), keywords=shared
        )
        opened = time.perf_counter()
        py_workers = py_workers or 0  # None: the default, no reader process
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
            frames=self.clips.frames if self.clips else 0,
            stride=self.clips.stride if self.clips else 1,
        )
        manifest = parts.dataset.manifest
        if buckets is not None and not isinstance(manifest, Manifest):
            raise ValueError(
                "buckets= reads one dataset, not a mixture: a bucketed batch waits for its "
                "bucket to fill, so it takes samples out of the mixture's deal order, while a "
                "mixture's resume state is each source's count read as a prefix of that order "
                "(and a bucket may be all one source); bucket each source's Loader on its own "
                "and interleave their batches by weight, or read the mixture without buckets "
                "(docs/MIXTURES.md, 'Buckets')"
            )
        if per_video > 1 and not isinstance(manifest, Manifest):
            raise ValueError(
                f"clips_per_video={per_video} plans the clips of one dataset, not a mixture: "
                "read the mixture with one clip per video, or each source on its own"
            )
        super().__init__(parts, batch_size=batch_size, per_sample=per_video)
        self.buckets: BucketPlanner | None = None
        if buckets is not None and isinstance(manifest, Manifest):
            options = bucket_options(buckets, manifest, image_size=image_size, max_crop=max_crop)
            self.buckets = BucketPlanner(options, manifest, batch_size)
        self.user_pipeline = pipeline
        self.num_threads = num_threads
        self.py_workers = py_workers
        self.prefetch = prefetch
        # decode_device() made sure a "gpu" loader has a CUDA torch
        self.torch_device = cuda_device() if self.device_kind == "gpu" else None
        self.copier = DeviceCopier(self.torch_device) if self.torch_device is not None else None
        self.missing: Counter[str] = Counter({s.name: 0 for s in self.specs if s.optional})
        self.runner = DaliRunner(weakly(self._build), weakly(self._source))
        #: start-up seconds, filled in up to the first batch: ``stats()["startup"]``
        self.startup: dict[str, float] = {
            "construction_s": time.perf_counter() - created,
            "manifest_s": opened - created,
        }
        self._created = created
        self._build_timings: dict[str, float] = {}

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        if self.runner.closed:
            raise RuntimeError(
                f"{self._describe()} is closed (its DALI pipeline and pass folder are gone): "
                "make a new Loader to read again"
            )
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
            tokenized=self.text is not None,
            bucketed=self.buckets is not None,
            shared=not self.py_workers,
        )

    def _source(self, pass_dir: str) -> BatchSource:
        reader = member_reader(self.source, self.shard_names, self.dataset)
        return BatchSource(
            reader, batch_size=self.batch_size, specs=self.specs, pass_dir=pass_dir,
            text=self.text, bucketed=self.buckets is not None, clips=self.clips,
            gpu=self.device_kind == "gpu",
            # read in this process: DALI takes the views into the mapped shards as they lie
            keep=0 if self.py_workers else shared_batches(self.prefetch),
        )  # fmt: skip

    # -- aspect-ratio buckets: the pass order, its length, drops and resume ----------------
    def _order(self, remaining: np.ndarray) -> PassOrder:
        order = (
            super()._order(remaining)
            if self.buckets is None
            else self.buckets.pass_order(self._bucket_position())
        )
        if self.clips is None:
            return order
        p = self._next_position()  # where each video clip starts: drawn by the plan
        per = self.clips.clips_per_video
        ids = np.asarray(order.ids, np.int64)
        return replace(order, draws=clip_draws(p.options.seed, p.epoch, ids // per, ids % per))

    def _next_position(self) -> PlanPosition:
        """The position the next pass starts from (the next epoch's, once this one ended)."""
        return self.position.following() if self._finished else self.position

    def _bucket_position(self) -> Position:
        """``_next_position`` of a bucketed loader, which reads one dataset (checked when
        it was made)."""
        return _single(self._next_position())

    def __len__(self) -> int:
        if self.buckets is None:
            return super().__len__()
        return self._order(np.zeros(0, np.int64)).num_batches

    def _end_epoch(self) -> None:
        if self.buckets is None:
            return super()._end_epoch()
        self._finished = True
        if self.ledger is not None:  # short tails (drop_last), skipped samples, plan surplus
            position = _single(self.position)
            got = self.buckets.order(position)
            unread = np.concatenate([got.dropped, self.buckets.surplus(position)])
            if len(unread):
                self.ledger.record_dropped(self.position.epoch, unread.tolist())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_clip_state(state, self.clips)
        if self.buckets is None:
            return super().load_state_dict(state)
        position = _single(self.position)
        saved = (replace(position, prior=list(position.prior)), self._finished)
        super().load_state_dict(state)
        try:  # a state that does not fit the bucketed order is refused here, not mid-pass
            self.buckets.pass_order(self._bucket_position())
        except ValueError:
            self.position, self._finished = saved
            raise

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.clips is not None and self.clips.clips_per_video > 1:
            state["clips_per_video"] = self.clips.clips_per_video
        if self.buckets is not None:  # what the bucketed order drops, every rank together
            state["dropped"] = self.buckets.dropped_total(_single(self.position))
        return state

    def bucket_report(self) -> dict[str, Any]:
        """Per bucket, this rank's samples, batches and mean crop loss in the current epoch,
        and the samples skipped (by reason) or dropped: see ``BucketPlanner.report``."""
        if self.buckets is None:
            raise ValueError("bucket_report() needs a Loader made with buckets=")
        return self.buckets.report(_single(self.position))

    def _lookahead(self) -> int:
        return self.prefetch + 1  # DALI asks for up to ``prefetch`` batches ahead of a run

    def _run(self, order: PassOrder) -> Generator[Batch, None, None]:
        feeder = self.stream(order, lookahead=self._lookahead())
        try:
            # the first batches' fetches start, then the pipeline builds while they run: a
            # built pipeline takes no sample before the first run(), after wait_ready(0);
            # the rest of the download waits until the first batch is made
            ask_start = time.perf_counter()
            feeder.hold_ahead()
            feeder.ask(0)  # a local shard's first use checks it (size and checksum) here
            asked = time.perf_counter() - ask_start
            started = feeder.wait_started(0)  # storage wait: the first bytes, pre-build
            startup = self.runner.start(order) if order.num_batches else 0.0
            storage = started + feeder.wait_ready(0)
            if "first_batch_s" not in self.startup and order.num_batches:
                reader = self._build_timings.get("reader_start_s", 0.0)
                self.startup["pipeline_build_s"] = max(startup - reader, 0.0)
                self.startup["reader_start_s"] = reader
                self.startup["first_fetch_s"] = asked + storage
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
        batch: Batch = {}
        for n, o in out.items():
            kind = self._parsed.get(n)
            if kind is not None:  # captions and JSON values: Python values, on the host
                batch[n] = collate_text(o) if kind == "text" else collate_json(o)
                self._count_missing(n, batch[n])
            else:
                batch[n] = to_torch(o, self._out_device(n), copier)
        label = batch.get("label")
        if isinstance(label, torch.Tensor) and label.ndim > 1:
            batch["label"] = label.reshape(-1)
        if copier is None:
            return batch, None
        copier.end(keep=[outputs])  # DALI's buffers go back once the copies are done
        return batch, copier.take_h2d()

    @property
    def _parsed(self) -> dict[str, str]:
        """Outputs that come out as Python values: untokenized captions, JSON values."""
        return {
            s.name: "text" if s.is_text else "json"
            for s in self.specs
            if (s.is_text and self.text is None) or s.json_key is not None
        }

    def _count_missing(self, name: str, values: Any) -> None:
        if name in self.missing and isinstance(values, list):
            self.missing[name] += sum(v is None for v in values)

    def stats(self) -> dict[str, Any]:
        """``PlannedLoader.stats()``, and ``"missing"``: per optional caption or JSON field,
        the delivered samples that lacked it (None in their batch); with buckets,
        ``"buckets"``: ``bucket_report()``; ``"startup"``: seconds of construction (of which
        ``manifest_s``: opening the dataset and its source), then on the first pass's path
        to its first batch: ``pipeline_build_s`` (the DALI graph, the pass file),
        ``reader_start_s`` (``pipe.build()``: executor and reader processes),
        ``first_fetch_s`` (the wait left for the first batch's bytes), ``first_decode_s``,
        and ``first_batch_s`` from ``Loader(...)`` to the first batch in hand."""
        out = super().stats()
        out["startup"] = dict(self.startup)
        out["missing"] = dict(self.missing)
        if self.buckets is not None:
            out["buckets"] = self.bucket_report()
        return out

    def _out_device(self, name: str) -> torch.device | None:
        return self.torch_device

    def _aug_seed(self) -> int:
        o = self.position.options
        return hash((o.seed, self.position.epoch, self.ctx.rank, self.position.consumed))

    def close(self) -> None:
        """Stop the DALI pipeline and its reader processes; close the stats log."""
        if self.copier is not None:
            self.copier.flush()
        self.runner.close()
        super().close()


def _single(position: PlanPosition) -> Position:
    """The position of a loader that reads one dataset (a bucketed one: see ``__init__``)."""
    if not isinstance(position, Position):
        raise TypeError("a bucketed Loader reads one dataset, not a mixture")
    return position
