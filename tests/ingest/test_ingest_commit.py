"""Ingest's commit in a fresh process: the shard table it builds (paths, checksums, index
names, per-sample image sizes) comes from Arrow buffers, equal to ``pa.array``'s columns,
and the commit imports no pandas (``pa.array`` does: most of a second of a fresh ingest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flashfeed.format.shardcolumns import arrow_int32_lists, arrow_strings


@pytest.mark.parametrize(
    "values",
    [[], ["shards/000000.tar"], ["a", None, "", "é/ü", None], [None, None], ["x" * 70_000, "y"]],
)
def test_arrow_strings_equal_pa_array(values: list[str | None]) -> None:
    got = arrow_strings(values)
    got.validate(full=True)
    assert got.equals(pa.array(values, pa.string()))
    assert got.to_pylist() == values


@pytest.mark.parametrize(
    "rows", [[], [[1, 2, 3]], [[640, 480], None, [], [7]], [None], [[2**31 - 1, 0]] * 3]
)
def test_arrow_int32_lists_equal_pa_array(rows: list[list[int] | None]) -> None:
    got = arrow_int32_lists(rows)
    got.validate(full=True)
    assert got.equals(pa.array(rows, pa.list_(pa.int32())))
    assert got.to_pylist() == rows


_COMMIT = """
import json, sys
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest, read_manifest
from flashfeed.format.shardtable import ShardTable
infos = [
    ShardInfo(path=f"shards/{i:06d}.tar", samples=2, bytes=100 + i,
              checksum="xxh3_128:" + f"{i:032x}", index=f"shards/{i:06d}.tar.idx")
    for i in range(3)
]
table = ShardTable.from_infos(infos).with_image_sizes([[64, 32], None, [8, 8]],
                                                      [[48, 16], None, [9, 9]])
manifest = Manifest(name="ds", shard_format="webdataset", schema={"jpg": "image/jpeg"},
                    shards=table)
commit_manifest(sys.argv[1], manifest)
back = read_manifest(sys.argv[1])
print(json.dumps({"pandas": "pandas" in sys.modules, "paths": [s.path for s in back.shards],
                  "sizes": back.table.has_image_sizes}))
"""


def test_commit_builds_its_shard_table_without_pandas(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _COMMIT, str(tmp_path / "ds")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    got = json.loads(run.stdout.strip().splitlines()[-1])
    paths = [f"shards/{i:06d}.tar" for i in range(3)]
    assert got == {"pandas": False, "paths": paths, "sizes": True}, run.stderr[-2000:]
