"""A shard's fill that ends (renamed into place, or failed) before every record batch was
seen to land leaves its arriving view stale: the view closes its progress and must not read
it again; the loader opens the shard anew. Driven with the fill's own progress file
(``cache.progress``) over a part file written by plain pyarrow (no layout: walked)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa

from flashfeed.cache.progress import FillProgress, FillView, live_path
from flashfeed.cache.view import arrow_partial
from flashfeed.loader.tokens.arrowstream import open_arriving_view

ROWS = (40, 40, 40, 40)


def _part(tmp_path) -> tuple[str, int]:
    values = np.arange(sum(ROWS) * 8, dtype=np.int32)
    table = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(values), 8)})
    sink = io.BytesIO()
    with pa.ipc.RecordBatchFileWriter(sink, table.schema) as writer:
        at = 0
        for n in ROWS:
            writer.write_table(table.slice(at, n))
            at += n
    part = tmp_path / "0.part"
    part.write_bytes(sink.getvalue())
    return str(part), len(sink.getvalue())


def test_a_view_whose_fill_ended_early_is_stale_and_reads_its_progress_no_more(tmp_path):
    part, size = _part(tmp_path)
    path = live_path(str(tmp_path), 0)
    fill = FillProgress(path, part=part, index_part=None, size=size, block=256)
    fill.written(0, size // 2)  # the first half has landed
    view_of_fill = FillView.open(path)
    assert view_of_fill is not None
    partial = arrow_partial(view_of_fill, "000000.arrow", sum(ROWS))
    assert partial is not None and partial.walk is not None
    view = open_arriving_view(partial, ("tokens",), name="000000.arrow")
    assert view.arriving is not None and not view.stale
    fill.close()  # the fill ends before the rest was seen to land
    view.catch_up()
    assert view.stale  # the loader drops this view and opens the shard anew
    assert view.catch_up() == 0  # its progress is closed: not read again (no EBADF)
    assert view.stale
