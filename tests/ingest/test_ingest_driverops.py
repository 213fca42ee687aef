"""The driver's own requests on the real S3 server: ``list_keys`` (signed ListObjectsV2
pages) lists what s3fs lists, ``delete_objects`` (signed DeleteObjects) deletes exactly the
names given, and a whole ingest with a local source and an S3 destination commits and drops
``_work/`` (stale done-records too) without an s3fs client on the driver."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flashfeed import storage
from flashfeed.s3.putobject import delete_objects, list_keys, put_object

_NAMES = ["a.json", "b c.json", "d&e.json", "f+g=h.json", "ü/x.json", "z" * 60 + ".json"]


def test_list_keys_lists_what_s3fs_lists_page_by_page(s3_prefix: str, tmp_path: Path) -> None:
    work = f"{s3_prefix}/_work"
    assert list_keys(work) == []
    for n in _NAMES:
        put_object(f"{work}/{n}", n.encode())
    put_object(f"{s3_prefix}/_worker/other.json", b"not under _work/")
    want = storage.list_files(work)
    assert len(want) == len(_NAMES)
    for page in (1, 2, 1000):  # continuation tokens, and one page
        assert list_keys(work, page=page) == want
    assert list_keys(str(tmp_path)) is None  # local: storage.list_files lists it
    with pytest.raises(ValueError, match="page must be >= 1, got 0"):
        list_keys(work, page=0)


def test_delete_objects_deletes_exactly_the_names_given(s3_prefix: str) -> None:
    urls = [f"{s3_prefix}/_work/{n}" for n in _NAMES]
    for u in urls:
        put_object(u, b"x")
    put_object(f"{s3_prefix}/keep.json", b"kept")
    gone = [*urls[:-1], f"{s3_prefix}/_work/never-written.json"]  # a missing name: no error
    assert delete_objects(gone, batch=2)
    assert storage.list_files(s3_prefix) == sorted([urls[-1], f"{s3_prefix}/keep.json"])
    assert delete_objects(urls[-1:])
    assert storage.list_files(s3_prefix) == [f"{s3_prefix}/keep.json"]
    assert storage.read_bytes(f"{s3_prefix}/keep.json") == b"kept"
    with pytest.raises(ValueError, match=r"batch must be in 1\.\.1000, got 1001"):
        delete_objects(urls, batch=1001)
    with pytest.raises(ValueError, match="one bucket"):
        delete_objects([urls[0], "s3://another-bucket/x.json"])


_INGEST = """
import json, sys
from flashfeed import storage
from flashfeed.ingest import IngestConfig, run
from flashfeed.format.manifest import read_manifest
src, dest = sys.argv[1], sys.argv[2]
result = run(IngestConfig(source=src, dest=dest, shard_size=20_000, progress="none",
                          num_cpus=1))
s3fs_used = "s3fs" in sys.modules
back = read_manifest(dest)
print(json.dumps({"s3fs": s3fs_used, "shards": len(back.shards),
                  "samples": back.num_samples, "files": storage.list_files(dest)}))
"""


def test_ingest_to_s3_drops_work_by_name_without_s3fs_on_the_driver(
    tmp_path: Path, s3_prefix: str
) -> None:
    from flashfeed.ingest.samplecorpus import make_imagefolder

    src = tmp_path / "src"
    make_imagefolder(src, classes=2, per_class=6, size=(32, 32))
    dest = f"{s3_prefix}/ds"
    stale = f"{dest}/_work/shard-000099.json"  # an earlier run's record of a shard now gone
    put_object(stale, json.dumps({"fingerprint": "old", "result": {}}).encode())
    run = subprocess.run(
        [sys.executable, "-c", _INGEST, str(src), dest],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["s3fs"] is False, "the driver opened s3fs"
    assert got["samples"] == 12 and got["shards"] >= 2
    assert not [f for f in got["files"] if "/_work/" in f]  # the stale record went too
    assert any(f.endswith("manifest.json") for f in got["files"])


def test_a_shard_jobs_fingerprint_follows_its_items_content_only():
    """The fingerprint a resumed run compares: equal items give equal bytes however their
    objects were made or shared; a changed text, size or line gives others; a value pickle
    refuses falls back to JSON."""
    from flashfeed.ingest.runner import _content_bytes

    text = 'a document with "quotes" and a lone \ud800 surrogate'
    shared = {"values": {"text": text}, "media": {}}
    one = [[0, "c.jsonl:1", 10, shared], [1, "c.jsonl:2", 10, shared]]
    two = json.loads(json.dumps(one))  # equal content, no object shared
    assert _content_bytes(one) == _content_bytes(two)
    for changed in (
        [[0, "c.jsonl:1", 11, shared], one[1]],
        [[0, "c.jsonl:9", 10, shared], one[1]],
        [[0, "c.jsonl:1", 10, {"values": {"text": text + "!"}, "media": {}}], one[1]],
    ):
        assert _content_bytes(changed) != _content_bytes(one)
    odd = [[0, "c.jsonl:1", 1, {"values": {"f": lambda: 0}}]]
    assert _content_bytes(odd).startswith(b"json:")
