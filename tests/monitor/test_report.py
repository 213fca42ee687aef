"""``flashfeed report LOG``, and the stats-log and status-file schemas a real loader writes
(``flashfeed.telemetry``) read back by the monitor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from flashfeed.cli import main as cli_main
from flashfeed.loader import Loader
from flashfeed.monitor.binning import stall_series
from flashfeed.monitor.report import summarize
from flashfeed.monitor.runlog import read_run, read_stats_log
from flashfeed.monitor.status import read_statuses, status_dir
from flashfeed.telemetry import (
    RECORD_FIELDS,
    RECORD_OPTIONAL,
    STATUS_HEADER,
    RankState,
    parse_record,
    parse_status,
    status_object,
)

from support.loader_helpers import make_image_dataset


@pytest.fixture(scope="module")
def stats_log(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("stats")
    prefix = str(d / "ds")
    make_image_dataset(prefix, [40, 40, 40], size=16)
    log = str(d / "stats.jsonl")
    loader = Loader(prefix, batch_size=8, image_size=16, stats_log=log, py_workers=0)
    for _ in range(2):
        for _ in loader:
            pass
    loader.close()
    return log


def test_the_log_summarizes_to_what_stats_said(stats_log):
    records = read_stats_log(stats_log)
    assert len(records) == 30 and {r["epoch"] for r in records} == {0, 1}
    s = summarize(records)
    assert s["samples"] == 240 and s["samples_per_s"] > 0
    assert 0 < s["decode_fraction"] <= 1
    series = stall_series(records, bin_s=0.05)
    assert series.samples_per_s.sum() * 0.05 == pytest.approx(240)
    assert all((f >= 0).all() and (f <= 1).all() for f in series.fractions.values())


def test_report_command_prints_a_summary(stats_log, capsys):
    assert cli_main(["report", stats_log]) == 0
    out = capsys.readouterr().out
    assert "30 batches, 240 samples" in out and "decode" in out


def test_report_without_matplotlib_says_what_to_install(stats_log, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli_main(["report", stats_log, "--out", str(tmp_path / "s.png")]) == 1
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "s.png").exists()


def test_report_draws_a_png_with_matplotlib(stats_log, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "stalls.png"
    assert cli_main(["report", stats_log, "--out", str(out), "--bin", "0.05"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_bad_log_line_is_named(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"t": 1, "samples": 4}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        read_stats_log(str(log))


def test_every_line_a_loader_wrote_is_exactly_the_schema(stats_log):
    lines = Path(stats_log).read_text().splitlines()
    assert len(lines) == 30
    for line in lines:
        obj = json.loads(line)
        rec = parse_record(obj, strict=True)
        assert rec.to_json() == obj  # the writer spells every key through the schema
        assert [k for k in RECORD_FIELDS if k in obj] == list(obj)  # in the schema's order
        assert set(RECORD_FIELDS) - set(obj) <= set(RECORD_OPTIONAL)


@pytest.mark.parametrize("drop", ["t", "samples", "storage", "waited_on_storage"])
def test_a_record_missing_a_key_fails_the_schema(stats_log, drop):
    obj = json.loads(Path(stats_log).read_text().splitlines()[0])
    del obj[drop]
    with pytest.raises(ValueError, match=f"missing key '{drop}'"):
        parse_record(obj, strict=True)


def test_a_renamed_key_fails_the_schema_and_the_report_names_the_line(stats_log, tmp_path):
    obj = json.loads(Path(stats_log).read_text().splitlines()[0])
    obj["delivered"] = obj.pop("samples")
    with pytest.raises(ValueError, match="missing key 'samples'"):
        parse_record(obj)  # a reader's tolerance stops at the keys every record has
    renamed = dict(json.loads(Path(stats_log).read_text().splitlines()[0]))
    renamed["decode_s"] = renamed.pop("decode")
    with pytest.raises(ValueError, match="missing key 'decode'"):
        parse_record(renamed, strict=True)
    renamed["decode"] = 0.0
    with pytest.raises(ValueError, match="unknown key 'decode_s'"):
        parse_record(renamed, strict=True)
    log = tmp_path / "renamed.jsonl"
    log.write_text(Path(stats_log).read_text() + json.dumps(obj) + "\n")
    with pytest.raises(ValueError, match=r"renamed\.jsonl:31: .*missing key 'samples'"):
        read_stats_log(str(log))
    assert cli_main(["report", str(log)]) == 2


def test_a_run_counts_records_missing_a_key_as_bad_lines(stats_log, tmp_path, capsys):
    good = Path(stats_log).read_text()
    obj = json.loads(good.splitlines()[0])
    del obj["t"]
    (tmp_path / "rank0.jsonl").write_text(good + json.dumps(obj) + "\n")
    run = read_run(str(tmp_path))
    assert [len(v) for v in run.ranks.values()] == [30]
    assert run.problems == ["rank0.jsonl: 1 line(s) are not loader stats records; skipped"]


def test_a_real_loaders_status_file_is_exactly_the_schema(tmp_path, monkeypatch):
    runtime = str(tmp_path / "runtime")
    monkeypatch.setenv("FLASHFEED_RUNTIME_DIR", runtime)
    url = str(tmp_path / "ds")
    make_image_dataset(url, [16, 16], size=16)
    loader = Loader(url, batch_size=4, image_size=16, py_workers=0)
    try:
        it = iter(loader)
        for _ in range(3):
            next(it)
        (name,) = os.listdir(status_dir(runtime))
        path = os.path.join(status_dir(runtime), name)
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        state_keys = [f.name for f in fields(RankState)]
        assert list(obj)[: len(STATUS_HEADER)] == list(STATUS_HEADER)
        assert set(obj) - set(STATUS_HEADER) <= set(state_keys)
        assert set(state_keys) - set(obj) <= {"sources"}  # only a mixture's loader has them
        st = parse_status(obj, path)
        assert (st.pid, st.dataset, st.rank) == (os.getpid(), url, 0)
        assert st.state.samples >= 4 and st.state.batches >= 1
        assert {k: st.wait(k) for k in st.state.wait_s} == obj["wait_s"]
        assert RankState(**{k: obj[k] for k in state_keys if k in obj}).to_json() == {
            k: obj[k] for k in obj if k not in STATUS_HEADER
        }
        assert read_statuses(runtime) == [st]
        del obj["pid"]
        with pytest.raises(KeyError):
            parse_status(obj, path)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f)  # a file of another format: skipped, never an error
        assert read_statuses(runtime) == []
    finally:
        loader.close()


def test_every_state_field_survives_the_status_file():
    state = RankState(
        epoch=3, batch=7, epoch_samples=56, batches=40, samples=320, elapsed_s=2.5,
        wait_s={"storage": 0.25, "decode": 0.5, "h2d": 0.125}, batches_waited_on_storage=2,
        sources={"x": {"samples": 200.0, "storage_s": 0.1}, "y": {"samples": 120.0,
                 "storage_s": 0.15}},
        cache={"used_bytes": 10**9, "capacity": None},
    )  # fmt: skip
    assert all(getattr(state, f.name) != f.default for f in fields(RankState))  # none default
    obj = json.loads(json.dumps(status_object(
        rank=1, pid=42, node="n", dataset="d", updated=5.0, state=state.to_json()
    )))  # fmt: skip
    st = parse_status(obj, "p")
    assert st.state == state
    assert (st.rank, st.pid, st.node, st.dataset, st.updated) == (1, 42, "n", "d", 5.0)


_NO_FRAMEWORKS = """
import json, sys
import flashfeed.monitor, flashfeed.monitor.cli
for name in ("binning", "htmlreport", "report", "runlog", "status", "svgchart", "top"):
    __import__("flashfeed.monitor." + name)
from flashfeed.cli import main
codes = [main(["report", sys.argv[1]]), main(["report", sys.argv[2], "--html", sys.argv[3]]),
         main(["top", "--cache-dir", sys.argv[2], "--iterations", "1"])]
print(json.dumps({"codes": codes, "heavy": sorted(m for m in sys.modules if m == "torch" or
      m.startswith(("torch.", "nvidia.dali", "flashfeed.loader", "ray")))}))
"""


def test_the_monitor_needs_neither_torch_nor_dali_nor_the_loader(stats_log, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.jsonl").write_text(Path(stats_log).read_text())
    env = {**os.environ, "FLASHFEED_RUNTIME_DIR": str(tmp_path / "runtime")}
    out = subprocess.run(
        [sys.executable, "-c", _NO_FRAMEWORKS, stats_log, str(run), str(tmp_path / "r.html")],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0, 0, 1]  # top: no loader runs there
    assert result["heavy"] == []
    assert "30 batches, 240 samples" in out.stdout
