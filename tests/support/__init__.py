"""What the tests share: datasets they make, servers and proxies they start, the simulated
cluster, and the worker scripts they run as separate processes."""

from pathlib import Path

#: this folder: the worker scripts tests run as separate processes live here
SUPPORT = Path(__file__).resolve().parent
#: the tests folder (what a subprocess needs on PYTHONPATH to import ``support``)
TESTS = SUPPORT.parent
#: the repository root
REPO = TESTS.parent
