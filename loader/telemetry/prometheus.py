"""Optional Prometheus metrics of a loader (``prometheus_client``), scraped over HTTP.

Names follow Prometheus conventions: a ``flashfeed_`` prefix, base units in the name,
``_total`` on counters (``_seconds_total``, ``_bytes_total``), and the labels ``rank``,
``node`` and ``dataset`` on every series, so one dashboard covers every node of a run.
``METRICS`` is the one list of what is exported (docs/grafana-dashboard.json uses it).

The exporter listens on 127.0.0.1 unless ``addr`` says otherwise; a Prometheus server on
another host needs ``prometheus_addr="0.0.0.0"`` (or the node's address), which logs a
warning: the metrics then answer anyone who can reach the port.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from flashfeed.storage import redact

from .stats import WAIT_KINDS, BatchTiming

__all__ = ["METRICS", "Metric", "PrometheusExporter", "is_loopback"]

log = logging.getLogger("flashfeed.loader")

INSTALL_HINT = (
    "prometheus_port= needs the optional package prometheus_client "
    "(pip install prometheus-client); or leave prometheus_port unset"
)
LABELS = ("rank", "node", "dataset")


@dataclass(frozen=True)
class Metric:
    """One exported family: its full name (as scraped), type, help, and source key."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    key: str  # loader total or cache stats key it reads
    extra_label: str | None = None


METRICS: tuple[Metric, ...] = (
    Metric("flashfeed_loader_samples_total", "counter", "Samples delivered", "samples"),
    Metric("flashfeed_loader_batches_total", "counter", "Batches delivered", "batches"),
    Metric(
        "flashfeed_loader_wait_seconds_total",
        "counter",
        "Seconds the consumer waited for batches, by cause (storage, decode, h2d)",
        "wait",
        "kind",
    ),
    Metric(
        "flashfeed_loader_storage_waited_batches_total",
        "counter",
        "Batches the consumer waited over 1 ms for shard bytes before",
        "waited_on_storage",
    ),
    Metric("flashfeed_loader_epoch", "gauge", "Epoch of the latest batch", "epoch"),
    Metric(
        "flashfeed_loader_last_wait_seconds", "gauge", "Consumer wait of the latest batch", "last"
    ),
    Metric("flashfeed_cache_hits_total", "counter", "Shard reads found in the cache", "hits"),
    Metric("flashfeed_cache_misses_total", "counter", "Shard reads that fetched", "misses"),
    Metric(
        "flashfeed_cache_fetched_bytes_total",
        "counter",
        "Bytes fetched from object storage",
        "bytes_fetched",
    ),
    Metric(
        "flashfeed_cache_fetch_seconds_total", "counter", "Seconds spent fetching", "fetch_seconds"
    ),
    Metric("flashfeed_cache_evictions_total", "counter", "Shards evicted", "evictions"),
    Metric("flashfeed_cache_evicted_bytes_total", "counter", "Bytes evicted", "evicted_bytes"),
    Metric(
        "flashfeed_cache_throttle_events_total",
        "counter",
        "Object-store throttling answers (503 SlowDown and the like)",
        "throttle_events",
    ),
    Metric("flashfeed_cache_retries_total", "counter", "Fetch requests retried", "retries"),
    Metric("flashfeed_cache_used_bytes", "gauge", "Bytes the node cache holds", "used_bytes"),
    Metric("flashfeed_cache_capacity_bytes", "gauge", "Capacity of the node cache", "capacity"),
)


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (an IP or a host name) only listens to this host."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(addr, None)
            )
        except (OSError, ValueError):
            return False


class PrometheusExporter:
    """Serves a loader's metrics (``METRICS``) on ``http://addr:port/metrics``.

    ``port=0`` picks a free port (see ``.port``). Every exporter has its own registry, so
    several loaders in one process do not collide. Cache counters are this process's
    (``set_cache``), labelled like the loader's series.
    """

    def __init__(
        self,
        *,
        port: int,
        rank: int = 0,
        addr: str = "127.0.0.1",
        node: str | None = None,
        dataset: str = "",
    ) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ImportError(INSTALL_HINT) from None
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"prometheus_port must be an int in [0, 65536), got {port!r}")
        if not isinstance(addr, str) or not addr:
            raise ValueError(f"prometheus_addr must be an address such as 127.0.0.1, got {addr!r}")
        self.labels = {
            "rank": str(rank),
            "node": node or socket.gethostname(),
            "dataset": redact(dataset),
        }
        self._lock = threading.Lock()
        self._values: dict[str, float] = {"samples": 0, "batches": 0, "waited_on_storage": 0}
        self._values.update({"epoch": 0, "last": 0.0})
        self._waits = dict.fromkeys(WAIT_KINDS, 0.0)
        self._cache: dict[str, float] = {}
        self._sources: tuple[dict[str, int], dict[str, float]] = ({}, {})
        self.registry: Any = prom.CollectorRegistry()
        self.registry.register(_Collector(self))
        try:
            server = prom.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve Prometheus metrics on {addr}:{port} ({exc.strerror or exc}): "
                "pick another prometheus_port (0 = any free one) or prometheus_addr"
            ) from None
        self.server: Any = server[0] if isinstance(server, tuple) else None
        self.port = self.server.server_port if self.server is not None else port
        self.addr = addr
        if not is_loopback(addr):
            log.warning(
                "flashfeed metrics listen on %s:%d, beyond loopback: anyone who can reach "
                "this port can read them (dataset names included); firewall it to the "
                "Prometheus server",
                addr,
                self.port,
            )

    def observe(self, timing: BatchTiming) -> None:
        with self._lock:
            self._values["samples"] += timing.samples
            self._values["batches"] += 1
            self._values["waited_on_storage"] += timing.waited_on_storage
            self._values["epoch"] = timing.epoch
            self._values["last"] = timing.wait
            for k in WAIT_KINDS:
                self._waits[k] += getattr(timing, k)

    def set_cache(self, stats: dict[str, Any]) -> None:
        """The latest counters of this process's cache (``ShardCache.stats()``)."""
        numbers = {
            k: float(v)
            for k, v in stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        with self._lock:
            self._cache = numbers

    def set_sources(self, samples: dict[str, int], storage_s: dict[str, float]) -> None:
        """A mixture's totals per source: samples delivered and storage wait (seconds)."""
        with self._lock:
            self._sources = (dict(samples), dict(storage_s))

    def _source_families(self, names: list[str], label_values: list[str]) -> Iterator[Any]:
        """``flashfeed_source_samples_total`` and ``..._storage_wait_seconds_total`` with a
        ``source`` label: only a mixture's loader has them."""
        from prometheus_client.core import CounterMetricFamily

        with self._lock:
            samples, storage = self._sources
        if not samples:
            return
        for base, help_, values in (
            ("flashfeed_source_samples", "Samples delivered per mixture source", samples),
            ("flashfeed_source_storage_wait_seconds",
             "Storage wait per mixture source (a batch's wait shared by its samples)", storage),
        ):  # fmt: skip
            fam = CounterMetricFamily(base, help_, labels=[*names, "source"])
            for source, v in values.items():
                fam.add_metric([*label_values, source], float(v))
            yield fam

    def families(self) -> Iterator[Any]:
        """The metric families as of now (what a scrape returns)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            values, waits, cache = dict(self._values), dict(self._waits), dict(self._cache)
        names, label_values = list(LABELS), [self.labels[k] for k in LABELS]
        for m in METRICS:
            cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            base = m.name[: -len("_total")] if m.kind == "counter" else m.name
            if m.extra_label is not None:
                fam = cls(base, m.help, labels=[*names, m.extra_label])
                for kind, v in waits.items():
                    fam.add_metric([*label_values, kind], v)
                yield fam
                continue
            value = values.get(m.key, cache.get(m.key))
            if value is None:
                continue  # no cache behind this loader: no cache series
            fam = cls(base, m.help, labels=names)
            fam.add_metric(label_values, value)
            yield fam
        yield from self._source_families(names, label_values)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Collector:
    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Any]:
        return self.exporter.families()

    def describe(self) -> list[Any]:
        return []
