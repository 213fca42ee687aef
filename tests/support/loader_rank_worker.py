"""One training rank as its own process, for the multi-process loader tests.

``python loader_rank_worker.py JSON``: builds a Loader or TokenLoader on a shared cache dir,
optionally loads a state, runs epochs (stopping after ``stop`` batches if given), writes its
state and stats to ``out``.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    cfg = json.loads(sys.argv[1])
    from flashfeed.cache import ShardCache
    from flashfeed.loader import Loader, TokenLoader

    cache = ShardCache(cfg["cache_dir"], capacity=cfg.get("capacity", 1 << 30))
    common = dict(
        batch_size=cfg["batch_size"],
        rank=cfg["rank"],
        world_size=cfg["world_size"],
        seed=3,
        cache=cache,
        ledger_dir=cfg["ledger"],
    )
    if cfg["kind"] == "tokens":
        loader = TokenLoader(cfg["url"], **common)
    else:
        loader = Loader(cfg["url"], image_size=16, py_workers=1, **common)
    if cfg.get("state"):
        loader.load_state_dict(cfg["state"])
    seen, stop = 0, cfg.get("stop")
    for epoch in range(loader.epoch, cfg["epochs"]):
        loader.set_epoch(epoch)
        for _ in loader:
            seen += 1
            if seen == stop:
                break
        if seen == stop:
            break
    with open(cfg["out"], "w") as f:
        json.dump({"state": loader.state_dict(), "seen": seen, "stats": loader.stats()}, f)
    cache.close()


if __name__ == "__main__":
    main()
