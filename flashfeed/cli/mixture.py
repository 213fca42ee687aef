"""``flashfeed inspect`` and ``verify`` on a mixture file: each source in turn, named."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from flashfeed.dataset import Dataset
from flashfeed.plan.mixture import Mixture, load_mixture
from flashfeed.summary import format_summary, summarize

__all__ = ["inspect_mixture", "verify_mixture"]


def _open(mixture: Mixture) -> list[Dataset]:
    """Every source's dataset; one that cannot be opened is named (one line)."""
    out = []
    for s in mixture.sources:
        try:
            out.append(Dataset.open(s.url))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"mixture source {s.key!r} ({s.url}) cannot be opened: {exc}"
            ) from None
    return out


def inspect_mixture(args: argparse.Namespace) -> int:
    """The mixture (weights, schedule, epoch) and each source's summary."""
    mixture = load_mixture(args.url)
    datasets = _open(mixture)
    sources = {}
    for s, w, ds in zip(mixture.sources, mixture.weights, datasets, strict=True):
        summary = summarize(ds.manifest, url=ds.url, shards=args.shards)
        sources[s.key] = {**summary, "weight": float(w)}
    if args.json:
        out = {"mixture": args.url, "digest": mixture.digest, **mixture.to_dict()}
        out["sources"] = sources
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    epoch = (
        f"length {mixture.length}" if mixture.length is not None
        else f"until {mixture.until!r} is read once" if mixture.until is not None
        else f"{sum(d.manifest.num_samples for d in datasets)} samples (all sources)"
    )  # fmt: skip
    print(f"mixture {args.url}: {len(datasets)} sources, {len(mixture.schedule)} schedule "
          f"change(s), epoch: {epoch}")  # fmt: skip
    for name, summary in sources.items():
        print(f"\nsource {name} (weight {summary['weight']:.4f}):")
        print(format_summary(summary))
    return 0


def verify_mixture(args: argparse.Namespace, verify: Callable[[Any, Dataset], int]) -> int:
    """Every source verified by ``verify`` (the one-dataset command), each named; exit 1 if
    any source has a bad shard."""
    mixture = load_mixture(args.url)
    worst = 0
    for s, ds in zip(mixture.sources, _open(mixture), strict=True):
        print(f"source {s.key}: ", end="", flush=True)
        worst = max(worst, verify(args, ds))
    return worst
