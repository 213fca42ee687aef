"""A cluster of simulated nodes on this machine, for the multi-node journey test.

Node ``i`` is what a training node is to flashfeed, faked with loopback addresses and Linux
namespaces (root only):

- its own address ``127.0.0.(i+2)`` (not .1: Ray replaces 127.0.0.1 by the machine's
  external address) and hostname ``ffnode<i>`` (a UTS namespace);
- its own node-local cache: a private tmpfs mounted, in the node's mount namespace, at one
  path every node shares (``cache_dir``), as every real node has its NVMe at the same path;
- its own S3 gateway: a counting proxy on ``127.0.0.(i+2):P`` in front of the session's
  SeaweedFS. The S3 endpoint is a name, ``http://s3.ffcluster.test:P``, that the node's
  private ``/etc/hosts`` resolves to the node's own address, so every process of the node
  reaches S3 through the node's proxy, even with an endpoint handed down by a Ray driver
  on another node. The proxy tells, per node, which objects (and byte ranges) were read.

Every process of a node runs inside the node's namespaces (``nsenter``), in its own process
group, with the node's environment (``AWS_ENDPOINT_URL``, ``FLASHFEED_CACHE_DIR``) and a
marker variable naming the cluster: ``survivors()`` finds any process of the cluster still
alive, wherever it was reparented, by that marker. ``stop()`` ends only what was started here
(process groups and marked processes), never another Ray on the machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from benchmarks.harness.slowproxy import Request, SlowProxy
from flashfeed.cli.devstore import StoreInfo

__all__ = [
    "MARKER",
    "Node",
    "NodeProxy",
    "SimCluster",
    "bytes_read",
    "free_port",
    "free_ports",
    "namespaces_available",
]

S3_NAME = "s3.ffcluster.test"
MARKER = "FFCLUSTER_TAG"
_UNSHARE = ["unshare", "--mount", "--uts", "--propagation", "private", "--"]
VENV_BIN = Path(sys.executable).parent

# The namespace holder: the node's hostname, tmpfs and /etc/hosts, then it waits. It dies
# with the process that started it (PR_SET_PDEATHSIG), so a crashed test leaves no holder.
_HOLDER = r"""
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[5]):
    sys.exit(1)
name, cache, size, hosts = sys.argv[1:5]
subprocess.run(["hostname", name], check=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", cache], check=True)
subprocess.run(["mount", "--bind", hosts, "/etc/hosts"], check=True)
print("ready", flush=True)
signal.pause()
"""


# The cluster's network: one namespace with only a loopback interface, so that whatever the
# cluster's processes listen on (Ray listens on every interface) is reachable from nowhere else.
_NET_HOLDER = r"""
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
print("ready", flush=True)
signal.pause()
"""
_CLONE_NEWNET = 0x40000000

# The cluster's watchdog: when the test process dies (even by SIGKILL, where no ``finally``
# runs), it kills every process carrying the cluster's marker, Ray's included.
_WATCHDOG = r"""
import os, select, shutil, signal, sys, time
tag, pid, root = sys.argv[1].encode(), int(sys.argv[2]), sys.argv[3]
select.select([os.pidfd_open(pid)], [], [])
for _ in range(3):
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if any(v.startswith(tag) for v in f.read().split(b"\0")):
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    time.sleep(0.5)
shutil.rmtree(root, ignore_errors=True)
"""


def namespaces_available() -> str | None:
    """None when this machine can run a simulated cluster, else the reason it cannot."""
    if os.geteuid() != 0:
        return "simulated nodes need root (mount and UTS namespaces, tmpfs)"
    for tool in ("unshare", "nsenter", "mount", "ip"):
        if shutil.which(tool) is None:
            return f"simulated nodes need {tool} (util-linux)"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--uts", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"unshare --net --mount --uts failed: {probe.stderr.strip()}"
    return None


@dataclass
class NodeProxy(SlowProxy):
    """The counting proxy of one node, listening on the node's address."""

    host: str = "127.0.0.1"
    bind_port: int = 0
    netns: str | None = None  # listen inside this network namespace (a /proc/PID/ns/net)

    def _listen(self) -> socket.socket:
        return in_netns(self.netns, lambda: socket.create_server((self.host, self.bind_port)))

    def mark(self) -> int:
        """A position in the request log: ``since(mark)`` is what came after it."""
        with self._lock:
            return len(self.requests)

    def since(self, mark: int = 0) -> list[Request]:
        with self._lock:
            return list(self.requests[mark:])


T = TypeVar("T")


def in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """``fn()`` run in a thread that entered network namespace ``netns`` (None: here). A
    socket keeps the namespace it was made in, whichever thread uses it later."""
    if netns is None:
        return fn()
    out: list[T] = []
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns({netns}) failed")
            finally:
                os.close(fd)
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=enter)  # the thread ends there: no other work sees its netns
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def bytes_read(requests: Sequence[Request], sizes: dict[str, int]) -> dict[str, int]:
    """Bytes GET per object path (``/bucket/key``): a ranged GET counts its range, a whole GET
    the object's size from ``sizes`` (objects not in ``sizes`` are left out)."""
    out: dict[str, int] = defaultdict(int)
    for r in requests:
        if r.method != "GET" or r.path not in sizes:
            continue
        out[r.path] += (r.range[1] - r.range[0]) if r.range else sizes[r.path]
    return dict(out)


@dataclass
class Node:
    index: int
    address: str
    hostname: str
    proxy: NodeProxy
    holder: subprocess.Popen[str]
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def path(self, path: str) -> str:
        """``path`` as this node sees it (its tmpfs included), readable from outside."""
        return f"/proc/{self.holder.pid}/root{os.path.abspath(path)}"


class SimCluster:
    """Simulated nodes, their Ray processes and whatever else runs on them.

    >>> with SimCluster(store_info) as c:          # doctest: +SKIP
    ...     n0, n1 = c.add_node(), c.add_node()
    ...     c.start_ray()                            # head on node 0, node 1 joins
    ...     c.popen(n1, ["python", "-c", "..."])     # runs on node 1
    """

    def __init__(self, store: StoreInfo, *, cache_size: str = "256m") -> None:
        self.store = store
        self.tag = uuid.uuid4().hex[:10]
        # short: Ray's AF_UNIX socket paths live under the temp dir
        self.root = tempfile.mkdtemp(prefix=f"ffc{self.tag[:4]}-", dir="/tmp")
        self.cache_dir = os.path.join(self.root, "cache")
        self.ray_temp = os.path.join(self.root, "ray")
        os.makedirs(self.cache_dir)
        os.makedirs(self.ray_temp)
        self.cache_size = cache_size
        self.nodes: list[Node] = []
        self.s3_port = 0
        self.ray_port = 0
        self.ray_head = ""
        self._ray: dict[int, subprocess.Popen[bytes]] = {}
        self._net = subprocess.Popen(
            ["unshare", "--net", "--", sys.executable, "-c", _NET_HOLDER, str(os.getpid())],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, MARKER: f"{self.tag}:net:holder"},
        )
        assert self._net.stdout is not None
        if self._net.stdout.readline().strip() != "ready":
            self._net.kill()
            raise RuntimeError(f"network namespace setup failed (rc {self._net.wait()})")
        self.netns = f"/proc/{self._net.pid}/ns/net"
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, f"{MARKER}={self.tag}", str(os.getpid()), self.root],
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != MARKER},
        )

    # -- nodes ------------------------------------------------------------------------------
    def add_node(self) -> Node:
        i = len(self.nodes)
        address = f"127.0.0.{i + 2}"  # Ray turns 127.0.0.1 into the machine's own address
        hostname = f"ffnode{i}"
        upstream = ("127.0.0.1", self.store.s3_port)
        proxy = NodeProxy(upstream=upstream, host=address, bind_port=self.s3_port, netns=self.netns)
        self.s3_port = proxy.port
        hosts = os.path.join(self.root, f"hosts{i}")
        with open("/etc/hosts", encoding="utf-8") as f:
            base = f.read()
        with open(hosts, "w", encoding="utf-8") as f:
            f.write(base.rstrip("\n") + f"\n{address}\t{hostname} {S3_NAME}\n")
        args = [hostname, self.cache_dir, self.cache_size, hosts, str(os.getpid())]
        argv = ["nsenter", f"--net={self.netns}", "--", *_UNSHARE, sys.executable, "-c", _HOLDER]
        holder = subprocess.Popen(
            [*argv, *args],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, MARKER: f"{self.tag}:node{i}:holder"},
        )
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            holder.kill()
            proxy.close()
            raise RuntimeError(f"node {i}: namespace setup failed (rc {holder.wait()})")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RAY_ADDRESS", "PYTEST_", "FLASHFEED_CACHE"))
            # "0" there refuses any multi-node cluster, even on Linux
            and k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
        }
        env.update(
            {
                "AWS_ENDPOINT_URL": f"http://{S3_NAME}:{self.s3_port}",
                "AWS_ACCESS_KEY_ID": self.store.access_key,
                "AWS_SECRET_ACCESS_KEY": self.store.secret_key,
                "AWS_DEFAULT_REGION": "us-east-1",
                "FLASHFEED_CACHE_DIR": self.cache_dir,
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled",
                "GLOO_SOCKET_IFNAME": "lo",
                "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
                MARKER: f"{self.tag}:node{i}",
            }
        )
        node = Node(i, address, hostname, proxy, holder, env)
        self.nodes.append(node)
        return node

    def popen(
        self,
        node: Node,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log: str | None = None,
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``node``: in its namespaces, its own process group, its env."""
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                [*self._enter(node, cwd), *argv],
                env={**node.env, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log:
                out.close()  # type: ignore[union-attr]
        node.procs.append(proc)
        return proc

    @staticmethod
    def _enter(node: Node, cwd: str | None) -> list[str]:
        pid = str(node.holder.pid)
        where = f"--wd={cwd or os.getcwd()}"
        return ["nsenter", "-t", pid, "--mount", "--uts", "--net", where, "--"]

    def run(
        self, node: Node, argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``node`` to its end; output captured."""
        proc = subprocess.run(
            [*self._enter(node, None), *argv],
            env={**node.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,
        )
        return proc

    # -- Ray --------------------------------------------------------------------------------
    def start_ray(self, nodes: Sequence[Node] | None = None, *, timeout: float = 60.0) -> str:
        """The head on node 0 (a node like the others, as on most clusters), then every other
        node of ``nodes`` joins it. Returns the address drivers pass to ``ray.init``."""
        for node in nodes or self.nodes:
            if node.index in self._ray:
                continue
            ports = free_ports(node.address, 7, self.netns)
            argv = [
                str(VENV_BIN / "ray"),
                "start",
                "--block",
                "--node-ip-address",
                node.address,
                "--num-cpus",
                "1",
                "--object-store-memory",
                str(80 * 1024 * 1024),
                "--disable-usage-stats",
                "--node-manager-port",
                str(ports[0]),
                "--object-manager-port",
                str(ports[1]),
                "--dashboard-agent-listen-port",
                str(ports[2]),
                "--dashboard-agent-grpc-port",
                str(ports[3]),
                "--metrics-export-port",
                str(ports[4]),
                "--runtime-env-agent-port",
                str(ports[5]),
            ]
            if node.index == 0:
                self.ray_port = free_port(node.address, self.netns)
                self.ray_head = node.address
                argv += [
                    "--head",
                    "--port",
                    str(self.ray_port),
                    "--dashboard-port",
                    str(ports[6]),
                    "--temp-dir",
                    self.ray_temp,
                    "--include-dashboard",
                    "false",
                ]
            else:
                if not self.ray_port:
                    raise RuntimeError("start node 0 (the Ray head) first")
                argv += ["--address", self.ray_address]
            log = os.path.join(self.root, f"ray-node{node.index}.log")
            self._ray[node.index] = self.popen(node, argv, log=log)
            self._wait_started(node.index, timeout)
        return self.ray_address

    @property
    def ray_address(self) -> str:
        return f"{self.ray_head}:{self.ray_port}"

    def ray_nodes(self) -> list[dict[str, object]]:
        """Alive Ray nodes as a driver on node 0 sees them (address, resources)."""
        code = (
            "import json, ray\n"
            f"ray.init(address={self.ray_address!r}, log_to_driver=False,"
            " configure_logging=False)\n"
            "print(json.dumps([{'address': n['NodeManagerAddress'],"
            " 'cpus': n['Resources'].get('CPU', 0)} for n in ray.nodes() if n['Alive']]))\n"
        )
        proc = self.run(self.nodes[0], [sys.executable, "-c", code], timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"ray driver failed: {proc.stderr[-2000:]}")
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    def _wait_started(self, index: int, timeout: float) -> None:
        """``ray start`` says so once its node is registered with the head."""
        deadline = time.monotonic() + timeout
        proc = self._ray[index]
        while "Ray runtime started" not in self.ray_log(index):
            if proc.poll() is not None:
                raise RuntimeError(f"ray on node {index} exited: {self.ray_log(index)[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray on node {index} not started after {timeout}s")
            time.sleep(0.2)

    def ray_log(self, index: int) -> str:
        try:
            return Path(self.root, f"ray-node{index}.log").read_text(errors="replace")
        except OSError:
            return ""

    # -- processes --------------------------------------------------------------------------
    def survivors(self, *, exclude_holders: bool = True) -> list[tuple[int, str, str]]:
        """Every live process carrying this cluster's marker: (pid, marker, command)."""
        out = []
        needle = f"{MARKER}={self.tag}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read()
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                        continue  # a zombie has no resources left; its parent reaps it
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            except OSError:
                continue
            for var in env.split(b"\0"):
                if var.startswith(needle):
                    marker = var.split(b"=", 1)[1].decode()
                    if not (exclude_holders and marker.endswith(":holder")):
                        out.append((int(entry), marker, cmd))
        return out

    def host_listeners(self) -> list[tuple[int, str]]:
        """(pid, command) of each process of the cluster listening on a TCP socket of this
        test's network namespace (there should be none: the cluster has its own)."""
        listening = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table, encoding="ascii") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A":  # LISTEN
                        listening.add(f"socket:[{fields[9]}]")
        out = []
        for pid, _, cmd in self.survivors():
            try:
                links = {
                    os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                }
            except OSError:
                continue
            if links & listening:
                out.append((pid, cmd))
        return out

    def children(self, pid: int) -> list[int]:
        """The live child processes of ``pid`` (torchrun's ranks, for one)."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        fields = f.read().rsplit(b")", 1)[-1].split()
                except OSError:
                    continue
                if int(fields[1]) == pid and fields[0] != b"Z":
                    out.append(int(entry))
        return sorted(out)

    def wait_gone(self, predicate: str = "", timeout: float = 10.0) -> list[tuple[int, str, str]]:
        """Wait until no marked process whose marker contains ``predicate`` lives; returns
        those still alive at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in self.survivors() if predicate in p[1]]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill_group(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop_ray(self, timeout: float = 5.0) -> None:
        """SIGTERM each node's ``ray start --block`` group (it stops its own processes),
        then SIGKILL what is left of those groups."""
        for proc in self._ray.values():
            self.kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self._ray.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self._ray.values():
            self.kill_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._ray.clear()

    def stop(self) -> list[tuple[int, str, str]]:
        """Stop everything started here. Returns the marked processes that were still alive
        after their groups were stopped (then killed, so nothing is left either way)."""
        self.stop_ray()
        for node in self.nodes:
            for proc in node.procs:
                self.kill_group(proc)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        left = self.wait_gone(timeout=5.0)
        for pid, _, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.nodes:
            node.holder.kill()
            node.holder.wait(5)
            node.proxy.close()
        self._net.kill()
        self._net.wait(5)
        self._watchdog.kill()
        self._watchdog.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)
        return left

    def __enter__(self) -> SimCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


def free_ports(host: str, n: int, netns: str | None = None) -> list[int]:
    socks = in_netns(netns, lambda: [socket.create_server((host, 0)) for _ in range(n)])
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str, netns: str | None = None) -> int:
    return free_ports(host, 1, netns)[0]
