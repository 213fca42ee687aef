"""What reading a mixture costs against reading one dataset of the same bytes, and how close
each source's share comes to its weight.

  tokens   ``TokenLoader`` GB/s over a 3-source mixture vs one dataset holding the same
           shards (each source a third of them; weights by rows, so an epoch reads each
           source about once)
  images   ``Loader`` img/s (DALI on this machine's device) over a 2-source mixture vs one
           dataset of the same shards
  shares   per source of the token mixture: weight, measured share over the epoch, and the
           worst share error over any window of 10,000 samples (or the whole pass if shorter)

Rounds alternate the two sides, the order rotating every round; medians are reported with
the ratio mixture / single. Local datasets: the mixture's own cost, no storage in the way.
Prints a table and writes JSON.

    python -m benchmarks.stages.mixbench --rows 16384 --images 512 --rounds 3 --out .bench/mix.json
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from flashfeed import Manifest, Mixture, Source, commit_manifest
from flashfeed.manifest import ShardInfo
from flashfeed.shardio import shard_name, write_arrow_shard, write_tar_shard

__all__ = ["images", "main", "shares", "tokens"]

WINDOW = 10_000


def _commit(prefix: str, infos: list[ShardInfo], fmt: str, schema: dict[str, str]) -> None:
    commit_manifest(prefix, Manifest(name=os.path.basename(prefix), shard_format=fmt,
                                     schema=schema, shards=tuple(infos)))  # fmt: skip


def _split(work: str, name: str, shards: list[tuple[str, Any]], parts: int, fmt: str,
           schema: dict[str, str], write: Any) -> tuple[str, list[str]]:  # fmt: skip
    """One dataset of every shard, and ``parts`` datasets of a share of them each (the same
    shard bytes): the single side and the mixture's sources."""
    single = os.path.join(work, f"{name}-single")
    infos = [write(single, path, body) for path, body in shards]
    _commit(single, infos, fmt, schema)
    sources = []
    for k in range(parts):
        prefix = os.path.join(work, f"{name}-part{k}")
        mine = shards[k::parts]
        _commit(prefix, [write(prefix, path, body) for path, body in mine], fmt, schema)
        sources.append(prefix)
    return single, sources


def tokens(work: str, rows: int, rounds: int, seq_len: int = 2048) -> dict[str, Any]:
    from flashfeed.loader import TokenLoader

    per_shard = max(4, rows // 24)
    shards = []
    for i in range(-(-rows // per_shard)):
        n = min(per_shard, rows - i * per_shard)
        values = np.arange(i * per_shard * seq_len, (i * per_shard + n) * seq_len, dtype=np.int32)
        col = pa.FixedSizeListArray.from_arrays(pa.array(values), seq_len)
        shards.append((shard_name(i, "arrow"), pa.table({"tokens": col})))
    schema = {"tokens": f"fixed_size_list<int32>[{seq_len}]"}
    single, parts = _split(work, "tok", shards, 3, "arrow", schema, write_arrow_shard)
    sizes = [sum(t.num_rows for _, t in shards[k::3]) for k in range(3)]
    mix = Mixture(tuple(Source(p, w, f"t{k}") for k, (p, w) in enumerate(zip(parts, sizes,
                                                                             strict=True))),
                  length=rows)  # fmt: skip
    nbytes: dict[str, int] = {}
    keys: list[str] = []
    loaders = {n: TokenLoader(d, batch_size=64, dtype=None, device="cpu", seed=0)
               for n, d in (("single", single), ("mixture", mix))}  # fmt: skip

    def epoch(name: str) -> float:
        t0 = time.perf_counter()
        got, ks = 0, []
        for batch in loaders[name]:
            got += batch["tokens"].numel() * batch["tokens"].element_size()
            ks += batch["__key__"]
        took = time.perf_counter() - t0
        nbytes[name] = got
        if name == "mixture":
            keys[:] = ks
        return took

    for name in loaders:  # a first pass maps the pages in
        epoch(name)
    secs = run_rounds({n: (lambda n=n: epoch(n)) for n in loaders}, rounds)
    for loader in loaders.values():
        loader.close()
    gbs = {n: nbytes[n] / statistics.median(s) / 1e9 for n, s in secs.items()}
    return {
        "rows": rows,
        "seq_len": seq_len,
        "single_gbs": gbs["single"],
        "mixture_gbs": gbs["mixture"],
        "ratio": gbs["mixture"] / gbs["single"],
        "seconds": secs,
        "shares": shares(keys, {s.key: s.weight for s in mix.sources}),
    }


def shares(keys: list[str], weights: dict[str, float]) -> list[dict[str, Any]]:
    """Per source: weight, measured share of ``keys`` and the worst window error."""
    total = sum(weights.values())
    names = np.array([k.split(":", 1)[0] for k in keys])
    window = min(WINDOW, len(keys))
    out = []
    for name, w in weights.items():
        hit = (names == name).astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(hit)])
        counts = cum[window:] - cum[:-window] if window else np.zeros(1)
        out.append({
            "source": name,
            "weight": w / total,
            "share": float(hit.mean()) if len(hit) else 0.0,
            "epoch_error": abs(float(hit.mean()) - w / total) if len(hit) else 0.0,
            "window": window,
            "window_error": float(np.abs(counts / max(window, 1) - w / total).max()),
        })  # fmt: skip
    return out


def _jpeg(rng: np.random.Generator, side: int) -> bytes:
    buf = io.BytesIO()
    base = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8).repeat(side // 8, 0).repeat(side // 8, 1)
    Image.fromarray(base).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def images(work: str, count: int, rounds: int, side: int = 128) -> dict[str, Any]:
    from flashfeed.loader import Loader

    rng = np.random.default_rng(0)
    per_shard = max(8, count // 8)
    shards = []
    for i in range(-(-count // per_shard)):
        n = min(per_shard, count - i * per_shard)
        samples = [(f"s{i:04d}-{j:05d}", {"jpg": _jpeg(rng, side), "cls": str(j % 10).encode()})
                   for j in range(n)]  # fmt: skip
        shards.append((shard_name(i, "tar"), samples))
    schema = {"jpg": "image/jpeg", "cls": "label"}
    single, parts = _split(work, "img", shards, 2, "webdataset", schema, write_tar_shard)
    sizes = [sum(len(s) for _, s in shards[k::2]) for k in range(2)]
    mix = Mixture((Source(parts[0], sizes[0], "a"), Source(parts[1], sizes[1], "b")),
                  length=count)  # fmt: skip
    counted: dict[str, int] = {}
    loaders = {n: Loader(d, batch_size=32, image_size=96, seed=0)
               for n, d in (("single", single), ("mixture", mix))}  # fmt: skip

    def epoch(name: str) -> float:
        t0 = time.perf_counter()
        n = sum(len(b["__key__"]) for b in loaders[name])
        counted[name] = n
        return time.perf_counter() - t0

    try:
        for name in loaders:  # a first pass builds the pipelines
            epoch(name)
        secs = run_rounds({n: (lambda n=n: epoch(n)) for n in loaders}, rounds)
    finally:
        for loader in loaders.values():
            loader.close()
    ips = {n: counted[n] / statistics.median(s) for n, s in secs.items()}
    return {
        "images": count,
        "single_img_s": ips["single"],
        "mixture_img_s": ips["mixture"],
        "ratio": ips["mixture"] / ips["single"],
        "seconds": secs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=16384, help="token rows (--seq-len tokens each)")
    p.add_argument("--images", type=int, default=512, help="images of the image mixture")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--out", default=".bench/mix.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ffmixb-", dir="/tmp")
    try:
        tok = tokens(work, args.rows, args.rounds, args.seq_len)
        img = images(work, args.images, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'':28} {'single':>10} {'mixture':>10} {'ratio':>6}")
    print(f"{'TokenLoader GB/s (3 sources)':28} {tok['single_gbs']:10.3f} "
          f"{tok['mixture_gbs']:10.3f} {tok['ratio']:6.2f}")  # fmt: skip
    print(f"{'Loader img/s (2 sources)':28} {img['single_img_s']:10.1f} "
          f"{img['mixture_img_s']:10.1f} {img['ratio']:6.2f}")  # fmt: skip
    print(f"\n{'source':>7} {'weight':>8} {'share':>8} {'epoch err':>9} {'window err':>10}")
    for s in tok["shares"]:
        print(f"{s['source']:>7} {s['weight']:8.4f} {s['share']:8.4f} {s['epoch_error']:9.5f} "
              f"{s['window_error']:10.5f}")  # fmt: skip
    write_json(args.out, {"tokens": tok, "images": img})
    return 0


if __name__ == "__main__":
    sys.exit(main())
