"""The shard table's optional ``videos`` column: per sample, what a probe of its video
member found (codec, frames, fps, duration, width, height, bytes), recorded at ingest and
``flashfeed index`` time so that a plan (clips per video, durations) needs no video read.

One ``list<struct>`` per shard, one entry per sample: a null entry where the sample holds no
video (or, for adopted tars, one PyAV cannot read); a null row for a shard without videos.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flashfeed.errors import ManifestError
from flashfeed.format.shardcolumns import checked_per_sample

__all__ = [
    "VIDEO_COLUMN",
    "VIDEO_FIELDS",
    "VIDEO_TYPE",
    "check_videos",
    "video_column",
    "videos_at",
]

VIDEO_COLUMN = "videos"
#: the fields of one sample's entry, in order
VIDEO_FIELDS = (
    pa.field("codec", pa.string()),
    pa.field("frames", pa.int64()),
    pa.field("fps", pa.float64()),
    pa.field("duration", pa.float64()),
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
    pa.field("bytes", pa.int64()),
)
VIDEO_TYPE = pa.list_(pa.struct(VIDEO_FIELDS))
_NUMBERS = ("frames", "fps", "duration", "width", "height", "bytes")


def video_column(rows: Sequence[Sequence[Mapping[str, Any] | None] | None]) -> pa.Array:
    """The column from one list per shard (None: no videos), one dict or None per sample."""
    names = [f.name for f in VIDEO_FIELDS]
    return pa.array(
        [
            None if row is None else [None if v is None else {n: v[n] for n in names} for v in row]
            for row in rows
        ],
        VIDEO_TYPE,
    )


def check_videos(table: pa.Table, samples: np.ndarray, source: str) -> pa.Array | None:
    """The checked ``videos`` column of ``table``, or None when it has none: of
    ``VIDEO_TYPE``, one entry per sample of the row's shard (or a null row), numbers >= 0."""
    if VIDEO_COLUMN not in table.column_names:
        return None
    arr = checked_per_sample(table, VIDEO_COLUMN, VIDEO_TYPE, samples, source)
    values = pc.list_flatten(arr)
    for name in _NUMBERS:
        field = pc.struct_field(values, name)
        if len(field) and (pc.min(field).as_py() or 0) < 0:
            raise ManifestError(
                f"{source}: shard table column {VIDEO_COLUMN!r} holds a negative {name}"
            )
    return arr


def videos_at(arr: pa.Array, shards: np.ndarray, rows: np.ndarray) -> list[dict[str, Any] | None]:
    """Entry ``rows[i]`` of shard ``shards[i]``: a dict of ``VIDEO_FIELDS``, or None."""
    offsets = arr.offsets.to_numpy(zero_copy_only=False)
    valid = ~arr.is_null().to_numpy(zero_copy_only=False)
    values = arr.values
    out: list[dict[str, Any] | None] = []
    for s, r in zip(np.asarray(shards).tolist(), np.asarray(rows).tolist(), strict=True):
        out.append(values[int(offsets[s]) + r].as_py() if valid[s] else None)
    return out
