"""The training script of the journey test, as a user writes one; torchrun starts it.

A tiny model on pooled images, DDP over gloo, a ``flashfeed.loader.Loader`` reading through
the node's cache (``--tokens``: a ``TokenLoader`` of token rows, the dataset a path or URL or
a mixture file). Every ``--ckpt-every`` steps each rank saves model, optimizer and loader
state with ``torch.save`` (temp file + rename); at start the latest checkpoint that every
rank of its run completed is loaded, under whatever world size this run has. Each rank
appends the ``__key__`` of every sample it receives to ``<keys-dir>/<run>-node<N>-rank<R>.log``
(``step epoch key`` lines), beside the Loader's own ledger.

``--hold-after-step H --hold-node N``: after step H every rank writes ``held-rank<R>``; the
ranks of node N then sleep (to be killed there), the others wait in a barrier that fails
once their peers are gone. That pins the crash to a known step without timing.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from flashfeed.loader import Loader, TokenLoader


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--keys-dir", required=True)
    p.add_argument("--ledger-dir", required=True)
    p.add_argument("--epochs", type=int, required=True, help="train until this many are done")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument(
        "--py-workers", type=int, default=None, help="reader processes (default: the Loader's)"
    )
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--hold-after-step", type=int, default=0)
    p.add_argument("--hold-node", type=int, default=-1)
    p.add_argument("--tokens", action="store_true", help="a TokenLoader over token rows")
    return p.parse_args()


def latest_checkpoint(ckpt_dir: str) -> tuple[int, str] | None:
    """The highest step whose directory holds one file per rank of the run that wrote it."""
    best = None
    for d in glob.glob(os.path.join(ckpt_dir, "step*")):
        m = re.fullmatch(r"step(\d+)-ws(\d+)", os.path.basename(d))
        if not m:
            continue
        step, ws = int(m.group(1)), int(m.group(2))
        done = [f for f in os.listdir(d) if re.fullmatch(r"rank\d+\.pt", f)]
        if len(done) == ws and (best is None or step > best[0]):
            best = (step, d)
    return best


def save(ckpt_dir: str, step: int, rank: int, ws: int, state: dict[str, Any]) -> None:
    d = os.path.join(ckpt_dir, f"step{step:06d}-ws{ws}")
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".rank{rank}.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(d, f"rank{rank}.pt"))


def _inputs(batch: dict[str, Any], classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 3) features and (B,) labels: a pooled image and its label, or a row's first three
    tokens (scaled) and its fourth as the label."""
    if "image" in batch:
        return batch["image"].float().mean(dim=(2, 3)), batch["label"] % classes
    tokens = batch["tokens"]
    return tokens[:, :3].float() / 1000.0, tokens[:, 3] % classes


def main() -> None:
    a = _args()
    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    node = int(os.environ["GROUP_RANK"])
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(3, a.classes))
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    loader: Loader | TokenLoader
    if a.tokens:
        loader = TokenLoader(
            a.dataset, batch_size=a.batch_size, device="cpu", ledger_dir=a.ledger_dir
        )
    else:
        loader = Loader(
            a.dataset,
            batch_size=a.batch_size,
            image_size=a.image_size,
            num_threads=1,
            py_workers=a.py_workers,
            ledger_dir=a.ledger_dir,
        )
    step = 0
    found = latest_checkpoint(a.ckpt_dir)
    if found is not None:
        step, d = found
        files = sorted(glob.glob(os.path.join(d, "rank*.pt")))
        state = torch.load(files[rank % len(files)], weights_only=False)
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
    # as a job would: the first batches' shards download while it sets up the rest
    loader.start_fetching()
    run = f"ws{ws}-from{step:06d}"
    os.makedirs(a.keys_dir, exist_ok=True)
    keys_log = open(
        os.path.join(a.keys_dir, f"{run}-node{node}-rank{rank}.log"), "a", encoding="utf-8"
    )
    print(f"rank {rank}/{ws} node {node}: start at step {step} ({found})", flush=True)
    while True:
        st = loader.state_dict()
        if st["epoch"] + (1 if st["finished"] else 0) >= a.epochs:
            break
        for batch in loader:
            step += 1
            x, y = _inputs(batch, a.classes)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optim.zero_grad()
            loss.backward()
            optim.step()
            epoch = loader.state_dict()["epoch"]
            keys_log.write("".join(f"{step} {epoch} {k}\n" for k in batch["__key__"]))
            keys_log.flush()
            if step % a.ckpt_every == 0:
                state = {
                    "model": model.module.state_dict(),
                    "optim": optim.state_dict(),
                    "loader": loader.state_dict(),
                    "step": step,
                }
                save(a.ckpt_dir, step, rank, ws, state)
            if a.hold_after_step and step == a.hold_after_step:
                open(os.path.join(a.keys_dir, f"held-rank{rank}"), "w").close()
                if node == a.hold_node:
                    while True:
                        time.sleep(60)
                dist.barrier()  # fails when the held node's ranks are killed
                raise SystemExit(f"rank {rank}: the held node was not killed")
    keys_log.close()
    loader.close()
    print(f"rank {rank}/{ws}: done at step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
