"""What encryption at rest costs: AES-256-GCM seal/open throughput, cache fill time, and
loader img/s for the same images stored plain and sealed (private SeaweedFS server).

  seal / open     GB/s of ``crypto.seal_shard`` / ``crypto.open_shard`` on one shard in RAM
  cache fill      seconds to fill an empty cache with every shard, plain vs sealed
                  (sealed: checksum in transit, then authenticate + decrypt once into 0600)
  loader          img/s of a cold epoch (cache empty: fetch + fill inside the epoch) and a
                  warm epoch (every shard cached: sealed and plain files are identical)

Prints a table and writes JSON. Not a timed test: run it by hand.

    python -m benchmarks.stages.crypto --shards 8 --per-shard 256 --out .bench/crypto.json
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from PIL import Image

from benchmarks.harness.results import write_json
from benchmarks.harness.store import start_store
from flashfeed import Dataset, Manifest, commit_manifest, crypto, storage
from flashfeed.format.manifest import ShardInfo
from flashfeed.shardio import shard_name, tar_shard_bytes


def _jpeg(rng: np.random.Generator, side: int) -> bytes:
    buf = io.BytesIO()
    base = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8).repeat(side // 8, 0).repeat(side // 8, 1)
    noise = rng.integers(0, 24, base.shape, dtype=np.uint8)
    Image.fromarray(base + noise).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_pair(prefix: str, key: crypto.EncryptionKey, args: argparse.Namespace) -> None:
    """The same shards at ``prefix/plain`` and sealed at ``prefix/sealed``."""
    rng = np.random.default_rng(0)
    plain_infos, sealed_infos, plaintext = [], [], {}
    for i in range(args.shards):
        samples = [
            (f"s{i:04d}-{j:05d}", {"jpg": _jpeg(rng, args.side), "cls": str(j % 10).encode()})
            for j in range(args.per_shard)
        ]
        data, index, n = tar_shard_bytes(samples)
        path = shard_name(i, "tar")
        for kind, body in (("plain", data), ("sealed", None)):
            if body is None:
                body, plaintext[path] = crypto.seal_shard(data, path, key)
            storage.write_bytes(f"{prefix}/{kind}/{path}.idx", index.encode())
            storage.write_bytes(f"{prefix}/{kind}/{path}", body)
            info = ShardInfo(path, n, len(body), storage.checksum(body), path + ".idx")
            (plain_infos if kind == "plain" else sealed_infos).append(info)
    schema = {"jpg": "image", "cls": "int"}
    commit_manifest(
        f"{prefix}/plain",
        Manifest(name="bench", shard_format="webdataset", schema=schema, shards=tuple(plain_infos)),
    )
    extra = {"encryption": crypto.encryption_record(key, plaintext)}
    commit_manifest(
        f"{prefix}/sealed",
        Manifest(
            name="bench", shard_format="webdataset", schema=schema, shards=tuple(sealed_infos),
            extra=extra,
        ),
    )  # fmt: skip


def bench_cipher(key: crypto.EncryptionKey, size: int, rounds: int) -> dict[str, float]:
    data = secrets.token_bytes(size)
    path = "shards/000000.tar"
    seal, open_ = [], []
    sealed, plain = crypto.seal_shard(data, path, key)
    record = crypto.encryption_record(key, {path: plain})
    info = ShardInfo(path, 1, len(sealed), storage.checksum(sealed))
    m = Manifest(name="b", shard_format="webdataset", schema={}, shards=(info,),
                 extra={"encryption": record})  # fmt: skip
    for _ in range(rounds):
        t0 = time.perf_counter()
        sealed, _ = crypto.seal_shard(data, path, key)
        seal.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        crypto.open_shard(m, info, sealed, dataset="bench", key=key)
        open_.append(time.perf_counter() - t0)
    # seal_shard also hashes the plaintext (xxh3) for the manifest; report that apart
    t0 = time.perf_counter()
    for _ in range(rounds):
        storage.checksum(data)
    hash_s = (time.perf_counter() - t0) / rounds
    return {
        "seal_gbps": size / statistics.median(seal) / 1e9,
        "open_gbps": size / statistics.median(open_) / 1e9,
        "xxh3_gbps": size / hash_s / 1e9,
    }


def bench_loader(url: str, root: str, args: argparse.Namespace) -> dict[str, float]:
    from flashfeed.cache import ShardCache
    from flashfeed.loader import Loader

    ds = Dataset.open(url)
    out: dict[str, float] = {}
    shutil.rmtree(root, ignore_errors=True)
    with ShardCache(root, capacity="4GiB") as cache:
        t0 = time.perf_counter()
        for i in range(len(ds.shards)):
            cache.get(ds, i)
        out["fill_seconds"] = time.perf_counter() - t0
    shutil.rmtree(root, ignore_errors=True)
    with ShardCache(root, capacity="4GiB") as cache:
        loader = Loader(
            ds, batch_size=args.batch_size, image_size=args.image_size, cache=cache,
            py_workers=args.py_workers, seed=0,
        )  # fmt: skip
        for phase in ("cold", "warm"):  # cold: the epoch fetches and fills; warm: all cached
            t0 = time.perf_counter()
            n = sum(len(b["label"]) for b in loader)
            out[f"{phase}_img_s"] = n / (time.perf_counter() - t0)
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cipher-mib", type=int, default=256, help="buffer for seal/open GB/s")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--per-shard", type=int, default=256)
    p.add_argument("--side", type=int, default=128, help="stored image side in pixels")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--py-workers", type=int, default=1)
    p.add_argument("--loader-rounds", type=int, default=3)
    p.add_argument("--out")
    args = p.parse_args(argv)
    key = crypto.EncryptionKey(secrets.token_bytes(32))
    result: dict[str, Any] = {"args": vars(args)}
    result["cipher"] = bench_cipher(key, args.cipher_mib << 20, args.rounds)
    c = result["cipher"]
    print(f"seal {c['seal_gbps']:.2f} GB/s   open {c['open_gbps']:.2f} GB/s   "
          f"(xxh3 of the plaintext {c['xxh3_gbps']:.1f} GB/s)")  # fmt: skip

    tmp = tempfile.mkdtemp(prefix="ffcrypto-", dir="/tmp")
    bs = start_store(tmp, bucket="bench", export_env=True)
    try:
        os.environ[crypto.ENV_KEY] = key.secret.hex()
        write_pair("s3://bench/ds", key, args)
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "sealed": []}
        for _ in range(args.loader_rounds):  # interleaved rounds: noise hits both alike
            for kind in rows:
                rows[kind].append(
                    bench_loader(f"s3://bench/ds/{kind}", os.path.join(tmp, "cache"), args)
                )
        result["loader"] = {
            kind: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for kind, runs in rows.items()
        }
        result["dataset_mb"] = Dataset.open("s3://bench/ds/plain").manifest.num_bytes / 1e6
    finally:
        bs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lp, ls = result["loader"]["plain"], result["loader"]["sealed"]
    images = args.shards * args.per_shard
    print(f"dataset {result['dataset_mb']:.1f} MB, {args.shards} shards, {images} images, "
          f"medians of {args.loader_rounds} rounds")  # fmt: skip
    print(f"{'':<22}{'plain':>10}{'sealed':>10}{'ratio':>8}")
    for k, label in (("fill_seconds", "cache fill (s)"), ("cold_img_s", "loader cold (img/s)"),
                     ("warm_img_s", "loader warm (img/s)")):  # fmt: skip
        print(f"{label:<22}{lp[k]:>10.2f}{ls[k]:>10.2f}{ls[k] / lp[k]:>8.2f}")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
