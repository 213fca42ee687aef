"""Warming a node's cache before a run: one node's share of a dataset or of a mixture (a
dataset is a mixture of one: ``units.share_units``), a whole cluster's."""

from __future__ import annotations

from .warm import (
    NodeShare,
    WarmResult,
    check_warm_record,
    dataset_digest,
    describe_warm_record,
    fitting_prefix,
    warm,
    warm_mismatch,
    warm_pairs,
    warm_share,
)

__all__ = [
    "NodeShare",
    "WarmResult",
    "check_warm_record",
    "dataset_digest",
    "describe_warm_record",
    "fitting_prefix",
    "warm",
    "warm_mismatch",
    "warm_pairs",
    "warm_share",
]
