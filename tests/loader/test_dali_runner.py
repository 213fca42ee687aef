"""When a loader collects garbage before forking its reader processes: only when a pipeline
may wait in a reference cycle, never for the first loader of a process."""

from __future__ import annotations

import gc
import weakref

import pytest

from flashfeed.loader.image.dali_runner import DaliRunner, collect_dropped_pipelines
from flashfeed.loader.image.image import dali_runner

from support.loader_helpers import stub_runner


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
    return stub_runner()


def test_the_first_loader_of_a_process_does_not_collect(fresh_process):
    first = _runner()
    assert collect_dropped_pipelines(first) is False
    assert fresh_process == []
    first.close()


class _Pipe:
    """Stands for a DALI pipeline: something a runner holds and drops."""

    cycle: object = None


def test_a_dropped_pipeline_still_referenced_or_another_open_runner_is_collected_first(
    fresh_process,
):
    first = _runner()
    pipe = _Pipe()
    pipe.cycle = pipe  # a loader dropped without close(): the pipeline waits in a cycle
    first.pipe = pipe
    del pipe
    first.drop()
    assert collect_dropped_pipelines(first) is True
    assert collect_dropped_pipelines(first) is False  # nothing new since
    first.pipe = _Pipe()  # the first loader is still open, holding its pipeline
    second = _runner()
    assert collect_dropped_pipelines(second) is True
    assert len(fresh_process) == 2
    first.close()
    second.close()


def test_a_loader_built_after_others_were_closed_does_not_collect(fresh_process):
    first = _runner()
    first.pipe = _Pipe()
    first.close()  # the pipeline is freed as the runner lets it go
    second = _runner()
    assert collect_dropped_pipelines(second) is False
    second.pipe = _Pipe()
    second.drop()  # a pass left early dropped a pipeline nothing else holds
    assert collect_dropped_pipelines(second) is False
    assert fresh_process == []
    second.close()
