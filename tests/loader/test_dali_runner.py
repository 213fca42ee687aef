"""When a loader collects garbage before forking its reader processes: only when a pipeline
may wait in a reference cycle, never for the first loader of a process."""

from __future__ import annotations

import gc
import weakref

import pytest

from flashfeed.loader import dali_runner
from flashfeed.loader.dali_runner import DaliRunner, collect_dropped_pipelines


@pytest.fixture
def fresh_process(monkeypatch):
    """The runner bookkeeping of a process that has built no loader yet; counts collections."""
    monkeypatch.setattr(dali_runner, "_runners", weakref.WeakSet())
    monkeypatch.setattr(dali_runner, "_dropped", 0)
    calls = []
    real = gc.collect
    monkeypatch.setattr(dali_runner.gc, "collect", lambda *a: calls.append(1) or real(*a))
    return calls


def _runner() -> DaliRunner:
    return DaliRunner(lambda source: (object(), ["x"]), lambda pass_dir: None)  # type: ignore[arg-type,return-value]


def test_the_first_loader_of_a_process_does_not_collect(fresh_process):
    first = _runner()
    assert collect_dropped_pipelines(first) is False
    assert fresh_process == []
    first.close()


def test_a_dropped_pipeline_or_another_runner_is_collected_first(fresh_process):
    first = _runner()
    first.pipe = object()
    first.drop()  # a pass left early dropped its pipeline
    assert collect_dropped_pipelines(first) is True
    assert collect_dropped_pipelines(first) is False  # nothing new since
    second = _runner()  # another loader exists (closed or not): its pipeline may be garbage
    assert collect_dropped_pipelines(second) is True
    assert len(fresh_process) == 2
    first.close()
    second.close()
