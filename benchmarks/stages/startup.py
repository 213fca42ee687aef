"""Start-up: from ``Loader(...)`` to the first batch, as a restarted job sees it.

A restart is a new process, so each figure is taken in a fresh Python process (median of
``--repeats``), on a local dataset whose files are in the page cache:

  flashfeed        ``Loader(...)`` then ``next(iter(loader))``; DALI already imported
  flashfeed+import the same, with ``import nvidia.dali`` inside the timer (a job that
                   imports the loader module and builds a loader at once pays it here)
  dali-floor       the Loader's own DALI pipeline (same operators, executor, reader process
                   and prefetch) built and run to its first batch on bytes already in RAM:
                   what any DALI pipeline of this shape costs to start, the floor for ours
  flashfeed again  a second loader in the same process (a later epoch or a retry)

Imports are timed apart (torch, flashfeed.loader, nvidia.dali): every job pays them.

    python -m benchmarks.stages.startup --repeats 5 [--dataset DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness.child import REPO
from benchmarks.harness.datasets import noise_jpeg_dataset
from benchmarks.harness.results import write_json
from benchmarks.harness.rounds import rotated

BATCH = 64

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
from flashfeed.loader import Loader
t2 = time.perf_counter()
mode, root, batch = sys.argv[1], sys.argv[2], int(sys.argv[4])
cache = {} if sys.argv[3] == "-" else {"cache_dir": sys.argv[3]}
out = {"import_torch": t1 - t0, "import_flashfeed_loader": t2 - t1}
if mode != "flashfeed+import":
    t = time.perf_counter()
    import nvidia.dali.fn  # noqa: F401
    import nvidia.dali.plugin.pytorch  # noqa: F401
    out["import_dali"] = time.perf_counter() - t
if mode == "dali-floor":
    from benchmarks.harness.peerloaders import dali_decode_ceiling
    from benchmarks.stages.startup import read_jpegs
    jpegs, labels = read_jpegs(root, 256)
    t = time.perf_counter()
    it = iter(dali_decode_ceiling(jpegs, labels, batch_size=batch, threads=2, device="cpu"))
    next(it)
    out["first_batch"] = time.perf_counter() - t
else:
    t = time.perf_counter()
    loader = Loader(root, batch_size=batch, num_threads=2, device="cpu", **cache)
    built = time.perf_counter()
    it = iter(loader)  # kept: dropping it would leave the pass inside the timer
    next(it)
    out["construct"] = built - t
    out["first_batch"] = time.perf_counter() - t
    out["breakdown"] = loader.stats()["startup"]
    it.close()
    loader.close()
    t = time.perf_counter()
    again = Loader(root, batch_size=batch, num_threads=2, device="cpu", **cache)
    it = iter(again)
    next(it)
    out["again"] = time.perf_counter() - t
    it.close()
    again.close()
print(json.dumps(out))
"""


def read_jpegs(root: str, n: int) -> tuple[list[bytes], list[int]]:
    """The first ``n`` samples' JPEG bytes and labels, read into RAM."""
    from flashfeed import Dataset

    ds = Dataset.open(root)
    jpegs: list[bytes] = []
    labels: list[int] = []
    for i in range(len(ds.shards)):
        data = ds.read_shard(i)
        for entry in ds.read_index(i):
            parts = {c.name.rsplit(".", 1)[-1]: c for c in entry.components}
            jpg, cls = parts["jpg"], parts["cls"]
            jpegs.append(data[jpg.offset : jpg.offset + jpg.size])
            labels.append(int(data[cls.offset : cls.offset + cls.size]))
            if len(jpegs) == n:
                return jpegs, labels
    return jpegs, labels


def _warm_page_cache(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            p.read_bytes()


def run_child(mode: str, root: Path | str, *, cache_dir: Path | None = None) -> dict[str, Any]:
    """One start-up in a fresh process: seconds per step (``first_batch``, ``construct``,
    ``again``: a second loader in the same process; the imports), and ``breakdown``: the
    first loader's ``stats()["startup"]``. ``root``: a local dataset or a URL (read through
    an empty node cache in ``cache_dir``)."""
    where = str(root.resolve()) if isinstance(root, Path) else root
    cache = "-" if cache_dir is None else str(Path(cache_dir).resolve())
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, where, cache, str(BATCH)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,  # the child imports benchmarks from here
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} start-up run failed:\n{proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", help="a local webdataset dataset (default: one made here)")
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per mode")
    p.add_argument("--json", help="write the medians here")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    with tempfile.TemporaryDirectory(prefix="ff-startup-") as tmp:
        root = Path(args.dataset) if args.dataset else Path(
            noise_jpeg_dataset(Path(tmp) / "ds", shards=4, per_shard=256, height=300, width=400,
                               quality=90, tinted=True)
        )  # fmt: skip
        _warm_page_cache(root)
        modes = ["flashfeed", "flashfeed+import", "dali-floor"]
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for r in range(args.repeats):  # interleaved, the order rotated each round
            for m in rotated(modes, r):
                runs[m].append(run_child(m, root))
    med: dict[str, Any] = {
        m: {k: statistics.median(x[k] for x in rs) for k, v in rs[0].items() if k != "breakdown"}
        for m, rs in runs.items()
    }
    spread = {m: (min(x["first_batch"] for x in rs), max(x["first_batch"] for x in rs))
              for m, rs in runs.items()}  # fmt: skip
    floor = med["dali-floor"]["first_batch"]
    print(f"start-up, fresh process each, median of {args.repeats} (min-max), local disk, warm")
    print(f"{'':18} {'to first batch s':>22} {'vs dali-floor':>14}")
    for m in modes:
        lo, hi = spread[m]
        v = med[m]["first_batch"]
        print(f"{m:18} {v:8.3f} ({lo:.3f}-{hi:.3f}) {v / floor:13.2f}x")
    print(f"{'flashfeed again':18} {med['flashfeed']['again']:8.3f}")
    print(
        "imports (s): torch {import_torch:.2f}, flashfeed.loader {import_flashfeed_loader:.2f},"
        " nvidia.dali {import_dali:.2f}".format(**med["flashfeed"])
    )
    if args.json:
        write_json(args.json, {"medians": med, "repeats": args.repeats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
