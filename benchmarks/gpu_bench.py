"""The GPU path measured on one GPU, stage by stage (``benchmarks/gpu.sh`` runs it).

Each stage runs in its own process under its own time limit and writes
``<results>/<stage>.json`` as soon as it is done, then ``summary.md`` is rendered again from
every result there: a stage that fails or runs out of time costs only itself.

Stages:
  env           python, torch, CUDA, GPU and DALI versions
  corpus        a synthetic JPEG dataset (numpy + Pillow, else torchvision), written with
                flashfeed's shard writer to local disk
  ceiling       a DALI pipeline with the Loader's operators and "mixed" (nvJPEG) decode, fed
                the same JPEGs from RAM: the decode ceiling
  loader        flashfeed's Loader, device="gpu", on that dataset: img/s against the ceiling,
                and the stall split (storage, decode, h2d)
  tokens        TokenLoader host-to-device GB/s against a pinned cudaMemcpy of the same bytes
  exactly_once  two epochs through the Loader on the GPU, one left early and finished, the
                ledger checked exactly once by __key__
  nvdec         H.264 clips/s through the Loader's NVDEC decode against DALI's decoder fed
                from RAM (``gpu_video.py``); skipped with one line without a GPU

Only the standard library is imported at module level, here and in its siblings
``gpu_setup`` (wheelhouse, import shim), ``gpu_results`` (result files, summary) and
``gpu_corpus`` (the JPEGs): ``install`` and ``shim`` run before numpy or flashfeed import.

    python -m benchmarks.gpu_bench install --wheelhouse DIR --target DIR
    python -m benchmarks.gpu_bench shim --target DIR
    python -m benchmarks.gpu_bench run STAGE --results DIR --work DIR [--quick] [--cpu]
    python -m benchmarks.gpu_bench summary --results DIR
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu_corpus import build_jpeg_corpus, read_jpegs
from benchmarks.gpu_results import STAGES, headline, render_summary, write_result
from benchmarks.gpu_setup import install_wheels, make_shim, merge_nvidia_namespace, missing_wheels
from benchmarks.gpu_video import stage_nvdec

__all__ = ["STAGES", "Run", "main", "run_stage"]

BATCH = 128
IMAGE_SIZE = 224


# -- stages (each in its own process, on the GPU) -----------------------------------------------


@dataclass(frozen=True)
class Run:
    """What every stage gets: its work folder, the results folder, the size, and whether it
    runs on the GPU (``cpu=True`` is a smoke run of the stage code, its figures no GPU's)."""

    work: Path
    results: Path
    quick: bool = False
    cpu: bool = False

    @property
    def seconds(self) -> float:
        """How long a throughput stage keeps measuring."""
        return 1.0 if self.cpu else 6.0 if self.quick else 15.0


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def stage_env(run: Run) -> dict[str, Any]:
    import platform

    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpus": os.cpu_count(),
    }
    try:
        import nvidia.dali as dali

        backend: Any = importlib.import_module("nvidia.dali.backend")

        out["dali"] = dali.__version__
        out["dali_devices"] = int(backend.GetCUDADeviceCount())
    except Exception as exc:  # reported, not fatal: the later stages say what fails
        out["dali"] = f"not importable: {exc!r}"
    smi = shutil.which("nvidia-smi")
    if smi:
        q = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        out["nvidia_smi"] = subprocess.run(q, capture_output=True, text=True).stdout.strip()
    return out


def stage_corpus(run: Run) -> dict[str, Any]:
    t0 = time.perf_counter()
    images = 256 if run.cpu else 1024 if run.quick else 4096
    made = build_jpeg_corpus(run.work / "photos", images=images, per_shard=256)
    (run.work / "photos-keys.json").write_text(json.dumps(made.pop("keys")))
    return {**made, "seconds": time.perf_counter() - t0}


def _run_for(seconds: float, step: Callable[[], int], *, warmup: int = 3) -> tuple[int, float]:
    """Call ``step`` (returns images done) ``warmup`` times, then until ``seconds`` have
    passed; returns (images, seconds) of the timed part, the GPU synchronised at both ends."""
    for _ in range(warmup):
        step()
    _sync()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += step()
    _sync()
    return n, time.perf_counter() - t0


def stage_ceiling(run: Run) -> dict[str, Any]:
    """DALI alone: the Loader's operators (``default_image_pipeline``), mixed decode, fed the
    corpus's JPEGs from RAM, outputs copied to torch as the Loader does."""
    import numpy as np
    import torch
    from nvidia.dali.pipeline import Pipeline

    fn: Any = importlib.import_module("nvidia.dali.fn")
    types: Any = importlib.import_module("nvidia.dali.types")

    from flashfeed.loader.image.convert import DeviceCopier, to_torch
    from flashfeed.loader.image.pipeline import AugmentOptions, default_image_pipeline

    jpegs = [np.frombuffer(j, np.uint8) for j in read_jpegs(run.work / "photos")]
    labels = [np.array([i % 1000], np.int64) for i in range(len(jpegs))]
    pos = [0]

    def source() -> tuple[list[Any], list[Any]]:
        i = pos[0]
        pos[0] = (i + BATCH) % len(jpegs)
        idx = [(i + k) % len(jpegs) for k in range(BATCH)]
        return [jpegs[k] for k in idx], [labels[k] for k in idx]

    threads = min(8, os.cpu_count() or 4)
    pipe = Pipeline(
        batch_size=BATCH,
        num_threads=threads,
        device_id=None if run.cpu else 0,
        prefetch_queue_depth=2,
        exec_dynamic=True,
    )
    with pipe:
        image, label = fn.external_source(
            source=source, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64]
        )
        opts = AugmentOptions(image_size=IMAGE_SIZE, train=True, device=_dev(run))
        out = default_image_pipeline({"image": image, "label": label}, opts)
        pipe.set_outputs(out["image"], out["label"])
    pipe.build()
    device = None if run.cpu else torch.device("cuda", 0)
    copier = None if device is None else DeviceCopier(device)

    def step() -> int:
        outputs = pipe.run()
        if copier is not None:
            copier.begin()
        batch = [to_torch(o, device, copier) for o in outputs]
        if copier is not None:
            copier.end(keep=[outputs])
        return len(batch[0])

    n, secs = _run_for(run.seconds, step)
    if copier is not None:
        copier.flush()
    return {"images": n, "seconds": secs, "img_per_s": n / secs, "batch": BATCH, "threads": threads}


def _dev(run: Run) -> str:
    return "cpu" if run.cpu else "gpu"


def _gpu_loader(run: Run, **kw: Any) -> Any:
    from flashfeed.loader import Loader

    opts: dict[str, Any] = {
        "batch_size": BATCH,
        "image_size": IMAGE_SIZE,
        "device": _dev(run),
        "num_threads": min(8, os.cpu_count() or 4),
        "py_workers": 1 if run.cpu else 4,
        "drop_last": False,
        **kw,
    }
    return Loader(str(run.work / "photos"), **opts)


def stage_loader(run: Run) -> dict[str, Any]:
    loader = _gpu_loader(run)
    t0 = time.perf_counter()
    first = sum(int(b["image"].shape[0]) for b in loader)  # startup: spawning the readers
    _sync()
    first_s = time.perf_counter() - t0
    n, epochs, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < run.seconds:
        n += sum(int(b["image"].shape[0]) for b in loader)
        epochs += 1
    _sync()
    secs = time.perf_counter() - t0
    stats = loader.stats()
    loader.close()
    out: dict[str, Any] = {
        "images": n,
        "epochs": epochs,
        "seconds": secs,
        "img_per_s": n / secs,
        "first_epoch_img_per_s": first / first_s,
        "reader_start": loader.py_start_method,
        "stalls": {k: stats["wait_s"][k] for k in ("storage", "decode", "h2d")},
        "stall_fraction": {k: stats["wait_fraction"][k] for k in ("storage", "decode", "h2d")},
        "stats": stats,
    }
    ceiling = run.results / "ceiling.json"
    if ceiling.exists():
        c = json.loads(ceiling.read_text())
        if c.get("status") == "ok":
            out["vs_ceiling"] = out["img_per_s"] / c["img_per_s"]
    return out


def stage_tokens(run: Run) -> dict[str, Any]:
    """TokenLoader to the GPU against a pinned cudaMemcpy of the same bytes per batch."""
    import numpy as np
    import pyarrow as pa
    import torch

    from flashfeed.format.manifest import Manifest, commit_manifest
    from flashfeed.loader import TokenLoader
    from flashfeed.shardio import shard_name, write_arrow_shard

    seq, shards, batch = 4096, 8, 256
    rows = 1024 if run.cpu else 8192 if run.quick else 32768
    prefix = str(run.work / "tokens")
    infos, per = [], rows // shards
    rng = np.random.default_rng(0)
    for s in range(shards):
        values = rng.integers(0, 50_000, (per, seq), dtype=np.int32)
        col = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), seq)
        keys = [f"t{s * per + j:08d}" for j in range(per)]
        table = pa.table({"__key__": keys, "tokens": col})
        infos.append(write_arrow_shard(prefix, shard_name(s, "arrow"), table))
    manifest = Manifest(
        name="gpu-bench-tokens",
        shard_format="arrow",
        schema={"__key__": "string", "tokens": f"fixed_size_list<int32>[{seq}]"},
        shards=tuple(infos),
    )
    commit_manifest(prefix, manifest, overwrite=True)

    device = "cpu" if run.cpu else "cuda"
    loader = TokenLoader(prefix, batch_size=batch, device=device, dtype="int64")
    for i, _ in enumerate(loader):  # warm: pages in, the pool filled
        if i == 4:
            break
    _sync()
    t0 = time.perf_counter()
    moved = 0
    for b in loader:
        t = b["tokens"]
        assert isinstance(t, torch.Tensor)
        moved += t.numel() * t.element_size()
    _sync()
    loader_s = time.perf_counter() - t0
    stats = loader.stats()
    loader.close()

    # the same pass on the CPU alone: what the gather from the mapped shards allows
    cpu_loader = TokenLoader(prefix, batch_size=batch, device="cpu", dtype="int64")
    t0 = time.perf_counter()
    gathered = sum(b["tokens"].numel() * 8 for b in cpu_loader)  # type: ignore[union-attr]
    gather_gbs = gathered / (time.perf_counter() - t0) / 1e9
    cpu_loader.close()

    nbytes = batch * seq * 8
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=not run.cpu)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    copies = max(1, moved // nbytes)
    for _ in range(5):
        dst.copy_(src, non_blocking=True)
    _sync()
    t0 = time.perf_counter()
    for _ in range(copies):
        dst.copy_(src, non_blocking=True)
    _sync()
    memcpy_s = time.perf_counter() - t0
    loader_gbs = moved / loader_s / 1e9
    memcpy_gbs = copies * nbytes / memcpy_s / 1e9
    return {
        "batch_bytes": nbytes,
        "bytes": moved,
        "loader_seconds": loader_s,
        "loader_gb_per_s": loader_gbs,
        "memcpy_gb_per_s": memcpy_gbs,
        "vs_memcpy": loader_gbs / memcpy_gbs,
        "cpu_gather_gb_per_s": gather_gbs,
        "stalls": {k: stats["wait_s"][k] for k in ("storage", "decode", "h2d")},
    }


def stage_exactly_once(run: Run) -> dict[str, Any]:
    """Two epochs on the GPU with a ledger; epoch 1 is left after two batches and finished by
    a second pass (the readers must serve it without being spawned again)."""
    from flashfeed.loader.telemetry.ledger import check_exactly_once

    keys = json.loads((run.work / "photos-keys.json").read_text())
    ledger = run.work / "ledger"
    shutil.rmtree(ledger, ignore_errors=True)
    loader = _gpu_loader(run, ledger_dir=str(ledger), seed=7)
    for _ in loader:
        pass
    it = iter(loader)
    next(it), next(it)
    it.close()
    for _ in loader:
        pass
    stats = loader.stats()
    builds, abandoned = loader.runner.builds, loader.runner.abandoned
    loader.close()
    checks = check_exactly_once(str(ledger), keys, epochs=[0, 1])
    return {
        "ok": all(c.ok for c in checks.values()),
        "epochs": sorted(checks),
        "checks": {e: str(c) for e, c in checks.items()},
        "builds": builds,
        "abandoned": abandoned,
        "stalls": {k: stats["wait_s"][k] for k in ("storage", "decode", "h2d")},
    }


_STAGE_FNS: dict[str, Callable[..., dict[str, Any]]] = {
    "env": stage_env,
    "corpus": stage_corpus,
    "ceiling": stage_ceiling,
    "loader": stage_loader,
    "tokens": stage_tokens,
    "exactly_once": stage_exactly_once,
    "nvdec": stage_nvdec,
}


def run_stage(stage: str, run: Run) -> dict[str, Any]:
    """Run one stage and write its result file (``status`` ok, or failed with the error)."""
    merge_nvidia_namespace()
    run.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        data = {"status": "ok", **_STAGE_FNS[stage](run), "cpu_smoke_run": run.cpu}
    except Exception as exc:  # written down, so the summary says which stage failed and why
        import traceback

        data = {"status": "failed", "error": repr(exc), "traceback": traceback.format_exc()}
    data["wall_s"] = time.perf_counter() - t0
    write_result(run.results, stage, data)
    render_summary(run.results)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("install")
    p.add_argument("--wheelhouse", required=True)
    p.add_argument("--target", required=True)
    p = sub.add_parser("shim")
    p.add_argument("--target", required=True)
    p = sub.add_parser("run")
    p.add_argument("stage", choices=STAGES)
    p.add_argument("--results", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cpu", action="store_true", help="smoke-run the stage code on the CPU")
    p = sub.add_parser("mark")  # the shell's note for a stage killed by its time limit
    p.add_argument("stage", choices=STAGES)
    p.add_argument("--results", required=True)
    p.add_argument("--status", required=True)
    p = sub.add_parser("summary")
    p.add_argument("--results", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "install":
        wheels = missing_wheels(a.wheelhouse, a.target)
        how = install_wheels(wheels, a.target)
        print(f"installed {len(wheels)} wheel(s) into {a.target} ({how})")
    elif a.cmd == "shim":
        made = make_shim(a.target)
        print(f"flashfeed importable from {made}" if made else "flashfeed already importable")
    elif a.cmd == "run":
        run = Run(Path(a.work), Path(a.results), quick=a.quick, cpu=a.cpu)
        data = run_stage(a.stage, run)
        print(f"{a.stage}: {headline(a.stage, data)}")
        return 0 if data["status"] in ("ok", "skipped") else 1
    elif a.cmd == "mark":
        if not (Path(a.results) / f"{a.stage}.json").exists():
            write_result(a.results, a.stage, {"status": a.status})
        render_summary(a.results)
    else:
        print(render_summary(a.results).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
