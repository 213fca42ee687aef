"""The report's rows of the text stages: tokenizing ingest, the token loader, near-dups."""

from __future__ import annotations

from typing import Any

from benchmarks.benchmath import ratio, report_row, spread

__all__ = ["neardup_rows", "neardupcurve_rows", "token_rows"]


def token_rows(stages: dict[str, Any]) -> list[dict[str, Any]]:
    """The tokens stage: ingest tokenization beside its peers, TokenLoader beside memcpy."""
    data = (stages.get("tokens") or {}).get("data") or {}
    if not data:
        return []
    rows = []
    t = (data.get("tokenize") or {}).get("rounds") or {}
    ff = t.get("flashfeed-ingest")
    for peer in ("datasets-map", "encode_batch", "encode_batch_fast"):
        if ff and t.get(peer):
            rows.append(
                report_row("tokens", "tokenization at ingest, 2 Ray CPUs", spread(ff), "MB/s", peer,
                     spread(t[peer]), ratio(ff, t[peer]))
            )  # fmt: skip
    rows += _per_cpu_rows(data.get("per_cpu"))
    if "loader" not in data:
        return rows
    lo = data["loader"]["rounds"]
    mine, plain = lo["with document outputs"], lo["tokens only"]
    rows.append(
        report_row("tokens", "TokenLoader with document outputs, CPU", spread(mine), "GB/s",
             "tokens only", spread(plain), ratio(mine, plain), "memcpy of the same bytes",
             max(lo["memcpy (same bytes)"]))
    )  # fmt: skip
    return rows


def _per_cpu_rows(per: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Token ingest's MB per CPU second beside ``encode_batch_fast`` on one thread, per
    corpus shape and Ray CPU count (``tokpercpu``)."""
    if not per:
        return []
    rows = []
    for shape, by_cpus in per["runs"].items():
        mb = per["corpora"][shape]["mb"]
        for cpus, runs in by_cpus.items():
            fast = [mb / k["cpu"] for k in per["kernels"][shape][cpus]["encode_batch_fast"]]
            mine = [mb / r["cpu"] for r in runs]
            rows.append(
                report_row("tokens", f"token ingest per CPU, {shape} documents, {cpus} Ray CPU",
                     spread(mine), "MB/CPU-s", "encode_batch_fast, 1 thread", spread(fast),
                     ratio(mine, fast))
            )  # fmt: skip
    return rows


def neardup_rows(stages: dict[str, Any]) -> list[dict[str, Any]]:
    """The neardup stage: the Ray stage at 2 CPUs beside 1, rensa beside datasketch."""
    data = (stages.get("neardup") or {}).get("data") or {}
    if not data:
        return []
    runs = {c: [r["docs_per_s"] for r in rs] for c, rs in data["ray"].items()}
    rows = []
    if "1" in runs and "2" in runs:
        rows.append(
            report_row("ingest", "near-dup removal, 2 Ray CPUs", spread(runs["2"]), "docs/s",
                 "1 Ray CPU", spread(runs["1"]), ratio(runs["2"], runs["1"]))
        )  # fmt: skip
    kernels = {k["kernel"]: k.get("rounds") for k in data["kernels"] if k.get("rounds")}
    mine = kernels.get("flashfeed-rensa")
    for peer in ("datasketch", "flashfeed-numpy"):
        if mine and kernels.get(peer):
            rows.append(
                report_row("ingest", "MinHash LSH, rensa kernel, 1 process", spread(mine), "docs/s",
                     peer, spread(kernels[peer]), ratio(mine, kernels[peer]))
            )  # fmt: skip
    return rows


def neardupcurve_rows(stages: dict[str, Any]) -> list[dict[str, Any]]:
    """The neardupcurve stage: documents per CPU second, from text to clusters with the
    exact check, beside the faster of datasketch and rensa used directly."""
    data = (stages.get("neardupcurve") or {}).get("data") or {}
    runs = (data.get("speed") or {}).get("rounds") or {}
    med = data.get("speed", {}).get("median") or {}
    peers = [k for k in ("rensa", "datasketch") if runs.get(k)]
    if not runs.get("flashfeed") or not peers:
        return []
    peer = max(peers, key=lambda k: med[k])
    what = "near-dup removal with the exact check, 1 process"
    return [
        report_row("ingest", what, spread(runs["flashfeed"]), "docs/CPU s", f"{peer} used directly",
             spread(runs[peer]), ratio(runs["flashfeed"], runs[peer]))
    ]  # fmt: skip
