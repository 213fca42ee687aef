"""The plan: which samples each rank reads, in what order, for one dataset or a mixture.

Pure, seeded functions of (manifest, options, topology): every rank, the cache's eviction and
``cache warm`` compute the same answer without talking to each other.
"""

from __future__ import annotations

from flashfeed.plan.mixture import Change, Mixture, Source, load_mixture
from flashfeed.plan.plan import (
    EpochPlan,
    PlanOptions,
    RankPlan,
    Segment,
    Topology,
    deal,
    epoch_sequence,
    locate,
    node_samples,
    node_shard_order,
    plan_epoch,
    rank_plan,
)

__all__ = [
    "Change",
    "EpochPlan",
    "Mixture",
    "PlanOptions",
    "RankPlan",
    "Segment",
    "Source",
    "Topology",
    "deal",
    "epoch_sequence",
    "load_mixture",
    "locate",
    "node_samples",
    "node_shard_order",
    "plan_epoch",
    "rank_plan",
]
