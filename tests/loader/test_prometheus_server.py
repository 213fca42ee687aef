"""Loader metrics as a real Prometheus server scrapes them, and the Grafana dashboard."""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from flashfeed.loader.telemetry.prometheus import METRICS, PrometheusExporter, is_loopback
from flashfeed.loader.telemetry.stats import BatchTiming
from flashfeed.runtime.lifeline import popen

from support import REPO
from support.monitor_helpers import running_ranks, wait_for

pytest.importorskip("prometheus_client")

PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
)
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scraped_names(exporter: PrometheusExporter) -> set[str]:
    """Every sample name the exporter serves, read from its /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics").read().decode()
    return {s.name for fam in text_string_to_metric_families(body) for s in fam.samples}


@pytest.fixture
def exporter(tmp_path):
    from flashfeed.cache import ShardCache

    e = PrometheusExporter(port=0, rank=2, node="n7", dataset="s3://b/ds")
    e.observe(BatchTiming(t=1.0, rank=2, epoch=1, batch=0, samples=8, storage=0.5, decode=0.1,
                          h2d=0.0, step=0.2))  # fmt: skip
    with ShardCache(str(tmp_path / "cache"), capacity=1 << 20) as cache:
        e.set_cache(cache.stats())  # every counter a real cache reports
    yield e
    e.close()


def test_metric_names_follow_prometheus_conventions(exporter):
    names = _scraped_names(exporter)
    assert names == {m.name for m in METRICS}
    for name in names:
        assert name.startswith("flashfeed_"), name
        assert re.fullmatch(r"[a-z_]+", name), name
    for m in METRICS:
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert "seconds" not in m.name or m.name.endswith(("_seconds_total", "_seconds")), m.name
        assert "bytes" not in m.name or m.name.endswith(("_bytes_total", "_bytes")), m.name
    body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics").read().decode()
    assert 'flashfeed_loader_samples_total{dataset="s3://b/ds",node="n7",rank="2"} 8.0' in body


def test_the_grafana_dashboard_uses_only_exported_metrics(exporter):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {n for e in exprs for n in re.findall(r"\bflashfeed_[a-z_]+", e)}
    exported = _scraped_names(exporter)
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("throughput per rank", "stall", "hit rate", "gb/s"):
        assert topic in titles, topic


def test_loopback_is_the_default_and_wider_binds_warn(caplog):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    with caplog.at_level(logging.WARNING, logger="flashfeed.loader"):
        quiet = PrometheusExporter(port=0)
        assert quiet.addr == "127.0.0.1" and not caplog.records
        quiet.close()
        wide = PrometheusExporter(port=0, addr="0.0.0.0")
        wide.close()
    assert "beyond loopback" in caplog.text and f"0.0.0.0:{wide.port}" in caplog.text


def test_a_bad_port_or_address_is_named():
    with pytest.raises(ValueError, match="prometheus_port"):
        PrometheusExporter(port=70000)
    with pytest.raises(ValueError, match="prometheus_addr"):
        PrometheusExporter(port=0, addr="")


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    except OSError:
        return []
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus server is not installed and could not be: apt-get install "
    "prometheus (make test installs it when run as root with apt)",
)
def test_a_real_prometheus_scrapes_the_rates_of_two_ranks(tmp_path):
    with running_ranks(tmp_path, prometheus=True) as run:
        port = _free_port()
        targets = [f"127.0.0.1:{p}" for p in run.ports]
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: flashfeed\n    static_configs:\n"
            f"      - targets: {json.dumps(targets)}\n"
        )
        log = open(tmp_path / "prometheus.log", "wb")
        server = popen(
            [
                str(PROMETHEUS),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        try:
            rate = "rate(flashfeed_loader_samples_total[5s])"
            samples = wait_for(
                "Prometheus to hold a samples/s rate for both ranks",
                lambda: (
                    (r := _query(port, rate))
                    and {x["metric"]["rank"] for x in r if float(x["value"][1]) > 0} == {"0", "1"}
                    and r
                ),
                timeout=120,
            )
            stalls = _query(
                port, "sum by (rank, kind) (rate(flashfeed_loader_wait_seconds_total[5s]))"
            )
            hits = _query(port, "sum by (rank) (rate(flashfeed_cache_hits_total[10s]))")
            up = _query(port, "up")
        finally:
            server.kill()
            server.wait()
    per_rank = {x["metric"]["rank"]: float(x["value"][1]) for x in samples}
    assert set(per_rank) == {"0", "1"} and all(v > 0 for v in per_rank.values())
    for x in samples:
        assert x["metric"]["node"] == socket.gethostname()
        assert x["metric"]["dataset"] == run.url
    assert {(x["metric"]["rank"], x["metric"]["kind"]) for x in stalls} == {
        (r, k) for r in ("0", "1") for k in ("storage", "decode", "h2d")
    }
    assert all(0 <= float(x["value"][1]) <= 1 for x in stalls)
    assert {x["metric"]["rank"] for x in hits} == {"0", "1"}
    assert sorted(x["value"][1] for x in up) == ["1", "1"]


def test_the_monitoring_page_lists_every_exported_metric(exporter):
    page = (DASHBOARD.parent / "MONITORING.md").read_text()
    documented = set(re.findall(r"`(flashfeed_[a-z_]+)`", page))
    assert documented == _scraped_names(exporter)
