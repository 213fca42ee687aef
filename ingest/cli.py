"""``flashfeed ingest SOURCE DEST``: the command-line face of ``flashfeed.ingest.run``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flashfeed import storage
from flashfeed.errors import FlashfeedError
from flashfeed.s3.retry import is_auth_error

from .config import OUTPUT_FORMATS, SOURCE_FORMATS, IngestConfig
from .progress import summary_table
from .sources import FORMATS

__all__ = ["build_config", "check_bucket", "register"]

EXAMPLES = """\
examples:
  # an ImageFolder tree into 256 MiB WebDataset shards on the local S3 store
  eval "$(flashfeed store up)"
  flashfeed ingest ./photos s3://flashfeed/photos-v1 --validate --dedup

  # re-shard .tgz shards written by others, re-encoding images to 512 px JPEG q90
  flashfeed ingest s3://raw/laion-tgz/ s3://flashfeed/laion-v1 \\
      --shard-size 512MiB --max-image-side 512 --jpeg-quality 90

  # a CSV of captions and image paths, with explicit field mapping
  flashfeed ingest ./captions.csv ./ds --field jpg=filepath --field txt=caption

  # JSONL text tokenized into packed 2048-token Arrow rows
  flashfeed ingest ./corpus.jsonl s3://flashfeed/tok-v1 --format arrow \\
      --tokenizer ./tokenizer.json --seq-len 2048

  # a JSONL.zst/Parquet text corpus on S3, near-duplicates (Jaccard >= 0.8 of 5-word
  # shingles) and documents a quality filter drops removed on Ray, then tokenized
  flashfeed ingest s3://raw/web/ s3://flashfeed/web-v1 --source-format text \\
      --text-column content --near-dup-threshold 0.8 --quality-filter mypkg.filters:keep \\
      --format arrow --tokenizer ./tokenizer.json --seq-len 2048

  # on an existing Ray cluster, summary as JSON for scripts
  flashfeed ingest s3://raw/imgs s3://flashfeed/imgs-v1 --ray-address 10.0.0.5:6379 --json

A re-run of the same command after a crash reuses finished shards and gives the same bytes.
"""


def _field(text: str) -> tuple[str, str]:
    name, sep, column = text.partition("=")
    if not sep or not name or not column:
        raise argparse.ArgumentTypeError(f"--field wants NAME=COLUMN, got {text!r}")
    return name, column


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "ingest",
        help="turn a raw corpus into a sharded dataset (on Ray)",
        description="Turn a raw corpus into a sharded WebDataset or Arrow dataset on any "
        "storage, on an embedded local Ray or an existing cluster. The manifest is written "
        "last: its presence is the commit.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help="path or URL of the raw corpus")
    p.add_argument("dest", metavar="DEST", help="path or URL of the new dataset prefix")
    p.add_argument(
        "--format",
        choices=OUTPUT_FORMATS,
        default="webdataset",
        help="output shard format (default: webdataset)",
    )
    p.add_argument(
        "--source-format",
        choices=SOURCE_FORMATS,
        default="auto",
        help="source format (default: auto-detect)",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--shard-size",
        default="256MiB",
        help="target shard size, e.g. 256MiB (default); shards land within "
        "about 10%% of it, the last one excepted",
    )
    size.add_argument("--samples-per-shard", type=int, help="fixed samples per shard instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the shard assignment (0)")
    p.add_argument(
        "--no-shuffle",
        action="store_true",
        help="keep source order instead of a seeded permutation",
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="decode every image; skip (and count) undecodable ones and bombs",
    )
    p.add_argument(
        "--max-pixels",
        type=int,
        default=89_478_485,
        help="refuse images with more pixels (decompression bombs)",
    )
    p.add_argument(
        "--dedup",
        action="store_true",
        help="drop exact duplicates (content hash) across the whole dataset",
    )
    _near_dup_arguments(p)
    p.add_argument("--max-image-side", type=int, help="re-encode: shrink images to this side")
    p.add_argument("--jpeg-quality", type=int, help="re-encode: JPEG quality 1-100")
    p.add_argument(
        "--keep-original-size",
        action="store_true",
        help="with re-encoding, record the original WxH as field orig_size",
    )
    p.add_argument(
        "--no-normalize-text",
        action="store_true",
        help="keep text as is (default: unicode NFC and strip)",
    )
    p.add_argument(
        "--field",
        action="append",
        type=_field,
        default=[],
        metavar="NAME=COLUMN",
        help="map a table column or TFRecord feature to output field NAME "
        "(repeatable); default names: image->jpg, text->txt, label->cls",
    )
    for fmt in FORMATS.values():  # each format's own options: --<format>-<option>
        for opt in fmt.options:
            p.add_argument(
                f"--{fmt.name}-{opt.name.replace('_', '-')}",
                dest=_option_dest(fmt.name, opt.name),
                choices=opt.choices or None,
                metavar=None if opt.choices else opt.name.upper(),
                help=opt.help,
            )
    p.add_argument("--tokenizer", help="tokenizer.json (tokenizers library) for token datasets")
    p.add_argument("--seq-len", type=int, help="tokens per packed row (with --tokenizer)")
    p.add_argument(
        "--packing",
        choices=["concat", "best-fit"],
        default="concat",
        help="documents into rows: one after the other (concat) or best-fit (least padding)",
    )
    p.add_argument(
        "--pack-window",
        type=int,
        default=4096,
        help="documents best-fit packing sorts at once (bounds its memory; default 4096)",
    )
    p.add_argument(
        "--special-tokens",
        choices=("text", "special"),
        default="text",
        help="a special token spelled in a document (e.g. <|endoftext|>): encoded as the "
        "text it is (default), or as its control id (special)",
    )
    p.add_argument(
        "--eos-token",
        help="EOS token (default: the tokenizer's </s>, <|endoftext|>, <eos> or [SEP])",
    )
    p.add_argument(
        "--encrypt",
        action="store_true",
        help="seal every shard with AES-256-GCM; the key (64 hex chars or base64) from "
        "--encrypt-key-file, $FLASHFEED_ENCRYPTION_KEY_FILE or $FLASHFEED_ENCRYPTION_KEY",
    )
    p.add_argument("--encrypt-key-file", help="file holding the key of --encrypt")
    p.add_argument("--name", help="dataset name in the manifest (default: last part of DEST)")
    p.add_argument("--ray-address", help="join this Ray cluster instead of an embedded Ray")
    p.add_argument("--num-cpus", type=int, help="CPUs of the embedded Ray (default: all)")
    p.add_argument("--overwrite", action="store_true", help="replace a committed dataset at DEST")
    p.add_argument(
        "--create-bucket",
        action="store_true",
        help="create DEST's bucket if it does not exist (default: refuse, before any work)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="live progress on stderr (default: a bar on a terminal, else lines)",
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    p.set_defaults(func=_main)


def _near_dup_arguments(p: Any) -> None:
    g = p.add_argument_group(
        "near-duplicates and quality (Ray tasks over the corpus, before sharding)"
    )
    g.add_argument(
        "--near-dup-threshold",
        type=float,
        metavar="J",
        help="drop documents whose shingle Jaccard similarity to another is >= J, in (0, 1), "
        "keeping the smallest source position of each cluster (MinHash LSH candidates, "
        "confirmed on exact Jaccard: J is a line; off by default)",
    )
    g.add_argument(
        "--near-dup-shingle-size",
        type=int,
        default=5,
        metavar="N",
        help="tokens per shingle (default 5)",
    )
    g.add_argument(
        "--near-dup-shingle-unit",
        choices=("word", "char"),
        default="word",
        help="shingle over words or characters (default word)",
    )
    g.add_argument(
        "--near-dup-num-perm",
        type=int,
        default=128,
        metavar="N",
        help="MinHash permutations (default 128); LSH bands x rows follow from the threshold",
    )
    g.add_argument(
        "--near-dup-backend",
        choices=("rensa", "numpy"),
        default="rensa",
        help="MinHash kernel (default rensa; numpy gives other hashes, same accuracy)",
    )
    g.add_argument(
        "--quality-filter",
        metavar="MODULE:FUNCTION",
        help="a function text -> None (keep) or a reason string (drop); drops are counted "
        "in the manifest as quality:<reason>",
    )


def build_config(args: argparse.Namespace) -> IngestConfig:
    return IngestConfig(
        source=args.source,
        dest=args.dest,
        format=args.format,
        source_format=args.source_format,
        shard_size=args.shard_size,
        samples_per_shard=args.samples_per_shard,
        seed=args.seed,
        shuffle=not args.no_shuffle,
        validate=args.validate,
        max_pixels=args.max_pixels,
        dedup=args.dedup,
        near_dup_threshold=args.near_dup_threshold,
        near_dup_shingle_size=args.near_dup_shingle_size,
        near_dup_shingle_unit=args.near_dup_shingle_unit,
        near_dup_num_perm=args.near_dup_num_perm,
        near_dup_backend=args.near_dup_backend,
        quality_filter=args.quality_filter,
        max_image_side=args.max_image_side,
        jpeg_quality=args.jpeg_quality,
        keep_original_size=args.keep_original_size,
        normalize_text=not args.no_normalize_text,
        fields=dict(args.field),
        source_options=_source_options(args),
        tokenizer=args.tokenizer,
        seq_len=args.seq_len,
        eos_token=args.eos_token,
        packing=args.packing,
        pack_window=args.pack_window,
        special_tokens=args.special_tokens,
        encrypt=args.encrypt or args.encrypt_key_file is not None,
        encrypt_key_file=args.encrypt_key_file,
        name=args.name,
        ray_address=args.ray_address,
        num_cpus=args.num_cpus,
        overwrite=args.overwrite,
        progress="none" if args.json and args.progress == "auto" else args.progress,
    )


def _option_dest(fmt: str, option: str) -> str:
    return f"source_option__{fmt}__{option}"


def _source_options(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """The per-format options given on the command line, ``{format: {option: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for fmt in FORMATS.values():
        for opt in fmt.options:
            value = getattr(args, _option_dest(fmt.name, opt.name), None)
            if value is not None:
                out.setdefault(fmt.name, {})[opt.name] = value
    return out


def check_bucket(dest: str, *, create: bool) -> None:
    """An object store DEST's bucket must exist before the first shard is written: some
    stores (SeaweedFS, the embedded one) create a bucket on the first PUT, so a typo in the
    bucket name would quietly make a new one. ``create`` makes it on purpose."""
    protocol, _, rest = dest.partition("://")
    if not rest or storage.is_local(dest):
        return
    bucket = rest.split("/", 1)[0]
    url = f"{protocol}://{bucket}"
    fs, path = storage.filesystem(url)
    if storage.call(lambda: fs.exists(path), url=url, what="look up bucket"):
        return
    if _bucket_listable(fs, path, url):
        return
    if not create:
        raise FlashfeedError(
            f"bucket {url} does not exist at {storage.endpoint(url)}: create it first, or "
            "pass --create-bucket to let ingest create it"
        )
    storage.call(lambda: fs.mkdir(path), url=url, what="create bucket")
    print(f"flashfeed ingest: created bucket {url}", file=sys.stderr)


_AUTH_CODES = ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "Forbidden")


def _bucket_listable(fs: Any, path: str, url: str) -> bool:
    """Whether the bucket answers a listing. s3fs's ``exists`` says False for a bucket whose
    every probe failed, refused credentials included; a listing tells a missing bucket
    (False) from refused credentials, which end here as one error that says so."""

    def probe() -> BaseException | None:
        try:
            fs.ls(path, refresh=True)
        except FileNotFoundError:
            raise
        except Exception as exc:
            if is_auth_error(exc):
                return exc  # an answer, not a failure to retry
            raise
        return None

    try:
        refused = storage.call(probe, url=url, what="list bucket")
    except FileNotFoundError:
        return False
    if refused is None:
        return True
    text = f"{refused} {refused.__cause__}"  # s3fs keeps botocore's error code in the cause
    code = next((c for c in _AUTH_CODES if c in text), "access denied")
    raise FlashfeedError(
        f"{storage.endpoint(url)} refused the credentials when ingest looked up bucket {url} "
        f"({code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the storage options)"
    )


def _main(args: argparse.Namespace) -> int:
    from .runner import run

    config = build_config(args)
    check_bucket(config.dest, create=args.create_bucket)
    result = run(config)
    summary = result.to_dict()
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print("ingest committed:\n" + summary_table(summary), file=sys.stderr)
    return 0
