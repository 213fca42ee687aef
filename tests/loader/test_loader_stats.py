"""Stall accounting, the optional exporter, and the shuffle measure (the stats log and its
report: tests/monitor/test_report.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from benchmarks.harness.shuffle_quality import (
    batch_entropy,
    buffer_shuffle_order,
    plan_shuffle_quality,
    shuffle_quality,
)
from flashfeed.loader import Loader, TokenLoader

from support.loader_helpers import make_image_dataset


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


_FIRST_BATCH_IMPORTS = """
import json, sys
from flashfeed.loader import Loader
loader = Loader(sys.argv[1], batch_size=8, image_size=16, device="cpu")
it = iter(loader)
batch = next(it)
print(json.dumps({"keys": len(batch["__key__"]), "pandas": "pandas" in sys.modules,
                  "sizes": loader.dataset.manifest.table.has_image_sizes}))
it.close()
loader.close()
"""


def test_the_way_to_the_first_batch_does_not_import_pandas(tmp_path):
    # pyarrow imports pandas on the first to_numpy() or Python scalar: about a second of a
    # fresh process's start-up, for a loader that never uses it. A dataset adopted with
    # `flashfeed index` has the per-sample image size columns the shard table checks.
    from flashfeed.format.indexer import index_dataset

    prefix = str(tmp_path / "ds")
    make_image_dataset(prefix, [12, 12], size=16)
    os.remove(os.path.join(prefix, "manifest.json"))
    index_dataset(prefix, workers=1)
    run = subprocess.run(
        [sys.executable, "-c", _FIRST_BATCH_IMPORTS, prefix],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {"keys": 8, "pandas": False, "sizes": True}, run.stderr[-2000:]
