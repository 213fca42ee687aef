"""``flashfeed report RUN_DIR --html``: a run's page, rendered by a real browser, and the
partial runs it must survive."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from flashfeed.cli import main as cli_main
from flashfeed.telemetry import WAIT_KINDS, parse_record

from support.monitor_helpers import running_ranks, wait_for

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """The stats logs of two real ranks, killed while they were reading."""
    tmp = tmp_path_factory.mktemp("run")
    with running_ranks(tmp) as run:
        logs = [Path(run.run_dir, f"rank{r}.jsonl") for r in (0, 1)]
        wait_for("40 batches per rank", lambda: all(_lines(p) >= 40 for p in logs))
    return Path(run.run_dir)


@pytest.fixture
def copy(run_dir, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    for p in out.glob("*.jsonl"):  # a kill may cut the last line: start from whole ones
        data = p.read_bytes()
        p.write_bytes(data[: data.rfind(b"\n") + 1])
    return out


def _lost_hours(run: Path) -> float:
    total = 0.0
    for p in run.glob("*.jsonl"):
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            total += sum(rec[k] for k in WAIT_KINDS)
    return total / 3600


def test_the_page_is_self_contained_and_gives_the_time_lost(copy, tmp_path, capsys):
    out = tmp_path / "run.html"
    assert cli_main(["report", str(copy), "--html", str(out), "--gpu-hour-price", "2.5"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    page = out.read_text()
    assert not re.search(r"""(src|href)\s*=|@import|url\(""", page)  # nothing to fetch
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)
    for rank in (0, 1):
        assert f"rank {rank}" in page
    shown = float(re.search(r"<b>([\d.]+) GPU-hours</b>", page).group(1))
    assert shown == pytest.approx(_lost_hours(copy), abs=1e-4)
    money = re.search(r"per GPU-hour = <b>([\d.,]+)</b>", page).group(1)
    assert float(money) == pytest.approx(2.5 * _lost_hours(copy), abs=0.01)
    assert "Slowest ranks" in page and page.count("<svg") == 3  # throughput + one per rank
    fills = [
        json.loads(line).get("cache_fills", 0)
        for p in copy.glob("*.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert max(fills) > 0  # the ranks fetched shards into the node cache...
    assert '<rect class="bar"' in page  # ...drawn as bars against the storage stalls


def test_the_ranks_logs_with_cache_fills_are_exactly_the_schema(copy):
    objs = [json.loads(line) for p in copy.glob("*.jsonl") for line in p.read_text().splitlines()]
    assert len(objs) >= 80
    for obj in objs:
        assert parse_record(obj, strict=True).to_json() == obj
    with_fills = [o for o in objs if "cache_fills" in o]
    assert with_fills and all("cache_fetched_bytes" in o for o in with_fills)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_chromium_renders_the_page(copy, tmp_path):
    from PIL import Image

    out, png = tmp_path / "run.html", tmp_path / "run.png"
    assert cli_main(["report", str(copy), "--html", str(out)]) == 0
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=900,1800", f"--screenshot={png}", out.as_uri()],
        check=True, capture_output=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    pixels = np.asarray(Image.open(png).convert("RGB"), dtype=float)
    assert pixels.shape[:2] == (1800, 900)
    assert pixels.std() > 20  # not a blank page
    colored = (pixels.max(axis=2) - pixels.min(axis=2)) > 60
    assert colored.mean() > 0.005  # the charts drew (grey text alone has no colour)


def test_a_log_cut_mid_line_is_noted_and_the_rest_counted(copy, tmp_path, capsys):
    log = copy / "rank1.jsonl"
    data = log.read_bytes()
    whole = data.count(b"\n")
    log.write_bytes(data + data[: data.find(b"\n") // 2])  # a record cut in its middle
    out = tmp_path / "run.html"
    assert cli_main(["report", str(copy), "--html", str(out)]) == 0
    captured = capsys.readouterr()
    assert "rank1.jsonl: the last line is cut off mid-record" in captured.err
    assert f"rank 1: {whole} batches" in captured.out
    assert "cut off mid-record" in out.read_text()


def test_a_rank_that_never_wrote_is_noted(copy, tmp_path, capsys):
    (copy / "rank2.jsonl").write_bytes(b"")
    out = tmp_path / "run.html"
    assert cli_main(["report", str(copy), "--html", str(out)]) == 0
    err = capsys.readouterr().err
    assert "rank2.jsonl: empty: this rank never recorded a batch" in err
    page = out.read_text()
    assert "rank2.jsonl: empty" in page and "rank 0" in page and "rank 1" in page


def test_an_empty_run_directory_is_one_clear_error(tmp_path, capsys):
    out = tmp_path / "run.html"
    assert cli_main(["report", str(tmp_path), "--html", str(out)]) == 1
    err = capsys.readouterr().err
    assert "holds no stats logs (*.jsonl)" in err and "stats_log=" in err
    assert not out.exists()


def test_a_run_of_only_empty_logs_says_so(tmp_path, capsys):
    (tmp_path / "rank0.jsonl").write_bytes(b"")
    assert cli_main(["report", str(tmp_path), "--html", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err
    assert "none of its 1 stats log(s) holds a batch yet" in err and "never recorded" in err


def test_html_needs_a_run_directory(copy, tmp_path, capsys):
    assert cli_main(["report", str(copy / "rank0.jsonl"), "--html", str(tmp_path / "r")]) == 2
    assert "is not a directory" in capsys.readouterr().err
