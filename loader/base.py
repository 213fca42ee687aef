"""What every flashfeed loader shares: the plan position, epochs, resume state, ledger, stats."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from .datasetinfo import ShardNames, check_version
from .mixposition import plan_position
from .mixsource import MixtureDataset, status_root
from .parts import LoaderParts
from .passorder import PassOrder, make_pass_order
from .position import PlanPosition
from .readahead import StreamFeeder
from .sources import reads_in_place
from .telemetry.ledger import Ledger
from .telemetry.stats import StatsRecorder
from .telemetry.status import open_local_status_root
from .weakcall import weakly

__all__ = ["Made", "PlannedLoader"]

T = TypeVar("T")


class PlannedLoader:
    """Epoch/position bookkeeping over ``flashfeed.plan.plan`` for one rank.

    One pass (``for batch in loader``) reads what remains of the current epoch; once a pass
    has run to its end, the next pass starts the next epoch unless ``set_epoch`` says
    otherwise. ``state_dict()`` after batch k makes a new loader continue with batch k+1.
    """

    def __init__(self, parts: LoaderParts, *, batch_size: int, per_sample: int = 1) -> None:
        """``per_sample``: plan entries per stored sample (a video's clips per epoch): the
        plan counts ``per_sample`` times each shard's samples, entry ``i`` standing for
        part ``i % per_sample`` of sample ``i // per_sample``; one dataset only."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (an integer), got {batch_size!r}")
        self.parts = parts
        self.dataset = dataset = parts.dataset
        self.ctx = ctx = parts.ctx
        self.batch_size = batch_size
        self.drop_last = parts.options.drop_last
        self.source = parts.source
        self.position: PlanPosition = plan_position(
            dataset, ctx, parts.options, batch=batch_size if self.drop_last else 1,
            per_sample=per_sample,
        )  # fmt: skip
        telemetry = parts.telemetry
        self.ledger = (
            Ledger(telemetry.ledger_dir, rank=ctx.rank, world_size=ctx.world_size)
            if telemetry.ledger_dir
            else None
        )
        exporter = None
        if telemetry.prometheus_port is not None:
            from .telemetry.prometheus import PrometheusExporter

            exporter = PrometheusExporter(
                port=telemetry.prometheus_port,
                rank=ctx.rank,
                addr=telemetry.prometheus_addr,
                dataset=dataset.url,
            )
        source = self.source
        self.recorder = StatsRecorder(
            rank=ctx.rank,
            log=telemetry.stats_log,
            cache_stats=source.stats,
            exporter=exporter,
            # this rank's status file for ``flashfeed top``: in the node cache (a mixture's:
            # the one its sources share), or in this user's runtime directory for a loader
            # reading local data in place
            status_dir=status_root(source) or open_local_status_root(),
            dataset=dataset.url,
        )
        self.shard_names = ShardNames(dataset)
        self.readahead = parts.readahead
        self.readahead_budget = parts.readahead_budget
        self._feeder: StreamFeeder | None = None
        self._primed = False  # the feeder was started by start_fetching(), no pass has it
        self.mixture = isinstance(dataset, MixtureDataset)
        self.recorder.extra = weakly(self._readahead_stats, gone=dict)
        self._finished = False
        self._active = False

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next. Another epoch starts from its beginning; the current one
        keeps its position (after a resume: the rest of it, possibly nothing)."""
        if self._active:
            raise RuntimeError(
                f"set_epoch() during a pass over this {type(self).__name__}: call it before "
                "the loop starts (or after it ends)"
            )
        self._finished = False
        self.position.set_epoch(epoch)

    def _batches(self, n: int) -> int:
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __len__(self) -> int:
        """Batches the next pass yields."""
        return self._batches(len(self._next_remaining()))

    def _next_remaining(self) -> np.ndarray:
        """The sample ids the next pass reads, without moving to the next epoch."""
        if self._finished:
            return self.position.following().remaining()
        return self.position.remaining()

    def state_dict(self) -> dict[str, Any]:
        """The exact position: seed, epoch, world size, segments, samples consumed, and how
        many samples of this epoch the job drops (``drop_last``: the plan's surplus and each
        rank's last partial batch; a mixture: what its sources' completed cycles leave)."""
        state = self.position.state_dict()
        state["finished"] = self._finished
        state["url"] = self.dataset.url  # tells another dataset from another version of it
        plan = self.position.rank_plan()
        tail = len(plan.samples) % self.batch_size if self.drop_last else 0
        state["dropped"] = plan.dropped_total + tail * self.ctx.world_size
        return state

    def _end_epoch(self) -> None:
        """A pass reached the end of the epoch. With ``drop_last``, what this rank's share
        leaves unread (the plan's surplus, a last partial batch) goes to the ledger as
        dropped: it was never delivered, and the ledger says so."""
        self._finished = True
        if self.ledger is not None:
            plan = self.position.rank_plan()
            unread = np.concatenate([plan.samples, plan.dropped])
            if len(unread):
                self.ledger.record_dropped(self.position.epoch, unread.tolist())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, saved by any rank, also under another world size."""
        if self._active:
            raise RuntimeError("load_state_dict() during a pass: finish or close the loop first")
        if not isinstance(self.dataset, MixtureDataset):  # a mixture checks its sources
            check_version(state, self.dataset)
        self.position.load_state_dict(state)
        self._finished = bool(state.get("finished", False))

    def _describe(self) -> str:
        return f"{type(self).__name__}({self.dataset.url!r}, rank {self.ctx.rank})"

    def _refuse_second_pass(self) -> None:
        """Two passes at once would read the same batches twice: refuse at ``iter()``."""
        if self._active:
            raise RuntimeError(
                f"{self._describe()} is already being iterated: finish or close the first loop "
                "(run it to its end, break out of it, or call .close() on its iterator) "
                "before iterating it again"
            )

    def _pass_iter(self, run: Generator[T, None, None]) -> Iterator[T]:
        """``run``'s batches. The loader counts as iterated from now (``iter()``, not the
        first batch) until the pass ends or fails, or its iterator is closed or dropped."""
        self._refuse_second_pass()
        self._active = True
        return _PassIterator(self, run)

    def begin_pass(self) -> PassOrder:
        """Start a pass: refuse a second one at once, move on to the next epoch if the last
        pass finished this one, and return what this pass reads, in order."""
        self._refuse_second_pass()
        if self._finished:
            self.position.next_epoch()
            self._finished = False
        return self._order(self.position.remaining())

    def _order(self, remaining: np.ndarray) -> PassOrder:
        return make_pass_order(
            remaining, self.position.shard_sizes, batch_size=self.batch_size,
            drop_last=self.drop_last,
        )  # fmt: skip

    def _lookahead(self) -> int:
        """The batches beyond the one asked for whose bytes a pass keeps readable."""
        return 1

    def start_fetching(self) -> int:
        """Start fetching what the next pass reads first, and return at once.

        A cold pass waits at its first batch for the shards its first batches mix (with the
        plan's window of 4, the window's shards). Called after the loader is set up (after
        ``load_state_dict`` or ``set_epoch``, if any) and before the job's own start-up
        (building the model, loading a checkpoint), that download runs beside it instead.
        The next pass takes these fetches over if it reads the same order; if its order
        changed since, the fills under way finish and stay in the node cache. Returns how
        many shards it started fetching: 0 for a dataset read in place (nothing to fetch)."""
        self._refuse_second_pass()
        order = self._order(self._next_remaining())
        if not order.num_batches or reads_in_place(self.source):
            return 0
        feeder = self.stream(order, lookahead=self._lookahead())
        self._primed = True
        feeder.ask(0)
        return feeder.shards_asked()

    def stream(self, order: PassOrder, *, lookahead: int) -> StreamFeeder:
        """The pass's feeder: it starts the fills of the shards of batches up to ``k +
        lookahead`` when batch k is asked for, serves their samples as their bytes arrive,
        and fetches further ahead as ``readahead``/``readahead_budget`` allow. Its
        ``snapshot()`` is the ``"readahead"`` entry of ``stats()``. A feeder that
        ``start_fetching`` began on the same order is taken over."""
        primed, self._primed = self._primed, False
        if self._feeder is not None and self._feeder.pid != os.getpid():
            self._feeder = None  # a forked worker's copy: its threads live in the parent
        if (
            primed
            and self._feeder is not None
            and self._feeder.lookahead == lookahead
            and self._feeder.pass_order.same(order)
        ):
            return self._feeder
        if self._feeder is not None:
            self._feeder.close()
        self._feeder = StreamFeeder(
            self.source,
            order,
            shard_bytes=self.dataset.manifest.shard_bytes.tolist(),
            shard_samples=self.position.shard_sizes.tolist(),
            lookahead=lookahead,
            readahead=self.readahead,
            budget=self.readahead_budget,
        )
        return self._feeder

    def _readahead_stats(self) -> dict[str, Any]:
        feeder = self._feeder
        out = {} if feeder is None else {"readahead": feeder.snapshot()}
        if self.mixture:
            out["sources"] = self.recorder.source_summary()
        return out

    def _deliver_batches(
        self,
        order: PassOrder,
        feeder: StreamFeeder,
        make: Callable[[int], Made[T]],
        *,
        storage: float = 0.0,
    ) -> Generator[T, None, None]:
        """The pass's batches in order: wait until batch k's bytes are readable (the
        feeder's ``wait_ready``; storage wait), make it (``make``), account for it, yield it;
        at the end, wait for the pass's fills to land verified (``StreamFeeder.finish``).
        ``storage``: seconds already waited for batch 0."""
        epoch = self.position.epoch
        step_start = time.perf_counter()
        for k in range(order.num_batches):
            asked = time.perf_counter()
            storage += feeder.wait_ready(k)
            made = make(k)
            if k == 0:
                feeder.release_ahead()  # held for the first batch (``hold_ahead``)
            self.deliver(
                len(made.keys),
                keys=made.keys,
                planned=order.batch_len(k),
                epoch=epoch,
                batch=k,
                storage=storage,
                decode=made.decode,
                h2d=made.h2d,
                step=asked - step_start,
            )
            storage = 0.0
            yield made.batch
            step_start = time.perf_counter()
        feeder.finish()

    def deliver(
        self,
        samples: int,
        *,
        epoch: int,
        batch: int,
        keys: Sequence[str] | None = None,
        planned: int | None = None,
        storage: float = 0.0,
        decode: float = 0.0,
        h2d: float = 0.0,
        step: float = 0.0,
    ) -> None:
        """Account for ``samples`` the consumer receives now (batch ``batch`` of ``epoch``):
        the ledger, the resume position, the timings.

        ``keys`` are the delivered ``__key__`` values, as the consumer gets them (needed with
        a ledger): the ledger records what was received, never what the plan meant to send.
        ``planned``: the samples the pass order has for this batch, checked against them.
        """
        if planned is not None and samples != planned:
            raise RuntimeError(
                f"{self._describe()}: batch {batch} of epoch {epoch} delivered {samples} "
                f"samples, its pass order has {planned}"
            )
        if self.ledger is not None:
            if keys is None:
                raise ValueError(f"{self._describe()} keeps a ledger: deliver() needs the keys")
            self.ledger.record(epoch, keys)
        per_source = self.position.source_counts(samples)
        if self.ledger is not None:  # a mixture's cycles this batch completes: what they left
            taken = self.position.consumed
            gone = self.position.dropped_between(taken, taken + samples)
            if len(gone):
                self.ledger.record_dropped(epoch, gone.tolist())
        self.position.advance(samples)
        # the values, not a ``StatsRecord``: the recorder builds one only for a reader of it
        self.recorder.add(
            time.time(), self.ctx.rank, epoch, batch, samples, storage, decode, h2d, step,
            per_source,
        )  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Samples/s, wait seconds and fractions per kind, cache hits, since construction."""
        return self.recorder.summary()

    def close(self) -> None:
        """Stop what a pass left running, close the stats log and what the source holds
        open (the descriptors a node service handed over: the service can then free the
        bytes of shards it evicted)."""
        if self._primed and self._feeder is not None:
            self._feeder.close()  # fetches started for a pass that never ran
            self._primed = False
        self.recorder.close()
        closing = getattr(self.source, "close", None)
        if closing is not None:
            closing()


class Made(Generic[T]):
    """One batch as a loader made it: the batch, its keys, the seconds spent decoding (or
    gathering) it and copying it to the device. A slotted class, not a frozen dataclass:
    made once per batch, where a frozen dataclass's ``__init__`` costs about 1 us."""

    __slots__ = ("batch", "decode", "h2d", "keys")

    def __init__(self, batch: T, keys: Sequence[str], decode: float, h2d: float) -> None:
        self.batch = batch
        self.keys = keys
        self.decode = decode
        self.h2d = h2d


class _PassIterator(Generic[T]):
    """The iterator of one pass. Its loader counts as iterated from ``iter()`` (not from the
    first batch) until the pass ends or fails, or this iterator is closed or dropped."""

    def __init__(self, loader: PlannedLoader, run: Generator[T, None, None]) -> None:
        self._loader: PlannedLoader | None = loader
        self._run = run

    def __iter__(self) -> _PassIterator[T]:
        return self

    def __next__(self) -> T:
        try:
            return next(self._run)
        except BaseException:  # the generator has ended, normally or not
            self._release()
            raise

    def close(self) -> None:
        """Leave the pass early: stop its work and let the loader start another."""
        try:
            self._run.close()
        finally:
            self._release()

    def _release(self) -> None:
        if self._loader is not None:
            self._loader._active = False
            self._loader = None

    def __del__(self) -> None:
        self.close()
