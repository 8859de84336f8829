"""Session records and metrics: the exact record format, the records file's flush rules, OTel metrics,
``SessionMetricsProcessor`` as a plain OTel ``SpanProcessor``, and bounded state over a long run.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import rltrace
from rltrace import runtime
from rltrace.exporters.session_records import SessionRecordWriter
from rltrace.perf_tracer import (
    register_session,
    register_task,
    session_context,
    trace_session_event,
    trace_session_phase,
)
from rltrace.testing import capture_spans, deterministic, read_jsonl

SESSIONS_ON = {"session_tracer": {"enabled": True}}
T0 = 1_700_000_000_000_000_000  # epoch ns


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """No caller rank/OTLP/RLTRACE_* settings (misuse counters start at zero with each
    ``configure``)."""
    clean_env(monkeypatch)


class ManualClock:
    """An epoch-ns clock that only moves when the test moves it."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def configure_sessions_only(tmp_path: Path, **overrides: Any) -> Path:
    """Span tracing off, session tracer on; returns the records file path."""
    st = {"enabled": True, **overrides.pop("session_tracer", {})}
    rltrace.configure(fileroot=str(tmp_path), enabled=False, flush_at_exit=False, session_tracer=st,
                      **overrides)
    path = runtime.get_pipeline().sessions_path
    assert path is not None
    return path


def finished_session(status: str = "accepted", **finalize: Any) -> Any:
    sid = register_session()
    with trace_session_phase("generate", session_id=sid):
        pass
    trace_session_event("mark_finalized", session_id=sid, status=status, **finalize)
    return sid


# ---- the record, exactly ---------------------------------------------------------------------------


def test_record_has_areal_fields_in_order_then_rltrace_fields_exactly(tmp_path: Path) -> None:
    clock = ManualClock()
    with deterministic(clock=clock), capture_spans(tmp_path, rank=2, **SESSIONS_ON) as cap:
        task = register_task("item-17")
        sid = register_session(task)
        clock.advance(0.25)
        with trace_session_phase("generate", session_id=sid):
            clock.advance(1.5)
        with trace_session_phase("reward", session_id=sid):
            clock.advance(0.1)
        h = trace_session_event("mark_toolcall_start", session_id=sid)
        clock.advance(0.05)
        trace_session_event("mark_toolcall_end", session_id=sid, handle=h)
        clock.advance(0.1)
        trace_session_event("mark_finalized", session_id=sid, status="rejected", reason="stale_weight")
        [span] = cap.by_name("rl.session")
        path = cap.log_dir / "session_tracer" / "sessions-r2.jsonl"
        rltrace.flush()
        [rec] = read_jsonl(path)

    def ts(seconds: float) -> float:
        return (T0 + round(seconds * 1e9)) / 1e9

    expected = {
        "task_id": "item-17", "session_id": sid, "rank": 2, "status": "rejected", "reason": "stale_weight",
        "submit_ts": ts(0), "finalized_ts": ts(2.0), "total_s": 2.0,
        "generate_s": 1.5, "reward_s": 0.1, "toolcall_s": 0.05,
        "phases": {
            "generate": [{"start_ts": ts(0.25), "end_ts": ts(1.75), "turn": 0}],
            "reward": [{"start_ts": ts(1.75), "end_ts": ts(1.85), "turn": 0}],
            "toolcall": [{"start_ts": ts(1.85), "end_ts": ts(1.9), "turn": 0}],
        },
        "trace_id": f"{span.context.trace_id:032x}",
        "turns": 1,
        "step": None,
        "phase_counts": {"generate": 1, "reward": 1, "toolcall": 1},
    }
    assert list(rec.items()) == list(expected.items())
    assert span.attributes["rl.session.total_s"] == 2.0
    assert span.attributes["rl.session.generate_s"] == 1.5
    assert span.attributes["rl.session.turns"] == 1


# ---- flush threshold, shutdown and exit (AReaL defect 6) -------------------------------------------------


def test_records_below_flush_threshold_wait_for_explicit_flush(tmp_path: Path) -> None:
    path = configure_sessions_only(tmp_path, flush_interval_s=3600, session_tracer={"flush_threshold": 100})
    for _ in range(150):
        finished_session()
    assert line_count(path) == 0
    runtime.get_pipeline().flush(everything=False)  # what the background cycle does
    assert line_count(path) == 100
    rltrace.flush()
    assert line_count(path) == 150
    assert len({r["session_id"] for r in read_jsonl(path)}) == 150


def test_sessions_below_flush_threshold_are_written_at_shutdown_with_span_tracing_off(tmp_path: Path) -> None:
    path = configure_sessions_only(tmp_path, session_tracer={"flush_threshold": 100})
    done = [finished_session() for _ in range(3)]
    still_open = register_session()
    trace_session_event("mark_generate_start", session_id=still_open)
    with trace_session_phase("reward", session_id=still_open):
        pass
    runtime.get_pipeline().flush(everything=False)
    assert line_count(path) == 0, "below the threshold nothing should be written before an explicit flush"
    rltrace.shutdown()

    records = {r["session_id"]: r for r in read_jsonl(path)}
    assert set(records) == {*done, still_open}
    assert all(records[s]["status"] == "accepted" for s in done)
    rec = records[still_open]
    assert (rec["status"], rec["reason"]) == ("pending", "open at shutdown")
    [gen] = rec["phases"]["generate"]
    assert gen["end_ts"] == pytest.approx(rec["finalized_ts"], abs=1e-6) and gen["interrupted"] is True
    assert "interrupted" not in rec["phases"]["reward"][0]
    assert runtime.RUNTIME.sessions.open_counts() == {"open_tasks": 0, "open_sessions": 0}


def test_sessions_are_written_at_interpreter_exit_without_shutdown(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import rltrace
        rltrace.configure(fileroot={str(tmp_path)!r}, enabled=False,
                          session_tracer={{"enabled": True, "flush_threshold": 100}})
        for _ in range(3):
            sid = rltrace.register_session()
            with rltrace.trace_session_phase("generate", session_id=sid):
                pass
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        sid = rltrace.register_session()
        rltrace.trace_session_event("mark_generate_start", session_id=sid)
        print(rltrace.diagnostics()["log_dir"])
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    log_dir = Path(proc.stdout.strip().splitlines()[-1])
    records = read_jsonl(log_dir / "session_tracer" / "sessions-r0.jsonl")
    assert sorted(r["status"] for r in records) == ["accepted"] * 3 + ["pending"]
    [pending] = [r for r in records if r["status"] == "pending"]
    assert pending["phases"]["generate"][0]["end_ts"] is not None


# ---- OTel metrics --------------------------------------------------------------------------------


def test_session_metrics_reach_an_otel_metric_reader_by_status(tmp_path: Path) -> None:
    reader = InMemoryMetricReader()

    @session_context()
    def failing() -> None:
        with trace_session_phase("generate"):
            pass
        raise RuntimeError("oom")

    with capture_spans(tmp_path, metric_readers=[reader], **SESSIONS_ON):
        for _ in range(3):
            finished_session("accepted")
        for _ in range(2):
            finished_session("rejected", reason="stale_weight")
        with pytest.raises(RuntimeError):
            failing()
        rltrace.flush()
        records = read_jsonl(runtime.get_pipeline().sessions_path)
        data = reader.get_metrics_data()

    points: dict[str, dict[str, Any]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for dp in metric.data.data_points:
                    points.setdefault(metric.name, {})[dp.attributes.get("rl.session.status")] = dp
    by_status = {"accepted": 3, "rejected": 2, "failed": 1}
    assert {s: dp.value for s, dp in points["rl.sessions"].items()} == by_status
    durations = points["rl.session.duration"]
    assert {s: dp.count for s, dp in durations.items()} == by_status
    for status, dp in durations.items():
        total = sum(r["total_s"] for r in records if r["status"] == status)
        assert dp.sum == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert {s: dp.count for s, dp in points["rl.phase.duration"].items()} == by_status


# ---- SessionMetricsProcessor outside rltrace ----------------------------------------------------------


@pytest.mark.parametrize("flight", [True, False])
def test_a_session_brings_its_phases_so_nothing_is_held_for_it_while_it_is_open(
        tmp_path: Path, flight: bool) -> None:
    """Each phase execution notes itself in its session as it ends: after export cycles that
    took the executions' records, the session processor holds nothing for the open session
    (it used to hold them until the session ended), with or without the flight recorder, and
    the record, once the session is finalized, has every execution with its turn, the token
    counts its executions reported, and the interrupted one marked."""
    path = configure_sessions_only(tmp_path, flush_interval_s=3600,
                                   session_tracer={"flush_threshold": 1, "flight_recorder": flight})
    p = runtime.get_pipeline()
    sid = register_session()
    with trace_session_phase("generate", {"input_tokens": 7}, {"output_tokens": 30}, session_id=sid):
        pass
    with trace_session_phase("reward", session_id=sid):
        pass
    h = trace_session_event("mark_generate_start", session_id=sid)
    p.flush(everything=False)  # the background cycle: the two ended executions' records go
    assert p.session_processor is not None and p.session_processor.open_sessions() == 0
    assert line_count(path) == 0  # the session is still open
    trace_session_event("mark_finalized", session_id=sid, status="accepted")  # closes h
    assert h.closed
    rltrace.flush()
    [rec] = read_jsonl(path)
    assert [(e["turn"], e.get("interrupted", False)) for e in rec["phases"]["generate"]] == [
        (0, False), (1, True)]
    assert [e["turn"] for e in rec["phases"]["reward"]] == [0]
    assert rec["phase_counts"] == {"generate": 2, "reward": 1} and rec["turns"] == 2
    assert (rec["input_tokens"], rec["output_tokens"]) == (7, 30)
    assert rltrace.diagnostics()["sessions"]["late_phases"] == 0
    assert p.session_processor.open_sessions() == 0


def test_executions_at_the_same_instant_with_and_without_a_turn_make_one_record(tmp_path: Path) -> None:
    """Spans of another framework may carry no ``rl.turn`` and equal times (a coarse clock): the
    executions are ordered by their times only, never by comparing a turn of None with an int."""
    path = tmp_path / "sessions.jsonl"
    proc = rltrace.SessionMetricsProcessor(SessionRecordWriter(path, 1), rank=0)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("my-rl-framework")
    session = tracer.start_span("rl.session", start_time=T0, attributes={"rl.session.id": "s-1"})
    ctx = trace.set_span_in_context(session)
    for turn in (None, 0, None):
        attrs = {"rl.session.id": "s-1", "rl.phase": "reward", **({} if turn is None else {"rl.turn": turn})}
        tracer.start_span("reward", context=ctx, start_time=T0, attributes=attrs).end(end_time=T0)
    session.end(end_time=T0)
    [rec] = read_jsonl(path)
    provider.shutdown()
    assert [e.get("turn") for e in rec["phases"]["reward"]] == [None, 0, None]  # as they ended
    assert rec["phase_counts"] == {"reward": 3} and rec["turns"] == 1


def test_processor_builds_a_record_from_plain_otel_sdk_spans(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    proc = rltrace.SessionMetricsProcessor(SessionRecordWriter(path, 1), rank=4)
    provider = TracerProvider()
    provider.add_span_processor(proc)
    tracer = provider.get_tracer("my-rl-framework")

    def ns(seconds: float) -> int:
        return T0 + round(seconds * 1e9)

    session = tracer.start_span("rl.session", start_time=ns(0),
                                attributes={"rl.session.id": "s-1", "rl.task.id": "t-1"})
    ctx = trace.set_span_in_context(session)
    for name, turn, start, end, extra in [
        ("generate", 0, 0.1, 0.6, {}),
        ("toolcall", 0, 0.6, 0.7, {}),
        ("generate", 1, 0.7, 0.9, {}),
        ("reward", 1, 0.9, 1.0, {"rl.phase.interrupted": True}),
    ]:
        attrs = {"rl.session.id": "s-1", "rl.phase": name, "rl.turn": turn, **extra}
        span = tracer.start_span(name, context=ctx, start_time=ns(start), attributes=attrs)
        span.end(end_time=ns(end))
    tracer.start_span("unrelated").end()
    session.set_attribute("rl.session.status", "accepted")
    session.end(end_time=ns(1.2))

    [rec] = read_jsonl(path)  # flush_threshold 1: written as the session span ended
    assert proc.open_sessions() == 0 and proc.sessions == 1
    provider.shutdown()

    def ts(seconds: float) -> float:
        return ns(seconds) / 1e9

    assert list(rec.items()) == list({
        "task_id": "t-1", "session_id": "s-1", "rank": 4, "status": "accepted", "reason": None,
        "submit_ts": ts(0), "finalized_ts": ts(1.2), "total_s": 1.2,
        "generate_s": 0.7, "reward_s": 0.1, "toolcall_s": 0.1,
        "phases": {
            "generate": [{"start_ts": ts(0.1), "end_ts": ts(0.6), "turn": 0},
                         {"start_ts": ts(0.7), "end_ts": ts(0.9), "turn": 1}],
            "toolcall": [{"start_ts": ts(0.6), "end_ts": ts(0.7), "turn": 0}],
            "reward": [{"start_ts": ts(0.9), "end_ts": ts(1.0), "turn": 1, "interrupted": True}],
        },
        "trace_id": f"{session.get_span_context().trace_id:032x}",
        "turns": 2,
        "step": None,
        "phase_counts": {"generate": 2, "toolcall": 1, "reward": 1},
    }.items())


# ---- bounded state over a long run ----------------------------------------------------------------------


def test_two_hundred_thousand_sessions_leave_no_state_and_flat_memory(tmp_path: Path) -> None:
    """No per-session state survives finalization, whatever the run length.

    Memory is checked two ways: live pymalloc blocks over the whole run after a 20k warm-up (a
    leak of one object per session would add 180k), and tracemalloc over the last 30k sessions
    (too slow to run for all 200k) after 20k traced sessions have refilled the bounded caches
    (e.g. the recent-task/session map used for links), so a leak of 50 bytes per session fails.
    """
    warmup, untraced, refill, window, flush_every = 20_000, 130_000, 20_000, 30_000, 1_000
    rltrace.configure(fileroot=str(tmp_path), exporters={"chrome": False}, flush_at_exit=False,
                      max_queue_size=8_192, **SESSIONS_ON)
    p = runtime.get_pipeline()
    path = p.sessions_path
    dropped_before = rltrace.diagnostics()["dropped"]  # process-wide: see the test below

    def run(n: int) -> None:
        for i in range(n):
            task = register_task()
            sid = register_session(task)
            with trace_session_phase("generate", session_id=sid):
                pass
            with trace_session_phase("reward", session_id=sid):
                pass
            trace_session_event("mark_finalized", session_id=sid, status="accepted")
            if i % flush_every == flush_every - 1:
                rltrace.flush()

    def settled() -> None:
        rltrace.flush()
        gc.collect()

    run(warmup)
    settled()
    blocks = sys.getallocatedblocks()
    run(untraced)
    tracemalloc.start()
    try:
        run(refill)
        settled()
        base = tracemalloc.get_traced_memory()[0]
        run(window)
        settled()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    gc.collect()
    grown_blocks = sys.getallocatedblocks() - blocks

    total = warmup + untraced + refill + window
    assert total >= 200_000
    assert runtime.RUNTIME.sessions.open_counts() == {"open_tasks": 0, "open_sessions": 0}
    assert p.session_processor.open_sessions() == 0
    diag = rltrace.diagnostics()
    assert diag["dropped"] == dropped_before and diag["misuse"] == {}
    assert line_count(path) == total
    assert grown_blocks < 20_000, f"{grown_blocks} more live objects after {total - warmup} sessions"
    assert grown < 1_500_000, f"memory grew by {grown / 1e6:.2f} MB over {window} sessions"


def test_a_full_queue_keeps_every_task_session_and_phase_record_and_leaves_no_state(
    tmp_path: Path,
) -> None:
    """A one-slot queue: tasks, sessions and phases (the session records' input) are never
    dropped; the recording thread exports a batch itself when the queue is full (issue 13,
    item 4: before, the reward phases and task spans here were dropped)."""
    path = configure_sessions_only(tmp_path, flush_interval_s=3600, max_queue_size=1)
    for _ in range(50):
        sid = register_session()
        with trace_session_phase("generate", session_id=sid):  # fits the one-slot queue
            pass
        with trace_session_phase("reward", session_id=sid):  # the queue is full: backpressure
            pass
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.flush()
    diag = rltrace.diagnostics()
    assert diag["dropped"] == 0 and diag["backpressure_cycles"] >= 50
    assert runtime.RUNTIME.sessions.open_counts() == {"open_tasks": 0, "open_sessions": 0}
    assert runtime.get_pipeline().session_processor.open_sessions() == 0
    records = read_jsonl(path)
    assert len(records) == 50  # no session lost
    assert all(r["phase_counts"] == {"generate": 1, "reward": 1} for r in records)


def test_a_new_pipeline_reports_only_its_own_drops(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path / "first"), flush_at_exit=False, flush_interval_s=3600,
                      max_queue_size=1, session_tracer={"enabled": True})
    for name in ("first", "second"):  # the second plain span overflows the one-slot queue
        with rltrace.trace_scope(name):
            pass
    if rltrace.diagnostics()["dropped"] == 0:
        raise RuntimeError("precondition: the tiny queue was expected to drop spans")
    rltrace.shutdown()
    configure_sessions_only(tmp_path / "second")
    finished_session()
    rltrace.flush()
    assert rltrace.diagnostics()["dropped"] == 0


def test_a_late_execution_is_late_beside_an_identical_one_that_ended_in_time(tmp_path: Path) -> None:
    """The session processor once matched an execution's record against its session's log by
    (phase, start, end): a late execution with the times of one in the record counted as in
    time.  It is matched by identity now.  The late record is handed to the processor directly
    (a late execution arises from a race with the exporter's cycle, not from a program)."""
    from rltrace.sessions.records import PhaseScope

    with capture_spans(tmp_path, session_tracer={"enabled": True}, clock=lambda: 1_000):  # one time
        reg = runtime.RUNTIME.sessions
        sid = register_session()
        sess = reg.sessions[sid]
        with trace_session_phase("generate", session_id=sid):
            pass
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.flush()
        proc = runtime.get_pipeline().session_processor  # type: ignore[union-attr]
        assert proc is not None and proc.late_phases == 0
        assert type(sess.phase_log) is tuple and len(sess.phase_log) == 1  # the record is built
        late = PhaseScope(reg.phases.get("generate"), None, None, 0, sid, reg)
        late.parent, late.start_ns, late.end_ns = sess, 1_000, 1_000  # the in-time one's times
        errors: list[Any] = []
        proc.on_records([late], lambda rec, exc: errors.append(exc))
        assert errors == [] and proc.late_phases == 1
