"""Resuming packed loading of a mixture on another world size: the states of every rank,
merged as ``packedstate.py`` merges one dataset's.

A mixture's deal is lock-step: every rank takes the same slots, so the state of the rank
that consumed the fewest documents (``m``) is the job's lock-step position; loaded on
another world size, the mixture starts a new deal from where every source stands there
(``MixPosition``). What some rank delivered beyond ``m`` is skipped when the new split
meets it, and the documents a rank stopped inside continue from that token. A pure
function of the states and the mixture's plan, the same on every new rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..distributed import DistContext
from ..mixposition import MixPosition
from .packedstate import check_job, merge_deliveries

__all__ = ["as_mixture_state", "merge_mix_states", "plan_state"]


def as_mixture_state(state: dict[str, Any]) -> dict[str, Any]:
    """A packed state of a mixture as its ``MixPosition`` state."""
    return dict(state, kind="mixture")


def plan_state(state: dict[str, Any], position: MixPosition) -> dict[str, Any]:
    """A packed state's plan as ``position``'s state: only under the mixture it was saved
    with (each rank packs its own documents: no rank can start a new deal alone)."""
    deal = state.get("deal")
    if state.get("plan") != "mixture" or not isinstance(deal, dict):
        raise ValueError(
            f"the state belongs to one dataset ({state.get('url')}); this PackedLoader "
            f"reads the mixture {list(position.mix.names)}"
        )
    if deal.get("mixture") != position.mix.mixture.digest:
        raise ValueError(
            "a PackedLoader over a mixture resumes under the mixture its state was saved "
            "with: weights, schedule, length and sources unchanged"
        )
    return as_mixture_state(state)


def merge_mix_states(
    states: Sequence[dict[str, Any]], position: MixPosition
) -> tuple[dict[str, Any], set[int], dict[int, int]]:
    """``(position state, documents to skip, document -> token to continue at)`` from the
    states of every rank of one job over ``position``'s mixture (virtual document ids)."""
    world, rpn = check_job(states, ("epoch", "world_size", "ranks_per_node", "seed", "mixture"))
    deals = {repr(_deal_where(s)) for s in states}
    if len(deals) > 1:
        raise ValueError(
            "the states disagree on their deal (where it started, its mixture or its "
            "cursors): they were not saved after the same step of one job"
        )
    if _deal_where(states[0]).get("mixture") != position.mix.mixture.digest:
        raise ValueError(
            "a PackedLoader over a mixture resumes on another world size under the mixture "
            "its states were saved with (their deal's mixture differs from this one's)"
        )
    taken = [_consumed(s) for s in states]
    lowest = states[taken.index(min(taken))]
    shares = []
    for s in states:
        rank = int(s["rank"])
        old = MixPosition(position.mix, DistContext(rank, world, rpn), position.options)
        old.load_state_dict(as_mixture_state(s))  # the same deal, exactly: checks the state
        shares.append(old.planner.rank_plan(replace(old.progress, consumed=0), rank).samples)
    skip, resume = merge_deliveries(states, taken, shares)
    return as_mixture_state(lowest), skip, resume


def _deal_where(state: dict[str, Any]) -> dict[str, Any]:
    """The state's deal without what each rank consumed of it."""
    deal = state.get("deal")
    if not isinstance(deal, dict):
        raise ValueError(f"packed mixture state field 'deal' must be a mapping, got {deal!r}")
    return {k: v for k, v in deal.items() if k not in ("consumed", "counts")}


def _consumed(state: dict[str, Any]) -> int:
    deal = state.get("deal")
    v = deal.get("consumed") if isinstance(deal, dict) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"packed mixture state: deal consumed must be an integer >= 0, got {v!r}")
    return v
