"""flashfeed's benchmarks: ``harness`` (store, corpus, rounds, results), the ``stages`` that
measure one thing each beside their peers, and the suite that runs them and writes the page.

Run from the repository root: ``python -m benchmarks.suite --quick`` or one stage,
``python -m benchmarks.stages.cachebench --help``.
"""
