"""The reserved run as users live it, on a simulated cluster (tests/cluster.py): ingest on
Ray, warm every node, train with torchrun on 2 nodes, lose one, resume on 3.

The cluster's nodes are namespaces on this machine, each with its own address, cache tmpfs
and counting S3 proxy, so the test can tell what each node fetched from the store.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from cluster import SimCluster, namespaces_available

from flashfeed.store import EmbeddedStore

pytestmark = pytest.mark.slow

_WHY_NOT = namespaces_available()
needs_namespaces = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


@pytest.fixture
def cluster(s3_store: EmbeddedStore) -> Iterator[SimCluster]:
    c = SimCluster(s3_store.info)
    try:
        yield c
    finally:
        left = c.stop()
        assert not left, f"processes of the cluster outlived its stop: {left}"


_WHOAMI = (
    "import os, socket, s3fs\n"
    "d = os.environ['FLASHFEED_CACHE_DIR']\n"
    "open(os.path.join(d, 'mine'), 'w').write(socket.gethostname())\n"
    "fs = s3fs.S3FileSystem()\n"
    "fs.pipe('flashfeed/' + os.environ['FFT_PREFIX'] + '/' + socket.gethostname(), b'x')\n"
    "print(socket.gethostname(), sorted(os.listdir(d)))\n"
)


@needs_namespaces
def test_cluster_comes_up_and_goes_down_cleanly(cluster: SimCluster, s3_prefix: str) -> None:
    nodes = [cluster.add_node(), cluster.add_node()]
    prefix = s3_prefix.removeprefix("s3://flashfeed/")
    for node in nodes:
        proc = cluster.run(
            node, [sys.executable, "-c", _WHOAMI], timeout=60, env={"FFT_PREFIX": prefix}
        )
        assert proc.returncode == 0, proc.stderr
        # its own hostname, and a cache that no other node sees
        assert proc.stdout.split() == [node.hostname, "['mine']"]
    for node in nodes:
        puts = [r.path for r in node.proxy.since() if r.method == "PUT"]
        assert puts == [f"/flashfeed/{prefix}/{node.hostname}"]  # through its own proxy only

    cluster.start_ray()
    seen = cluster.ray_nodes()
    assert sorted(str(n["address"]) for n in seen) == [n.address for n in nodes]
    assert any("raylet" in cmd for _, marker, cmd in cluster.survivors() if "node1" in marker)

    cluster.stop_ray()
    left = [p for p in cluster.survivors() if "raylet" in p[2] or "gcs_server" in p[2]]
    assert not left, f"Ray processes outlived the stop: {left}"
