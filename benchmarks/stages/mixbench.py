"""What reading a mixture costs against reading one dataset of the same bytes, and how close
each source's share comes to its weight.

  tokens   ``TokenLoader`` GB/s over a 3-source mixture vs one dataset holding the same
           shards (each source a third of them; weights by rows, so an epoch reads each
           source about once)
  images   ``Loader`` img/s (DALI on this machine's device) over a 2-source mixture vs one
           dataset of the same shards: 2,048 photos by default (``--corpus``: an ImageFolder
           of real ones, else grainy synthetic JPEGs of a photo's size) out at 224 px, enough
           for a steady state; beside the whole epoch's rate, each side's epoch start (to
           its first batch) and its steady rate after it
  shares   per source of the token mixture: weight, measured share over the epoch, and the
           worst share error over any window of 10,000 samples (or the whole pass if shorter)

Rounds alternate the two sides, the order rotating every round; medians are reported with
the ratio mixture / single. Local datasets: the mixture's own cost, no storage in the way.
Prints a table and writes JSON.

    python -m benchmarks.stages.mixbench --rows 16384 --images 2048 --corpus .bench/corpus \\
        --rounds 5 --out .bench/mix.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.harness.corpus import synthetic_images
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from benchmarks.harness.timing import BATCH, tree_cpu_seconds
from flashfeed import Manifest, Mixture, Source, commit_manifest
from flashfeed.format.manifest import ShardInfo
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
    # the single dataset keeps as many shards open as the mixture does by default, so neither
    # re-maps shards the other keeps mapped: the ratio is the mixture's own cost
    mixed = TokenLoader(mix, batch_size=64, dtype=None, device="cpu", seed=0)
    loaders = {
        "single": TokenLoader(
            single, batch_size=64, dtype=None, device="cpu", seed=0, max_open=mixed.max_open
        ),
        "mixture": mixed,
    }

    cpu: dict[str, list[float]] = {"single": [], "mixture": []}  # CPU seconds per epoch

    def epoch(name: str) -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        got, ks = 0, []
        for batch in loaders[name]:
            got += batch["tokens"].numel() * batch["tokens"].element_size()
            ks += batch["__key__"]
        took = time.perf_counter() - t0
        cpu[name].append(time.process_time() - c0)
        nbytes[name] = got
        if name == "mixture":
            keys[:] = ks
        return took

    for name in loaders:  # a first pass maps the pages in
        epoch(name)
    for v in cpu.values():
        v.clear()
    secs = run_rounds({n: (lambda n=n: epoch(n)) for n in loaders}, rounds)
    for loader in loaders.values():
        loader.close()
    gbs = {n: nbytes[n] / statistics.median(s) / 1e9 for n, s in secs.items()}
    # GB per CPU second (this process): less moved by other tenants than GB/s
    cpu_gbs = {n: nbytes[n] / max(statistics.median(v), 1e-9) / 1e9 for n, v in cpu.items()}
    return {
        "rows": rows,
        "seq_len": seq_len,
        "max_open": mixed.max_open,
        "single_gbs": gbs["single"],
        "mixture_gbs": gbs["mixture"],
        "ratio": gbs["mixture"] / gbs["single"],
        "cpu_gbs": cpu_gbs,
        "cpu_ratio": cpu_gbs["mixture"] / cpu_gbs["single"],
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


def _photos(work: str, count: int, corpus: str | None) -> list[tuple[bytes, int]]:
    """``count`` ``(jpeg, label)``: an ImageFolder corpus's photos in file order (cycled when
    it holds fewer), else grainy 300-500 px synthetic JPEGs of about a photo's size."""
    if corpus is None:
        folder = os.path.join(work, "corpus")
        synthetic_images(Path(folder), count, seed=0)
    else:
        folder = corpus
    files = sorted(Path(folder).glob("class_*/*.jpg"))
    if not files:
        raise SystemExit(f"--corpus {corpus}: no class_*/*.jpg in it")
    return [(files[i % len(files)].read_bytes(), int(files[i % len(files)].parent.name[6:]))
            for i in range(count)]  # fmt: skip


def images(
    work: str, count: int, rounds: int, *, corpus: str | None = None, image_size: int = 224
) -> dict[str, Any]:
    """img/s of a whole epoch (the issue's measure), and apart: each epoch's start (``iter``
    to the first batch) and the steady rate after it, both sides in the same rounds."""
    from flashfeed.loader import Loader

    photos = _photos(work, count, corpus)
    per_shard = max(8, count // 16)  # 16 shards: 8 a source
    shards = []
    for i in range(-(-count // per_shard)):
        mine = photos[i * per_shard : (i + 1) * per_shard]
        samples = [(f"s{i:04d}-{j:05d}", {"jpg": jpg, "cls": str(label).encode()})
                   for j, (jpg, label) in enumerate(mine)]  # fmt: skip
        shards.append((shard_name(i, "tar"), samples))
    del photos
    schema = {"jpg": "image/jpeg", "cls": "label"}
    single, parts = _split(work, "img", shards, 2, "webdataset", schema, write_tar_shard)
    sizes = [sum(len(s) for _, s in shards[k::2]) for k in range(2)]
    nbytes = sum(len(v["jpg"]) for _, samples in shards for _, v in samples)
    del shards
    mix = Mixture((Source(parts[0], sizes[0], "a"), Source(parts[1], sizes[1], "b")),
                  length=count)  # fmt: skip
    counted: dict[str, int] = {}
    starts: dict[str, list[float]] = {"single": [], "mixture": []}
    steady: dict[str, list[float]] = {"single": [], "mixture": []}
    cpu: dict[str, list[float]] = {"single": [], "mixture": []}  # CPU ms per image
    batch = max(1, min(BATCH, count // 8))  # a tiny run still has batches to time
    loaders = {n: Loader(d, batch_size=batch, image_size=image_size, seed=0)
               for n, d in (("single", single), ("mixture", mix))}  # fmt: skip

    def epoch(name: str) -> float:
        c0, t0 = tree_cpu_seconds(), time.perf_counter()
        n, first, t1 = 0, 0, t0
        for batch in loaders[name]:
            if not n:
                t1, first = time.perf_counter(), len(batch["__key__"])
            n += len(batch["__key__"])
        took = time.perf_counter() - t0
        cpu[name].append(1000 * (tree_cpu_seconds() - c0) / max(n, 1))
        counted[name] = n
        starts[name].append(t1 - t0)
        if n > first:  # an epoch of one batch has no steady part
            steady[name].append((n - first) / max(took - (t1 - t0), 1e-9))
        return took

    try:
        for name in loaders:  # a first pass builds the pipelines
            epoch(name)
        for v in (*starts.values(), *steady.values(), *cpu.values()):
            v.clear()
        secs = run_rounds({n: (lambda n=n: epoch(n)) for n in loaders}, rounds)
    finally:
        for loader in loaders.values():
            loader.close()
    ips = {n: counted[n] / statistics.median(s) for n, s in secs.items()}
    rate = {n: statistics.median(v) if v else 0.0 for n, v in steady.items()}
    cpu_ms = {n: statistics.median(v) for n, v in cpu.items()}
    return {
        "images": count,
        "mean_jpeg_bytes": nbytes / max(count, 1),
        "image_size": image_size,
        "batch_size": batch,
        "corpus": corpus or "synthetic",
        "single_img_s": ips["single"],
        "mixture_img_s": ips["mixture"],
        "ratio": ips["mixture"] / ips["single"],
        "start_s": {n: statistics.median(v) for n, v in starts.items()},
        "steady_img_s": rate,
        "steady_ratio": rate["mixture"] / rate["single"] if rate["single"] else None,
        # CPU ms per image of this process tree: less moved by other tenants than img/s
        "cpu_ms_per_img": cpu_ms,
        "cpu_ratio": cpu_ms["single"] / cpu_ms["mixture"] if cpu_ms["mixture"] else None,
        "seconds": secs,
    }


def _print(out: dict[str, Any]) -> None:
    print(f"{'':28} {'single':>10} {'mixture':>10} {'ratio':>6}")
    tok, img = out.get("tokens"), out.get("images")
    if tok:
        print(f"{'TokenLoader GB/s (3 sources)':28} {tok['single_gbs']:10.3f} "
              f"{tok['mixture_gbs']:10.3f} {tok['ratio']:6.2f}")  # fmt: skip
        print(f"{'  GB per CPU second':28} {tok['cpu_gbs']['single']:10.3f} "
              f"{tok['cpu_gbs']['mixture']:10.3f} {tok['cpu_ratio']:6.2f}")  # fmt: skip
    if img:
        print(f"{'Loader img/s (2 sources)':28} {img['single_img_s']:10.1f} "
              f"{img['mixture_img_s']:10.1f} {img['ratio']:6.2f}")  # fmt: skip
        print(f"{'  steady, after batch 1':28} {img['steady_img_s']['single']:10.1f} "
              f"{img['steady_img_s']['mixture']:10.1f} "
              f"{img['steady_ratio'] or 0:6.2f}")  # fmt: skip
        print(f"{'  epoch start ms':28} {img['start_s']['single'] * 1e3:10.1f} "
              f"{img['start_s']['mixture'] * 1e3:10.1f}")  # fmt: skip
        print(f"{'  CPU ms/img (ratio inverse)':28} {img['cpu_ms_per_img']['single']:10.2f} "
              f"{img['cpu_ms_per_img']['mixture']:10.2f} {img['cpu_ratio'] or 0:6.2f}")  # fmt: skip
    if tok:
        print(f"\n{'source':>7} {'weight':>8} {'share':>8} {'epoch err':>9} {'window err':>10}")
        for s in tok["shares"]:
            print(f"{s['source']:>7} {s['weight']:8.4f} {s['share']:8.4f} "
                  f"{s['epoch_error']:9.5f} {s['window_error']:10.5f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=16384, help="token rows (--seq-len tokens each)")
    p.add_argument("--images", type=int, default=2048, help="images of the image mixture")
    p.add_argument("--corpus", help="an ImageFolder corpus (class_*/*.jpg) to take them from")
    p.add_argument("--image-size", type=int, default=224, help="the Loader's output side")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--out", default=".bench/mix.json", help="where to write the JSON results")
    p.add_argument("--only", choices=("tokens", "images"), help="run one part alone")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ffmixb-", dir="/tmp")
    out: dict[str, Any] = {}
    try:
        if args.only != "images":
            out["tokens"] = tokens(work, args.rows, args.rounds, args.seq_len)
        if args.only != "tokens":
            out["images"] = images(work, args.images, args.rounds, corpus=args.corpus,
                                   image_size=args.image_size)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print(out)
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
