"""A ``PackedLoader`` batch beside a ``TokenLoader`` batch over the same tokens, when the
decode is gone: ``PackedLoader(keep_decoded=...)`` after its first epoch (units mapped)
over a Parquet column of token ids, and ``TokenLoader`` over an ingested Arrow dataset of
the same documents packed the same way.

Layouts: ``--docs long`` (the tokenized machine corpus, documents of hundreds to thousands
of tokens) or ``--docs short`` (the same tokens cut into documents of 10 to 100 tokens);
``--outputs``: both sides with every document output. tokens/s and tokens per CPU second,
interleaved rounds, ratios of medians. Not a timed test.

    python -m benchmarks.stages.packedcost --mb 8 --batch 64 --docs short --outputs
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.benchmath import ratio
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from benchmarks.harness.tokenrates import rates_table, timed, write_corpus
from benchmarks.stages.inplace import run_packed
from benchmarks.stages.tokenize_bench import machine_documents, train_tokenizer

PACKED = "PackedLoader epoch 2+, keep_decoded"
TOKENS = "TokenLoader, ingested Arrow"


def short_documents(ids: list[list[int]], seed: int = 0) -> list[list[int]]:
    """The tokens of ``ids`` end to end, cut into documents of 10 to 100 tokens."""
    flat = np.concatenate([np.asarray(d, np.int64) for d in ids])
    lens = np.random.default_rng(seed).integers(10, 101, len(flat) // 10 + 1)
    ends = np.cumsum(lens)
    keep = ends <= len(flat)
    cuts = zip(ends[keep].tolist(), lens[keep].tolist(), strict=True)
    return [flat[e - n : e].tolist() for e, n in cuts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=8, help="MB of text in the corpus")
    p.add_argument("--token-copies", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--docs", choices=("long", "short"), default="long")
    p.add_argument("--outputs", action="store_true", help="every document output")
    p.add_argument("--row-group", type=int, default=1000, help="rows per Parquet row group")
    p.add_argument("--files", type=int, default=4, help="Parquet files")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)

    import pyarrow as pa

    from benchmarks.harness.tokens_dataset import document_ids, ingested_tokens
    from flashfeed.format.inplaceindex import index_in_place
    from flashfeed.loader import TokenLoader
    from flashfeed.loader.tokens.segments import DOC_OUTPUTS

    work = Path(tempfile.mkdtemp(prefix="ff-packedcost-"))
    docs = machine_documents(int(args.mb * 1e6))
    tok = str(work / "tok.json")
    train_tokenizer(docs[:2000], Path(tok), 8000)
    ids = document_ids(docs, tok) * args.token_copies
    if args.docs == "short":
        ids = short_documents(ids)
    arrow = ingested_tokens(work / "arrow", ids, tok, seq_len=args.seq_len)
    print(f"{sum(map(len, ids)):,} tokens in {len(ids):,} documents, batch {args.batch} x "
          f"{args.seq_len}, outputs {'all' if args.outputs else 'none'}, {args.files} files "
          f"of row groups of {args.row_group:,} rows")  # fmt: skip
    local = str(work / "ids")
    write_corpus(local, {"input_ids": pa.array(ids, pa.list_(pa.int32()))}, args.files,
                 args.row_group, "zstd")  # fmt: skip
    index_in_place(local)
    del ids, docs
    gc.collect()
    kw: dict[str, Any] = {"column": "input_ids", "keep_decoded": str(work / "kept")}
    tkw: dict[str, Any] = {}
    if args.outputs:
        kw["outputs"] = DOC_OUTPUTS
        tkw = {"columns": ("tokens",), "outputs": DOC_OUTPUTS}

    def token_loader() -> int:
        loader = TokenLoader(arrow, batch_size=args.batch, drop_last=False, **tkw)
        n = sum(int(b["tokens"].numel()) for b in loader)
        loader.close()
        return n

    def packed() -> int:
        return run_packed(local, None, args, **kw)

    packed()  # kept once
    token_loader()
    sides = {PACKED: lambda: timed(packed), TOKENS: lambda: timed(token_loader)}
    got = run_rounds(sides, args.rounds)
    rows = rates_table("PackedLoader (kept) vs TokenLoader", got, (PACKED,))  # type: ignore[arg-type]
    for key in ("tokens_per_s", "tokens_per_cpu_s"):
        r = ratio([m[key] for m in got[PACKED]], [m[key] for m in got[TOKENS]])
        print(f"{key}: PackedLoader / TokenLoader {r['ratio']:.2f}x")
    if args.out:
        write_json(args.out, {"args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
