"""One training rank that keeps reading until killed, for the monitoring tests.

``python monitor_worker.py JSON``: a Loader on a shared node cache, epoch after epoch, with
a short pause per batch (a training step), a stats log, and optionally a Prometheus
exporter whose port it writes to ``port_file`` once it listens. Started with
``flashfeed.runtime.lifeline.popen``: it dies with the test.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    cfg = json.loads(sys.argv[1])
    from flashfeed.loader import Loader

    loader = Loader(
        cfg["url"],
        batch_size=cfg.get("batch_size", 4),
        image_size=16,
        py_workers=0,
        rank=cfg["rank"],
        world_size=cfg["world_size"],
        cache_dir=cfg["cache_dir"],
        stats_log=cfg.get("stats_log"),
        prometheus_port=0 if cfg.get("port_file") else None,
        prometheus_addr=cfg.get("prometheus_addr", "127.0.0.1"),
    )
    if cfg.get("port_file"):
        tmp = cfg["port_file"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(loader.recorder.exporter.port))
        os.replace(tmp, cfg["port_file"])
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        for _ in loader:
            time.sleep(cfg.get("step_s", 0.05))
        epoch += 1


if __name__ == "__main__":
    main()
