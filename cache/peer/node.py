"""``PeerNode``: one node's cache, its view of the cluster and its server, wired together.

What a node service hosts (or ``python -m flashfeed.cache.peer serve`` runs alone): a
``ShardCache`` whose misses go to peers first (``PeerTier``), and a ``PeerServer`` that
serves this cache to the others and fills, for them, the shards this node single-flights.
A fill asked for by a peer reads the store itself (it never hands the shard on again), so
two nodes with different views of who is alive cannot wait on each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashfeed.dataset import Dataset

from ..shardcache import ShardCache
from .client import PeerTier
from .server import PeerServer

__all__ = ["PeerNode"]


class PeerNode:
    """A node of the cluster tier: ``cache`` (use it as any ``ShardCache``) and ``server``.

    ``peers``: every node's ``host:port`` (this one's may be in it); ``listen``: where this
    node serves (port 0: any, then ``address`` says which).
    """

    def __init__(
        self,
        *,
        cache_dir: str,
        token: bytes,
        listen: tuple[str, int],
        peers: Sequence[str] = (),
        storage_options: dict[str, Any] | None = None,
        max_streams: int = 8,
        rate: float = 0.0,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.server = PeerServer(
            cache_dir=cache_dir,
            token=token,
            address=listen,
            fill=self._fill,
            open_dataset=self._open,
            max_streams=max_streams,
            rate=rate,
        )
        self.address = self.server.address
        self.tier = PeerTier(peers=peers, token=token, self_address=self.address)
        self.cache = ShardCache(
            cache_dir, storage_options=storage_options, peers=self.tier, **(cache_kwargs or {})
        )

    def _fill(self, dataset: Dataset, shard: int) -> None:
        with self.tier.owning():
            self.cache.fetch(dataset, shard)

    def _open(self, url: str) -> Dataset:
        return self.cache.open_dataset(url)

    def set_peers(self, peers: Sequence[str]) -> None:
        """The cluster's nodes changed (a node joined, or was replaced)."""
        self.tier.peers = [p for p in dict.fromkeys(peers) if p != self.address]

    def start(self) -> PeerNode:
        self.server.start()
        return self

    def close(self) -> None:
        self.server.close()
        self.cache.close()

    def __enter__(self) -> PeerNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
