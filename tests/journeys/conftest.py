"""The journeys' simulated cluster (tests/support/cluster.py), one per test."""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashfeed.cli.devstore import EmbeddedStore

from support.cluster import SimCluster


@pytest.fixture
def cluster(s3_store: EmbeddedStore, tmp_path: Path) -> Iterator[SimCluster]:
    c = SimCluster(s3_store.info)
    try:
        yield c
    finally:
        # the processes' logs stay with the test's tmp_path for a post-mortem
        for log in glob.glob(os.path.join(c.root, "*.log")):
            shutil.copy(log, tmp_path)
        c.stop()  # the tests check for survivors themselves, before this
