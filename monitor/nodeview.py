"""The node service's figures in ``flashfeed top``: one row per tenant and job, as the
service tells them to whoever asks (a tenant sees its own rows, an admin every tenant's).
Shown when ``FLASHFEED_NODE_SOCKET`` names a service."""

from __future__ import annotations

from typing import Any

__all__ = ["NodeView"]


class NodeView:
    """Asks the service at each frame; one line saying so when it is away."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._client: Any = None

    def lines(self) -> list[str]:
        from flashfeed.cache.node.cli import status_text
        from flashfeed.cache.node.client import NodeClient, NodeError

        try:
            if self._client is None:
                self._client = NodeClient(self.socket_path, job="top", reconnect_timeout=0.5)
            body = self._client.status()
        except NodeError as exc:
            return [f"node service {self.socket_path}: {exc}"]
        return [f"node service {self.socket_path}", *status_text(body).splitlines()]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
