"""The benchmark suite's pure parts stay runnable: tables and BENCHMARKS.md from a small
result, the plots, and the plan-cost and eviction-curve functions at small sizes.
No timed assertions: benchmark numbers are not tests."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from support.bench import load_bench


def _load(name: str) -> ModuleType:
    return load_bench(name)


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return _load("report")


def _ingest(scale: float) -> dict[str, Any]:
    runs = {
        m: [{"mb_s": v * scale, "seconds": 1.0, "shards": 2}, {"mb_s": v * scale * 1.1}]
        for m, v in (("flashfeed", 70.0), ("ray-data", 44.0), ("shardwriter", 60.0))
    }
    med = {m: (r[0]["mb_s"] + r[1]["mb_s"]) / 2 for m, r in runs.items()}
    return {"runs": runs, "median_mb_s": med, "ceilings": {"s3_put_mb_s": 200.0}}


def _loader(scale: float) -> dict[str, Any]:
    base = {
        "flashfeed": 490.0,
        "dali-reader": 466.0,
        "wds+pil": 245.0,
        "imagefolder+pil": 273.0,
        "decode-ceiling": 520.0,
    }
    rounds = {k: [v * scale, v * scale * 0.9] for k, v in base.items()}
    return {
        "images": {
            "img_per_s": {k: v[0] for k, v in rounds.items()},
            "rounds": {"img_per_s": rounds},
        },
        "tokens_gbps": {"tokens-int32": 2.0, "row-gather": 8.0, "memcpy": 8.9},
    }


def _result() -> dict[str, Any]:
    cold = {
        "warm_gbps": [0.5, 0.52],
        "raw_gbps": [0.8, 0.85],
        "warm_median": 0.51,
        "raw_median": 0.82,
    }
    records = [
        {
            "t": 100.0 + i * 0.2,
            "rank": 0,
            "epoch": i // 10,
            "samples": 64,
            "storage": 0.1 if i < 10 else 0.0,
            "decode": 0.05,
            "h2d": 0.0,
        }
        for i in range(20)
    ]
    return {
        "date": "2026-11-29T17:00:00+00:00",
        "profile": "quick",
        "device": "cpu",
        "duration_s": 120.0,
        "machine": {
            "host": "h",
            "cpu": "Some CPU",
            "cores": 2,
            "memory_gib": 23.4,
            "kernel": "6.1",
            "python": "3.11.7",
            "commit": "abc",
            "loadavg": [1.0],
        },
        "versions": {"flashfeed": "0.1.0", "litdata": "not installed"},
        "unavailable": {"litdata": "unavailable: not installed"},
        "errors": {"crypto": "exit 1: boom"},
        "stages": {
            "limits": {
                "data": {
                    "memcpy_gbps": 9.0,
                    "read_hot_gbps": [6.0, 6.5],
                    "read_cold_gbps": [0.3],
                    "s3_get_gbps": [0.8, 0.9],
                }
            },
            "ingest": [
                {
                    "label": f"{f}x",
                    "factor": f,
                    "workers": 2,
                    "default_workers": True,
                    "data": _ingest(1 + f / 10),
                }
                for f in (1, 4)
            ]
            + [
                {
                    "label": "4x, 1 CPU",
                    "factor": 4,
                    "workers": 1,
                    "default_workers": False,
                    "data": _ingest(0.6),
                }
            ],
            "cache": [
                {
                    "label": "1x",
                    "factor": 1,
                    "workers": 8,
                    "default_workers": True,
                    "data": {"cold": cold, "hit": {"cache_gbps": 6.0, "plain_gbps": 6.2}},
                }
            ],
            "loader": [
                {
                    "label": f"{f}x",
                    "factor": f,
                    "workers": 2,
                    "default_workers": True,
                    "data": _loader(1.0),
                }
                for f in (1, 4)
            ],
            "peers": {
                "data": {
                    "rounds": {
                        "img_per_s": {
                            "flashfeed": [480.0, 470.0],
                            "mosaicml-streaming": [400.0, 380.0],
                        }
                    },
                    "unavailable": {},
                }
            },
            "stalls": {"data": {"records": records}},
            "plan": {
                "data": {
                    "plan_cost": [
                        {
                            "shards": 1000,
                            "open_s": 0.01,
                            "rank_plan_s": 0.07,
                            "node_order_s": 0.06,
                            "resplit_s": 0.08,
                            "whole_epoch_s": 0.5,
                        }
                    ],
                    "eviction": [
                        {"capacity": c, "lru": c / 3, "plan_aware": c / 2, "optimum": c / 2}
                        for c in (0.25, 0.5, 0.75)
                    ],
                }
            },
        },
    }


def test_headline_rows_carry_ratios_and_fractions_of_limits(report: ModuleType) -> None:
    rows = report.headline(_result())
    areas = {(r["area"], r["reference"]) for r in rows}
    assert ("ingest", "ray-data") in areas and ("loader", "mosaicml-streaming") in areas
    ingest = next(r for r in rows if r["reference"] == "ray-data")
    assert "4x" in ingest["measure"]  # the largest size is the headline
    q = ingest["ratio"]
    assert q["min"] - 1e-9 <= q["ratio"] <= q["max"] + 1e-9
    loader = next(r for r in rows if r["reference"] == "dali-reader")
    assert loader["of_limit"] == pytest.approx(loader["value"]["median"] / 520.0 / 1.0, rel=0.1)


def test_markdown_and_page_name_the_machine_and_what_did_not_run(report: ModuleType) -> None:
    result = _result()
    table = report.markdown(result)
    assert "| ingest |" in table and "Scaling" in table
    assert "litdata: unavailable" in table and "stage crypto: exit 1" in table
    page = _load("page").benchmarks_page(
        result, "benchmarks/results/x.json", ["benchmarks/results/a.png"]
    )
    assert "Some CPU" in page and "2 cores" in page and "![a](benchmarks/results/a.png)" in page
    assert "GPU" in page


def test_plots_write_small_pngs(tmp_path: Path) -> None:
    plots = _load("plots")
    made = plots.write_all(_result(), tmp_path, "smoke")
    assert {p.name for p in made} == {
        "smoke-loaders.png",
        "smoke-stalls.png",
        "smoke-eviction.png",
        "smoke-scaling.png",
    }
    for p in made:
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size < 200_000


def test_plan_cost_and_eviction_curve_at_small_sizes() -> None:
    planbench = _load("stages.planbench")
    cost = planbench.plan_cost(
        200, samples_per_shard=10, world_size=4, ranks_per_node=2, new_world_size=6
    )
    assert cost["shards"] == 200 and cost["node_shards"] > 0
    assert cost["rank_plan_s"] > 0 and cost["whole_epoch_s"] > 0
    assert cost["samples_per_rank"] == 500 and cost["samples_per_rank_after_resplit"] > 0
    mix = planbench.mixture_scale(4, 20, world_size=8, ranks_per_node=2, new_world_size=6)
    scale_keys = {"shards", "samples", "world_size", "ranks_per_node", "open_s", "rank_plan_s"}
    assert scale_keys | {"node_order_s", "resplit_s", "peak_rss_mib"} <= set(mix)
    assert mix["shards"] == 80 and mix["samples"] == 80_000 and mix["node_shards"] > 0
    assert mix["samples_per_rank_after_resplit"] < mix["samples_per_rank"]
    curve = planbench.eviction_curve(shards=8, epochs=2, fractions=(0.5,))
    assert curve[0]["optimum"] >= curve[0]["plan_aware"] >= 0.0


def test_suite_profiles_and_corpus_subset(tmp_path: Path) -> None:
    suite = _load("suite")
    assert suite.QUICK.scales[0] == 1 and suite.FULL.rounds >= 5
    assert suite.FULL.min_seconds >= 5 and suite.FULL.targets_shard_mib == "100"
    corpus = tmp_path / "corpus"
    for i in range(6):
        f = corpus / f"class_{i % 2:03d}" / f"img_{i:07d}.jpg"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * 100)
    sub = suite.subset_corpus(corpus, tmp_path / "sub", 250)
    assert len(list(sub.glob("class_*/*.jpg"))) == 3
    with pytest.raises(SystemExit, match="unknown stages"):
        suite.main(["--stages", "nope"])


def test_the_cold_ceilings_download_lands_every_object_whole(
    s3_prefix: str, tmp_path: Path
) -> None:
    # the download the cold-epoch ceiling runs beside a local epoch: every byte of every
    # object, each chunk at its place, parts larger than a chunk (the cache's 16 MiB parts)
    from flashfeed import storage

    limits = _load("stages.limits")
    blobs = {"a.tar": os.urandom(17 << 20), "sub/b.idx": os.urandom(1000), "c": b""}
    for name, blob in blobs.items():
        storage.write_bytes(f"{s3_prefix}/{name}", blob)
    landed = limits.download(s3_prefix, tmp_path / "dl")
    assert landed == sum(len(b) for b in blobs.values())
    got = {p.name: p.read_bytes() for p in (tmp_path / "dl").iterdir()}
    assert len(got) == len(blobs)
    for name, blob in blobs.items():
        match = [v for k, v in got.items() if k.endswith(name.replace("/", "_"))]
        assert match == [blob], name


def test_cpu_steal_reads_this_machines_counters() -> None:
    steal_before, total_before = _load("machine").cpu_steal()
    time.sleep(0.1)  # idle time counts too: every CPU's ticks move on
    steal, total = _load("machine").cpu_steal()
    assert 0.0 <= steal_before <= steal <= total
    assert total > total_before > 0.0  # seconds since boot, all CPUs, moving forward


def test_the_mixture_benchmark_runs_tiny_and_prints_its_keys(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "mix.json"
    args = ["--rows", "96", "--images", "32", "--rounds", "1", "--seq-len", "16"]
    cmd = [sys.executable, "-m", "benchmarks.stages.mixbench", *args, "--out", str(out)]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TokenLoader GB/s (3 sources)" in proc.stdout
    assert "Loader img/s (2 sources)" in proc.stdout and "window err" in proc.stdout
    data = json.loads(out.read_text())
    assert {"single_gbs", "mixture_gbs", "ratio", "shares"} <= set(data["tokens"])
    assert data["tokens"]["cpu_ratio"] > 0 and "GB per CPU second" in proc.stdout
    assert {"single_img_s", "mixture_img_s", "ratio"} <= set(data["images"])
    img = data["images"]
    assert img["images"] == 32 and img["mean_jpeg_bytes"] > 1000  # photo-sized JPEGs
    assert set(img["start_s"]) == set(img["steady_img_s"]) == {"single", "mixture"}
    assert all(v > 0 for v in img["start_s"].values()) and "epoch start ms" in proc.stdout
    assert all(v > 0 for v in img["cpu_ms_per_img"].values()) and "CPU ms/img" in proc.stdout
    assert [s["source"] for s in data["tokens"]["shares"]] == ["t0", "t1", "t2"]
    assert all(s["epoch_error"] < 0.05 for s in data["tokens"]["shares"])


def test_the_dali_reader_peer_reads_whole_epochs(tmp_path: Path) -> None:
    from support.loader_helpers import make_image_dataset

    peers = _load("harness.peerloaders")
    make_image_dataset(str(tmp_path / "ds"), [20, 20], size=32)
    tars = sorted(str(p) for p in (tmp_path / "ds").rglob("*.tar"))
    assert len(tars) == 2 and all(Path(t + ".idx").exists() for t in tars)
    reader = peers.DaliReaderEpochs(tars, batch_size=16, threads=1, device="cpu")
    assert reader.batches == 3  # 40 samples in batches of 16
    for _ in range(2):  # the first epoch, then a hot one on the same pipeline
        batches = list(reader)
        assert len(batches) == 3
        images = batches[0][0]
        assert tuple(images.shape) == (16, 3, 224, 224) and str(images.dtype) == "torch.float32"
        assert all(0 <= int(v) < 10 for b in batches for v in b[1])
    reader.close()


def test_the_layouts_stage_compares_the_loader_and_dali_on_a_gnu_tar_layout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import numpy as np

    from support.loader_helpers import _jpeg

    datasets = _load("harness.datasets")
    stage = _load("stages.layouts")
    rng = np.random.default_rng(0)
    files = []
    for i in range(130):
        f = tmp_path / "photos" / f"{i:03d}.jpg"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(_jpeg(rng, i % 5, 32))
        files.append((f, i % 5))
    layout = tmp_path / "gnutar"
    assert datasets.gnutar_dataset(files, layout, 1) == 1  # 130 small photos: one shard
    from flashfeed.dataset import Dataset

    ds = Dataset.open(str(layout))
    assert sum(s.samples for s in ds.shards) == 130
    assert set(ds.manifest.schema) == {"jpg", "txt", "json"}
    out = tmp_path / "layouts.json"
    argv = [str(layout), "--rounds", "1", "--min-seconds", "0", "--fields",
            "image=jpg,caption=txt", "--out", str(out)]  # fmt: skip
    assert stage.main(argv) == 0
    table = capsys.readouterr().out
    for measure in ("hot epoch, img/s", "CPU ms per image, hot", "first epoch, img/s"):
        assert f"| gnutar | {measure} |" in table
    rounds = json.loads(out.read_text())["rounds"]
    for side in ("ff-gnutar", "dali-gnutar"):
        assert all(rounds[f"{side}-{k}"][0] > 0 for k in ("first", "hot", "cpu_ms"))
    with pytest.raises(SystemExit):
        stage.main([str(tmp_path / "photos"), "--out", str(out)])  # no manifest: refused


def test_the_node_quota_benchmark_runs_tiny_and_each_tenant_keeps_its_quota(
    tmp_path: Path,
) -> None:
    import json
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("the node quota stage makes two Unix users: it runs as root")
    out = tmp_path / "quota.json"
    args = ["--shards", "6", "--shard-size", "64KiB", "--per-shard", "2", "--quota-shards", "3",
            "--rate", "512KiB", "--epochs", "3", "--weights", "2:1", "--sample-every", "0.05",
            "--users", "ffsmokea,ffsmokeb"]  # fmt: skip
    cmd = [sys.executable, "-m", "benchmarks.stages.nodequota", *args, "--out", str(out)]
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=repo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "max resident" in proc.stdout and "weight share" in proc.stdout
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["weights"] == [2.0, 1.0] and run["samples"] > 10 and run["window_s"] > 0
    assert sorted(run["tenants"]) == ["ffsmokea", "ffsmokeb"]
    dataset = 6 * 64 * 1024
    for user, t in run["tenants"].items():
        # the quota bound, as the service's own status showed it through the run
        assert t["quota"] == 3 * 64 * 1024 and t["max_resident"] > 0, (user, t)
        assert t["within_one_shard"] and t["max_resident"] <= t["quota"] + 64 * 1024, (user, t)
        assert len(t["store_bytes_by_epoch"]) == 3 and len(t["epoch_seconds"]) == 3
        assert sum(t["store_bytes_by_epoch"]) >= dataset  # its cold epoch read it all
        assert t["evictions_suffered"] >= 3  # a dataset twice its quota: its own shards went
        share = t["share"]
        assert 0 < share["share"] < 1 and share["weight_share"] == (
            2 / 3 if user == "ffsmokea" else 1 / 3
        )
    assert abs(sum(t["share"]["share"] for t in run["tenants"].values()) - 1) < 1e-9
    for user in ("ffsmokea", "ffsmokeb"):  # the users it made are gone again
        assert subprocess.run(["id", user], capture_output=True).returncode != 0
