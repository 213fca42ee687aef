"""The same documents two ways: an ingested Arrow token dataset (``TokenPacker``, concat
packing, as ``flashfeed ingest --tokenizer`` writes) and each document's token ids (its
tokens plus EOS), for a Parquet column of ids holding exactly those tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flashfeed import storage
from flashfeed.arrowshard import write_arrow
from flashfeed.ingest.tokenize import TOKEN_FEATURE, TokenPacker
from flashfeed.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.shardio import shard_name

__all__ = ["ingested_tokens"]


def ingested_tokens(
    prefix: Path, docs: list[str], tokenizer: str, *, seq_len: int, docs_per_shard: int = 2000
) -> tuple[str, list[list[int]]]:
    """``(dataset url, ids per document)``: the Arrow dataset committed at ``prefix``."""
    packer = TokenPacker(tokenizer, seq_len=seq_len, packing="concat")
    stream, lengths = packer.encode(docs)
    ends = np.cumsum(lengths)
    ids = [stream[e - n : e].astype(np.int32).tolist() for e, n in zip(ends, lengths, strict=True)]
    infos = []
    for n, first in enumerate(range(0, len(docs), docs_per_shard)):
        part = docs[first : first + docs_per_shard]
        table, _ = packer.pack(part, list(range(first, first + len(part))))
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
    return str(prefix), ids
