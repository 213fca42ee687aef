"""Text to tokens, and tokens to batches: flashfeed beside what a data team would use.

  tokenize   MB/s of text from one JSONL with one tokenizer.json, in rotated rounds:
             flashfeed ingest (Ray, ``--num-cpus``, best-fit packing, committed dataset),
             Hugging Face ``datasets``: ``load_dataset("json")`` + ``map(batched=True,
             num_proc=2)`` calling the same tokenizer, and ``tokenizers``' own
             ``encode_batch`` / ``encode_batch_fast`` on the texts already in memory, in one
             process (its limit: no reading, no writing)
  per_cpu    ingest's MB per CPU second beside the bare tokenizer's, on generated corpora of
             three shapes (median document 300 B, 3 KB, 100 KB) with 1 and 2 Ray CPUs, the
             shards PUT to a local SeaweedFS; Ray's start-up apart (``tokpercpu``)
  packing    padding of concat and best-fit on the corpus's real document lengths
  loader     TokenLoader GB/s of delivered bytes, tokens only and with the document outputs
             (position_ids, document_ids, cu_seqlens, max_seqlen, labels), beside a memcpy
             of the same number of bytes and a row gather: the same rows in the same order
             gathered into buffers reused batch after batch (so cache-resident at small
             batches), one per (B, L) array a batch delivers; not a limit of the loader
             (and each loader's CPU microseconds per batch, its fixed cost at small batches)

The corpus is real text found on the machine (package docs, changelogs, Python sources),
one document per file or changelog entry (long files cut at 256 KiB), and a byte-level BPE
trained on it.
Prints tables and writes JSON. Not a timed test.

    python -m benchmarks.stages.tokenize_bench --mb 8 --rounds 3 --out .bench/tokenize.json
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated
from benchmarks.harness.rowgather import row_gather_rate
from benchmarks.harness.textshapes import DEFAULT_SHAPES, SHAPES

SOURCES = ("/usr/share/doc/*/*", "/usr/lib/python3*/**/*.py")
CHUNK = 256 << 10
KERNEL_OUTPUTS = ("position_ids", "document_ids", "cu_seqlens", "max_seqlen", "labels")
KERNEL_ARRAYS = ("position_ids", "document_ids", "labels")  # the (B, L) ones among them
ROW_GATHER = "row gather into reused buffers, not a limit"


def machine_documents(limit: int, seed: int = 0) -> list[str]:
    """Up to ``limit`` bytes of UTF-8 text files on this machine, in a seeded order: each
    file a document, a changelog one document per entry, long files cut at 256 KiB."""
    files = [f for pattern in SOURCES for f in sorted(glob.glob(pattern, recursive=True))]
    order = np.random.default_rng(seed).permutation(len(files))
    docs: list[str] = []
    total = 0
    for f in (files[i] for i in order):
        if total >= limit:
            break
        if not os.path.isfile(f) or os.path.islink(f):
            continue
        try:
            with gzip.open(f) if f.endswith(".gz") else open(f, "rb") as fh:
                text = fh.read().decode("utf-8").strip()
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        parts = re.split(r"(?m)(?<=^ -- ).*\n+", text) if "changelog" in f else [text]
        for part in parts:
            for i in range(0, len(part), CHUNK):
                piece = part[i : i + CHUNK].strip()
                if piece:
                    docs.append(piece)
                    total += len(piece.encode())
    if not docs:
        raise SystemExit(f"no text files found under {SOURCES}")
    return docs


def train_tokenizer(docs: list[str], path: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))


def run_flashfeed(src: Path, tok: Path, work: Path, args: argparse.Namespace) -> float:
    """Seconds of a whole ingest run (scan, tasks, commit) on the already running Ray."""
    from flashfeed.ingest import IngestConfig, run

    dest = work / "ff-out"
    shutil.rmtree(dest, ignore_errors=True)
    config = IngestConfig(
        source=str(src), dest=str(dest), format="arrow", tokenizer=str(tok),
        seq_len=args.seq_len, packing="best-fit", shard_size=args.shard_size, progress="none",
    )  # fmt: skip
    t0 = time.perf_counter()
    run(config)
    return time.perf_counter() - t0


def _hf_tokenize(batch: dict[str, list[str]], tok_path: str) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = _TOKENIZERS.get(tok_path) or _TOKENIZERS.setdefault(
        tok_path, Tokenizer.from_file(tok_path)
    )
    return {"input_ids": [e.ids for e in tok.encode_batch(batch["text"])]}


_TOKENIZERS: dict[str, Any] = {}


def run_datasets(src: Path, tok: Path, work: Path, args: argparse.Namespace) -> float | None:
    """Seconds of ``load_dataset("json")`` + ``map(batched=True, num_proc)``, fresh cache."""
    try:
        import datasets
    except ImportError:
        return None
    datasets.disable_progress_bars()
    cache = work / "hf-cache"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(src), split="train", cache_dir=str(cache))
    ds.map(
        _hf_tokenize, batched=True, num_proc=args.num_cpus, remove_columns=["text"],
        fn_kwargs={"tok_path": str(tok)},
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    shutil.rmtree(cache, ignore_errors=True)
    return seconds


def run_encode(texts: list[str], tok: Path, fast: bool) -> float:
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(tok))
    fn = t.encode_batch_fast if fast else t.encode_batch
    t0 = time.perf_counter()
    fn(texts, add_special_tokens=False)
    return time.perf_counter() - t0


def bench_tokenize(
    src: Path, tok: Path, texts: list[str], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    from flashfeed.ingest.raysetup import ray_session

    mb = sum(len(t.encode()) for t in texts) / 1e6
    peers = {
        "flashfeed-ingest": lambda: run_flashfeed(src, tok, work, args),
        "datasets-map": lambda: run_datasets(src, tok, work, args),
        "encode_batch": lambda: run_encode(texts, tok, fast=False),
        "encode_batch_fast": lambda: run_encode(texts, tok, fast=True),
    }
    names = list(peers)
    rates: dict[str, list[float]] = {n: [] for n in names}
    with ray_session(num_cpus=args.num_cpus):
        run_flashfeed(src, tok, work, args)  # warm-up: Ray's workers start and import once
        for r in range(args.rounds):
            order = rotated(names, r)
            for name in order:
                secs = peers[name]()
                if secs is not None:
                    rates[name].append(mb / secs)
                    print(f"  round {r} {name:18s} {mb / secs:7.2f} MB/s", file=sys.stderr)
    med = {n: statistics.median(v) for n, v in rates.items() if v}
    ff = med["flashfeed-ingest"]
    ratios = {f"vs {n}": ff / v for n, v in med.items() if n != "flashfeed-ingest"}
    return {
        "mb": mb,
        "documents": len(texts),
        "median_mb_s": med,
        "rounds": rates,
        "ratios": ratios,
    }


def bench_packing(texts: list[str], tok: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Padding of each mode on this corpus's real token counts, at 4096 and ``seq_len``."""
    from flashfeed.ingest.packing import PackOptions, plan_packing
    from flashfeed.ingest.tokenize import TokenPacker

    _, lengths = TokenPacker(str(tok), seq_len=args.seq_len).encode(texts)
    out: dict[str, Any] = {"documents": len(lengths), "tokens": int(lengths.sum())}
    for seq in sorted({4096, args.seq_len}):
        for mode in ("concat", "best-fit"):
            plan = plan_packing(lengths, PackOptions(seq_len=seq, mode=mode))
            out[f"{mode}@{seq}"] = {
                "rows": plan.rows,
                "padding_pct": 100 * plan.padding / (plan.rows * seq),
                "truncated_pct": 0.0,
                "split_documents": plan.split_documents,
                "longer_than_row": int((lengths > seq).sum()),
            }
    return out


def make_token_dataset(prefix: Path, tok: Path, args: argparse.Namespace) -> None:
    """``--token-rows`` rows of random tokens in documents of a log-normal length mix."""
    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.ingest.packing import PackOptions, plan_packing
    from flashfeed.ingest.tokenize import TOKEN_FEATURE, TokenPacker
    from flashfeed.shardio import shard_name, write_arrow_shard

    packer = TokenPacker(str(tok), seq_len=args.seq_len, packing="best-fit")
    rng = np.random.default_rng(0)
    infos, first = [], 0
    per_shard = args.token_rows * args.seq_len // 8
    for s in range(8):
        lengths = rng.lognormal(np.log(600), 1.0, per_shard // 900).astype(np.int64) + 1
        stream = rng.integers(0, 16000, int(lengths.sum())).astype(packer.dtype)
        plan = plan_packing(lengths, PackOptions(seq_len=args.seq_len, mode="best-fit"))
        ids = np.arange(first, first + len(lengths))
        table = packer.table(stream, lengths, plan, ids)
        infos.append(write_arrow_shard(str(prefix), shard_name(s, "arrow"), table))
        first += len(lengths)
    m = Manifest(
        name="tok", shard_format="arrow", schema=packer.schema, shards=tuple(infos),
        requires=(TOKEN_FEATURE,),
    )  # fmt: skip
    commit_manifest(str(prefix), m, overwrite=True)


def bench_loader(prefix: Path, args: argparse.Namespace) -> dict[str, Any]:
    """GB/s at ``--batch-size`` (tokens only, with document outputs, memcpy), in rotated
    rounds; then with document outputs at each of ``--more-batch-sizes`` beside memcpy."""
    from flashfeed.loader import TokenLoader

    out = _loader_rates(prefix, args, args.batch_size, with_tokens_only=True)
    out["by_batch_size"] = {
        str(b): _loader_rates(prefix, args, b, with_tokens_only=False)
        for b in args.more_batch_sizes
        if len(TokenLoader(str(prefix), batch_size=b, device="cpu"))  # a batch to time
    }
    return out


def _loader_rates(
    prefix: Path, args: argparse.Namespace, batch_size: int, *, with_tokens_only: bool
) -> dict[str, Any]:
    from flashfeed.loader import TokenLoader

    keys: list[list[str]] = []  # the timed pass's rows, for the row gather
    #: CPU microseconds per batch of each timed pass: the loader's cost per batch, which a
    #: machine loaded by others changes far less than it changes the wall clock
    cpu_us: dict[tuple[str, ...], list[float]] = {}

    def epoch(outputs: tuple[str, ...]) -> tuple[float, int]:
        loader = TokenLoader(str(prefix), batch_size=batch_size, outputs=outputs, device="cpu")
        for _ in loader:  # the first pass maps the pages in
            pass
        before = loader.bytes_delivered
        keys.clear()
        c0, t0 = time.process_time(), time.perf_counter()
        for batch in loader:
            keys.append(batch["__key__"])  # type: ignore[arg-type]
        secs = time.perf_counter() - t0
        cpu_us.setdefault(outputs, []).append((time.process_time() - c0) / len(keys) * 1e6)
        return secs, loader.bytes_delivered - before

    def memcpy(nbytes: int) -> float:
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault the destination in
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return time.perf_counter() - t0

    rows = {"tokens only": (), "with document outputs": KERNEL_OUTPUTS}
    if not with_tokens_only:
        del rows["tokens only"]
    rates: dict[str, list[float]] = {n: [] for n in [*rows, "memcpy (same bytes)", ROW_GATHER]}
    for r in range(args.rounds):
        for name in rotated(list(rows), r):
            secs, nbytes = epoch(rows[name])
            rates[name].append(nbytes / secs / 1e9)
            if name == "with document outputs":
                rates["memcpy (same bytes)"].append(nbytes / memcpy(nbytes) / 1e9)
                rates[ROW_GATHER].append(row_gather_rate(prefix, keys, 1 + len(KERNEL_ARRAYS)))
    med = {n: statistics.median(v) for n, v in rates.items()}
    return {
        "gb_per_s": med,
        "rounds": rates,
        "of_memcpy": med["with document outputs"] / med["memcpy (same bytes)"],
        "of_row_gather": med["with document outputs"] / med[ROW_GATHER],
        "cpu_us_per_batch": {
            n: statistics.median(cpu_us[o]) for n, o in rows.items() if o in cpu_us
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=8.0, help="MB of text to tokenize")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-cpus", type=int, default=2, help="Ray CPUs and datasets' num_proc")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--shard-size", default="1MB", help="ingest's shard size (text bytes)")
    p.add_argument("--token-rows", type=int, default=8192, help="rows of the loader dataset")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--more-batch-sizes", type=int, nargs="*", default=[256],
        help="TokenLoader with document outputs at these batch sizes too",
    )  # fmt: skip
    p.add_argument(
        "--only", choices=("all", "loader", "percpu"), default="all",
        help="loader: only the TokenLoader table (no tokenizer runs, no Ray); "
        "percpu: only the per-CPU table",
    )  # fmt: skip
    p.add_argument(
        "--shapes", nargs="+", choices=tuple(SHAPES), default=list(DEFAULT_SHAPES),
        help="per_cpu: the corpus shapes (median document size)",
    )  # fmt: skip
    p.add_argument(
        "--ray-cpus", type=int, nargs="+", default=[1, 2], help="per_cpu: Ray CPU counts"
    )
    p.add_argument("--percpu-mb", type=float, default=4.0, help="per_cpu: MB of each corpus")
    p.add_argument(
        "--percpu-input", choices=("jsonl", "parquet"), default="jsonl",
        help="per_cpu: the corpora's file format (one text column)",
    )  # fmt: skip
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--out")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="fftok-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        texts = machine_documents(int(args.mb * 1e6))
        src, tok = work / "corpus.jsonl", work / "tokenizer.json"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        train_tokenizer(texts[::4], tok, args.vocab)
        result: dict[str, Any] = {"config": vars(args)}
        if args.only == "all":
            result["tokenize"] = bench_tokenize(src, tok, texts, work, args)
            result["packing"] = bench_packing(texts, tok, args)
        if args.only in ("all", "percpu"):
            # imported here: Ray and the store would slow the loader's timings a few percent
            from benchmarks.stages.tokpercpu import per_cpu_on_own_store

            result["per_cpu"] = per_cpu_on_own_store(tok, work, args)
        if args.only != "percpu":
            make_token_dataset(work / "tokens", tok, args)
            result["loader"] = bench_loader(work / "tokens", args)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print_tables(result)
    if args.out:
        write_json(args.out, result)
    return 0


def print_tables(result: dict[str, Any]) -> None:
    if "tokenize" in result:
        print_ingest_tables(result)
    if "per_cpu" in result:
        from benchmarks.stages.tokpercpu import print_per_cpu

        print_per_cpu(result["per_cpu"])
    if "loader" not in result:
        return
    lo = result["loader"]
    print("\nTokenLoader, CPU (GB/s of delivered bytes, median)")
    for name, v in lo["gb_per_s"].items():
        print(f"  {name:44s} {v:8.2f}")
    print(f"  {'with outputs / memcpy':44s} {lo['of_memcpy']:8.2f}")
    print(f"  {'with outputs / row gather (not a limit)':44s} {lo['of_row_gather']:8.2f}")
    for name, us in lo["cpu_us_per_batch"].items():
        print(f"  {'CPU us per batch, ' + name:44s} {us:8.1f}")
    for b, more in lo.get("by_batch_size", {}).items():
        rates = more["gb_per_s"]
        print(
            f"  batch {b:>5s}: with document outputs {rates['with document outputs']:6.2f}, "
            f"memcpy {rates['memcpy (same bytes)']:6.2f}, of memcpy {more['of_memcpy']:5.2f}, "
            f"row gather into reused buffers {rates[ROW_GATHER]:6.2f}, "
            f"of it {more['of_row_gather']:5.2f}, "
            f"CPU us/batch {more['cpu_us_per_batch']['with document outputs']:8.1f}"
        )


def print_ingest_tables(result: dict[str, Any]) -> None:
    t = result["tokenize"]
    print(f"\ntokenization, {t['mb']:.1f} MB of text, {t['documents']} documents (MB/s, median)")
    ff = t["median_mb_s"]["flashfeed-ingest"]
    for name, v in t["median_mb_s"].items():
        ratio = "" if name == "flashfeed-ingest" else f"  flashfeed {ff / v:.2f}x"
        print(f"  {name:22s} {v:8.2f}{ratio}")
    pk = result["packing"]
    print(f"\npacking of its {pk['documents']} documents ({pk['tokens']} tokens)")
    for k, v in pk.items():
        if isinstance(v, dict):
            print(
                f"  {k:16s} rows {v['rows']:7d}  padding {v['padding_pct']:6.3f}%  truncated "
                f"{v['truncated_pct']:.1f}%  split {v['split_documents']} "
                f"(longer than a row: {v['longer_than_row']})"
            )


if __name__ == "__main__":
    sys.exit(main())
