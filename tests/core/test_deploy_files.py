"""The files in deploy/ name only commands, flags, environment variables and config keys that
flashfeed has: each ``flashfeed ...`` line is checked against that command's ``--help``, each
``FLASHFEED_*`` variable against the product code, each config against ``NodeConfig``."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from flashfeed.cache.node.tenants import NodeConfig
from flashfeed.cli.app import build_parser

from support import REPO

DEPLOY = REPO / "deploy"
PRODUCT = ("flashfeed", "cache", "ingest", "loader", "monitor")
SOCKET = "/run/flashfeed/node.sock"
#: the commands each file must run (so a file that stops naming them fails here too)
EXPECTED = {
    "systemd/flashfeed-node.service": {("node", "serve")},
    "kubernetes/node-daemonset.yaml": {("node", "serve"), ("node", "status")},
    "kubernetes/warm-job.yaml": {("cache", "warm")},
    "slurm/prolog.sh": {("cache", "warm")},
}
COMMAND = re.compile(r"""(?:\bflashfeed|"\$FLASHFEED")\s+([a-z]+)\s+([a-z]+)(.*)""")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _code_lines(text: str) -> str:
    """The text without comment lines, backslash continuations joined."""
    text = re.sub(r"\\\n", " ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _yaml_commands(node: object, out: list[str]) -> None:
    """Every string list holding ``flashfeed`` (a container's command + args, a probe) as one
    line, and every multi-line string (a script in a ConfigMap)."""
    if isinstance(node, dict):
        if isinstance(node.get("command"), list):
            words = [*node["command"], *node.get("args", [])]
            if "flashfeed" in words:
                out.append(shlex.join(words[words.index("flashfeed") :]))
        for value in node.values():
            _yaml_commands(value, out)
    elif isinstance(node, list):
        for value in node:
            _yaml_commands(value, out)
    elif isinstance(node, str) and "\n" in node:
        out.append(_code_lines(node))


def _yaml_docs(rel: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]


def commands(rel: str) -> list[tuple[str, str, list[str]]]:
    """``(command, action, flags)`` of each flashfeed command line in a deploy file."""
    if rel.endswith(".yaml"):
        texts: list[str] = []
        for doc in _yaml_docs(rel):
            _yaml_commands(doc, texts)
    elif rel.endswith(".service"):  # only what systemd runs, not the unit's prose
        text = _code_lines((DEPLOY / rel).read_text())
        texts = [ln for ln in text.splitlines() if ln.startswith("Exec")]
    else:
        texts = [_code_lines((DEPLOY / rel).read_text())]
    found = []
    for text in texts:
        for m in COMMAND.finditer(text):
            found.append((m.group(1), m.group(2), FLAG.findall(m.group(3))))
    return found


@cache
def help_text(command: str, action: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "flashfeed.cli", command, action, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"flashfeed {command} {action} --help: {proc.stderr[-500:]}"
    return proc.stdout


def flags_missing(command: str, action: str, flags: list[str]) -> list[str]:
    text = help_text(command, action)
    return [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_every_command_and_flag_exists(rel):
    found = commands(rel)
    assert {(c, a) for c, a, _ in found} == EXPECTED[rel], found
    for command, action, flags in found:
        missing = flags_missing(command, action, flags)
        assert not missing, f"{rel}: flashfeed {command} {action} has no {missing}"


def test_a_renamed_flag_is_caught(tmp_path, monkeypatch):
    """The check above fails when a file names a flag the command lacks."""
    copy = tmp_path / "slurm"
    copy.mkdir()
    text = (DEPLOY / "slurm/prolog.sh").read_text()
    assert "--node-rank" in text
    (copy / "prolog.sh").write_text(text.replace("--node-rank", "--node-index"))
    monkeypatch.setattr(sys.modules[__name__], "DEPLOY", tmp_path)
    [(command, action, flags)] = commands("slurm/prolog.sh")
    assert flags_missing(command, action, flags) == ["--node-index"]


def test_every_flashfeed_variable_is_read_by_the_code():
    named = set()
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            named |= set(re.findall(r"\bFLASHFEED_[A-Z_]+\b", path.read_text()))
    assert {"FLASHFEED_NODE_SOCKET", "FLASHFEED_JOB"} <= named
    code = "".join(p.read_text() for top in PRODUCT for p in (REPO / top).rglob("*.py"))
    unread = sorted(v for v in named if not re.search(rf"[\"']{v}[\"']", code))
    assert not unread, f"deploy/ sets variables no code reads: {unread}"


def _configs() -> list[tuple[str, dict]]:
    out = [("node.json", json.loads((DEPLOY / "node.json").read_text()))]
    for doc in _yaml_docs("kubernetes/node-daemonset.yaml"):
        if doc["kind"] == "Secret":
            out.append(("Secret", json.loads(doc["stringData"]["node.json"])))
    return out


def test_the_configs_are_valid_node_configs():
    configs = _configs()
    assert len(configs) == 2
    for source, data in configs:
        config = NodeConfig.parse(data, source=source)
        assert config.socket == SOCKET
        assert config.store.get("secret"), f"{source}: the service's own credentials"


def test_the_systemd_unit_runs_the_service_beside_its_socket():
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str
    unit.read_string((DEPLOY / "systemd/flashfeed-node.service").read_text())
    service = unit["Service"]
    assert service["RuntimeDirectory"] == os.path.basename(os.path.dirname(SOCKET))
    assert service["UMask"] == "0077"
    cache_dir = json.loads((DEPLOY / "node.json").read_text())["cache_dir"]
    assert cache_dir in service["ReadWritePaths"].split()
    args = shlex.split(service["ExecStart"])
    assert args[1:3] == ["node", "serve"]
    build_parser().parse_args(args[1:])  # flags and values the real parser takes


def test_the_daemonset_shares_the_socket_dir_and_hides_the_config():
    docs = {d["kind"]: d for d in _yaml_docs("kubernetes/node-daemonset.yaml")}
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["socket-dir"]["hostPath"]["path"] == os.path.dirname(SOCKET)
    cache_dir = json.loads(docs["Secret"]["stringData"]["node.json"])["cache_dir"]
    assert volumes["cache"]["hostPath"]["path"] == cache_dir
    assert volumes["config"]["secret"]["defaultMode"] == 0o400
    [container] = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cache"] == cache_dir and mounts["socket-dir"] == os.path.dirname(SOCKET)
    assert container["command"][-1] == f"{mounts['config']}/node.json"
    # the warm job's pods reach the same socket directory and set the variable to its socket
    job = {d["kind"]: d for d in _yaml_docs("kubernetes/warm-job.yaml")}["Job"]
    jpod = job["spec"]["template"]["spec"]
    jvolumes = {v["name"]: v for v in jpod["volumes"]}
    assert jvolumes["socket-dir"]["hostPath"]["path"] == os.path.dirname(SOCKET)
    env = {e["name"]: e.get("value") for e in jpod["containers"][0]["env"]}
    assert env["FLASHFEED_NODE_SOCKET"] == SOCKET
    assert "config" not in jvolumes and job["spec"]["completions"] == job["spec"]["parallelism"]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)


def test_the_slurm_prolog_warms_this_nodes_share(tmp_path):
    """Run with stand-ins for Slurm's commands and ``runuser``: the prolog runs one warm as
    the job's user, with this node's rank in scontrol's order, and the real parser takes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "argv"
    _fake(bin_dir, "squeue", 'echo "flashfeed-warm=s3://b/ds-v1 ranks-per-node=8 seed=3"')
    _fake(bin_dir, "scontrol", 'printf "gpu01\\ngpu02\\ngpu03\\n"')
    _fake(bin_dir, "runuser", 'echo "$2" > "$ARGV"; shift 3; exec "$@"')  # -u USER -- CMD
    _fake(bin_dir, "ff", 'printf "%s\\n" "$FLASHFEED_NODE_SOCKET" "$FLASHFEED_JOB" "$@" >> "$ARGV"')
    sock = tmp_path / "node.sock"

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_USER": "root",
        "SLURM_JOB_NODELIST": "gpu[01-03]",
        "SLURMD_NODENAME": "gpu02",  # no SLURM_NODEID: found from the node list
        "FLASHFEED_NODE_SOCKET": str(sock),
        "FLASHFEED": str(bin_dir / "ff"),
        "LOGDIR": str(tmp_path / "log"),
        "ARGV": str(argv_file),
    }
    try:
        proc = subprocess.run(
            ["bash", str(DEPLOY / "slurm/prolog.sh")], env=env, capture_output=True, timeout=60
        )
    finally:
        listener.close()
    assert proc.returncode == 0, proc.stderr
    user, socket_path, job, *argv = argv_file.read_text().splitlines()
    assert (user, socket_path, job) == ("root", str(sock), "slurm-77")
    args = build_parser().parse_args(argv)
    assert (args.dataset, args.node_rank, args.num_nodes) == ("s3://b/ds-v1", 1, 3)
    assert (args.ranks_per_node, args.seed, args.epochs) == (8, 3, 1)


def test_the_warm_job_warms_each_listed_node_with_its_rank(tmp_path):
    """The Job's script, run on the third node of hosts.txt with a stand-in ``flashfeed``:
    node rank 2 of 4, the flags the real parser takes; one pod per listed node."""
    docs = {d["kind"]: d for d in _yaml_docs("kubernetes/warm-job.yaml")}
    data = docs["ConfigMap"]["data"]
    hosts = [h for h in data["hosts.txt"].splitlines() if h.strip()]
    spec = docs["Job"]["spec"]
    assert spec["completions"] == spec["parallelism"] == len(hosts)
    pod = spec["template"]["spec"]
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"][0]["values"] == hosts
    assert pod["affinity"]["podAntiAffinity"]  # one pod per node
    mount = next(
        m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == "warm"
    )
    (tmp_path / "hosts.txt").write_text(data["hosts.txt"])
    script = tmp_path / "warm.sh"
    script.write_text(data["warm.sh"].replace(mount, str(tmp_path)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "flashfeed", 'printf "%s\\n" "$@" > "$ARGV"')
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", NODE_NAME=hosts[2], ARGV=str(tmp_path / "a"))
    proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = build_parser().parse_args((tmp_path / "a").read_text().splitlines())
    assert (args.dataset, args.node_rank, args.num_nodes) == (env["DATASET"], 2, len(hosts))
    assert args.cache_dir is None  # through the service, FLASHFEED_NODE_SOCKET
    env["NODE_NAME"] = "elsewhere"
    proc = subprocess.run(["sh", str(script)], env=env, capture_output=True, timeout=60)
    assert proc.returncode == 1 and b"is not in hosts.txt" in proc.stderr
