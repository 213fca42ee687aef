"""The node service as training loaders see it, against the embedded cache, in one run
(``nodebench.py`` runs these beside its hit and flood rows):

  token hot    ``TokenLoader`` GB/s of token bytes over a cached Arrow token dataset:
               through the service vs the embedded cache; rounds interleaved
  cold epoch   one epoch of ``ShardDataset`` from an empty cache (each round evicts the
               service's copies, or starts a new embedded cache) to the last sample:
               samples a second, through the service vs embedded

Each side reads the same store; the ratio is the service's over the embedded cache's.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.benchmath import ratio
from benchmarks.harness.rounds import run_rounds

__all__ = ["loader_rows", "through_node_service"]


def through_node_service(sock: str, make: Callable[[], Any]) -> Any:
    """``make()`` with ``FLASHFEED_NODE_SOCKET`` set: a loader whose shards come from the
    service (the variable is read when the loader opens its source)."""
    before = os.environ.get("FLASHFEED_NODE_SOCKET")
    os.environ["FLASHFEED_NODE_SOCKET"] = sock
    try:
        return make()
    finally:
        if before is None:
            del os.environ["FLASHFEED_NODE_SOCKET"]
        else:
            os.environ["FLASHFEED_NODE_SOCKET"] = before


def _token_pass(loader: Any, min_seconds: float = 1.0) -> float:
    """GB/s of whole passes of ``loader`` for at least ``min_seconds``: the token bytes
    delivered over their time (one pass of a small dataset is too short to time)."""
    nbytes, t0 = 0, time.perf_counter()
    while True:
        nbytes += sum(b["tokens"].numel() * b["tokens"].element_size() for b in loader)
        took = time.perf_counter() - t0
        if took >= min_seconds:
            return nbytes / took / 1e9


def _cold_epoch(make: Callable[[], Any], reset: Callable[[], None]) -> float:
    """Samples a second of a first epoch from an empty cache, the loader's set-up counted;
    the loader is closed after it (the descriptors it holds let go)."""
    reset()
    t0 = time.perf_counter()
    loader = make()
    n = sum(1 for _ in loader)
    took = time.perf_counter() - t0
    loader.close()
    return n / took


def loader_rows(
    *,
    sock: str,
    client: Any,
    tokens_url: str,
    images_url: str,
    embedded_dir: str,
    rounds: int,
    batch: int = 64,
) -> dict[str, Any]:
    """The token-hot and cold-epoch rows (see the module docstring)."""
    from flashfeed.loader import ShardDataset, TokenLoader

    def token_loader(**kw: Any) -> Any:
        return TokenLoader(
            tokens_url, batch_size=batch, dtype=None, device="cpu", shuffle=False, **kw
        )

    node_tok = through_node_service(sock, token_loader)
    cache_tok = token_loader(cache_dir=embedded_dir)
    for loader in (node_tok, cache_tok):  # hot: every shard cached and mapped once
        _token_pass(loader, 0.0)
    tokens = run_rounds({"node": lambda: _token_pass(node_tok),
                         "embedded": lambda: _token_pass(cache_tok)}, rounds)  # fmt: skip

    cold_dir = embedded_dir + "-cold"

    def reset() -> None:
        """Both caches emptied before either side's epoch: each side's fills then find the
        memory the other's copies held freed (on a VM, memory never touched before costs
        the writer several times the copy: a side that kept its copies would slow the
        next one)."""
        got = client.evict(images_url)
        shutil.rmtree(cold_dir, ignore_errors=True)
        if got.get("kept"):
            raise RuntimeError(f"the service kept shards of {images_url} at evict: {got}")

    def node_epoch() -> Any:
        return through_node_service(sock, lambda: ShardDataset(images_url, shuffle=False))

    cold = run_rounds(
        {
            "node": lambda: _cold_epoch(node_epoch, reset),
            "embedded": lambda: _cold_epoch(
                lambda: ShardDataset(images_url, shuffle=False, cache_dir=cold_dir), reset
            ),
        },
        rounds,
    )
    shutil.rmtree(cold_dir, ignore_errors=True)
    for loader in (node_tok, cache_tok):
        loader.close()
    return {
        "token_hot_gb_per_s": tokens,
        "token_hot_node_vs_embedded": ratio(tokens["node"], tokens["embedded"]),
        "cold_epoch_samples_per_s": cold,
        "cold_epoch_node_vs_embedded": ratio(cold["node"], cold["embedded"]),
        "medians": {
            "token_gb_per_s": {k: statistics.median(v) for k, v in tokens.items()},
            "cold_samples_per_s": {k: statistics.median(v) for k, v in cold.items()},
        },
    }
