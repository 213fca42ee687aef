"""Stall accounting, its log and report, the optional exporter, and the shuffle measure."""

from __future__ import annotations

import socket
import sys
import urllib.request

import numpy as np
import pytest

from flashfeed.cli import main as cli_main
from flashfeed.loader import Loader, TokenLoader
from flashfeed.loader.report import read_stats_log, stall_series, summarize
from flashfeed.loader.shuffle_quality import (
    batch_entropy,
    buffer_shuffle_order,
    plan_shuffle_quality,
    shuffle_quality,
)

from support.loader_helpers import make_image_dataset


@pytest.fixture(scope="module")
def stats_log(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("stats")
    prefix = str(d / "ds")
    make_image_dataset(prefix, [40, 40, 40], size=16)
    log = str(d / "stats.jsonl")
    loader = Loader(prefix, batch_size=8, image_size=16, stats_log=log, py_workers=0)
    for _ in range(2):
        for _ in loader:
            pass
    loader.close()
    return log


def test_the_log_summarizes_to_what_stats_said(stats_log):
    records = read_stats_log(stats_log)
    assert len(records) == 30 and {r["epoch"] for r in records} == {0, 1}
    s = summarize(records)
    assert s["samples"] == 240 and s["samples_per_s"] > 0
    assert 0 < s["decode_fraction"] <= 1
    series = stall_series(records, bin_s=0.05)
    assert series.samples_per_s.sum() * 0.05 == pytest.approx(240)
    assert all((f >= 0).all() and (f <= 1).all() for f in series.fractions.values())


def test_report_command_prints_a_summary(stats_log, capsys):
    assert cli_main(["report", stats_log]) == 0
    out = capsys.readouterr().out
    assert "30 batches, 240 samples" in out and "decode" in out


def test_report_without_matplotlib_says_what_to_install(stats_log, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli_main(["report", stats_log, "--out", str(tmp_path / "s.png")]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "s.png").exists()


def test_report_draws_a_png_with_matplotlib(stats_log, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "stalls.png"
    assert cli_main(["report", stats_log, "--out", str(out), "--bin", "0.05"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_log_line_is_named(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"t": 1, "samples": 4}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        read_stats_log(str(log))


def test_prometheus_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    from support.loader_helpers import make_token_dataset

    prefix = str(tmp_path / "tok")
    make_token_dataset(prefix, [8], seq_len=4)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match="pip install prometheus-client"):
        TokenLoader(prefix, batch_size=2, prometheus_port=0)


def test_prometheus_exports_waits_on_loopback(tmp_path):
    pytest.importorskip("prometheus_client")
    from support.loader_helpers import make_token_dataset

    prefix = str(tmp_path / "tok")
    make_token_dataset(prefix, [8, 8], seq_len=4)
    loader = TokenLoader(prefix, batch_size=4, prometheus_port=0)
    for _ in loader:
        pass
    exporter = loader.recorder.exporter
    assert exporter.addr == "127.0.0.1"
    body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics").read().decode()
    labels = f'dataset="{prefix}",node="{socket.gethostname()}",rank="0"'
    assert f"flashfeed_loader_samples_total{{{labels}}} 16.0" in body
    assert f'flashfeed_loader_wait_seconds_total{{dataset="{prefix}",kind="decode"' in body
    exporter.close()


def test_entropy_of_pure_and_mixed_batches():
    assert batch_entropy(np.array([1, 1, 1, 1, 2, 3, 4, 5]), 4).tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="full batch"):
        batch_entropy(np.arange(3), 4)


def test_the_plan_mixes_a_class_sorted_dataset_better_than_a_shuffle_buffer():
    sizes = [250] * 20  # one class per shard, as a class-sorted source gives
    labels = np.repeat(np.arange(20), 250)
    sequential = shuffle_quality(labels, batch_size=64)
    assert sequential.quality < 0.1 and sequential.classes_per_batch < 1.5
    # a window of w shards against a streaming buffer holding w/2 shards of samples
    for window, buffer in ((4, 250), (8, 500), (16, 1000)):
        plan = plan_shuffle_quality(sizes, labels, batch_size=64, window=window)
        order = buffer_shuffle_order(sizes, buffer_size=buffer)
        buffered = shuffle_quality(labels[order], batch_size=64)
        assert plan.quality > buffered.quality, (window, plan, buffered)
    assert plan_shuffle_quality(sizes, labels, batch_size=64, window=16).quality > 0.8


def test_loader_batches_from_class_sorted_shards_mix_classes(tmp_path):
    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, [32] * 8, classes=8, sorted_classes=True, size=16)
    loader = Loader(prefix, batch_size=16, image_size=16, window=4, py_workers=0)
    labels = np.concatenate([b["label"].numpy() for b in loader])
    q = shuffle_quality(labels, batch_size=16)
    assert q.classes_per_batch >= 3 and q.quality > 0.6


STARTUP_PARTS = (
    "construction_s", "pipeline_build_s", "reader_start_s", "first_fetch_s", "first_decode_s",
)  # fmt: skip


def test_stats_break_startup_down_up_to_the_first_batch(tmp_path):
    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, [24, 24], size=16)
    for _ in range(2):  # a second loader in the same process has its own breakdown
        loader = Loader(prefix, batch_size=8, image_size=16)
        before = loader.stats()["startup"]
        assert set(before) == {"construction_s", "manifest_s"}  # nothing read yet
        it = iter(loader)
        batch = next(it)
        startup = loader.stats()["startup"]
        assert set(startup) == {*STARTUP_PARTS, "manifest_s", "first_batch_s"}
        assert all(v >= 0 for v in startup.values()), startup
        assert startup["manifest_s"] <= startup["construction_s"]
        assert startup["reader_start_s"] > 0  # a pipeline was built and started
        # the parts lie one after another on the way to the first batch
        assert sum(startup[k] for k in STARTUP_PARTS) <= startup["first_batch_s"] + 1e-6
        assert len(batch["__key__"]) == 8
        for _ in it:  # later batches and passes leave the breakdown as it was
            pass
        for _ in loader:
            pass
        assert loader.stats()["startup"] == startup
        loader.close()
