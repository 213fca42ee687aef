"""Warming a node's cache before a run: one node's share, a mixture's, a whole cluster's."""

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
    "warm_share",
]
