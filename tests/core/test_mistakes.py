"""A user's mistakes, as a table: each is a real ``python -m flashfeed.cli`` process against the
session's SeaweedFS, and each must end with its exit code, one line on stderr that names what
to fix, no Python traceback, nothing created that was not asked for, and no process left.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flashfeed import storage
from flashfeed.errors import FlashfeedError, StorageError
from flashfeed.ingest.cli import check_bucket
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.s3.retry import FIRST_CONTACT, RetryPolicy

from support.procs import session_members

CLI = [sys.executable, "-m", "flashfeed.cli"]


def run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    out, err = proc.communicate(timeout=120)
    left = session_members(proc.pid)
    assert not left, f"{args}: processes left behind: {left}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@dataclass
class Mistake:
    name: str
    args: list[str]  # {file}, {missing}, {dir}, {s3}, {port} are filled in
    code: int
    words: list[str]
    env: dict[str, str] = field(default_factory=dict)
    not_created: str | None = None  # a path that must still not exist afterwards
    absent: list[str] = field(default_factory=list)  # words the line must not say


MISTAKES = [
    Mistake(
        "verify-missing-cache",
        ["cache", "verify", "{missing}"],
        1,
        ["no cache directory", "{missing}", "cache warm"],
        not_created="{missing}",
    ),
    Mistake(
        "evict-missing-cache",
        ["cache", "evict", "{missing}", "--all"],
        1,
        ["no cache directory", "{missing}"],
        not_created="{missing}",
    ),
    Mistake(
        "status-missing-cache",
        ["cache", "status", "{missing}"],
        1,
        ["no cache directory", "{missing}"],
        not_created="{missing}",
    ),
    Mistake("status-file", ["cache", "status", "{file}"], 1, ["{file}", "is a file"]),
    Mistake("verify-file", ["cache", "verify", "{file}"], 1, ["{file}", "is a file"]),
    Mistake(
        "warm-into-file",
        ["cache", "warm", "{s3}", "--cache-dir", "{file}", "--no-progress"],
        1,
        ["{file}", "is a file", "--cache-dir"],
    ),
    Mistake("store-up-file", ["store", "up", "--dir", "{file}"], 1, ["--dir {file}", "is a file"]),
    Mistake(
        "store-down-file", ["store", "down", "--dir", "{file}"], 1, ["--dir {file}", "is a file"]
    ),
    Mistake("inspect-file", ["inspect", "{file}"], 1, ["{file}", "is a file, not a directory"]),
    Mistake("inspect-dotdot", ["inspect", "s3://flashfeed/a/../b"], 2, ["'..'", "without it"]),
    Mistake(
        "manifest-without-version",
        ["inspect", "{dir}/noversion"],
        1,
        ["no format_version", "not a flashfeed manifest"],
    ),
    Mistake(
        "ingest-missing-bucket",
        ["ingest", "{dir}/corpus", "s3://nosuchbucket-{uid}/ds", "--num-cpus", "1"],
        1,
        ["s3://nosuchbucket-{uid}", "does not exist", "--create-bucket"],
    ),
    Mistake(  # the bucket exists; the server checks signatures and refuses this one
        "ingest-wrong-secret",
        ["ingest", "{dir}/corpus", "s3://flashfeed/wrong-secret-{uid}", "--num-cpus", "1"],
        1,
        ["refused the credentials", "s3://flashfeed", "SignatureDoesNotMatch"],
        env={"AWS_SECRET_ACCESS_KEY": "not-the-secret-{uid}"},
        absent=["does not exist", "--create-bucket", "create it"],
    ),
    Mistake(  # asked to create a missing bucket, with credentials the server refuses
        "ingest-wrong-secret-create",
        ["ingest", "{dir}/corpus", "s3://new-{uid}/ds", "--num-cpus", "1", "--create-bucket"],
        1,
        ["refused the credentials", "s3://new-{uid}", "SignatureDoesNotMatch"],
        env={"AWS_SECRET_ACCESS_KEY": "not-the-secret-{uid}"},
        absent=["does not exist", "created bucket"],
    ),
    Mistake(
        "ingest-unknown-key",
        ["ingest", "{dir}/corpus", "s3://flashfeed/unknown-key-{uid}", "--num-cpus", "1"],
        1,
        ["refused the credentials", "s3://flashfeed", "AWS_ACCESS_KEY_ID"],
        env={"AWS_ACCESS_KEY_ID": "nokey{uid}"},
        absent=["does not exist", "--create-bucket", "create it"],
    ),
    Mistake(
        "closed-port",
        ["inspect", "s3://flashfeed/anything"],
        1,
        ["127.0.0.1:{port}", "nothing listens", "start the server or fix AWS_ENDPOINT_URL"],
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:{port}"},
    ),
]


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory, s3_store) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mistakes")
    (root / "afile").write_text("not a directory\n")
    (root / "noversion").mkdir()
    (root / "noversion" / "manifest.json").write_text(json.dumps({"name": "x", "shards": []}))
    make_imagefolder(root / "corpus", classes=2, per_class=2)
    return {
        "file": str(root / "afile"),
        "dir": str(root),
        "s3": f"s3://flashfeed/mistakes-{uuid.uuid4().hex[:8]}",
        "port": str(_closed_port()),
        "uid": uuid.uuid4().hex[:8],
    }


@pytest.mark.parametrize("m", MISTAKES, ids=[m.name for m in MISTAKES])
def test_a_mistake_is_one_clear_line(m: Mistake, places: dict[str, str], tmp_path: Path):
    fill = {**places, "missing": str(tmp_path / "no-such-cache")}
    args = [a.format(**fill) for a in m.args]
    env = {k: v.format(**fill) for k, v in m.env.items()}
    r = run_cli(args, env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == m.code, (args, r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, f"{args}: want one line, got:\n{r.stderr}"
    for w in m.words:
        assert w.format(**fill) in lines[0], (w, lines[0])
    for w in m.absent:
        assert w not in lines[0], (w, lines[0])
    if m.not_created:
        assert not os.path.exists(m.not_created.format(**fill)), "the mistake created a path"


def test_create_bucket_makes_the_missing_bucket(s3_store):
    bucket = f"made-{uuid.uuid4().hex[:8]}"
    with pytest.raises(FlashfeedError, match="--create-bucket"):
        check_bucket(f"s3://{bucket}/ds", create=False)
    check_bucket(f"s3://{bucket}/ds", create=True)
    fs, path = storage.filesystem(f"s3://{bucket}")
    assert fs.exists(path)
    check_bucket(f"s3://{bucket}/ds", create=False)  # now it exists: no error
    check_bucket("s3://flashfeed/ds", create=False)


def test_refused_connection_is_patient_only_where_the_server_answered_before(s3_store):
    """A fresh endpoint on a closed port gives up after FIRST_CONTACT's few attempts; an
    endpoint that answered earlier in this process keeps the caller's whole budget (a
    server restarting under a running job)."""
    patient = RetryPolicy(attempts=6, base_delay=0.01, max_delay=0.05, deadline=30)
    url = f"s3://flashfeed/refused-{uuid.uuid4().hex[:8]}"
    # an endpoint that answered once (``call`` records every endpoint that answers) and
    # whose server is gone now
    opts = {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}
    storage.call(lambda: None, url=url, what="read", storage_options=opts)
    fs, path = storage.filesystem(url, opts)
    with pytest.raises(StorageError, match="after 6 attempts"):
        storage.call(lambda: fs.cat_file(path), url=url, what="read", retry=patient,
                     storage_options=opts)  # fmt: skip

    fresh = {"endpoint_url": f"http://127.0.0.1:{_closed_port()}"}
    fs, path = storage.filesystem(url, fresh)
    quick = "|".join(f"after {n} attempts" for n in range(1, FIRST_CONTACT.attempts + 1))
    with pytest.raises(StorageError, match=quick):
        storage.call(lambda: fs.cat_file(path), url=url, what="read", retry=patient,
                     storage_options=fresh)  # fmt: skip


@pytest.mark.parametrize(
    "field_name, bad, words",
    [
        ("epoch", -3, ["'epoch'", "-3"]),
        ("seed", "x", ["'seed'", "'x'"]),
        ("shuffle", 1, ["'shuffle'", "True or False"]),
        ("dataset", "0" * 32, ["another dataset", "0" * 32]),
    ],
)
def test_a_bad_loader_state_names_its_field(field_name, bad, words):
    """A hand-edited or foreign loader state fails naming the field (or both datasets)."""
    import numpy as np

    from flashfeed.loader.distributed import DistContext
    from flashfeed.loader.position import Position
    from flashfeed.plan.plan import PlanOptions

    def position() -> Position:
        return Position(np.array([5, 5, 5, 5]), DistContext(), PlanOptions(), dataset_id="ab" * 16)

    state = {**position().state_dict(), field_name: bad}
    with pytest.raises(ValueError) as info:
        position().load_state_dict(state)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
