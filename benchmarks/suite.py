"""The benchmark suite: every benchmark on the realistic photo corpus, one process tree, one
result file, plots and BENCHMARKS.md.

Stages (each a module of ``benchmarks.stages`` run as a child process, each starting and
stopping its own SeaweedFS server through the harness where it needs one; comparisons inside
a stage run in interleaved rounds whose order rotates every round):

  limits   memcpy, read hot/cold (whole files), parallel S3 GET in the cache's shape
  ingest   flashfeed vs Ray Data's writer vs ShardWriter, 1x/4x data, 1 and 2 Ray CPUs;
           the PUT limit in ingest's shape
  cache    cold warm-up vs raw GET, hit path, 1x/4x data, 8 GETs in flight (and the
           profile's ``cache_get_variants``)
  fillcpu  client CPU s/GB of a cache fill vs raw ranged GETs   (fillcpu)
  loader   flashfeed vs plain DALI vs wds+PIL vs wds+DALI vs ImageFolder vs the decode
           ceiling (the Loader's pipeline fed from RAM), tokens   (loaderbench)
  coldstart first epoch from S3 vs local disk and cold peers, the suite's small shards
  targets  issues #18/#28's targets on 100 MiB ShardWriter shards: DALI's own reader, start-up
           (local, S3 empty cache), litdata and mosaic cold from S3 (targets, .bench-venv)
  peers    litdata and mosaicml-streaming beside flashfeed       (peers, .bench-venv)
  stalls   stall fractions over time, cold cache from S3          (stalls)
  plan     open + rank-local plan cost up to 10^6 shards, eviction curve  (planbench)
  mixture  TokenLoader over 3 sources and Loader over 2 vs one dataset of the same shards,
           share error per source beside its weight                (mixbench)
  crypto   sealed vs plain shards                                  (crypto)
  neardup  MinHash kernels (rensa, numpy, datasketch) on planted near-duplicates; the
           near-dup stage's docs/s at 1 and 2 Ray CPUs      (neardup, .bench-venv)
  neardupcurve near-dup accuracy on planted edits around the threshold (exact-Jaccard
           ground truth), the removal curve, docs per CPU second vs datasketch and rensa
                                                            (neardupcurve, .bench-venv)
  tokens   tokenization MB/s at ingest vs datasets.map and tokenizers' encode_batch,
           packing padding, TokenLoader GB/s with document outputs vs memcpy
                                                                   (tokenize_bench)
  docfill  TokenLoader's document outputs: the batch kernel vs the numpy passes vs
           memcpy, and its compile cost (first call, start-up, disk cache)   (docfill)
  tokcold  a token dataset's first epoch from S3 (streaming by the layout, by the walk of
           a pyarrow file, with dictionaries) vs local disk and the download ceiling (tokcold)
  multimodal image-text pairs vs webdataset + PIL, vs the single-image Loader; buckets vs
           square                                                  (multimodal)
  crc      TFRecord CRC check MB/s per crc32c backend             (tfrecordcrc)
  sign     CPU us to sign one ranged GET: our SigV4 vs botocore's S3SigV4Auth (signcost)
  feed     CPU us per image handing batches to DALI: copied or in place, keys as list or column
           (feedcost)
  extsource DALI's native webdataset reader vs the same operators fed through external_source
           from RAM, on the targets stage's shards: the bound on a loader that feeds DALI
           its own order                                           (extsource)
  cluster  the cluster tier on simulated nodes behind a throttled store: a sweep's store
           bytes, a replacement node's warm from peers, a cold first epoch of 2 x 2 nodes
           (peertier); and on paper at 1,000 nodes and a 64-run sweep        (peersim)

A result above the limit that bounds it is a measurement error: the run lists it under
``limit_errors`` (a full run then exits 1) and the tables show the row as refused.

Writes ``benchmarks/results/<date>-<host>[-quick].json``, PNG plots beside it, and
BENCHMARKS.md (full runs; ``--quick`` writes its Markdown next to its JSON).

    python -m benchmarks.suite --quick          # smoke check, a few minutes
    python -m benchmarks.suite                  # the published numbers (~30 minutes)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.harness.results import RESULTS, result_stem, write_run
from benchmarks.page import benchmarks_page
from benchmarks.profiles import FULL, QUICK, Profile
from benchmarks.stagerun import Runner, ensure_corpus, peer_status, shards_for, subset_corpus
from flashfeed.units import parse_size

__all__ = ["FULL", "QUICK", "Profile", "main"]

STAGES = (
    "limits",
    "ingest",
    "cache",
    "fillcpu",
    "loader",
    "coldstart",
    "targets",
    "peers",
    "stalls",
    "plan",
    "mixture",
    "crypto",
    "neardup",
    "neardupcurve",
    "tokens",
    "docfill",
    "tokcold",
    "multimodal",
    "crc",
    "sign",
    "feed",
    "extsource",
    "cluster",
)


def variant(
    label: str, factor: int, workers: int, data: dict[str, Any] | None, default_workers: bool = True
) -> dict[str, Any]:
    v: dict[str, Any] = {
        "label": label,
        "factor": factor,
        "workers": workers,
        "default_workers": default_workers,
    }
    if data is not None:
        v["data"] = data
    return v


def run_stages(
    r: Runner, p: Profile, corpus: Path, stages: tuple[str, ...], device: str, threads: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mid = p.scales[min(1, len(p.scales) - 1)]
    rounds = ["--rounds", str(p.rounds)]

    def extra(*workers: int) -> list[tuple[int, int]]:
        return [(mid, w) for w in workers] if p.worker_variants else []

    if "limits" in stages:
        data = r.run(
            "limits",
            "limits",
            [
                "--files",
                str(corpus),
                "--read-mb",
                str(p.read_mb),
                "--s3-objects",
                str(p.s3_objects),
                "--s3-object-mb",  # the cache stage's shards: the objects the cache fetches
                str(max(1, parse_size(p.cache_shard) >> 20)),
                "--rounds",
                str(max(2, p.rounds)),
            ],
        )
        out["limits"] = {"data": data} if data else {}
    if "ingest" in stages:
        runs = []
        for f, cpus in [(f, 2) for f in p.scales] + extra(1):
            mb = p.ingest_base_mb * f
            sub = subset_corpus(corpus, r.work / f"corpus-{mb}MB", mb << 20)
            name = f"ingest-{f}x-{cpus}cpu"
            data = r.run(
                name,
                "ingestbench",
                [str(sub), *rounds, "--shard-size", p.ingest_shard, "--num-cpus", str(cpus)],
            )
            runs.append(variant(f"{f}x ({mb} MB), {cpus} Ray CPUs", f, cpus, data, cpus == 2))
        out["ingest"] = runs
    if "cache" in stages:
        runs = []
        for f, conc in [(f, 8) for f in p.scales] + extra(*p.cache_get_variants):
            n = p.cache_base_shards * f
            data = r.run(
                f"cache-{f}x-c{conc}",
                "cachebench",
                [
                    "--shards",
                    str(n),
                    "--shard-size",
                    p.cache_shard,
                    "--concurrency",
                    str(conc),
                    "--rounds",
                    str(max(2, p.rounds)),
                ],
            )
            label = f"{f}x ({n} x {p.cache_shard}), {conc} GETs in flight"
            runs.append(variant(label, f, conc, data, conc == 8))
        out["cache"] = runs
    if "fillcpu" in stages:
        data = r.run(
            "fillcpu",
            "fillcpu",
            ["--shards", str(p.fillcpu_shards), "--shard-size", p.fillcpu_shard,
             "--rounds", str(max(3, p.rounds))],
            out_flag="--json",
        )  # fmt: skip
        out["fillcpu"] = {"data": data} if data else {}
    if "loader" in stages:
        runs = []
        lmid = p.loader_scales[-1]
        lextra = [(lmid, 1)] if p.worker_variants and len(p.loader_scales) > 1 else []
        for f, t in [(f, threads) for f in p.loader_scales] + lextra:
            n = p.loader_base_images * f
            data = r.run(
                f"loader-{f}x-t{t}",
                "loaderbench",
                [
                    "--images",
                    str(n),
                    "--shards",
                    str(shards_for(n)),
                    *rounds,
                    "--min-seconds",
                    str(p.min_seconds),
                    "--threads",
                    str(t),
                    "--device",
                    device,
                    "--token-rows",
                    str(p.token_rows),
                    "--corpus",
                    str(corpus),
                    "--work",
                    str(r.work / f"loader-{f}x"),
                ],
            )
            runs.append(variant(f"{f}x ({n} images), {t} threads", f, t, data, t == threads))
        out["loader"] = runs
    if "coldstart" in stages:
        n = p.coldstart_images
        data = r.run(
            "coldstart",
            "coldstart",
            [
                "--images",
                str(n),
                "--shards",
                str(shards_for(n)),
                "--shards-2x",
                str(4 * shards_for(n)),
                *rounds,
                "--corpus",
                str(corpus),
                "--work",
                str(r.work / "coldstart"),
            ],
        )
        out["coldstart"] = {"data": data} if data else {}
    if "targets" in stages:
        data = r.run(
            "targets",
            "targets",
            [
                "--corpus",
                str(corpus),
                "--mb",
                str(p.targets_mb),
                "--shard-mib",
                p.targets_shard_mib,
                "--rounds",
                str(p.targets_rounds),
                "--min-seconds",
                str(p.min_seconds),
                "--threads",
                str(threads),
                "--work",
                str(r.work / "targets"),
            ],
            python=r.peer_py,
        )
        out["targets"] = {"data": data} if data else {}
    if "peers" in stages:
        data = r.run(
            "peers",
            "peers",
            [
                "--corpus",
                str(corpus),
                "--images",
                str(p.peer_images),
                "--shards",
                str(shards_for(p.peer_images)),
                *rounds,
                "--min-seconds",
                str(p.min_seconds),
                "--threads",
                str(threads),
                "--work",
                str(r.work / "peers"),
            ],
            python=r.peer_py,
        )
        out["peers"] = {"data": data} if data else {}
    if "stalls" in stages:
        data = r.run(
            "stalls",
            "stalls",
            [
                "--corpus",
                str(corpus),
                "--images",
                str(p.stall_images),
                "--log",
                str(r.work / "stalls.jsonl"),
            ],
        )
        out["stalls"] = {"data": data} if data else {}
    if "plan" in stages:
        data = r.run("plan", "planbench", ["--shards", "10000,100000,1000000"])
        out["plan"] = {"data": data} if data else {}
    if "mixture" in stages:
        # enough photos for a steady state (cycled where the corpus holds fewer)
        images = str(4 * p.loader_base_images)
        args = ["--rows", str(p.token_rows), "--images", images, "--corpus", str(corpus)]
        data = r.run("mixture", "mixbench", [*args, "--rounds", str(max(2, p.rounds))])
        out["mixture"] = {"data": data} if data else {}
    if "crypto" in stages:
        data = r.run("crypto", "crypto", list(p.crypto_args))
        out["crypto"] = {"data": data} if data else {}
    if "neardup" in stages:
        data = r.run("neardup", "neardup", list(p.neardup_args), python=r.peer_py)
        out["neardup"] = {"data": data} if data else {}
    if "neardupcurve" in stages:  # datasketch, a peer, lives in the peers' environment
        data = r.run("neardupcurve", "neardupcurve", list(p.neardupcurve_args), python=r.peer_py)
        out["neardupcurve"] = {"data": data} if data else {}
    if "tokens" in stages:  # datasets, a peer, lives in the peers' environment
        data = r.run("tokens", "tokenize_bench", list(p.tokens_args), python=r.peer_py)
        out["tokens"] = {"data": data} if data else {}
    if "cluster" in stages:
        size = ["--shards", "12"] if p.rounds < 3 else []
        data = r.run("cluster", "peertier", size)
        paper = ["--job-shards", "20000", "--sweep-shards", "4000"] if p.rounds < 3 else []
        sim = r.run("cluster-paper", "peersim", paper)
        out["cluster"] = {"data": data, "paper": sim} if data else {}
    if "tokcold" in stages:
        size = ["--shards", "4", "--shard-mib", "8"] if p.rounds < 3 else ["--shards", "8"]
        data = r.run("tokcold", "tokcold", [*size, "--rounds", str(max(2, p.rounds))])
        out["tokcold"] = {"data": data} if data else {}
    if "multimodal" in stages:
        extra = ["--corpus", str(corpus), "--device", device, "--threads", str(threads)]
        data = r.run("multimodal", "multimodal", [*p.multimodal_args, *extra])
        out["multimodal"] = {"data": data} if data else {}
    if "docfill" in stages:
        size = ["--batches", "5", "--compile-rounds", "1"] if p.rounds < 3 else []
        data = r.run("docfill", "docfill", [*size, "--rounds", str(max(3, p.rounds))])
        out["docfill"] = {"data": data} if data else {}
    if "crc" in stages:
        size = "8MiB" if p.rounds < 3 else "64MiB"
        data = r.run("crc", "tfrecordcrc", ["--size", size, "--rounds", str(max(3, p.rounds))])
        out["crc"] = {"data": data} if data else {}
    if "sign" in stages:
        requests = "2000" if p.rounds < 3 else "20000"
        data = r.run(
            "sign", "signcost", ["--requests", requests, "--rounds", str(max(3, p.rounds))],
            out_flag="--json",
        )  # fmt: skip
        out["sign"] = {"data": data} if data else {}
    if "feed" in stages:
        batches = "100" if p.rounds < 3 else "400"
        data = r.run("feed", "feedcost", ["--batches", batches, "--rounds", str(max(3, p.rounds))])
        out["feed"] = {"data": data} if data else {}
    if "extsource" in stages:  # the targets stage's first layout: tars with their .idx
        size = p.targets_shard_mib.split(",")[0].strip()
        tars = r.work / "targets" / f"wds-{size}MiB"
        data = None
        if any(tars.glob("*.tar.idx")):
            data = r.run("extsource", "extsource", ["--tars", str(tars), "--rounds",
                                                    str(max(3, p.rounds))])  # fmt: skip
        else:
            print(f"extsource: no tars at {tars} (the targets stage writes them)", flush=True)
        out["extsource"] = {"data": data} if data else {}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke-check sizes (a few minutes; numbers not published)",
    )
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    ap.add_argument("--corpus", default=".bench/corpus")
    ap.add_argument("--work", default=".bench/suite")
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="loader workers/threads")
    ap.add_argument(
        "--peer-python",
        default=".bench-venv/bin/python",
        help="interpreter with the peers installed (make bench-venv)",
    )
    ap.add_argument(
        "--markdown", default="BENCHMARKS.md", help="page to write after a full run ('' for none)"
    )
    args = ap.parse_args(argv)
    p = QUICK if args.quick else FULL
    stages = tuple(s for s in args.stages.split(",") if s)
    if unknown := set(stages) - set(STAGES):
        raise SystemExit(f"unknown stages {sorted(unknown)}; known: {', '.join(STAGES)}")
    peer_py = args.peer_python if os.access(args.peer_python, os.X_OK) else sys.executable
    work = Path(args.work).resolve() / p.name  # absolute: stages run from the repository root
    work.mkdir(parents=True, exist_ok=True)
    corpus = Path(args.corpus).resolve()
    need = max(
        p.ingest_base_mb * max(p.scales) << 20,
        int(p.loader_base_images * max(p.loader_scales) * 110e3),
        p.targets_mb << 20,
    )
    ensure_corpus(corpus, need, sys.executable)
    started = dt.datetime.now(dt.timezone.utc)
    result: dict[str, Any] = {
        "schema": 1,
        "date": started.isoformat(timespec="seconds"),
        "profile": p.name,
        "device": args.device,
        "machine": report.machine_info(),
        "corpus": str(corpus),
    }
    t0 = time.perf_counter()
    runner = Runner(work, p, sys.executable, peer_py)
    result["stages"] = run_stages(runner, p, corpus, stages, args.device, args.threads)
    result["duration_s"] = time.perf_counter() - t0
    result["stage_seconds"] = runner.seconds
    result["errors"] = runner.errors
    result["loadavg_end"] = list(os.getloadavg())
    result["versions"], result["unavailable"] = peer_status(result["stages"], peer_py)
    result["limit_errors"] = report.limit_errors(result)
    for why in result["limit_errors"]:  # a result above its limit: a measurement error
        print(f"[suite] LIMIT ERROR: {why}", file=sys.stderr)
    stem = result_stem(started, p.name, args.device)
    written = write_run(result, args.results, stem)
    json_path, pngs = written.json, written.pngs
    if args.markdown and p.name == "full" and args.device == "cpu":
        base = Path(args.markdown).resolve().parent
        rel = [os.path.relpath(x.resolve(), base) for x in pngs]
        rel_json = os.path.relpath(json_path.resolve(), base)
        plan = ((result.get("stages") or {}).get("plan") or {}).get("data")
        page = benchmarks_page(result, rel_json, rel, (plan, rel_json, None) if plan else None)
        Path(args.markdown).write_text(page)
    print(written.table)
    print(f"wrote {json_path}, {', '.join(str(x) for x in pngs)}", file=sys.stderr)
    # a full run with a result above its limit fails; the quick profile's windows are too
    # short to bound anything, so there it is only listed
    over = bool(result["limit_errors"]) and p.name == "full"
    return 1 if runner.errors or over else 0


if __name__ == "__main__":
    sys.exit(main())
