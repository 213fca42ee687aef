"""What the user sees while ingest runs: a live bar on a terminal, plain periodic lines
otherwise, and a summary table at the end. All of it goes to stderr."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from flashfeed.units import format_size

__all__ = ["Progress", "summary_table"]


class Progress:
    """Shards done/total, samples/s, MB/s and skips; ``mode`` auto|bar|lines|none."""

    def __init__(
        self,
        total_shards: int,
        *,
        mode: str = "auto",
        stream: TextIO | None = None,
        interval: float = 5.0,
    ) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self.total = total_shards
        self.done = self.reused = self.samples = self.bytes = self.skipped = 0
        self.start = time.monotonic()
        self._last_line = self.start
        self.interval = interval
        self._bar: Any = None
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_shards,
                unit="shard",
                file=self.stream,
                dynamic_ncols=True,
                desc="ingest",
            )

    def update(self, *, samples: int, nbytes: int, skipped: int, reused: bool) -> None:
        self.done += 1
        self.reused += int(reused)
        self.samples += samples
        self.bytes += nbytes
        self.skipped += skipped
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = f"{self.samples / elapsed:,.0f} samples/s, {self.bytes / elapsed / 1e6:,.1f} MB/s"
        if self._bar is not None:
            self._bar.set_postfix_str(f"{rate}, {self.skipped} skipped", refresh=False)
            self._bar.update(1)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self._last_line >= self.interval or self.done == self.total:
                self._last_line = now
                print(
                    f"ingest: {self.done}/{self.total} shards ({self.reused} reused), "
                    f"{self.samples:,} samples, {rate}, {self.skipped} skipped",
                    file=self.stream,
                    flush=True,
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def summary_table(summary: dict[str, Any]) -> str:
    """The final table, from ``IngestResult.to_dict()``."""
    t = summary["timings"]
    rows = [
        ("destination", summary["dest"]),
        ("format", f"{summary['format']} (source: {summary['source_format']})"),
        ("shards", f"{summary['shards']} ({summary['shards_reused']} reused from a previous run)"),
        ("samples", f"{summary['samples']:,}"),
        ("bytes read", format_size(summary["bytes_in"])),
        ("bytes written", format_size(summary["bytes_out"])),
        ("wall time", f"{summary['seconds']:.1f} s"),
        (
            "throughput",
            f"{summary['mb_per_s']:.1f} MB/s in, {summary['samples_per_s']:,.0f} samples/s",
        ),
        ("driver time", ", ".join(f"{k} {v:.1f} s" for k, v in summary["phases"].items())),
        ("task time", ", ".join(f"{k} {v:.1f} s" for k, v in t.items()) + " (summed)"),
    ]
    if "documents_with_special_tokens" in summary:
        encoded = "as text" if summary["special_tokens"] == "text" else "as control ids"
        rows.append(
            (
                "special tokens",
                f"{summary['documents_with_special_tokens']:,} documents spell one "
                f"(encoded {encoded})",
            )
        )
    skipped = summary["skipped"]
    rows.append(
        (
            "skipped",
            ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) if skipped else "none",
        )
    )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
