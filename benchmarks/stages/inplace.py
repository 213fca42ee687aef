"""Training on Parquet where it lies: flashfeed's in-place index beside its peers.

  text     tokens/s and tokens per CPU second of a text column read from Parquet files
           (Hugging Face layout: ``data/train-0000k-of-0000n.parquet``, row groups of
           ``--row-group`` rows, zstd) and tokenized in the loader with one tokenizer.json:
           flashfeed ``PackedLoader`` (packing into ``--seq-len`` rows, document outputs
           off) beside Hugging Face ``datasets`` streaming ``load_dataset("parquet",
           streaming=True).map(tokenize, batched=True)`` and LitData's ``ParquetLoader``
           (its ``StreamingDataLoader``, batches of 1,000 texts tokenized) when installed;
           local files, and cold from S3 (a fresh node cache each round); and later epochs
           with ``keep_decoded`` (units tokenized once, then mapped from flash) beside
           ``datasets``' own tokenize-once (``load_dataset`` and ``.map`` into its Arrow
           cache, read as Arrow batches)
  tokens   a column of token ids (lists of int32; zstd, snappy) packed by ``PackedLoader``
           beside ``TokenLoader`` over an ingested Arrow dataset of the same tokens packed
           the same way (the tokenized corpus repeated ``--token-copies`` times); and later
           epochs with ``keep_decoded`` (each unit decoded once, then mapped)
  images   images/s of the DALI ``Loader`` over JPEGs and captions as a Hugging Face
           ``Image`` column in Parquet (indexed in place) beside the same in tar shards
  ceilings the bare work each of those cannot avoid, measured in the same rounds: the
           tokenizer's call over the same texts (text), pyarrow decoding the same row groups'
           list column and nothing else (tokens); each flashfeed side's fraction of it
  index    seconds and requests of ``flashfeed index`` over ``--index-files`` Parquet files
           on S3 (the benchmark's own SeaweedFS)

Rounds are interleaved in rotated order; ratios are of medians (``benchmath.ratio``).
Prints tables and writes JSON. Not a timed test.

    python -m benchmarks.stages.inplace --mb 16 --rounds 3 --out .bench/inplace.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.benchmath import ratio
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from benchmarks.harness.textpeers import (
    hf_map_cached,
    litdata_dir,
    run_decode,
    run_hf_cached,
    run_hf_streaming,
    run_litdata,
    run_tokenizer,
)
from benchmarks.harness.tokenrates import Measure, progress, rates_table, timed, write_corpus
from benchmarks.stages.tokenize_bench import machine_documents, train_tokenizer


def run_packed(
    url: str, tok: str | None, args: argparse.Namespace, *, column: str = "text", **kw: Any
) -> int:
    from flashfeed.loader import PackedLoader

    loader = PackedLoader(
        url, batch_size=args.batch, seq_len=args.seq_len, column=column, tokenizer=tok,
        drop_last=False, **kw,
    )  # fmt: skip
    n = sum(int(b["tokens"].numel()) for b in loader)
    loader.close()
    return n


def _later_epoch(url: str, tok: str | None, args: argparse.Namespace, **kw: Any) -> Measure:
    """A loader's second epoch, timed alone (the loader made and its first epoch read before
    the timer), as ``datasets``' second pass over its cache is."""
    from flashfeed.loader import PackedLoader

    loader = PackedLoader(url, batch_size=args.batch, seq_len=args.seq_len, tokenizer=tok,
                          drop_last=False, **kw)  # fmt: skip
    try:
        for _ in loader:
            pass
        loader.set_epoch(1)
        return timed(lambda: sum(int(b["tokens"].numel()) for b in loader))
    finally:
        loader.close()


def bench_text(work: Path, docs: list[str], tok: str, args: argparse.Namespace,
               store: Any) -> dict[str, Any]:  # fmt: skip
    from flashfeed import storage
    from flashfeed.format.inplaceindex import index_in_place

    local = str(work / "text")
    write_corpus(local, {"text": docs}, args.files, args.row_group, "zstd")
    index_in_place(local)
    files = [str(Path(local) / f) for f in sorted(os.listdir(Path(local) / "data"))]
    files = [str(Path(local) / "data" / Path(f).name) for f in files]
    lit = litdata_dir(files, work)
    cached = hf_map_cached(files, tok, work)
    kept = str(work / "kept-text")
    run_packed(local, tok, args, keep_decoded=kept)  # an epoch before: every unit kept
    sides: dict[str, Callable[[], Measure | None]] = {
        "flashfeed local": lambda: timed(lambda: run_packed(local, tok, args)),
        KEPT_TEXT: lambda: _later_epoch(local, tok, args, keep_decoded=kept),
        "datasets streaming local": lambda: _maybe(run_hf_streaming, files, tok, None),
        "litdata ParquetLoader local": lambda: _maybe(run_litdata, lit, tok),
        "datasets map-cached epoch 2+, local": lambda: _maybe(run_hf_cached, cached, args),
        CEILING_TEXT: lambda: timed(lambda: run_tokenizer(docs, tok)),
    }
    if store is not None:
        remote = f"{store}/text"
        for f in sorted((Path(local) / "data").iterdir()):
            storage.write_bytes(f"{remote}/data/{f.name}", f.read_bytes())
        index_in_place(remote)
        remote_files = [f"{remote}/data/{f.name}" for f in sorted((Path(local) / "data").iterdir())]
        opts = storage.filesystem(remote)[0].storage_options

        def cold() -> Measure:
            cache = tempfile.mkdtemp(dir=work, prefix="cache-")
            try:
                return timed(lambda: run_packed(remote, tok, args, cache_dir=cache))
            finally:
                shutil.rmtree(cache, ignore_errors=True)

        sides["flashfeed S3 cold"] = cold
        sides["datasets streaming S3 cold"] = lambda: _maybe(
            run_hf_streaming, remote_files, tok, opts
        )
    got = run_rounds(sides, args.rounds, after_each=progress)
    rows = rates_table(
        "text column tokenized in the loader",
        got,
        ("flashfeed local", KEPT_TEXT, "flashfeed S3 cold", CEILING_TEXT),
    )
    _of_ceiling(rows, got, CEILING_TEXT, ("flashfeed local", "flashfeed S3 cold"))
    return rows


#: later epochs (and a node's other ranks) with ``keep_decoded``: units mapped, not decoded
KEPT_TEXT = "flashfeed epoch 2+, keep_decoded, local"
KEPT_IDS = "PackedLoader epoch 2+, keep_decoded, zstd"

#: the bare work each side cannot avoid, measured beside them
CEILING_TEXT = "ceiling: bare tokenizer, same texts"
CEILING_IDS = "ceiling: pyarrow decode only, zstd"


def _of_ceiling(
    rows: dict[str, Any], got: dict[str, list[Any]], ceiling: str, names: tuple[str, ...]
) -> None:
    """Each side's rate as a fraction of the ceiling's (medians; tokens/s and per CPU s)."""
    top = got[ceiling]
    for name in names:
        if name not in got or any(m is None for m in got[name]):
            continue
        r = ratio([m["tokens_per_s"] for m in got[name]], [m["tokens_per_s"] for m in top])
        c = ratio([m["tokens_per_cpu_s"] for m in got[name]], [m["tokens_per_cpu_s"] for m in top])
        rows[name]["of_ceiling"] = {"ratio": r, "cpu_ratio": c}
        print(f"{name}: {r['ratio']:.2f}x of the ceiling ({c['ratio']:.2f}x per CPU second)")


def _maybe(fn: Callable[..., int | None], *a: Any) -> Measure | None:
    out: list[int | None] = []
    m = timed(lambda: (out.append(fn(*a)), out[0] or 0)[1])
    return None if out[0] is None else m


def bench_tokens(work: Path, docs: list[str], tok: str, args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow as pa

    from benchmarks.harness.tokens_dataset import document_ids, ingested_tokens
    from flashfeed.format.inplaceindex import index_in_place
    from flashfeed.loader import TokenLoader

    ids = document_ids(docs, tok) * args.token_copies  # more tokens than a tokenizer makes
    arrow = ingested_tokens(work / "arrow", ids, tok, seq_len=args.seq_len)
    print(f"\n{sum(len(d) for d in ids):,} tokens in {len(ids):,} documents")
    column = pa.array(ids, pa.list_(pa.int32()))
    local = {}
    for codec in ("zstd", "snappy"):
        local[codec] = str(work / f"ids-{codec}")
        write_corpus(local[codec], {"input_ids": column}, args.files, args.row_group, codec)
        index_in_place(local[codec])

    def token_loader() -> int:
        loader = TokenLoader(arrow, batch_size=args.batch, drop_last=False)
        n = sum(int(b["tokens"].numel()) for b in loader)
        loader.close()
        return n

    def packed(codec: str) -> Callable[[], Measure]:
        return lambda: timed(lambda: run_packed(local[codec], None, args, column="input_ids"))

    kept = str(work / "kept-ids")
    run_packed(local["zstd"], None, args, column="input_ids", keep_decoded=kept)  # kept once
    sides = {
        "PackedLoader, Parquet ids zstd": packed("zstd"),
        KEPT_IDS: lambda: timed(
            lambda: run_packed(local["zstd"], None, args, column="input_ids", keep_decoded=kept)
        ),
        "PackedLoader, Parquet ids snappy": packed("snappy"),
        "TokenLoader, ingested Arrow": lambda: timed(token_loader),
        CEILING_IDS: lambda: timed(lambda: run_decode(local["zstd"], "input_ids")),
    }
    got = run_rounds(sides, args.rounds, after_each=progress)
    ours = ("PackedLoader, Parquet ids zstd", "PackedLoader, Parquet ids snappy", KEPT_IDS,
            CEILING_IDS)  # fmt: skip
    rows = rates_table("pre-tokenized column vs ingested Arrow", got, ours)
    _of_ceiling(rows, got, CEILING_IDS, ours[:1])
    return rows


def bench_images(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Images/s of the DALI ``Loader`` over the same JPEGs and captions: rows of Parquet
    files indexed in place (a Hugging Face ``Image`` column) beside tar shards."""
    import io
    import tarfile

    import pyarrow as pa
    from PIL import Image

    from flashfeed.format.indexer import index_dataset
    from flashfeed.format.inplaceindex import index_in_place
    from flashfeed.loader import Loader

    rng = np.random.default_rng(0)
    jpegs, captions = [], []
    for i in range(args.images):
        pixels = rng.integers(0, 255, (args.image_side, args.image_side, 3), np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG", quality=85)
        jpegs.append(out.getvalue())
        captions.append(f"image {i}")
    pq_prefix, tar_prefix = str(work / "img-parquet"), work / "img-tar"
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(jpegs)], image_type)
    write_corpus(pq_prefix, {"image": images, "caption": pa.array(captions)}, args.files,
                 args.image_rows, "snappy")  # fmt: skip
    index_in_place(pq_prefix)
    bounds = np.linspace(0, args.images, args.files + 1).astype(int)
    tar_prefix.mkdir(parents=True)
    for k in range(args.files):
        with tarfile.open(tar_prefix / f"shard-{k:05d}.tar", "w") as tar:
            for i in range(int(bounds[k]), int(bounds[k + 1])):
                for ext, data in (("jpg", jpegs[i]), ("txt", captions[i].encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    index_dataset(str(tar_prefix))

    def run(url: str, fields: dict[str, str]) -> Measure:
        def count() -> int:
            loader = Loader(url, batch_size=64, image_size=args.image_out, fields=fields,
                            device="cpu", drop_last=False)  # fmt: skip
            n = sum(len(b["__key__"]) for b in loader)
            loader.close()
            return n

        m = timed(count)  # "tokens" are images here
        return m

    sides = {
        "Loader, Parquet image bytes": lambda: run(
            pq_prefix, {"image": "image", "caption": "caption"}
        ),
        "Loader, tar shards": lambda: run(str(tar_prefix), {"image": "jpg", "caption": "txt"}),
    }
    got = run_rounds(sides, args.rounds, after_each=progress)
    return rates_table("image bytes in Parquet vs tar shards (images/s)", got,
                  ("Loader, Parquet image bytes",))  # fmt: skip


def bench_index(work: Path, store: str, args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow as pa

    from flashfeed.format.inplaceindex import index_in_place

    prefix = f"{store}/many"
    text = pa.array([f"r{i}" for i in range(2 * args.index_rows * args.index_files)])
    write_corpus(prefix, {"text": text}, args.index_files, args.index_rows, "snappy")
    t0 = time.perf_counter()
    report = index_in_place(prefix, workers=args.index_workers)
    seconds = time.perf_counter() - t0
    out = {
        "files": report.files, "units": report.manifest.num_shards, "seconds": seconds,
        "requests": report.requests, "requests_per_file": report.requests / report.files,
        "workers": args.index_workers,
    }  # fmt: skip
    print(f"\nindex {out['files']} Parquet files on S3 ({out['units']} row groups): "
          f"{seconds:.2f} s, {report.requests} requests "
          f"({out['requests_per_file']:.2f} per file), {args.index_workers} workers")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=16, help="MB of text in the corpus")
    p.add_argument("--files", type=int, default=4, help="Parquet files of the corpus")
    p.add_argument("--row-group", type=int, default=1000, help="rows per row group")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument(
        "--token-copies", type=int, default=16, help="the tokenized corpus, repeated (tokens)"
    )
    p.add_argument("--index-files", type=int, default=1000)
    p.add_argument("--index-rows", type=int, default=1000, help="rows per row group (2 each)")
    p.add_argument("--index-workers", type=int, default=16)
    p.add_argument("--no-s3", action="store_true", help="local files only, no index stage")
    p.add_argument("--images", type=int, default=2000, help="JPEGs of the images stage")
    p.add_argument("--image-side", type=int, default=256, help="their width and height")
    p.add_argument("--image-out", type=int, default=64, help="the Loader's image_size")
    p.add_argument("--image-rows", type=int, default=250, help="images per row group")
    p.add_argument("--stages", default="text,tokens,images,index")
    p.add_argument("--out", default=None, help="JSON file to write")
    args = p.parse_args(argv)
    stages = set(args.stages.split(","))
    docs = machine_documents(int(args.mb * 1e6))
    out: dict[str, Any] = {"args": vars(args), "documents": len(docs)}
    with tempfile.TemporaryDirectory(prefix="ff-inplace-") as tmp:
        work = Path(tmp)
        tok = str(work / "tok.json")
        train_tokenizer(docs[:2000], Path(tok), args.vocab)
        store = None if args.no_s3 else _start_store(work)
        try:
            bucket = None if store is None else "s3://flashfeed"
            if "text" in stages:
                out["text"] = bench_text(work, docs, tok, args, bucket)
            if "tokens" in stages:
                out["tokens"] = bench_tokens(work, docs, tok, args)
            if "images" in stages:
                out["images"] = bench_images(work, args)
            if "index" in stages and bucket is not None:
                out["index"] = bench_index(work, bucket, args)
        finally:
            if store is not None:
                store.stop()
    if args.out:
        write_json(args.out, out)
    return 0


def _start_store(work: Path) -> Any:
    """The benchmark's own SeaweedFS, its AWS variables exported for this process."""
    from flashfeed.cli.devstore import EmbeddedStore

    store = EmbeddedStore(str(work / "store"), port=0)
    store.start()
    store.make_bucket("flashfeed")
    os.environ.update(store.info.env())
    return store


if __name__ == "__main__":
    raise SystemExit(main())
