"""Sampling (``rltrace.pipeline.sampling``) with the real OTLP receiver: whole traces kept or dropped.

Each test runs an RL-shaped workload (tasks of two sessions with generate/reward phases, a
user scope nested in a phase, plain train-step traces), exports over OTLP/gRPC to the
in-process receiver, and checks (a) exactly the traces the sampler keeps arrive, computed
independently from the trace ids in the session records on disk, (b) every kept trace arrives
whole, (c) the session records and the Chrome file still hold 100%, (d) ``diagnostics()``
shows the decisions.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult, TraceIdRatioBased

import rltrace
from rltrace import runtime
from rltrace.testing.otlp_receiver import OTLPReceiver

N_TASKS = 60
SPANS_PER_TASK = 1 + 2 * (1 + 2) + 1  # task, 2 x (session + generate + reward), a user scope


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OTLPReceiver]:
    for k in list(os.environ):
        if k.startswith("OTEL_"):
            monkeypatch.delenv(k, raising=False)
    with OTLPReceiver() as rx:
        yield rx


def _configure(tmp_path: Path, rx: OTLPReceiver, **kw: Any) -> None:
    rltrace.configure(fileroot=str(tmp_path), session_tracer={"enabled": True, "flush_threshold": 1},
                      otlp={"endpoint": rx.grpc_endpoint, "protocol": "grpc", "timeout_s": 5.0,
                            "metrics": False},
                      flush_at_exit=False, **kw)


def _workload(statuses: dict[int, str] | None = None, slow: set[int] = frozenset()) -> None:
    """``N_TASKS`` tasks of two sessions; task i's first session gets ``statuses[i]``."""
    statuses = statuses or {}
    for i in range(N_TASKS):
        task = rltrace.register_task(f"task-{i}")
        sids = [rltrace.register_session(task) for _ in range(2)]
        for j, sid in enumerate(sids):
            with rltrace.trace_session_phase("generate", session_id=sid):
                if j == 0:
                    with rltrace.trace_scope("tokenize"):
                        pass
            with rltrace.trace_session_phase("reward", session_id=sid):
                pass
            if i in slow and j == 1:
                # a slow session, planted by its clock: its finalize comes 2 s "later"
                sess = rltrace.runtime.RUNTIME.sessions.sessions[sid]
                sess.start_ns -= 2_000_000_000
            status = statuses.get(i, "accepted") if j == 0 else "accepted"
            rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
    with rltrace.step(7):  # a plain trace, not a task's
        with rltrace.trace_scope("optimizer"):
            pass


def _finish(tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Flush, shut down; returns (diagnostics, session records, Chrome X events)."""
    p = runtime.get_pipeline()
    assert p is not None
    rltrace.shutdown()
    diag = p.diagnostics()
    records = [json.loads(line) for f in tmp_path.rglob("sessions-r0*.jsonl")
               for line in f.read_text().splitlines()]
    chrome = sum(1 for f in tmp_path.rglob("traces-r0*.jsonl")
                 for line in f.read_text().splitlines() if '"ph":"X"' in line)
    return diag, records, chrome


def _task_traces(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["trace_id"], []).append(r)
    return by


def _received(rx: OTLPReceiver, expected: int) -> dict[str, list[Any]]:
    spans = rx.wait_for_spans(expected) if expected else rx.spans()
    by: dict[str, list[Any]] = {}
    for s in spans:
        by.setdefault(s.trace_id, []).append(s)
    return by


def _ratio_keeps(trace_hex: str, ratio: float) -> bool:
    return TraceIdRatioBased(ratio).should_sample(None, int(trace_hex, 16), "x").decision.is_sampled()


def test_ratio_mode_keeps_whole_traces_by_trace_id_and_the_local_files_keep_all(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    _configure(tmp_path, receiver, sampling={"mode": "ratio", "ratio": 0.3})
    _workload()
    diag, records, chrome = _finish(tmp_path)
    tasks = _task_traces(records)
    assert len(records) == 2 * N_TASKS  # session records: 100%
    assert chrome == N_TASKS * SPANS_PER_TASK + 2  # Chrome: 100% (+ the step and optimizer)
    want = {t for t in tasks if _ratio_keeps(t, 0.3)}
    assert 0 < len(want) < N_TASKS  # the ratio does select (60 tasks at 0.3)
    step_trace_kept = diag["sampling"]["traces_sampled"] - len(want)
    got = _received(receiver, len(want) * SPANS_PER_TASK + 2 * step_trace_kept)
    got_tasks = {t for t in got if t in tasks}
    assert got_tasks == want
    for t in want:  # whole: task, sessions, phases and the nested user scope
        assert Counter(s.name for s in got[t]) == Counter(
            {"rl.task": 1, "rl.session": 2, "generate": 2, "reward": 2, "tokenize": 1})
    s = diag["sampling"]
    assert s["mode"] == "ratio" and s["traces_sampled"] + s["traces_unsampled"] == N_TASKS + 1
    assert diag["otlp"]["unsampled"] == (N_TASKS - len(want)) * SPANS_PER_TASK + 2 * (1 - step_trace_kept)


def test_ratio_mode_decides_roots_with_children_by_their_trace_id(tmp_path: Path) -> None:
    """A root scope's ids are drawn when its first child (or a processor) asks, inside its
    ``with``: the ratio still decides by the trace id, and the children follow the root."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    started: list[tuple[str, Any]] = []

    class OnStart(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            started.append((span.name, span.get_span_context()))

    mem = InMemorySpanExporter()
    procs = [OnStart(), SimpleSpanProcessor(mem)]
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                      sampling={"mode": "ratio", "ratio": 0.5})
    for proc in procs:
        rltrace.add_span_processor(proc)
    try:
        for i in range(40):
            with rltrace.trace_scope("train_step", args={"i": i}):
                with rltrace.trace_scope("forward"):
                    pass
        diag = rltrace.diagnostics()
        rltrace.shutdown()
    finally:
        for proc in procs:
            runtime.RUNTIME.remove_span_processor(proc)
    roots = {sc.trace_id: sc for name, sc in started if name == "train_step"}
    assert len(roots) == 40 and len(started) == 80  # on_start sees every span
    want = {t for t in roots if _ratio_keeps(f"{t:032x}", 0.5)}
    assert 0 < len(want) < 40
    assert {t for t, sc in roots.items() if sc.trace_flags.sampled} == want
    for _, sc in started:  # a child follows its root
        assert sc.trace_flags.sampled == (sc.trace_id in want)
    ended = mem.get_finished_spans()  # processors' on_end: the sampled traces, whole
    assert Counter(s.context.trace_id for s in ended) == {t: 2 for t in want}
    assert diag["sampling"]["traces_sampled"] == len(want)
    assert diag["sampling"]["traces_unsampled"] == 40 - len(want)


def test_the_standard_env_variables_choose_the_sampler(tmp_path: Path, receiver: OTLPReceiver,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    _configure(tmp_path, receiver)
    _workload()
    diag, records, chrome = _finish(tmp_path)
    assert receiver.spans() == [] and diag["otlp"]["exported"] == 0
    assert diag["sampling"]["traces_unsampled"] == N_TASKS + 1
    assert len(records) == 2 * N_TASKS and chrome == N_TASKS * SPANS_PER_TASK + 2


class _KeepNamed(Sampler):
    """A user's sampler: keeps traces whose root's name starts with ``keep``."""

    def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                      attributes: Any = None, links: Any = None, trace_state: Any = None
                      ) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if name.startswith("keep")
                              else Decision.DROP)

    def get_description(self) -> str:
        return "KeepNamed"


def test_a_users_sampler_decides_once_per_trace_and_children_follow(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    _configure(tmp_path, receiver, sampler=_KeepNamed())
    for name in ("keep.a", "drop.b", "keep.c"):
        with rltrace.trace_scope(name), rltrace.trace_scope("child"):
            with rltrace.trace_scope("grandchild"):
                pass
    diag, _, chrome = _finish(tmp_path)
    spans = receiver.wait_for_spans(6)
    assert Counter(s.name for s in spans) == Counter({"keep.a": 1, "keep.c": 1, "child": 2,
                                                      "grandchild": 2})
    assert diag["sampling"]["sampler"] == "KeepNamed"
    assert (diag["sampling"]["traces_sampled"], diag["sampling"]["traces_unsampled"]) == (2, 1)
    assert chrome == 9


def test_by_default_a_foreign_parents_flag_is_followed_and_travels_on(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    _configure(tmp_path, receiver)
    headers: dict[str, dict[str, str]] = {}
    for flag, label in ((0, "unsampled"), (1, "sampled")):
        remote = trace.NonRecordingSpan(trace.SpanContext(
            0xABC0 + flag, 0x1234, is_remote=True, trace_flags=trace.TraceFlags(flag)))
        with trace.use_span(remote), rltrace.trace_scope(f"server.{label}"):
            headers[label] = dict(rltrace.inject_headers())
    with rltrace.trace_scope("root"):
        pass
    diag, _, _ = _finish(tmp_path)
    spans = receiver.wait_for_spans(2)
    assert sorted(s.name for s in spans) == ["root", "server.sampled"]
    assert headers["unsampled"]["traceparent"].endswith("-00")  # downstream sees the decision
    assert headers["sampled"]["traceparent"].endswith("-01")
    assert diag["sampling"] == {"mode": "parent"}  # the default path: no sampler consulted


def test_session_mode_sends_whole_failed_rejected_slow_and_ratio_tasks(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    statuses = {3: "failed", 10: "rejected", 11: "failed"}
    slow = {20, 21}
    _configure(tmp_path, receiver, sampling={"mode": "sessions", "ratio": 0.1, "slow_s": 1.0})
    _workload(statuses, slow)
    diag, records, chrome = _finish(tmp_path)
    tasks = _task_traces(records)
    assert len(records) == 2 * N_TASKS and chrome == N_TASKS * SPANS_PER_TASK + 2
    by_task = {r["task_id"]: r["trace_id"] for r in records}
    interesting = {by_task[f"task-{i}"] for i in (*statuses, *slow)}
    by_ratio = {t for t in tasks if _ratio_keeps(t, 0.1)} - interesting
    want = interesting | by_ratio
    got = _received(receiver, len(want) * SPANS_PER_TASK + 2)  # + the step trace, always sent
    assert {t for t in got if t in tasks} == want
    for t in want:
        assert len(got[t]) == SPANS_PER_TASK  # whole
    s = diag["sampling"]
    assert s["tasks_kept"] == {"status": 3, "slow": 2, "ratio": len(by_ratio)}
    assert s["tasks_dropped"] == N_TASKS - len(want) and s["spans_held"] == 0
    assert s["spans_dropped"] == (N_TASKS - len(want)) * SPANS_PER_TASK


def test_session_mode_holds_at_most_max_held_spans_deciding_the_oldest_early(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    """Tasks left open: each holds its spans; past ``max_held`` the oldest is decided early
    (ratio 1: kept, so nothing is lost)."""
    _configure(tmp_path, receiver, sampling={"mode": "sessions", "ratio": 1.0, "max_held": 5})
    sids = []
    for i in range(6):
        task = rltrace.register_task(f"open-{i}")
        sid = rltrace.register_session(task)
        rltrace.register_session(task)  # never finalized: the task stays open
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        sids.append(sid)
        rltrace.flush()
        s = rltrace.diagnostics()["sampling"]
        assert s["spans_held"] <= 5
    s = rltrace.diagnostics()["sampling"]
    assert s["decided_early"] >= 2
    diag, _, _ = _finish(tmp_path)  # shutdown writes the open sessions as pending, ends the tasks
    spans = receiver.wait_for_spans(24)
    assert Counter(s.name for s in spans) == Counter({"rl.session": 12, "generate": 6, "rl.task": 6})
    assert diag["sampling"]["spans_held"] == 0 and diag["sampling"]["spans_dropped"] == 0


def test_bad_sampling_settings_name_the_key_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(rltrace.config.ConfigError, match=r"sampling.mode.*did you mean 'ratio'"):
        rltrace.configure(fileroot=str(tmp_path), sampling={"mode": "ratoi"})
    with pytest.raises(rltrace.config.ConfigError, match=r"sampling.ratio.*\[0, 1\]"):
        rltrace.configure(fileroot=str(tmp_path), sampling={"mode": "ratio", "ratio": 2})
    with pytest.raises(TypeError, match="sampler must be"):
        rltrace.configure(fileroot=str(tmp_path), sampler="half")


def test_an_unknown_env_sampler_is_warned_about_and_the_default_kept_as_the_sdk_does(
        tmp_path: Path, receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")  # valid elsewhere, not here
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "lots")
    with caplog.at_level("WARNING", logger="rltrace"):
        _configure(tmp_path, receiver)
    with rltrace.trace_scope("kept"):
        pass
    diag, _, _ = _finish(tmp_path)
    assert [s.name for s in receiver.wait_for_spans(1)] == ["kept"]
    assert diag["sampling"] == {"mode": "parent"}
    assert any("jaeger_remote" in r.getMessage() for r in caplog.records)


def test_session_mode_across_processes_each_decides_its_part_the_same_by_ratio(
        tmp_path: Path, receiver: OTLPReceiver) -> None:
    """A driver's tasks whose sessions run in another process (``rltrace.ray``'s propagator;
    both sides here on two pipelines one after the other, as ``tests/sessions/test_caller_task.py``
    does; ``tests/integrations/ray/test_ray.py`` runs the propagation on real actors).  Each side decides its
    part: by the task's trace id (the same decision on both sides), or, in the actor, a failed
    session keeps the sessions of the task open with it.  The driver sends the span of every
    task it drops (its sessions ran elsewhere), so what the actor keeps has its parent.  The
    actor holds nothing once its part of each task is over: nothing waits for shutdown."""
    from opentelemetry import context as otel_context

    from rltrace.ray import CallerContextPropagator

    n, ratio, failed = 40, 0.5, {3, 7, 8}
    sampling = {"mode": "sessions", "ratio": ratio}
    carriers: list[dict[str, str]] = []
    _configure(tmp_path / "driver", receiver, sampling=sampling)
    for i in range(n):
        task = rltrace.register_task(f"task-{i}")
        rltrace.set_task_id(task)
        carriers.append({})
        CallerContextPropagator().inject(carriers[-1])
        rltrace.trace_session_event("mark_finalized", task_id=task, status="accepted")
    rltrace.set_task_id(None)
    driver, _, _ = _finish(tmp_path / "driver")
    tasks = {s.attributes["rl.task.id"]: s for s in receiver.wait_for_spans("rl.task", min_count=n)}
    assert len(tasks) == n  # every task's span, kept or not
    by_ratio = {t for t, s in tasks.items() if _ratio_keeps(s.trace_id, ratio)}
    assert 0 < len(by_ratio) < n
    assert driver["sampling"]["tasks_kept"]["ratio"] == len(by_ratio)
    assert driver["sampling"]["task_spans_sent"] == n - len(by_ratio)

    _configure(tmp_path / "actor", receiver, sampling=sampling)
    for i, carrier in enumerate(carriers):
        token = otel_context.attach(CallerContextPropagator().extract(carrier))
        try:
            sids = [rltrace.register_session() for _ in range(2)]  # open together: one part
            for j, sid in enumerate(sids):
                with rltrace.trace_session_phase("generate", session_id=sid):
                    pass
                status = "failed" if i in failed and j == 0 else "accepted"
                rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
        finally:
            otel_context.detach(token)
    rltrace.flush(wait_s=5)
    actor = rltrace.diagnostics()["sampling"]
    assert actor["spans_held"] == 0  # decided as each part ended, not at shutdown
    want = by_ratio | {f"task-{i}" for i in failed}
    # (a failed session's reason comes first)
    assert actor["tasks_kept"] == {"ratio": len(want) - len(failed), "status": len(failed),
                                   "slow": 0}
    sessions = receiver.wait_for_spans("rl.session", min_count=2 * len(want))
    _finish(tmp_path / "actor")
    got = Counter(s.attributes["rl.task.id"] for s in sessions)
    assert got == {t: 2 for t in want}  # whole parts, the ratio ones the driver kept too
    for s in sessions:  # under the driver's task span, in its trace
        task = tasks[s.attributes["rl.task.id"]]
        assert (s.trace_id, s.parent_span_id) == (task.trace_id, task.span_id)
