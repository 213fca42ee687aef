"""The benchmark harness: the store start (a real SeaweedFS, stopped and the environment put
back), the corpus and dataset makers (read back through flashfeed), the rounds runner's
rotated order, and the results writer. No timing is asserted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks.harness.corpus import image_corpus, pick_images
from benchmarks.harness.datasets import (
    image_dataset,
    noise_jpeg_dataset,
    random_dataset,
    token_dataset,
)
from benchmarks.harness.results import result_stem, write_json
from benchmarks.harness.rounds import best_median, rotated, run_rounds
from benchmarks.harness.store import start_store, upload_tree
from flashfeed import Dataset, storage


def test_rotated_starts_each_round_one_name_later() -> None:
    assert [rotated("abc", r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip
    assert rotated([], 3) == []


def test_run_rounds_interleaves_and_resets_before_each_round() -> None:
    calls: list[str] = []
    sides = {n: (lambda n=n: calls.append(n) or len(calls)) for n in ("x", "y", "z")}
    got = run_rounds(sides, 3, before_round=lambda r: calls.append(f"reset{r}"))
    assert calls == ["reset0", "x", "y", "z", "reset1", "y", "z", "x", "reset2", "z", "x", "y"]
    assert got == {"x": [2, 8, 11], "y": [3, 6, 12], "z": [4, 7, 10]}
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        run_rounds(sides, 0)


def test_best_median_knows_rates_from_times() -> None:
    assert best_median([3.0, 1.0, 2.0]) == {"median": 2.0, "best": 3.0, "rounds": [3.0, 1.0, 2.0]}
    assert best_median([3.0, 1.0, 2.0], higher_is_better=False)["best"] == 1.0
    with pytest.raises(ValueError, match="at least one round"):
        best_median([])


def test_write_json_replaces_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "r.json"
    write_json(out, {"a": 1})
    write_json(out, {"b": [1, 2]})
    assert json.loads(out.read_text()) == {"b": [1, 2]}
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]


def test_result_stem_names_profile_and_device_but_not_the_defaults() -> None:
    import datetime as dt

    day = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)
    assert result_stem(day, "full", "cpu").startswith("2026-12-02-")
    assert not result_stem(day, "full", "cpu").endswith(("-full", "-cpu"))
    assert result_stem(day, "quick", "gpu").endswith("-quick-gpu")


def test_the_store_serves_its_bucket_and_puts_the_environment_back(tmp_path: Path) -> None:
    before = os.environ.get("AWS_ENDPOINT_URL")
    with start_store(tmp_path, bucket="harness", export_env=True) as bs:
        assert bs.bucket == "s3://harness"
        assert os.environ["AWS_ENDPOINT_URL"] == bs.env["AWS_ENDPOINT_URL"]
        storage.write_bytes("s3://harness/x", b"abc", storage_options=bs.opts)
        bs.restart()  # same data, same port
        assert storage.read_bytes("s3://harness/x", storage_options=bs.opts) == b"abc"
        pid = bs.store.info.pid
        files = image_corpus(tmp_path, 6, seed=0)
        image_dataset(tmp_path / "local", files, 2)
        upload_tree(tmp_path / "local", "s3://harness/ds")
        remote = Dataset.open("s3://harness/ds", storage_options=bs.opts)
        assert remote.manifest.num_samples == 6
    assert os.environ.get("AWS_ENDPOINT_URL") == before
    assert pid is not None and not bs.store.pid_alive()


def test_the_image_corpus_falls_back_to_synthetic_jpegs_and_shards_read_back(
    tmp_path: Path,
) -> None:
    files = image_corpus(tmp_path, 12, seed=0, existing=None)
    assert len(files) == 12 and all(f.read_bytes()[:2] == b"\xff\xd8" for f, _ in files)
    again = image_corpus(tmp_path, 12, seed=0, existing=str(tmp_path / "corpus"))
    assert again == files
    first = pick_images(tmp_path / "corpus", files[0][0].stat().st_size + 1)
    assert [f for f, _ in first] == sorted(f for f, _ in files)[:2]
    paths = image_dataset(tmp_path / "ds", files, 3, seed=0)
    assert len(paths) == 3 and all(Path(p).is_file() for p in paths)
    ds = Dataset.open(str(tmp_path / "ds"))
    assert ds.manifest.num_samples == 12 and len(ds.shards) == 3


def test_random_noise_and_token_datasets_are_what_they_say(tmp_path: Path) -> None:
    rnd = random_dataset(str(tmp_path / "rnd"), 2, 8192)
    assert len(rnd.shards) == 2 and rnd.manifest.num_samples == 8
    noise = noise_jpeg_dataset(
        tmp_path / "noise", shards=2, per_shard=3, height=20, width=30, quality=80, tinted=True
    )
    assert Dataset.open(noise).manifest.num_samples == 6
    tok = token_dataset(tmp_path / "tok", rows=16, seq_len=32, shards=4)
    import pyarrow as pa

    shards = Dataset.open(tok).shards
    rows = [pa.ipc.open_file(Path(tok) / s.path).read_all() for s in shards]
    assert len(rows) == 4 and sum(t.num_rows for t in rows) == 16
    assert np.asarray(rows[0]["tokens"][0].as_py()).max() < 50000
    with pytest.raises(ValueError, match="shards must be >= 1, got 0"):
        random_dataset(str(tmp_path / "bad"), 0, 10)


def test_the_proxy_counts_each_responses_bytes_on_the_request_it_answers(
    s3_store, s3_prefix
) -> None:
    from benchmarks.harness.slowproxy import SlowProxy

    opts = s3_store.info.storage_options()
    storage.write_bytes(f"{s3_prefix}/a.tar", b"a" * 300_000, storage_options=opts)
    storage.write_bytes(f"{s3_prefix}/b.bin", b"b" * 100_000, storage_options=opts)
    proxy = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    try:
        via = {**opts, "endpoint_url": proxy.endpoint}
        for _ in range(2):  # the second round over the same kept-alive connections
            assert len(storage.read_bytes(f"{s3_prefix}/a.tar", storage_options=via)) == 300_000
            assert len(storage.read_bytes(f"{s3_prefix}/b.bin", storage_options=via)) == 100_000
        a, b = proxy.sent_bytes("/a.tar"), proxy.sent_bytes("/b.bin")
        gets = len([r for r in proxy.requests if r.method == "GET"])
    finally:
        proxy.close()
    # each body counted on its own request, with its response's header (under 2 KiB)
    assert 600_000 <= a < 600_000 + 4096 and 200_000 <= b < 200_000 + 4096, (a, b, gets)
