"""A tenant's training process for the node journey: one rank reading a dataset through the
node service (``FLASHFEED_NODE_SOCKET``), logging each delivered key and checkpointing its
position after each one, so that a run killed anywhere resumes exactly on another node.

Run as a tenant (``JourneyTenant``); every action of ``node_tenant`` is available too."""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from typing import Any

from support import node_tenant
from support.node_tenant import Tenant


class JourneyTenant(Tenant):
    """A ``Tenant`` whose processes run this file's actions (and ``node_tenant``'s)."""

    script = os.path.abspath(__file__)


def _train(url: str, work: str, hold_at: str) -> dict[str, Any]:
    """One epoch of ``url`` (rank 0 of 1, no shuffle). Keys go to ``work/keys.log``, the
    position to ``work/state.pkl`` (with how many keys it covers) after each sample; a run
    starts from that state, dropping logged keys it does not cover. After ``hold_at``
    delivered keys (0: never), write ``work/held`` and sleep, to be killed there."""
    from flashfeed.loader import ShardDataset

    keys_path = os.path.join(work, "keys.log")
    state_path = os.path.join(work, "state.pkl")
    ds = ShardDataset(url, shuffle=False, rank=0, world_size=1, seed=0)
    done = 0
    if os.path.exists(state_path):
        with open(state_path, "rb") as f:
            saved = pickle.load(f)
        ds.load_state_dict(saved["state"])
        done = saved["keys"]
    with open(keys_path, "a+") as log:  # keys past the checkpoint were never committed
        log.seek(0)
        kept = log.read().splitlines()[:done]
        log.seek(0)
        log.truncate()
        log.write("".join(k + "\n" for k in kept))
        log.flush()
        resumed_at = done
        for sample in ds:
            log.write(sample["__key__"] + "\n")
            log.flush()
            done += 1
            tmp = state_path + ".tmp"
            with open(tmp, "wb") as f:
                pickle.dump({"state": ds.state_dict(), "keys": done}, f)
            os.replace(tmp, state_path)
            if done == int(hold_at):
                with open(os.path.join(work, "held"), "w") as f:
                    f.write(str(done))
                time.sleep(600)
    return {"resumed_at": resumed_at, "delivered": done}


def main() -> None:
    what, *args = sys.argv[1:]
    if what == "train":
        print(json.dumps(_train(*args)), flush=True)
        return
    sys.argv = [node_tenant.__file__, what, *args]
    node_tenant.main()


if __name__ == "__main__":
    main()
