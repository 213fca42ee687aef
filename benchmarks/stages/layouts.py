"""The local rows of issue 28's targets on any layout: folders of tar shards, however written.

Shards written by other tools (GNU ``tar``, img2dataset, a ``ShardWriter`` of other sizes),
adopted with ``flashfeed index DIR``, are read by the Loader and by DALI's own
``fn.readers.webdataset`` with the same operators (ROI crop decode, resize, flip, normalise
to float CHW) and the same members (``--fields``: the first field is the image, the others
pass through undecoded in both). Per layout, in rounds whose order rotates (batch 64,
``--threads`` DALI threads, image size 224):

  ff-<L>    the Loader on the folder: its first epoch from ``Loader(...)`` to the last
            batch, then whole hot epochs (at least --min-seconds) with CPU ms per image
            (the whole process tree)
  dali-<L>  DALI's reader on the same tars and ``.idx`` files, timed the same way from its
            pipeline's construction

Both first epochs start from a warm page cache (every file of the folder read once,
untimed, just before). ``--gnutar DIR`` first writes such a layout from the benchmark
corpus (benchmarks/harness/corpus.py): each photo with a caption ``.txt`` and a ``.json``,
in shards of ``--shard-mb`` MB written by GNU ``tar``, then indexed. ``--grain DIR`` writes
1,600 high-entropy JPEGs of about 200 KB (grain over a tint, 4:3, about 1 MP) in
webdataset ``ShardWriter`` shards of ``--shard-mb`` MB (three of 100 MB), a layout whose
decode is bound by entropy.

    .bench-venv/bin/python -m benchmarks.stages.layouts --gnutar .bench/layouts/gnutar-100MB
    .bench-venv/bin/python -m benchmarks.stages.layouts --grain .bench/layouts/grain-100MB
    .bench-venv/bin/python -m benchmarks.stages.layouts /data/laion-shards --fields image=jpg
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.benchmath import ratio
from benchmarks.harness.corpus import pick_images
from benchmarks.harness.datasets import gnutar_dataset, grain_jpegs, shardwriter_dataset
from benchmarks.harness.peerloaders import DaliReaderEpochs
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import run_rounds
from benchmarks.harness.timing import BATCH, first_then_hot
from benchmarks.stagerun import ensure_corpus
from benchmarks.stages.targets import DEFAULT_MB, compile_product, warm_page_cache


def parse_field_list(text: str) -> dict[str, str]:
    """``image=jpg,label=cls`` -> ``{"image": "jpg", "label": "cls"}`` (the image first)."""
    out: dict[str, str] = {}
    for part in text.split(","):
        name, eq, ext = part.strip().partition("=")
        if not eq or not name.isidentifier() or not ext.strip() or ";" in ext:
            raise ValueError(
                f"--fields takes name=ext pairs, one extension each, the image first "
                f"(image=jpg,label=cls), got {text!r}"
            )
        out[name] = ext.strip().lstrip(".")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("layouts", nargs="*", type=Path, help="folders of indexed tar shards")
    p.add_argument(
        "--fields", default="image=jpg",
        help="the members both read, name=ext pairs, the image first (default: %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--gnutar", type=Path,
        help="write a GNU tar layout (jpg, txt, json per photo) here first, and measure it",
    )  # fmt: skip
    p.add_argument(
        "--grain", type=Path,
        help="write a webdataset ShardWriter layout of --grain-images high-entropy JPEGs "
             "(about 200 KB each, harness.datasets.grain_jpegs) in shards of --shard-mb MB "
             "here first, and measure it",
    )  # fmt: skip
    p.add_argument("--grain-images", type=int, default=1600, help="--grain's image count")
    p.add_argument("--shard-mb", type=int, default=100,
                   help="--gnutar's and --grain's shard size in MB")  # fmt: skip
    p.add_argument("--corpus", default=".bench/corpus", help="--gnutar's photos")
    p.add_argument("--mb", type=int, default=DEFAULT_MB, help="--gnutar's dataset size, MiB")
    p.add_argument("--rounds", type=int, default=3, help="rounds (default: %(default)s)")
    p.add_argument("--min-seconds", type=float, default=5.0, help="least seconds of hot epochs")
    p.add_argument("--threads", type=int, default=2, help="DALI threads (default: %(default)s)")
    p.add_argument("--out", default=".bench/layouts.json", help="the result JSON")
    args = p.parse_args(argv)
    try:
        fields = parse_field_list(args.fields)
    except ValueError as exc:
        p.error(str(exc))
    for name, v in (("--rounds", args.rounds), ("--threads", args.threads),
                    ("--shard-mb", args.shard_mb), ("--mb", args.mb),
                    ("--grain-images", args.grain_images)):  # fmt: skip
        if v < 1:
            p.error(f"{name} must be >= 1, got {v}")
    layouts: list[Path] = list(args.layouts)
    if args.gnutar is not None:
        ensure_corpus(Path(args.corpus), args.mb << 20, sys.executable)
        gnutar_dataset(pick_images(Path(args.corpus), args.mb << 20), args.gnutar, args.shard_mb)
        layouts.append(args.gnutar)
    if args.grain is not None:
        files = grain_jpegs(args.grain.with_name(args.grain.name + ".jpgs"), args.grain_images)
        shardwriter_dataset(files, args.grain, args.shard_mb * 1_000_000 >> 20)
        layouts.append(args.grain)
    if not layouts:
        p.error("name at least one layout folder, or --gnutar DIR, or --grain DIR")
    for d in layouts:
        if not (d / "manifest.json").exists():
            p.error(f"{d} has no manifest.json: adopt its shards first with `flashfeed index {d}`")
    compile_product()
    from flashfeed.loader import Loader

    exts = list(fields.values())
    sides: dict[str, Any] = {}
    for d in layouts:
        tars = [str(t) for t in sorted(d.rglob("*.tar"))]

        def ff(d: Path = d) -> dict[str, float]:
            warm_page_cache(d)
            return first_then_hot(
                lambda: Loader(str(d), batch_size=BATCH, num_threads=args.threads, fields=fields),
                min_seconds=args.min_seconds,
            )

        def dali(d: Path = d, tars: list[str] = tars) -> dict[str, float]:
            warm_page_cache(d)
            return first_then_hot(
                lambda: DaliReaderEpochs(
                    tars, batch_size=BATCH, threads=args.threads, device="cpu", ext=exts
                ),
                min_seconds=args.min_seconds,
            )

        sides[f"ff-{d.name}"], sides[f"dali-{d.name}"] = ff, dali

    def report(r: int, name: str, got: dict[str, float]) -> None:
        shown = " ".join(f"{k} {v:.2f}" for k, v in got.items())
        print(f"round {r}: {name} {shown}", file=sys.stderr, flush=True)

    results = run_rounds(sides, args.rounds, after_each=report)
    rounds = {f"{name}-{k}": [got[k] for got in runs] for name, runs in results.items()
              for k in runs[0]}  # fmt: skip
    print("| layout | measure | flashfeed | DALI reader | ratio (min-max) | target |")
    print("|---|---|---|---|---|---|")
    rows = (("hot", "hot epoch, img/s", ">= 1.0x"), ("cpu_ms", "CPU ms per image, hot",
            "<= 1.0x"), ("first", "first epoch, img/s", ">= 0.95x"))  # fmt: skip
    for d in layouts:
        for key, label, target in rows:
            a, b = f"ff-{d.name}-{key}", f"dali-{d.name}-{key}"
            r = ratio(rounds[a], rounds[b])  # of the medians; min-max of the rounds' ratios
            print(
                f"| {d.name} | {label} | {statistics.median(rounds[a]):.2f} | "
                f"{statistics.median(rounds[b]):.2f} | {r['ratio']:.2f}x "
                f"({r['min']:.2f}-{r['max']:.2f}) | {target} |"
            )
    write_json(args.out, {"config": {k: str(v) for k, v in vars(args).items()},
                          "layouts": [str(d) for d in layouts], "rounds": rounds})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
