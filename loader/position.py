"""Where a rank stands in the plan, and the state protocol that saves and restores it.

The position is (seed, epoch, the segments of this epoch already trained under earlier
topologies, samples this rank consumed under the current one). DDP ranks advance in
lock-step, so one rank's state describes every rank; loading it on a new world size
re-splits what remains of the epoch (``flashfeed.plan`` segments) and nothing is seen twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flashfeed.plan import EpochPlan, Segment, plan_epoch

from .distributed import DistContext

__all__ = ["STATE_VERSION", "PlanOptions", "Position"]

STATE_VERSION = 1


@dataclass(frozen=True)
class PlanOptions:
    """What the plan depends on besides the position."""

    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True
    window: int = 4

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@dataclass
class Position:
    """A rank's position in the plan of one dataset, with ``state_dict``/``load_state_dict``."""

    shard_sizes: np.ndarray
    ctx: DistContext
    options: PlanOptions
    epoch: int = 0
    prior: list[Segment] = field(default_factory=list)
    consumed: int = 0

    @property
    def num_samples(self) -> int:
        return int(self.shard_sizes.sum())

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning; the current epoch keeps its position."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self.prior, self.consumed = epoch, [], 0

    def next_epoch(self) -> None:
        self.epoch, self.prior, self.consumed = self.epoch + 1, [], 0

    def segments(self) -> list[Segment]:
        """Everything trained in this epoch so far, the current topology last."""
        segs = list(self.prior)
        if self.consumed:
            segs.append(Segment(self.ctx.world_size, self.ctx.ranks_per_node, self.consumed))
        return segs

    def plan(self) -> EpochPlan:
        """The plan of what remains of this epoch, for every rank of the current topology."""
        o = self.options
        return plan_epoch(
            self.shard_sizes,
            seed=o.seed,
            epoch=self.epoch,
            world_size=self.ctx.world_size,
            ranks_per_node=self.ctx.ranks_per_node,
            window=o.window,
            shuffle=o.shuffle,
            drop_last=o.drop_last,
            segments=self.segments(),
        )

    def remaining(self) -> np.ndarray:
        """Global sample ids this rank still reads in this epoch, in order."""
        return self.plan().rank_samples(self.ctx.rank)

    def advance(self, n: int) -> None:
        self.consumed += n

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "num_samples": self.num_samples,
            "num_shards": len(self.shard_sizes),
            "seed": self.options.seed,
            "shuffle": self.options.shuffle,
            "drop_last": self.options.drop_last,
            "window": self.options.window,
            "epoch": self.epoch,
            "world_size": self.ctx.world_size,
            "ranks_per_node": self.ctx.ranks_per_node,
            "samples_consumed": sum(s.samples_per_rank * s.world_size for s in self.segments()),
            "segments": [
                [s.world_size, s.ranks_per_node, s.samples_per_rank] for s in self.segments()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> PlanOptions:
        """Restore a position saved by any rank of any world size; returns the plan options
        it was saved with (seed, shuffle, window), which replace the current ones."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"not a flashfeed loader state of version {STATE_VERSION}: {str(state)[:80]!r}"
            )
        if state["num_samples"] != self.num_samples or state["num_shards"] != len(self.shard_sizes):
            raise ValueError(
                f"the state belongs to another dataset: it has {state['num_samples']} samples "
                f"in {state['num_shards']} shards, this one {self.num_samples} in "
                f"{len(self.shard_sizes)}"
            )
        self.options = PlanOptions(
            seed=int(state["seed"]),
            shuffle=bool(state["shuffle"]),
            drop_last=bool(state["drop_last"]),
            window=int(state["window"]),
        )
        segs = _segments(state["segments"])
        self.epoch = int(state["epoch"])
        here = Segment(self.ctx.world_size, self.ctx.ranks_per_node, 0).topology
        if segs and segs[-1].topology == here:
            self.prior, self.consumed = segs[:-1], segs[-1].samples_per_rank
        else:
            self.prior, self.consumed = segs, 0
        self.plan()  # refuses a state that does not fit this dataset
        return self.options


def _segments(raw: Sequence[Any]) -> list[Segment]:
    out = []
    for item in raw:
        ws, rpn, n = item
        out.append(Segment(int(ws), None if rpn is None else int(rpn), int(n)))
    return out
