"""The same token documents two ways: an ingested Arrow token dataset (concat packing, as
``flashfeed ingest --tokenizer`` lays rows out) and each document's token ids (its tokens
plus EOS), for a Parquet column of ids holding exactly those tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flashfeed import storage
from flashfeed.format.arrowshard import write_arrow
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.ingest.packing import plan_packing
from flashfeed.ingest.tokenize import TOKEN_FEATURE, TokenPacker
from flashfeed.shardio import shard_name

__all__ = ["document_ids", "ingested_tokens"]


def document_ids(docs: list[str], tokenizer: str) -> list[np.ndarray]:
    """Each document's tokens plus EOS, as ingest encodes them."""
    packer = TokenPacker(tokenizer, seq_len=1, packing="concat")
    stream, lengths = packer.encode(docs)
    ends = np.cumsum(lengths)
    return [stream[e - n : e].astype(np.int32) for e, n in zip(ends, lengths, strict=True)]


def ingested_tokens(
    prefix: Path,
    ids: list[np.ndarray],
    tokenizer: str,
    *,
    seq_len: int,
    docs_per_shard: int = 2000,
) -> str:
    """The Arrow dataset of documents ``ids`` (packed back to back into ``seq_len`` rows,
    their boundaries recorded), committed at ``prefix``; its URL."""
    packer = TokenPacker(tokenizer, seq_len=seq_len, packing="concat")
    infos = []
    for n, first in enumerate(range(0, len(ids), docs_per_shard)):
        part = ids[first : first + docs_per_shard]
        lengths = np.array([len(d) for d in part], np.int64)
        stream = np.concatenate(part).astype(packer.dtype)
        plan = plan_packing(lengths, packer.options)
        table = packer.table(stream, lengths, plan, np.arange(first, first + len(part)))
        data = write_arrow(table)
        path = shard_name(n, "arrow")
        storage.write_bytes(storage.join(str(prefix), path), data)
        infos.append(ShardInfo(path, table.num_rows, len(data), storage.checksum(data)))
    manifest = Manifest(
        name="tokens", shard_format="arrow", schema=packer.schema, shards=tuple(infos),
        extra={"tokens": {"seq_len": seq_len, "eos_id": packer.eos_id, "pad_id": packer.pad_id}},
        requires=(TOKEN_FEATURE,),
    )  # fmt: skip
    commit_manifest(str(prefix), manifest)
    return str(prefix)
