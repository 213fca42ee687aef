"""One rank of a packed training run over a dataset indexed in place, as its own process.

Each step appends the batch's pieces to ``<out>/<run>-rank<R>.jsonl`` (one line per piece:
key, document id, offset in the document, tokens) and saves the loader's state to
``<ckpt>/step<S>-ws<W>/rank<R>.json`` (temp file + rename). At start it resumes from the
newest step every rank of one run saved: its own state on the same world size, else the
states of every rank. ``--hold-after S``: after step S it writes ``held-rank<R>`` and sleeps
(to be killed by a signal there); otherwise it trains to the end of the epoch.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import time

import numpy as np

from flashfeed.loader import DOC_OUTPUTS, PackedLoader
from flashfeed.runtime.lifeline import set_parent_death_signal


def _latest(ckpt: str) -> tuple[int, list[dict]] | None:
    best = None
    for d in glob.glob(os.path.join(ckpt, "step*-ws*")):
        m = re.fullmatch(r"step(\d+)-ws(\d+)", os.path.basename(d))
        files = sorted(glob.glob(os.path.join(d, "rank*.json")))
        if m and len(files) == int(m.group(2)) and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), [json.load(open(f)) for f in files])
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("dataset", "tokenizer", "cache", "ckpt", "out", "ledger"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=48)
    p.add_argument("--hold-after", type=int, default=0)
    a = p.parse_args()
    set_parent_death_signal()  # dies with the test that started it
    loader = PackedLoader(
        a.dataset, batch_size=a.batch_size, seq_len=a.seq_len, tokenizer=a.tokenizer,
        outputs=DOC_OUTPUTS, drop_last=False, seed=21, rank=a.rank, world_size=a.world_size,
        ranks_per_node=1, cache_dir=a.cache, ledger_dir=a.ledger,
    )  # fmt: skip
    step, found = 0, _latest(a.ckpt)
    if found is not None:
        step, states = found
        same = len(states) == a.world_size
        loader.load_state_dict(states[a.rank] if same else states)
    run = f"ws{a.world_size}-from{step:04d}"
    log = open(os.path.join(a.out, f"{run}-rank{a.rank}.jsonl"), "a", encoding="utf-8")
    for batch in loader:
        step += 1
        toks, docs, offs = (batch[k].numpy() for k in ("tokens", "document_ids",
                                                       "document_offsets"))  # fmt: skip
        for r in range(toks.shape[0]):
            ids = [d for d in dict.fromkeys(docs[r].tolist()) if d >= 0]
            for key, d in zip(batch["__key__"][r], ids, strict=True):
                at = np.flatnonzero(docs[r] == d)
                piece = {"key": key, "doc": d, "off": int(offs[r, at[0]]),
                         "tokens": toks[r, at].tolist()}  # fmt: skip
                log.write(json.dumps(piece) + "\n")
        log.flush()
        d = os.path.join(a.ckpt, f"step{step:04d}-ws{a.world_size}")
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".rank{a.rank}.tmp")
        with open(tmp, "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(tmp, os.path.join(d, f"rank{a.rank}.json"))
        if a.hold_after and step == a.hold_after:
            open(os.path.join(a.out, f"held-rank{a.rank}"), "w").close()
            while True:
                time.sleep(60)
    loader.close()
    log.close()


if __name__ == "__main__":
    main()
