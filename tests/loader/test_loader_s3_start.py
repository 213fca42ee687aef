"""A loader from S3 with an empty node cache starts without s3fs and its AWS client
libraries where signed GETs of our own reach the store (an endpoint given by URL): the
manifest, its version check, the shard table and the shards all go through them. Each
start runs in a fresh process, as a restarted job does; nothing is timed here
(``benchmarks/stages/targets.py`` times start-up)."""

from __future__ import annotations

import json
import subprocess
import sys

from support.loader_helpers import make_image_dataset

_CHILD = r"""
import json, sys
from flashfeed.loader import Loader
url, cache, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
loader = Loader(url, batch_size=8, image_size=16, num_threads=1, device="cpu", cache_dir=cache,
                seed=5, storage_options=opts)
heavy = ("s3fs", "botocore", "aiobotocore")
it = iter(loader)
batches = [next(it)]
after_first = sorted(m for m in heavy if m in sys.modules)
batches += list(it)
keys = [k for b in batches for k in b["__key__"]]
labels = [int(x) for b in batches for x in b["label"].tolist()]
loader.close()
print(json.dumps({"after_first": after_first, "keys": keys, "labels": labels}))
"""

#: a botocore client option: signed GETs of our own do not stand in for it, so this start
#: takes the s3fs way (the way every start took before)
_S3FS_WAY = {"config_kwargs": {"max_pool_connections": 7}}


def _start(url: str, cache: str, opts: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, url, cache, json.dumps(opts)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_s3_start_imports_no_s3fs_and_delivers_the_same_epoch(s3_prefix, tmp_path):
    make_image_dataset(s3_prefix, [20, 12, 16], size=16)  # 48 samples
    lean = _start(s3_prefix, str(tmp_path / "cache-lean"), {})
    assert lean["after_first"] == []  # nothing imported s3fs, botocore or aiobotocore
    before = _start(s3_prefix, str(tmp_path / "cache-s3fs"), _S3FS_WAY)
    assert "s3fs" in before["after_first"]  # the other way really went through s3fs
    assert len(lean["keys"]) == 48 and len(set(lean["keys"])) == 48
    assert lean["keys"] == before["keys"] and lean["labels"] == before["labels"]
    # each label is the one written for its sample: key s<shard>-<n> has label n % 10
    assert lean["labels"] == [int(k.rsplit("-", 1)[1]) % 10 for k in lean["keys"]]
