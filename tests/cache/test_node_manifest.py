"""The manifest reaches a node once: ranks sharing a node cache GET its header and shard
table once, counted at a proxy in front of the real S3 server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed.cache.manifests import node_manifest
from flashfeed.errors import ManifestError
from flashfeed.loader import TokenLoader

from support.loader_helpers import make_token_dataset


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()


def _gets(proxy: SlowProxy, suffix: str) -> int:
    return sum(1 for r in proxy.requests if r.method == "GET" and r.path.endswith(suffix))


_RANK = """
import sys
from flashfeed.loader import TokenLoader
loader = TokenLoader(sys.argv[1], batch_size=4, rank=int(sys.argv[2]), world_size=2,
                     cache_dir=sys.argv[3])
print(sum(len(b["tokens"]) for b in loader))
"""


def test_ranks_of_a_node_fetch_the_manifest_once(s3_prefix, proxy, tmp_path):
    make_token_dataset(s3_prefix, [20, 20, 20, 20], seq_len=4)
    cache = str(tmp_path / "node-cache")
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, s3_prefix, str(r), cache],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 2
    assert sum(int(o.split()[-1]) for o in outs) == 80
    assert _gets(proxy, "/manifest.json") == 1
    assert _gets(proxy, ".arrow") - _shard_gets(proxy) == 1  # the shard table, once


def _shard_gets(proxy: SlowProxy) -> int:
    return sum(
        1
        for r in proxy.requests
        if r.method == "GET" and "/shards/" in r.path and ".arrow" in r.path
    )


def _heads(proxy: SlowProxy, suffix: str) -> int:
    return sum(1 for r in proxy.requests if r.method == "HEAD" and r.path.endswith(suffix))


def test_each_opening_checks_the_version_with_one_head_and_fetches_only_a_new_one(
    s3_prefix, proxy, tmp_path
):
    make_token_dataset(s3_prefix, [10, 10], seq_len=4)
    opts = {"endpoint_url": proxy.endpoint}
    root = str(tmp_path / "c")
    first = node_manifest(root, s3_prefix, storage_options=opts)
    assert _gets(proxy, "/manifest.json") == 1
    before = len(proxy.requests)
    again = node_manifest(root, s3_prefix, storage_options=opts)
    seen = [(r.method, r.path.rsplit("/", 1)[-1]) for r in proxy.requests[before:]]
    assert seen == [("HEAD", "manifest.json")]  # one version check, the node's copy read
    assert _gets(proxy, ".arrow") == 1
    assert again.digest == first.digest
    make_token_dataset(s3_prefix, [10, 10, 5], seq_len=4, overwrite=True)  # a new commit
    newer = node_manifest(root, s3_prefix, storage_options=opts)
    assert newer.digest != first.digest and newer.num_samples == 25
    assert _gets(proxy, "/manifest.json") == 2 and _gets(proxy, ".arrow") == 2


def test_a_damaged_copy_is_fetched_again(s3_prefix, proxy, tmp_path):
    make_token_dataset(s3_prefix, [10, 10], seq_len=4)
    opts = {"endpoint_url": proxy.endpoint}
    root = str(tmp_path / "c")
    digest = node_manifest(root, s3_prefix, storage_options=opts).digest
    (here,) = (os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns if n.endswith(".arrow"))
    with open(here, "r+b") as f:
        f.truncate(100)
    again = node_manifest(root, s3_prefix, storage_options=opts)
    assert again.digest == digest and _gets(proxy, ".arrow") == 2


def test_no_dataset_is_one_clear_error(s3_prefix, tmp_path):
    with pytest.raises(ManifestError, match="no dataset at"):
        node_manifest(str(tmp_path / "c"), s3_prefix + "-missing")
    with pytest.raises(ManifestError, match="no dataset at"):
        TokenLoader(s3_prefix + "-missing", batch_size=2, cache_dir=str(tmp_path / "c"))
    time.sleep(0)  # nothing left behind to wait for


def test_a_header_naming_a_table_outside_the_prefix_is_refused(s3_prefix, tmp_path):
    import json

    from flashfeed import storage

    make_token_dataset(s3_prefix, [10], seq_len=4)
    url = storage.join(s3_prefix, "manifest.json")
    header = json.loads(storage.read_bytes(url))
    header["shard_table"]["path"] = "../elsewhere/manifest-0.arrow"
    storage.write_bytes(url, json.dumps(header).encode())
    with pytest.raises(ManifestError, match="escapes the dataset prefix"):
        node_manifest(str(tmp_path / "c"), s3_prefix)
    assert not list((tmp_path / "c").rglob("*.arrow"))


def test_a_version_nowhere_to_be_found_is_refused_naming_both(s3_prefix, tmp_path):
    current = make_token_dataset(s3_prefix, [10], seq_len=4).digest
    root = str(tmp_path / "c")
    assert node_manifest(root, s3_prefix, version=current).digest == current
    gone = "0" * 32
    with pytest.raises(ManifestError) as err:
        node_manifest(root, s3_prefix, version=gone)
    assert gone in str(err.value) and current in str(err.value) and s3_prefix in str(err.value)
    with pytest.raises(ManifestError, match=gone):
        TokenLoader(s3_prefix, batch_size=2, cache_dir=root, dataset_version=gone)
