"""Optional Prometheus metrics of a loader (``prometheus_client``, 127.0.0.1 by default)."""

from __future__ import annotations

from typing import Any

from .stats import WAIT_KINDS, BatchTiming

__all__ = ["PrometheusExporter"]

INSTALL_HINT = (
    "prometheus_port= needs the optional package prometheus_client "
    "(pip install prometheus-client); or leave prometheus_port unset"
)


class PrometheusExporter:
    """Serves samples, batches and wait seconds per kind on ``http://addr:port/metrics``.

    ``port=0`` picks a free port (see ``.port``). Every exporter has its own registry, so
    several loaders in one process do not collide.
    """

    def __init__(self, *, port: int, rank: int = 0, addr: str = "127.0.0.1") -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ImportError(INSTALL_HINT) from None
        if not 0 <= port < 65536:
            raise ValueError(f"prometheus port must be in [0, 65536), got {port}")
        self.registry: Any = prom.CollectorRegistry()
        labels = {"rank": str(rank)}
        self.samples = prom.Counter(
            "flashfeed_loader_samples", "Samples delivered", ["rank"], registry=self.registry
        ).labels(**labels)
        self.batches = prom.Counter(
            "flashfeed_loader_batches", "Batches delivered", ["rank"], registry=self.registry
        ).labels(**labels)
        wait = prom.Counter(
            "flashfeed_loader_wait_seconds",
            "Seconds the consumer waited, by cause",
            ["rank", "kind"],
            registry=self.registry,
        )
        self.waits = {k: wait.labels(kind=k, **labels) for k in WAIT_KINDS}
        self.stall = prom.Gauge(
            "flashfeed_loader_last_wait_seconds",
            "Consumer wait of the latest batch",
            ["rank"],
            registry=self.registry,
        ).labels(**labels)
        server = prom.start_http_server(port, addr=addr, registry=self.registry)
        self.server: Any = server[0] if isinstance(server, tuple) else None
        self.port = self.server.server_port if self.server is not None else port
        self.addr = addr

    def observe(self, timing: BatchTiming) -> None:
        self.samples.inc(timing.samples)
        self.batches.inc()
        for k in WAIT_KINDS:
            self.waits[k].inc(getattr(timing, k))
        self.stall.set(timing.wait)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None
