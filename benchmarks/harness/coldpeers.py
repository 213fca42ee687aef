"""The cold peers of the targets stage read from S3: litdata through its boto3 client and
mosaicml-streaming in a process of its own per epoch (``python -m
benchmarks.harness.coldpeers URL LOCAL WORKERS`` prints that epoch's rate), and each peer's
own conversion of the photos."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.harness.child import REPO, module_command
from benchmarks.harness.timing import BATCH, epoch

__all__ = ["convert_peers", "drop_s3_clients", "litdata_s3", "mosaic_s3", "mosaic_s3_child"]


def litdata_s3(url: str, cache: Path, opts: dict[str, Any], workers: int) -> Iterable[Any]:
    """litdata from S3 through its boto3 client: its optional obstore client refuses a
    plain-http endpoint (this SeaweedFS), so it is switched off as if not installed."""
    import litdata.streaming.downloader as downloader
    from litdata import StreamingDataLoader, StreamingDataset

    from benchmarks.stages.peers import DecodeBatch

    downloader._OBSTORE_AVAILABLE = False  # type: ignore[attr-defined]

    ds = StreamingDataset(url, cache_dir=str(cache), shuffle=True, storage_options=opts)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=DecodeBatch())


def mosaic_s3(url: str, local: Path, workers: int) -> Iterable[Any]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    from benchmarks.stages.peers import DecodeBatch

    clean_stale_shared_memory()
    ds = StreamingDataset(remote=url, local=str(local), shuffle=True, batch_size=BATCH)
    drop_s3_clients(ds)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=DecodeBatch())


def drop_s3_clients(ds: Any) -> None:
    """Forget the S3 client each of mosaic's streams made in this process to fetch its
    ``index.json``, so that every DataLoader worker makes its own. A forked worker inherits
    the client with its open keep-alive connection (mosaic resets it only when a stream is
    pickled, as under spawn): two workers then send their GETs down one socket and read each
    other's answers. Seen: a shard landed whole in size with its first 8 MiB (the first
    ranged GET of boto3's download) holding another shard's bytes, then
    ``PIL.UnidentifiedImageError``; and rounds of 35-42 img/s waiting out read timeouts."""
    for stream in ds.streams:
        stream._downloader.clean_up()


def mosaic_s3_child(url: str, local: Path, workers: int) -> float:
    """images/s of one cold epoch of mosaic's StreamingDataset in a process of its own, as a
    training job runs it: a second StreamingDataset in one process shares the first one's
    shared-memory state (its downloaded-shard flags among them), and after a few rounds
    served bytes that were not images yet. Its imports come before the timer, as
    flashfeed's do."""
    proc = subprocess.run(
        module_command("benchmarks.harness.coldpeers", url,
                       str(local.resolve()), str(workers)),
        capture_output=True, text=True, timeout=900, check=False, cwd=REPO,
    )  # fmt: skip
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        # the exception's own line first: the round's one-line report keeps 160 characters
        raise RuntimeError(f"mosaic run failed: {lines[-1] if lines else proc.returncode}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["rate"])


def _mosaic_child(url: str, local: str, workers: str) -> int:
    import streaming  # noqa: F401  (imported before the timer)
    import torch.utils.data  # noqa: F401

    rate, _ = epoch(lambda: mosaic_s3(url, Path(local), int(workers)))
    print(json.dumps({"rate": rate}))
    return 0


def convert_peers(
    files: list[tuple[Path, int]], work: Path, workers: int
) -> tuple[dict[str, Path], dict[str, str]]:
    """Each peer's own conversion of the files (local), or why it is unavailable."""
    from benchmarks.stages.peers import convert_litdata, convert_mosaic

    out, missing = {}, {}
    for name, conv in (
        ("litdata", lambda p: convert_litdata(files, p, workers)),
        ("mosaicml-streaming", lambda p: convert_mosaic(files, p)),
    ):
        path = work / name
        try:
            conv(path)
            out[name] = path
        except Exception as exc:
            missing[name] = f"unavailable: {type(exc).__name__}: {str(exc)[:160]}"
    return out, missing


if __name__ == "__main__":
    sys.exit(_mosaic_child(*sys.argv[1:4]))
