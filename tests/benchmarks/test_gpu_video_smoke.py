"""``gpu.sh``'s nvdec stage stays runnable: its code on the CPU at a tiny size (VP9, its keys
and the clip shape), the one-line skip without a GPU, and its summary line. No timed
assertions: benchmark numbers are not tests."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from support.bench import load_bench

pytest.importorskip("av")


def test_the_nvdec_stage_smoke_runs_on_the_cpu_and_renders(tmp_path):
    video = load_bench("gpu_video")
    results = load_bench("gpu_results")
    run = SimpleNamespace(work=tmp_path / "work", quick=True, cpu=True, seconds=0.3)
    got = video.stage_nvdec(run)
    assert got["codec"] == "vp9" and got["videos"] == 8
    assert got["loader"]["batch_shape"] == [4, video.FRAMES, 3, video.SIZE, video.SIZE]
    assert got["loader_clips_per_s"] > 0 and got["ceiling_clips_per_s"] > 0
    line = results.headline("nvdec", {"status": "ok", **got, "cpu_smoke_run": True})
    assert line.startswith("vp9 clips of 8: Loader ") and "not a GPU figure" in line
    assert "nvdec" in results.STAGES


def test_without_a_gpu_the_nvdec_stage_says_it_is_skipped(tmp_path):
    video = load_bench("gpu_video")
    results = load_bench("gpu_results")
    if video._cuda_devices():
        pytest.skip("this machine has a GPU: the stage runs instead")
    run = SimpleNamespace(work=tmp_path, quick=True, cpu=False, seconds=0.3)
    got = video.stage_nvdec(run)
    assert got == {"status": "skipped", "reason": "no GPU: NVDEC clips/s needs a CUDA device"}
    assert results.headline("nvdec", got) == f"skipped: {got['reason']}"
