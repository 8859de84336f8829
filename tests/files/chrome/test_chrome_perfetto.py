"""Chrome-trace output loaded into Perfetto's real trace processor.

A workflow with nested scopes, decorated sync/async/generator functions, concurrent asyncio
tasks and two threads whose scopes overlap in time is traced, merged with ``convert`` and
loaded by Perfetto.  Every recorded scope and instant must come back as exactly one slice at
the depth the program's nesting implies: Perfetto silently drops a complete event that
overlaps another one on the same track, so any lane mistake shows up as a missing slice or an
import error.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from conftest import perfetto_check

import rltrace
from rltrace.cli.convert import convert

N_TASKS = 5
N_THREADS = 2
N_COMPUTE = 2
N_ITEMS = 3

SLICES_BY_DEPTH = "select name, depth, count(*) as n from slice group by name, depth"
INSTANTS = "select name, count(*) as n from slice where dur = 0 group by name"
TASK_TRACKS = "select count(distinct track_id) as n from slice where name = 'task.outer'"
THREAD_TRACKS = "select count(distinct track_id) as n from slice where name = 'thread.work'"
TASK_OVERLAPS = (
    "select count(*) as n from slice a join slice b on a.name = 'task.outer' "
    "and b.name = 'task.outer' and a.id < b.id and a.ts < b.ts + b.dur and b.ts < a.ts + a.dur"
)
THREAD_OVERLAPS = TASK_OVERLAPS.replace("task.outer", "thread.work")


def _run_workflow(expected: Counter[tuple[str, int]], instants: Counter[str]) -> None:
    """Run the traced program, adding every slice it records (name, Perfetto depth) to ``expected``.

    Depth rules: a scope nested in another scope of the same thread and task is one level
    deeper; a scope started in another task or thread, a traced generator, and a scope whose
    parent is a foreign OTel span each start a track of their own (depth 0); an instant is one
    level below the scope it is recorded in (depth 0 outside any scope).
    """

    def saw(name: str, depth: int, instant: bool = False) -> None:
        expected[(name, depth)] += 1
        if instant:
            instants[name] += 1

    @rltrace.trace_perf("compute")
    def compute(x: int) -> int:
        saw("compute", 1)
        with rltrace.trace_scope("compute.kernel", rltrace.Category.COMPUTE, {"x": x}):
            saw("compute.kernel", 2)
            return x * 2

    @rltrace.trace_perf("gen")
    def items(n: int):  # type: ignore[no-untyped-def]
        saw("gen", 0)
        for i in range(n):
            with rltrace.trace_scope("gen.item"):
                saw("gen.item", 1)
            yield i

    entered: list[int] = []

    @rltrace.trace_perf("task.inner", category="compute")
    async def inner(i: int, all_in: asyncio.Event) -> None:
        saw("task.inner", 1)
        rltrace.instant("task.mark", args={"i": i})
        saw("task.mark", 2, instant=True)
        entered.append(i)
        if len(entered) == N_TASKS:
            all_in.set()
        await all_in.wait()  # every task is inside its scopes before any leaves: they overlap

    async def task(i: int, all_in: asyncio.Event) -> None:
        async with rltrace.atrace_scope("task.outer", rltrace.Category.SCHEDULER, {"i": i}):
            saw("task.outer", 0)
            await inner(i, all_in)

    async def rollout() -> None:
        all_in = asyncio.Event()
        await asyncio.gather(*(task(i, all_in) for i in range(N_TASKS)))

    barrier = threading.Barrier(N_THREADS, timeout=30)
    thread_errors: list[BaseException] = []

    def worker() -> None:
        try:
            with rltrace.trace_scope("thread.work"):
                saw("thread.work", 0)
                barrier.wait()  # both threads are inside thread.work
                with rltrace.trace_scope("thread.step"):
                    saw("thread.step", 1)
                    barrier.wait()  # and inside thread.step
        except BaseException as exc:
            thread_errors.append(exc)

    rltrace.instant("start")
    saw("start", 0, instant=True)
    with rltrace.trace_scope("workflow"):
        saw("workflow", 0)
        with rltrace.trace_scope("prepare"):
            saw("prepare", 1)
            with rltrace.trace_scope("load", rltrace.Category.IO):
                saw("load", 2)
                rltrace.instant("loaded")
                saw("loaded", 3, instant=True)
        for x in range(N_COMPUTE):
            compute(x)
        for _ in items(N_ITEMS):
            with rltrace.trace_scope("between"):
                saw("between", 1)
        tracer = rltrace.tracer_provider().get_tracer("test.foreign")
        with tracer.start_as_current_span("otel.foreign"):
            saw("otel.foreign", 0)
            with rltrace.trace_scope("under.foreign"):
                saw("under.foreign", 0)
                with rltrace.trace_scope("under.foreign.child"):
                    saw("under.foreign.child", 1)
        asyncio.run(rollout())
        threads = [threading.Thread(target=worker, name=f"worker-{k}") for k in range(N_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not thread_errors


def _rows(report: dict, sql: str) -> list[dict]:
    return report["queries"][sql]


@pytest.mark.perfetto
def test_concurrent_scopes_load_in_perfetto_as_exactly_the_recorded_slices(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="perfetto", trial_name="t0",
                      rank=0, flush_at_exit=False)
    expected: Counter[tuple[str, int]] = Counter()
    instants: Counter[str] = Counter()
    _run_workflow(expected, instants)
    rltrace.shutdown()

    merged = tmp_path / "trace.json"
    res = convert([tmp_path / "logs"], merged, progress=False)
    assert res.skipped == []
    report = perfetto_check(merged, SLICES_BY_DEPTH, INSTANTS, TASK_TRACKS, THREAD_TRACKS,
                            TASK_OVERLAPS, THREAD_OVERLAPS)

    assert report["load_error"] is None
    assert report["import_errors"] == []
    assert report["ok"] is True
    got = Counter({(r["name"], r["depth"]): r["n"] for r in _rows(report, SLICES_BY_DEPTH)})
    assert got == expected
    assert report["slices"] == sum(expected.values())
    assert {r["name"]: r["n"] for r in _rows(report, INSTANTS)} == dict(instants)
    # the concurrent scopes really overlapped, and each one sits on a track of its own
    assert _rows(report, TASK_OVERLAPS)[0]["n"] == N_TASKS * (N_TASKS - 1) // 2
    assert _rows(report, TASK_TRACKS)[0]["n"] == N_TASKS
    assert _rows(report, THREAD_OVERLAPS)[0]["n"] == N_THREADS * (N_THREADS - 1) // 2
    assert _rows(report, THREAD_TRACKS)[0]["n"] == N_THREADS


@pytest.mark.perfetto
def test_perfetto_checker_reports_overlapping_complete_events_on_one_thread(tmp_path: Path) -> None:
    # negative control: what the lanes avoid is really detected by the checker
    bad = tmp_path / "overlap.json"
    bad.write_text(json.dumps({"traceEvents": [
        {"pid": 1, "tid": 1, "ph": "X", "ts": 0, "dur": 10, "name": "a"},
        {"pid": 1, "tid": 1, "ph": "X", "ts": 5, "dur": 10, "name": "b"},
    ]}))
    report = perfetto_check(bad)
    assert report["ok"] is False
    assert "slice_drop_overlapping_complete_event" in {e["name"] for e in report["import_errors"]}
    assert report["slices"] == 1
