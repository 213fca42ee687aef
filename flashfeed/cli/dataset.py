"""``flashfeed inspect|verify|index``: look at, check, and adopt datasets on any fsspec URL."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from tqdm import tqdm

from flashfeed.cli.help import formatter
from flashfeed.dataset import Dataset
from flashfeed.format.indexer import index_dataset
from flashfeed.format.inplaceindex import find_in_place_files, index_in_place
from flashfeed.plan.mixture import is_mixture_file
from flashfeed.summary import format_summary, summarize
from flashfeed.units import format_size
from flashfeed.verify import verify_dataset

__all__ = ["register"]

_URL_HELP = (
    "dataset prefix: s3://bucket/ds, file:///data/ds or a local path; or a mixture file "
    "(.json/.yaml): each of its sources"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="summarize a dataset: shards, samples, bytes, schema, skips",
        description="Read a dataset's manifest and print what it holds: shard and sample "
        "counts, bytes, schema, what ingest skipped and why, and where it came from.",
        epilog="examples:\n  flashfeed inspect s3://flashfeed/photos-v1\n"
        "  flashfeed inspect ./photos-v1 --json | jq .samples",
        formatter_class=formatter(),
    )
    p.add_argument("url", metavar="URL", help=_URL_HELP)
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--shards", action="store_true", help="also list every shard")
    p.set_defaults(func=_inspect)

    p = sub.add_parser(
        "verify",
        help="check every shard's size and checksum against the manifest",
        description="Stream every shard (in parallel) and compare its size and xxh3-128 "
        "checksum with the manifest; tar shards' .idx files must parse and agree. Exits 1 "
        "and names every bad shard if any is missing, truncated, corrupt or replaced.",
        epilog="examples:\n  flashfeed verify s3://flashfeed/photos-v1\n"
        "  flashfeed verify /data/photos-v1 --workers 16 --no-progress",
        formatter_class=formatter(),
    )
    p.add_argument("url", metavar="URL", help=_URL_HELP)
    p.add_argument(
        "--workers", type=int, default=8, help="shards checked at once (default %(default)s)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_verify)

    p = sub.add_parser(
        "index",
        help="adopt *.tar shards written by other tools, or index Parquet/JSONL in place",
        description="Parquet, JSONL, JSONL.gz or JSONL.zst files under URL are indexed in "
        "place: a manifest of their row groups (or blocks of lines) with checksums, footers "
        "and schema, no copy (see docs/INGEST.md, 'Index in place or convert'). "
        "Otherwise: find the uncompressed *.tar shards under URL (written by webdataset's "
        "ShardWriter, Ray's write_webdataset, GNU tar, ...), write a DALI .idx beside each, "
        "and commit a manifest whose schema is inferred from the member extensions. "
        "Compressed shards (.tgz, .tar.gz) cannot be indexed: re-shard them with "
        "`flashfeed ingest SRC DEST --source-format webdataset`.",
        epilog="examples:\n  flashfeed index s3://flashfeed/laion-wds --name laion\n"
        "  flashfeed index ./shards --overwrite     # re-index after adding shards\n"
        "  flashfeed index s3://corpus/web/ --manifest-prefix s3://mine/web-index",
        formatter_class=formatter(),
    )
    p.add_argument(
        "url",
        metavar="URL",
        help="prefix holding *.tar shards, or Parquet/JSONL files to index in place "
        "(searched recursively)",
    )
    p.add_argument(
        "--manifest-prefix",
        default=None,
        metavar="URL",
        help="Parquet/JSONL: write the manifest here instead of beside the files (a "
        "read-only source); the files stay where they are",
    )
    p.add_argument(
        "--block-bytes",
        type=int,
        default=16 << 20,
        help="JSONL: a block's target size in bytes, whole lines (default %(default)s)",
    )
    p.add_argument("--name", default=None, help="dataset name (default: the prefix's last part)")
    p.add_argument("--overwrite", action="store_true", help="replace a committed manifest")
    p.add_argument(
        "--workers", type=int, default=4, help="shards indexed at once (default %(default)s)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_index)


def _inspect(args: argparse.Namespace) -> int:
    if is_mixture_file(args.url):
        from flashfeed.cli.mixture import inspect_mixture

        return inspect_mixture(args)
    ds = Dataset.open(args.url)
    summary = summarize(ds.manifest, url=ds.url, shards=args.shards)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(format_summary(summary))
    return 0


def _verify(args: argparse.Namespace) -> int:
    if is_mixture_file(args.url):
        from flashfeed.cli.mixture import verify_mixture

        return verify_mixture(args, _verify_one)
    return _verify_one(args, Dataset.open(args.url))


def _verify_one(args: argparse.Namespace, ds: Dataset) -> int:
    lock = threading.Lock()
    with tqdm(
        total=ds.manifest.num_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="verify",
        file=sys.stderr,
        disable=args.no_progress,
    ) as bar:

        def done(info: Any) -> None:
            with lock:
                bar.update(info.bytes)

        report = verify_dataset(ds, workers=args.workers, on_done=done)
    if report.ok:
        print(
            f"ok: {report.shards} shards, {format_size(report.bytes)} of {report.url} "
            f"match the manifest (version {report.format_version})"
        )
        return 0
    for p in report.problems:
        print(f"BAD {p.path}: {p.reason}", file=sys.stderr)
    print(
        f"flashfeed verify: {len(report.problems)} of {report.shards} shards of {report.url} "
        f"are bad: {', '.join(p.path for p in report.problems)}",
        file=sys.stderr,
    )
    return 1


def _index(args: argparse.Namespace) -> int:
    if args.manifest_prefix is not None or _in_place(args.url):
        return _index_in_place(args)
    lock = threading.Lock()
    with tqdm(unit="shard", desc="index", file=sys.stderr, disable=args.no_progress) as bar:

        def done(info: Any) -> None:
            with lock:
                bar.update(1)

        report = index_dataset(
            args.url, name=args.name, overwrite=args.overwrite, workers=args.workers, on_shard=done
        )
    m = report.manifest
    for path in report.empty:
        print(f"flashfeed index: skipped empty tar {path}", file=sys.stderr)
    print(
        f"indexed {m.num_shards} shards, {m.num_samples} samples, "
        f"{format_size(m.num_bytes)}; schema {', '.join(sorted(m.schema))}; "
        f"committed {report.manifest_url}"
    )
    return 0


def _in_place(url: str) -> bool:
    """Whether ``url`` holds files to index in place (and no tar shards)."""
    from flashfeed import storage

    if any(u.endswith(".tar") for u in storage.list_files(url)):
        return False
    return bool(find_in_place_files(url))


def _index_in_place(args: argparse.Namespace) -> int:
    lock = threading.Lock()
    with tqdm(unit="file", desc="index", file=sys.stderr, disable=args.no_progress) as bar:

        def done(_: str) -> None:
            with lock:
                bar.update(1)

        report = index_in_place(
            args.url, manifest_prefix=args.manifest_prefix, name=args.name,
            overwrite=args.overwrite, workers=args.workers, block_bytes=args.block_bytes,
            on_file=done,
        )  # fmt: skip
    m = report.manifest
    print(
        f"indexed {report.files} {m.shard_format} files in place: {m.num_shards} units, "
        f"{m.num_samples} rows, {format_size(m.num_bytes)}; columns "
        f"{', '.join(sorted(m.schema))}; committed {report.manifest_url}"
    )
    return 0
