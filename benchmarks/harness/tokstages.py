"""Where token ingest's CPU goes, stage by stage, in one process and without Ray: the same
functions a run calls (the driver's scan, assignment and job pickling; a task's unpickling,
reading back, tokenizing in calls of ``CALL_CHARS`` with the ids gathered into one array,
the packing plan, the rows, the Arrow write and the PUT), each timed in CPU seconds, best
of ``repeat`` calls; beside them the bare tokenizer in one call. Part of
``tokenize_bench``'s ``per_cpu`` output."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["KERNEL", "STAGES", "stage_profile"]

#: the bare tokenizer: one ``encode_batch_fast`` call over every text (not a stage of a run)
KERNEL = "encode_batch_fast"
#: the stages, in the order a run meets them: (name, where it runs)
STAGES = (
    ("scan", "driver"),
    ("assign + fingerprint", "driver"),
    ("job pickle", "driver"),
    ("job unpickle", "task"),
    ("read back + NFC", "task"),
    ("encode, ids into one array", "task"),
    ("special-token count", "task"),
    ("best-fit plan", "task"),
    ("rows + segment columns", "task"),
    ("Arrow write", "task"),
    ("PUT", "task"),
)


def _best(fn: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    best, out = float("inf"), None
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return out, best


def stage_profile(
    src: Path, tok: Path, dest: str, *, seq_len: int, repeat: int = 5
) -> dict[str, float]:
    """CPU seconds of each of ``STAGES`` for the whole corpus at ``src`` made one shard, and
    of the bare tokenizer (``KERNEL``) over the same texts."""
    from flashfeed.ingest import IngestConfig, runner, shardtask
    from flashfeed.ingest.packing import plan_packing
    from flashfeed.ingest.shardtask import ShardResult
    from flashfeed.ingest.sources import StorageContext, scan_source
    from flashfeed.ingest.sources.base import item_rows
    from flashfeed.ingest.tokenize import shared_packer, tokenizer_threads
    from flashfeed.ingest.transforms import table_texts
    from flashfeed.runtime.gcpause import gc_paused
    from flashfeed.s3.putobject import put_object

    config = IngestConfig(
        source=str(src), dest=dest, format="arrow", tokenizer=str(tok), seq_len=seq_len,
        packing="best-fit", shard_size="1TB", progress="none",
    )  # fmt: skip
    ctx = StorageContext.resolve(None)
    t: dict[str, float] = {}
    with gc_paused():  # as a run scans and assigns
        scan, t["scan"] = _best(
            lambda: scan_source(config.source, config.source_format, ctx, fields=config.fields,
                                options=config.source_options), repeat,
        )  # fmt: skip
        jobs, t["assign + fingerprint"] = _best(
            lambda: runner._assign_shards(config, scan, scan.items, ctx, set()), repeat
        )
    spec, job = jobs.spec, jobs.jobs[0]
    blob, t["job pickle"] = _best(lambda: pickle.dumps(job, 5), repeat)
    _, t["job unpickle"] = _best(lambda: pickle.loads(blob), repeat)
    if spec.kinds == {spec.text_field: "text"}:  # the rows path a run takes for such tables
        rows = item_rows(job.items)
        (texts, _, _, _), t["read back + NFC"] = _best(
            lambda: table_texts(rows, spec.text_field or "", spec.transform), repeat
        )
    else:
        found, t["read back + NFC"] = _best(
            lambda: list(shardtask._samples(spec, job, ShardResult(0, None))), repeat
        )
        texts = [rec[spec.text_field] for _, rec, _ in found]
    packer = shared_packer(str(tok), seq_len=seq_len, packing="best-fit")
    with tokenizer_threads(False):
        # its encodings dropped at once: held while the next stage runs, they cost it 30%
        _, t[KERNEL] = _best(
            lambda: len(packer.tokenizer.encode_batch_fast(texts, add_special_tokens=False)),
            repeat,
        )
        (stream, lengths), t["encode, ids into one array"] = _best(
            lambda: packer.encode(texts), repeat
        )
    _, t["special-token count"] = _best(lambda: packer.specials.documents_with(texts), repeat)
    plan, t["best-fit plan"] = _best(lambda: plan_packing(lengths, packer.options), repeat)
    ids = np.arange(len(texts))
    table, t["rows + segment columns"] = _best(
        lambda: packer.table(stream, lengths, plan, ids), repeat
    )
    data, t["Arrow write"] = _best(lambda: shardtask.write_arrow(table), repeat)
    url = f"{dest}/stage-profile.arrow"
    _, t["PUT"] = _best(lambda: put_object(url, data, storage_options=ctx.options(url)), repeat)
    return t
