"""Where a rank stands in the plan, and the state protocol that saves and restores it.

The position is (plan options, epoch, the segments of this epoch already trained under
earlier topologies, samples this rank consumed under the current one). DDP ranks advance in
lock-step, so one rank's state describes every rank; loading it on a new world size
re-splits what remains of the epoch (``flashfeed.plan.plan`` segments) and nothing is seen twice.
The state is a few integers per segment: no per-sample set, whatever the dataset's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from flashfeed.plan.plan import PlanOptions, RankPlan, Segment, Topology, rank_plan
from flashfeed.plan.types import ARRIVAL_SPACINGS, ARRIVAL_WINDOWS

from .distributed import DistContext

__all__ = ["STATE_VERSION", "PlanOptions", "PlanPosition", "Position"]

STATE_VERSION = 2
_NONE = np.zeros(0, np.int64)


class PlanPosition(Protocol):
    """What a loader asks of its place in the plan, one dataset's (``Position``) or a
    mixture's (``flashfeed.loader.mixposition.MixPosition``) alike."""

    ctx: DistContext
    options: PlanOptions
    shard_sizes: np.ndarray

    @property
    def epoch(self) -> int: ...
    @property
    def consumed(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def next_epoch(self) -> None: ...
    def following(self) -> Any: ...
    def rank_plan(self) -> RankPlan: ...
    def remaining(self) -> np.ndarray: ...
    def advance(self, n: int) -> None: ...
    def source_counts(self, samples: int) -> tuple[tuple[str, int], ...]: ...
    def dropped_between(self, lo: int, hi: int) -> np.ndarray: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> PlanOptions: ...


@dataclass
class Position:
    """A rank's position in the plan of one dataset, with ``state_dict``/``load_state_dict``.

    ``dataset_id``: a digest of the dataset's shard table, saved in the state so that a
    state is never loaded into another dataset of the same shape.
    """

    shard_sizes: np.ndarray
    ctx: DistContext
    options: PlanOptions
    epoch: int = 0
    prior: list[Segment] = field(default_factory=list)
    consumed: int = 0
    dataset_id: str | None = None
    _memo: tuple[Any, RankPlan] | None = field(default=None, repr=False)

    @property
    def topology(self) -> Topology:
        return self.ctx.topology

    @property
    def num_samples(self) -> int:
        return int(self.shard_sizes.sum())

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; the current epoch keeps its position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch != self.epoch:
            self.epoch, self.prior, self.consumed = int(epoch), [], 0

    def next_epoch(self) -> None:
        self.epoch, self.prior, self.consumed = self.epoch + 1, [], 0

    def following(self) -> Position:
        """A copy standing at the start of the next epoch."""
        ahead = Position(self.shard_sizes, self.ctx, self.options, dataset_id=self.dataset_id)
        ahead.set_epoch(self.epoch + 1)
        return ahead

    def segments(self) -> list[Segment]:
        """Everything trained in this epoch so far, the current topology last."""
        segs = list(self.prior)
        if self.consumed:
            t = self.topology
            segs.append(Segment(t.world_size, t.rpn, self.consumed))
        return segs

    def rank_plan(self) -> RankPlan:
        """What this rank still reads of this epoch. The plan of the current topology's
        stretch is computed once; consuming samples only moves along it."""
        key = (self.options, self.epoch, tuple(self.prior), self.topology, self.ctx.rank)
        if self._memo is None or self._memo[0] != key:
            plan = rank_plan(
                self.shard_sizes,
                options=self.options,
                epoch=self.epoch,
                topology=self.topology,
                rank=self.ctx.rank,
                segments=self.prior,
            )
            self._memo = (key, plan)
        whole = self._memo[1]
        if self.consumed > len(whole.samples):
            raise ValueError(
                f"resume state says each rank consumed {self.consumed} samples but the plan "
                f"gave only {len(whole.samples)}: the state belongs to another dataset"
            )
        return RankPlan(
            whole.samples[self.consumed :], whole.dropped, whole.repeated, whole.dropped_total
        )

    def remaining(self) -> np.ndarray:
        """Global sample ids this rank still reads in this epoch, in order."""
        return self.rank_plan().samples

    def advance(self, n: int) -> None:
        self.consumed += n

    def source_counts(self, samples: int) -> tuple[tuple[str, int], ...]:
        """Samples per source of the next ``samples``: none named, one dataset."""
        return ()

    def dropped_between(self, lo: int, hi: int) -> np.ndarray:
        """What samples ``lo`` to ``hi`` complete leaves unread: nothing; one dataset's
        losses are the epoch's, named when its pass ends."""
        return _NONE

    def state_dict(self) -> dict[str, Any]:
        t = self.topology
        return {
            "version": STATE_VERSION,
            "dataset": self.dataset_id,
            "num_samples": self.num_samples,
            "num_shards": len(self.shard_sizes),
            **options_fields(self.options),
            "epoch": self.epoch,
            "world_size": t.world_size,
            "ranks_per_node": t.rpn,
            "samples_consumed": sum(s.samples_per_rank * s.world_size for s in self.segments()),
            "segments": [
                [s.world_size, s.ranks_per_node, s.samples_per_rank] for s in self.segments()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> PlanOptions:
        """Restore a position saved by any rank of any world size; returns the plan options
        it was saved with (seed, shuffle, window, drop_last), which replace the current ones."""
        check_state(state)
        if state.get("kind") == "mixture":
            raise ValueError(
                f"the state belongs to the mixture of sources "
                f"{[s[0] for s in state.get('sources') or []]}; this loader reads one "
                f"dataset ({self.dataset_id})"
            )
        saved_id = state.get("dataset")
        if saved_id and self.dataset_id and saved_id != self.dataset_id:
            raise ValueError(
                f"the state belongs to another dataset: it was saved for dataset {saved_id}, "
                f"this loader reads dataset {self.dataset_id}"
            )
        if state["num_samples"] != self.num_samples or state["num_shards"] != len(self.shard_sizes):
            raise ValueError(
                f"the state belongs to another dataset: it has {state['num_samples']} samples "
                f"in {state['num_shards']} shards, this one {self.num_samples} in "
                f"{len(self.shard_sizes)}"
            )
        options = read_options(state)
        epoch = _field(state, "epoch", int)
        if epoch < 0:
            raise ValueError(f"state field 'epoch' must be >= 0, got {epoch}")
        segs = _segments(state.get("segments"))
        self.options, self.epoch = options, epoch
        if segs and segs[-1].topology == self.topology:
            self.prior, self.consumed = segs[:-1], segs[-1].samples_per_rank
        else:
            self.prior, self.consumed = segs, 0
        self.rank_plan()  # refuses a state that does not fit this dataset
        return self.options


def check_state(state: Any) -> None:
    """Refuse what is not a loader state of this version, saying what it is."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else None
        raise ValueError(
            f"not a flashfeed loader state of version {STATE_VERSION} (found version "
            f"{found!r}): {str(state)[:80]!r}"
        )


def options_fields(options: PlanOptions) -> dict[str, Any]:
    """The plan options as a state saves them."""
    return {
        "seed": options.seed,
        "shuffle": options.shuffle,
        "drop_last": options.drop_last,
        "window": options.window,
        "arrival_slices": options.arrival_slices,
        "arrival_spacing": options.arrival_spacing,
        "arrival_windows": options.arrival_windows,
    }


def read_options(state: dict[str, Any]) -> PlanOptions:
    """The plan options a state was saved with; each field checked, the ones added since
    given the value the code before them had."""
    return PlanOptions(
        seed=_field(state, "seed", int),
        shuffle=_field(state, "shuffle", bool),
        drop_last=_field(state, "drop_last", bool),
        window=_field(state, "window", int),
        arrival_slices=_arrival_slices(state),
        arrival_spacing=_arrival_spacing(state),
        arrival_windows=_arrival_windows(state),
    )


def _field(state: dict[str, Any], name: str, kind: type) -> Any:
    value = state.get(name)
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not ok:
        raise ValueError(
            f"state field {name!r} must be {'True or False' if kind is bool else 'an integer'}, "
            f"got {value!r}"
        )
    return value


def _arrival_slices(state: dict[str, Any]) -> int:
    """The state's ``arrival_slices``; a state saved before the option read the first window
    in the plain window shuffle, which is ``arrival_slices=1``."""
    if "arrival_slices" not in state:
        return 1
    value = _field(state, "arrival_slices", int)
    if value < 1:
        raise ValueError(f"state field 'arrival_slices' must be >= 1, got {value}")
    return int(value)


def _arrival_spacing(state: dict[str, Any]) -> str:
    """The state's ``arrival_spacing``; a state saved before the option cut the first window
    in equal slices, which is ``"even"``."""
    value = state.get("arrival_spacing", "even")
    if value not in ARRIVAL_SPACINGS:
        raise ValueError(
            f"state field 'arrival_spacing' must be one of {ARRIVAL_SPACINGS}, got {value!r}"
        )
    return str(value)


def _arrival_windows(state: dict[str, Any]) -> str:
    """The state's ``arrival_windows``; a state saved before the option sliced only the first
    epoch's first window, which is ``"first"``."""
    value = state.get("arrival_windows", "first")
    if value not in ARRIVAL_WINDOWS:
        raise ValueError(
            f"state field 'arrival_windows' must be one of {ARRIVAL_WINDOWS}, got {value!r}"
        )
    return str(value)


def _segments(raw: Sequence[Any] | None) -> list[Segment]:
    if not isinstance(raw, list | tuple):
        raise ValueError(f"state field 'segments' must be a list, got {raw!r}")
    out = []
    for item in raw:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise ValueError(f"state field 'segments' holds a bad entry: {item!r}")
        ws, rpn, n = item
        try:
            out.append(Segment(int(ws), None if rpn is None else int(rpn), int(n)))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"state field 'segments' holds a bad entry {item!r}: {exc}") from None
    return out
