"""benchmarks/stages/multimodal.py runs at a tiny size and prints and writes every key it promises.
No timed assertions: benchmark numbers are not tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.bench import load_bench


def test_multimodal_benchmark_runs_small_and_reports_its_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mm = load_bench("stages.multimodal")
    out = tmp_path / "mm.json"
    args = ["--images", "96", "--shards", "2", "--rounds", "1", "--min-seconds", "0.1",
            "--batch", "8", "--videos", "4",
            "--work", str(tmp_path / "w"), "--out", str(out)]  # fmt: skip
    assert mm.main(args) == 0
    result = json.loads(out.read_text())
    loaders = {"flashfeed-text", "wds+pil-text", "flashfeed-image", "flashfeed-bucket",
               "flashfeed-video", "pyav-video"}  # fmt: skip
    assert set(result["img_per_s"]) == loaders and all(v > 0 for v in result["img_per_s"].values())
    assert set(result["ratios"]) == set(result["targets"]) == {
        "text_vs_wds_pil", "text_vs_image", "bucket_vs_image", "video_vs_pyav"
    }  # fmt: skip
    assert result["units"]["pyav-video"] == "clips/s"
    assert result["images"] == 96 and result["shards"] == 2
    assert result["buckets"]["buckets"] and "skipped" in result["buckets"]
    printed = capsys.readouterr().out
    for name in [*loaders, *result["ratios"], "| bucket (h, w) |"]:
        assert name in printed
    # the shards are webdataset's, adopted by flashfeed index, captions beside each jpg
    import webdataset as wds

    tars = sorted(str(p) for p in (tmp_path / "w" / "pairs").glob("*.tar"))
    first = next(iter(wds.WebDataset(tars, shardshuffle=False)))
    assert {"jpg", "txt", "json"} <= set(first) and (tmp_path / "w/pairs/manifest.json").exists()
