"""Session lifecycle (AReaL's session tracer) against the real OTel SDK and the real records file.

Covers the AReaL profiling-guide workflow verbatim (``session_context``, ``atrace_session_phase``,
``trace_session``, ``trace_session_event``), overlapping and interrupted phases, custom phases
and misuse errors, multi-turn numbering, GenAI attributes and payloads, concurrency across
asyncio tasks and threads, training steps, and the disabled mode.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

import rltrace
from rltrace import perf_tracer, runtime
from rltrace.perf_tracer import (
    atrace_session_phase,
    session_context,
    trace_perf,
    trace_session,
    trace_session_event,
    trace_session_phase,
)
from rltrace.testing import CapturedSpans, capture_spans, read_jsonl

AREAL_FIELDS = ["task_id", "session_id", "rank", "status", "reason", "submit_ts", "finalized_ts",
                "total_s", "generate_s", "reward_s", "toolcall_s", "phases"]
#: slack between the epoch clock rltrace records with and the test's perf_counter stopwatch
EPS = 1e-3
SESSIONS_ON = {"session_tracer": {"enabled": True}}


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No caller rank/OTLP/RLTRACE_* settings; the phases a test registers, and the task and
    session it makes current, are forgotten after it (misuse counters start at zero with each
    ``configure``)."""
    clean_env(monkeypatch)
    registered = runtime.RUNTIME.phases.snapshot()
    yield
    runtime.RUNTIME.phases.restore(registered)
    # tests that make a task or session current in pytest's own context leave it to no other
    perf_tracer.set_task_id(None)
    perf_tracer.set_session_id(None)


# ---- helpers -----------------------------------------------------------------------------------


def sessions_path(cap: CapturedSpans) -> Path:
    return cap.log_dir / "session_tracer" / "sessions-r0.jsonl"


def session_records(cap: CapturedSpans) -> dict[Any, dict[str, Any]]:
    """Flush, then every record in the rank-0 sessions file by session id (each exactly once)."""
    rltrace.flush()
    path = sessions_path(cap)
    out: dict[Any, dict[str, Any]] = {}
    for rec in read_jsonl(path) if path.exists() else []:
        assert rec["session_id"] not in out, f"session {rec['session_id']} recorded twice"
        out[rec["session_id"]] = rec
    return out


def dur(item: dict[str, Any]) -> float:
    return item["end_ts"] - item["start_ts"]


def span_dur(span: ReadableSpan) -> float:
    return (span.end_time - span.start_time) / 1e9


def assert_timed(recorded: float, inner: float, outer: float, what: str) -> None:
    """``recorded`` lies between what the test measured inside and around the timed region."""
    assert inner - EPS <= recorded <= outer + EPS, (
        f"{what}: recorded {recorded:.4f}s, the test measured {inner:.4f}s inside and {outer:.4f}s around"
    )


def assert_child_of(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None, f"{child.name} has no parent, expected {parent.name}"
    assert child.parent.span_id == parent.context.span_id, f"{child.name} is not a child of {parent.name}"
    assert child.context.trace_id == parent.context.trace_id


def spans_by_attr(spans: list[ReadableSpan], name: str, attr: str) -> dict[Any, ReadableSpan]:
    out: dict[Any, ReadableSpan] = {}
    for s in spans:
        if s.name == name:
            key = s.attributes[attr]
            assert key not in out, f"two {name} spans with {attr}={key!r}"
            out[key] = s
    return out


def phase_spans(spans: list[ReadableSpan], sid: Any, phase: str | None = None) -> list[ReadableSpan]:
    return sorted(
        (s for s in spans if s.attributes.get("rl.phase") is not None
         and s.attributes.get("rl.session.id") == sid and (phase is None or s.name == phase)),
        key=lambda s: s.start_time,
    )


# ---- the AReaL guide workflow, verbatim -------------------------------------------------------------


class FakeEngine:
    """Stands in for an inference engine: generation takes a known time (the work being timed)."""

    async def agenerate(self, req: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        await asyncio.sleep(req["gen_s"])
        return {"output_tokens": [1, 2, 3], "gen_inner": time.perf_counter() - t0}


class RLVRWorkflow:
    """AReaL's RLVR workflow (profiling guide, Pattern 3), plus the test's own stopwatch."""

    def __init__(self, reward_s: float) -> None:
        self.reward_s = reward_s
        self.measured: dict[Any, dict[str, tuple[float, float]]] = {}
        self.reward_inner: dict[Any, float] = {}

    @trace_perf("rlvr_workflow.arun_episode", category="compute")
    async def arun_episode(self, engine: FakeEngine, data: dict[str, Any]) -> list[Any]:
        sample_results = await asyncio.gather(
            *[self._collect_samples(engine, {"gen_s": s}, data["prompt"], data) for s in data["gen_s"]]
        )
        return [sid for sid, _reward, _completion in sample_results]

    @session_context()
    async def _collect_samples(
        self, engine: FakeEngine, req: dict[str, Any], prompt_str: str, task_data: dict[str, Any]
    ) -> tuple[Any, float, str]:
        sid = perf_tracer.get_session_id()
        t0 = time.perf_counter()
        async with atrace_session_phase("generate"):
            resp = await engine.agenerate(req)
        t1 = time.perf_counter()
        reward, completion_str = await self._compute_rewards(resp, prompt_str, task_data)
        t2 = time.perf_counter()
        self.measured[sid] = {"generate": (resp["gen_inner"], t1 - t0),
                              "reward": (self.reward_inner[sid], t2 - t1)}
        return sid, reward, completion_str

    @trace_session("reward")
    async def _compute_rewards(
        self, resp: dict[str, Any], prompt_str: str, task_data: dict[str, Any]
    ) -> tuple[float, str]:
        t0 = time.perf_counter()
        await asyncio.sleep(self.reward_s)
        self.reward_inner[perf_tracer.get_session_id()] = time.perf_counter() - t0
        return 1.0, f"{prompt_str}:{len(resp['output_tokens'])}"


async def workflow_executor(
    workflow: RLVRWorkflow, engine: FakeEngine, data: dict[str, Any], finalize_by_task: bool
) -> tuple[Any, list[Any]]:
    """AReaL's WorkflowExecutor: register the task, run the episode, finalize its sessions."""
    task_id = perf_tracer.register_task()
    perf_tracer.set_task_id(task_id)
    session_ids = await workflow.arun_episode(engine, data)
    if finalize_by_task:
        trace_session_event("mark_finalized", task_id=task_id, status="accepted")
    else:
        for i, session_id in enumerate(session_ids):
            if i % 2 == 0:
                trace_session_event("mark_finalized", session_id=session_id, status="accepted")
            else:
                trace_session_event("mark_finalized", session_id=session_id, status="rejected",
                                    reason="stale_weight")
    return task_id, session_ids


def test_areal_guide_workflow_records_every_session_with_phases_and_span_tree(tmp_path: Path) -> None:
    engine, workflow = FakeEngine(), RLVRWorkflow(reward_s=0.01)

    async def main() -> list[tuple[Any, list[Any]]]:
        return await asyncio.gather(
            workflow_executor(workflow, engine, {"prompt": "p0", "gen_s": [0.03, 0.06, 0.09]}, False),
            workflow_executor(workflow, engine, {"prompt": "p1", "gen_s": [0.05, 0.02]}, True),
        )

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        (task0, sids0), (task1, sids1) = asyncio.run(main())
        spans = cap.spans()
        records = session_records(cap)

    expected = {sid: (task0, "accepted", None) if i % 2 == 0 else (task0, "rejected", "stale_weight")
                for i, sid in enumerate(sids0)}
    expected.update({sid: (task1, "accepted", None) for sid in sids1})
    assert len(expected) == 5 and task0 != task1
    assert set(records) == set(expected)

    task_spans = spans_by_attr(spans, "rl.task", "rl.task.id")
    session_spans = spans_by_attr(spans, "rl.session", "rl.session.id")
    assert set(task_spans) == {task0, task1}
    assert set(session_spans) == set(expected)
    assert len([s for s in spans if s.name == "rlvr_workflow.arun_episode"]) == 2

    for sid, rec in records.items():
        task_id, status, reason = expected[sid]
        keys = list(rec)
        assert keys[: len(AREAL_FIELDS)] == AREAL_FIELDS
        assert keys.index("trace_id") > keys.index("phases") and "turns" in keys
        assert (rec["task_id"], rec["session_id"], rec["rank"], rec["status"], rec["reason"]) == (
            task_id, sid, 0, status, reason)
        assert rec["total_s"] == pytest.approx(rec["finalized_ts"] - rec["submit_ts"], abs=1e-6)
        assert set(rec["phases"]) == {"generate", "reward"}
        [gen], [rew] = rec["phases"]["generate"], rec["phases"]["reward"]
        assert rec["submit_ts"] <= gen["start_ts"] <= gen["end_ts"] <= rew["start_ts"] <= rew["end_ts"]
        assert rew["end_ts"] <= rec["finalized_ts"]
        assert rec["generate_s"] == pytest.approx(dur(gen), abs=1e-6)
        assert rec["reward_s"] == pytest.approx(dur(rew), abs=1e-6)
        assert_timed(rec["generate_s"], *workflow.measured[sid]["generate"], f"generate of {sid}")
        assert_timed(rec["reward_s"], *workflow.measured[sid]["reward"], f"reward of {sid}")
        assert rec["toolcall_s"] == 0.0
        assert rec["turns"] == 1 and rec["phase_counts"] == {"generate": 1, "reward": 1}

        sess = session_spans[sid]
        assert_child_of(sess, task_spans[task_id])
        assert task_spans[task_id].parent is None, "a task is the root of its own trace"
        assert sess.attributes["rl.task.id"] == task_id
        assert sess.attributes["rl.session.status"] == status
        assert sess.attributes.get("rl.session.reason") == reason
        assert sess.attributes["rl.session.total_s"] == rec["total_s"]
        assert rec["trace_id"] == f"{sess.context.trace_id:032x}"
        assert (sess.start_time / 1e9, sess.end_time / 1e9) == pytest.approx(
            (rec["submit_ts"], rec["finalized_ts"]), abs=1e-6)
        children = phase_spans(spans, sid)
        assert [s.name for s in children] == ["generate", "reward"]
        for child in children:
            assert_child_of(child, sess)
            assert child.attributes["rl.phase"] == child.name
            assert child.attributes["rl.turn"] == 0
        assert span_dur(children[0]) == pytest.approx(rec["generate_s"], abs=1e-6)


# ---- overlapping executions of one phase --------------------------------------------------------


def test_overlapping_toolcall_scopes_in_one_session_are_both_recorded(tmp_path: Path) -> None:
    measured: dict[float, tuple[float, float]] = {}

    async def tool(d: float) -> None:
        t0 = time.perf_counter()
        async with atrace_session_phase("toolcall", start_payload={"d": d}):
            t1 = time.perf_counter()
            await asyncio.sleep(d)
            t2 = time.perf_counter()
        measured[d] = (t2 - t1, time.perf_counter() - t0)

    @session_context()
    async def sample() -> Any:
        await asyncio.gather(tool(0.06), tool(0.02))
        return perf_tracer.get_session_id()

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = asyncio.run(sample())
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
        rec = session_records(cap)[sid]

    tools = phase_spans(spans, sid, "toolcall")
    assert len(tools) == 2
    starts = [s.start_time for s in tools]
    ends = [s.end_time for s in tools]
    assert max(starts) < min(ends), "the two toolcalls were expected to overlap"
    for s in tools:
        d = s.attributes["rl.start.d"]
        assert_timed(span_dur(s), *measured[d], f"toolcall sleeping {d}s")
    assert sorted(dur(t) for t in rec["phases"]["toolcall"]) == pytest.approx(
        sorted(span_dur(s) for s in tools), abs=1e-6)
    assert rec["toolcall_s"] == pytest.approx(sum(span_dur(s) for s in tools), abs=1e-6)
    assert rec["phase_counts"] == {"toolcall": 2}


def test_overlapping_manual_toolcall_marks_pair_by_handle(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session(perf_tracer.register_task())
        a0 = time.perf_counter()
        first = trace_session_event("mark_toolcall_start", session_id=sid, tool_name="search")
        a1 = time.perf_counter()
        time.sleep(0.03)
        b0 = time.perf_counter()
        second = trace_session_event("mark_toolcall_start", session_id=sid, tool_name="python")
        b1 = time.perf_counter()
        time.sleep(0.02)
        b2 = time.perf_counter()
        trace_session_event("mark_toolcall_end", session_id=sid, handle=second)  # inner one first
        b3 = time.perf_counter()
        time.sleep(0.01)
        a2 = time.perf_counter()
        trace_session_event("mark_toolcall_end", session_id=sid, handle=first)
        a3 = time.perf_counter()
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
        rec = session_records(cap)[sid]

    tools = {s.attributes["gen_ai.tool.name"]: s for s in phase_spans(spans, sid, "toolcall")}
    assert set(tools) == {"search", "python"}
    assert_timed(span_dur(tools["search"]), a2 - a1, a3 - a0, "outer toolcall")
    assert_timed(span_dur(tools["python"]), b2 - b1, b3 - b0, "inner toolcall")
    assert tools["search"].start_time < tools["python"].start_time < tools["python"].end_time \
        < tools["search"].end_time
    items = rec["phases"]["toolcall"]
    assert [dur(i) for i in items] == pytest.approx(
        [span_dur(tools["search"]), span_dur(tools["python"])], abs=1e-6)
    assert rec["toolcall_s"] == pytest.approx(sum(dur(i) for i in items), abs=1e-6)
    assert rec["phase_counts"] == {"toolcall": 2}
    assert not any(i.get("interrupted") for i in items)


def test_mark_end_without_handle_closes_the_oldest_open_execution(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session()
        first = trace_session_event("mark_generate_start", session_id=sid)
        second = trace_session_event("mark_generate_start", session_id=sid)
        assert trace_session_event("mark_generate_end", session_id=sid) is first
        assert first.closed and not second.closed
        assert trace_session_event("mark_generate_end", session_id=sid) is second
        assert trace_session_event("mark_generate_end", session_id=sid) is None  # nothing open: misuse
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rec = session_records(cap)[sid]
        misuse = rltrace.diagnostics()["misuse"]
    assert rec["phase_counts"] == {"generate": 2}
    assert misuse == {"phase_not_started": 1}


# ---- interrupted phases ------------------------------------------------------------------------


def test_exception_escaping_session_context_fails_session_and_closes_open_phase(tmp_path: Path) -> None:
    seen: list[Any] = []

    @session_context()
    def sample() -> None:
        seen.append(perf_tracer.get_session_id())
        trace_session_event("mark_generate_start")
        raise RuntimeError("engine died")

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        with pytest.raises(RuntimeError, match="engine died"):
            sample()
        assert perf_tracer.get_session_id() is None, "the session id leaked out of session_context"
        spans = cap.spans()
        [sid] = seen
        rec = session_records(cap)[sid]
        open_after = rltrace.runtime.RUNTIME.sessions.open_counts()

    assert rec["status"] == "failed"
    assert "engine died" in rec["reason"] and "RuntimeError" in rec["reason"]
    [gen] = rec["phases"]["generate"]
    assert gen["end_ts"] is not None
    assert gen["interrupted"] is True
    assert gen["end_ts"] == pytest.approx(rec["finalized_ts"], abs=1e-6)
    sess = spans_by_attr(spans, "rl.session", "rl.session.id")[sid]
    assert sess.status.status_code is StatusCode.ERROR
    assert phase_spans(spans, sid, "generate")[0].attributes["rl.phase.interrupted"] is True
    assert open_after == {"open_tasks": 0, "open_sessions": 0}


def test_finalizing_a_task_closes_open_phases_at_finalize_time(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        task = perf_tracer.register_task()
        sids = [perf_tracer.register_session(task) for _ in range(2)]
        for sid in sids:
            trace_session_event("mark_generate_start", session_id=sid)
        with trace_session_phase("reward", session_id=sids[0]):
            pass
        trace_session_event("mark_finalized", task_id=task, status="dropped", reason="timeout")
        spans = cap.spans()
        records = session_records(cap)
        open_after = rltrace.runtime.RUNTIME.sessions.open_counts()

    assert set(records) == set(sids)
    for sid in sids:
        rec = records[sid]
        assert (rec["task_id"], rec["status"], rec["reason"]) == (task, "dropped", "timeout")
        [gen] = rec["phases"]["generate"]
        assert gen["end_ts"] is not None and gen["interrupted"] is True
        assert gen["end_ts"] == pytest.approx(rec["finalized_ts"], abs=1e-6)
    assert "interrupted" not in records[sids[0]]["phases"]["reward"][0]
    [task_span] = [s for s in spans if s.name == "rl.task"]
    assert task_span.end_time >= max(s.end_time for s in spans if s.name == "rl.session")
    assert open_after == {"open_tasks": 0, "open_sessions": 0}


def test_phase_scope_that_raises_is_interrupted_with_error_status(tmp_path: Path) -> None:
    @session_context()
    def sample() -> Any:
        try:
            with trace_session_phase("reward"):
                raise ValueError("bad reward model")
        except ValueError:
            pass
        with trace_session_phase("generate"):
            pass
        return perf_tracer.get_session_id()

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = sample()
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
        rec = session_records(cap)[sid]

    assert rec["status"] == "accepted"
    assert rec["phases"]["reward"][0]["interrupted"] is True
    assert "interrupted" not in rec["phases"]["generate"][0]
    [reward] = phase_spans(spans, sid, "reward")
    assert reward.status.status_code is StatusCode.ERROR
    assert "bad reward model" in reward.status.description
    assert reward.attributes["rl.phase.interrupted"] is True
    assert [e.name for e in reward.events] == ["exception"]
    assert phase_spans(spans, sid, "generate")[0].status.status_code is StatusCode.UNSET


# ---- custom phases and misuse ------------------------------------------------------------------


def test_registered_custom_phase_gets_spans_and_its_own_seconds_field(tmp_path: Path) -> None:
    rltrace.register_phase("validation")
    measured: list[tuple[float, float]] = []

    @trace_session("validation")
    def validate(d: float) -> str:
        t0 = time.perf_counter()
        time.sleep(d)
        measured.append((time.perf_counter() - t0, 0.0))
        return "valid"

    @session_context()
    def sample() -> Any:
        t0 = time.perf_counter()
        with trace_session_phase("validation"):
            t1 = time.perf_counter()
            time.sleep(0.02)
            t2 = time.perf_counter()
        measured.append((t2 - t1, time.perf_counter() - t0))
        t0 = time.perf_counter()
        assert validate(0.01) == "valid"
        measured[-1] = (measured[-1][0], time.perf_counter() - t0)
        return perf_tracer.get_session_id()

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = sample()
        other = perf_tracer.register_session()
        with trace_session_phase("generate", session_id=other):
            pass
        for s in (sid, other):
            trace_session_event("mark_finalized", session_id=s, status="accepted")
        spans = cap.spans()
        records = session_records(cap)

    rec = records[sid]
    assert list(rec)[: len(AREAL_FIELDS)] == AREAL_FIELDS
    assert rec["phase_counts"] == {"validation": 2}
    assert rec["validation_s"] == pytest.approx(sum(dur(i) for i in rec["phases"]["validation"]), abs=1e-6)
    val_spans = phase_spans(spans, sid, "validation")
    assert len(val_spans) == 2 and all(s.attributes["rl.phase"] == "validation" for s in val_spans)
    for s, (inner, outer) in zip(val_spans, measured, strict=True):
        assert_timed(span_dur(s), inner, outer, "validation")
    assert records[other]["validation_s"] == 0.0
    assert "validation" not in records[other]["phases"]


def test_unknown_phase_raises_at_the_call_site_naming_register_phase() -> None:
    fix = re.escape("register_phase('x')")
    for configured in (False, True):
        if configured:
            rltrace.configure(enabled=False, flush_at_exit=False, **SESSIONS_ON)
        with pytest.raises(rltrace.UnknownPhaseError, match=fix):
            trace_session_phase("x")
        with pytest.raises(rltrace.UnknownPhaseError, match=fix):
            atrace_session_phase("x")
        with pytest.raises(rltrace.UnknownPhaseError, match=fix):
            trace_session("x")
        with pytest.raises(rltrace.UnknownPhaseError, match=fix):
            trace_session_event("mark_x_start")
        with pytest.raises(rltrace.UnknownPhaseError, match=fix):
            trace_session_event("mark_x_end")
    assert issubclass(rltrace.UnknownPhaseError, ValueError)


def test_unknown_event_method_and_invalid_status_raise_value_error(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session()
        with pytest.raises(ValueError, match="unknown method 'finalize'"):
            trace_session_event("finalize", session_id=sid)
        with pytest.raises(ValueError, match="unknown method 'mark_generate'"):
            trace_session_event("mark_generate", session_id=sid)
        for bad in ("done", "pending", None):
            with pytest.raises(ValueError, match="status must be one of"):
                trace_session_event("mark_finalized", session_id=sid, status=bad)
        assert rltrace.runtime.RUNTIME.sessions.open_counts()["open_sessions"] == 1, \
            "a rejected call finalized the session"
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        assert session_records(cap)[sid]["status"] == "accepted"


def test_session_counters_through_rltraces_own_trace_session_event(tmp_path: Path) -> None:
    """``increment_counter`` is a session event of ``rltrace.trace_session_event`` itself (not only
    of the AReaL namespace): by session, by task, from context, written in ``counters``."""
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        task = rltrace.register_task()
        a, b = rltrace.register_session(task), rltrace.register_session(task)
        rltrace.trace_session_event("increment_counter", session_id=a, name="truncated")
        rltrace.trace_session_event("increment_counter", task_id=task, name="retries", value=2)
        rltrace.set_session_id(b)
        rltrace.trace_session_event("increment_counter", name="retries")
        rltrace.set_session_id(None)
        with pytest.raises(TypeError, match="use name= and value="):
            rltrace.trace_session_event("increment_counter", session_id=a, name="x", count=1)
        rltrace.trace_session_event("mark_finalized", task_id=task, status="accepted")
        recs = session_records(cap)
    assert recs[a]["counters"] == {"truncated": 1, "retries": 2}
    assert recs[b]["counters"] == {"retries": 3}


def test_misuse_is_counted_not_raised_and_records_nothing(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        with trace_session_phase("generate"):  # no session in context
            pass
        sid = perf_tracer.register_session()
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        trace_session_event("mark_finalized", session_id=sid, status="accepted")  # twice
        with trace_session_phase("reward", session_id=sid):  # already finalized
            pass
        spans = cap.spans()
        records = session_records(cap)
        misuse = rltrace.diagnostics()["misuse"]
    assert misuse == {"no_session": 1, "unknown_session": 2}
    assert list(records) == [sid] and records[sid]["phases"] == {}
    assert not [s for s in spans if "rl.phase" in s.attributes]


# ---- multi-turn --------------------------------------------------------------------------------


def test_generate_starts_turns_and_toolcalls_share_the_preceding_turn(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session()
        for phase in ("generate", "toolcall", "generate", "toolcall", "generate", "reward"):
            with trace_session_phase(phase, session_id=sid):
                pass
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
        rec = session_records(cap)[sid]
    assert rec["turns"] == 3
    assert [i["turn"] for i in rec["phases"]["generate"]] == [0, 1, 2]
    assert [i["turn"] for i in rec["phases"]["toolcall"]] == [0, 1]
    assert [i["turn"] for i in rec["phases"]["reward"]] == [2]
    assert [(s.name, s.attributes["rl.turn"]) for s in phase_spans(spans, sid)] == [
        ("generate", 0), ("toolcall", 0), ("generate", 1), ("toolcall", 1), ("generate", 2), ("reward", 2)]


def test_explicit_turn_overrides_the_automatic_counter(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session()
        with trace_session_phase("toolcall", session_id=sid):  # before any generate: turn 0
            pass
        with trace_session_phase("generate", session_id=sid, turn=5):
            pass
        with trace_session_phase("toolcall", session_id=sid):
            pass
        with trace_session_phase("toolcall", session_id=sid, turn=2):
            pass
        h = trace_session_event("mark_generate_start", session_id=sid, turn=9)
        trace_session_event("mark_generate_end", session_id=sid, handle=h)
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
        rec = session_records(cap)[sid]
    assert [(s.name, s.attributes["rl.turn"]) for s in phase_spans(spans, sid)] == [
        ("toolcall", 0), ("generate", 5), ("toolcall", 5), ("toolcall", 2), ("generate", 9)]
    assert [i["turn"] for i in rec["phases"]["generate"]] == [5, 9]
    assert rec["turns"] == 10
    assert "rl.start.turn" not in phase_spans(spans, sid, "generate")[1].attributes


# ---- GenAI attributes and payloads -----------------------------------------------------------------


def test_generate_span_carries_genai_attributes_and_payloads(tmp_path: Path) -> None:
    start_payload = {"model": "qwen2.5-7b", "input_tokens": 128}
    end_payload = {"finish_reason": "stop"}
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session()
        with trace_session_phase("generate", start_payload, end_payload, session_id=sid) as ph:
            ph.set_end_payload(output_tokens=64)
        with trace_session_phase("toolcall", {"tool_name": "calculator"}, session_id=sid):
            pass
        with trace_session_phase("reward", {"model": "rm-1"}, session_id=sid):
            pass
        h = trace_session_event("mark_generate_start", session_id=sid, model="m2", input_tokens=3)
        trace_session_event("mark_generate_end", session_id=sid, handle=h, output_tokens=5)
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        spans = cap.spans()
    assert start_payload == {"model": "qwen2.5-7b", "input_tokens": 128}, "caller's payload modified"
    assert end_payload == {"finish_reason": "stop"}, "caller's payload modified"
    gen, gen2 = phase_spans(spans, sid, "generate")
    assert {k: v for k, v in gen.attributes.items() if k.startswith(("gen_ai.", "rl.start.", "rl.end."))} == {
        "gen_ai.operation.name": "text_completion",
        "gen_ai.conversation.id": f"{gen.context.trace_id:032x}-{sid}",
        "gen_ai.request.model": "qwen2.5-7b",
        "gen_ai.usage.input_tokens": 128,
        "gen_ai.usage.output_tokens": 64,
        "rl.start.model": "qwen2.5-7b",
        "rl.start.input_tokens": 128,
        "rl.end.finish_reason": "stop",
        "rl.end.output_tokens": 64,
    }
    assert (gen2.attributes["gen_ai.request.model"], gen2.attributes["gen_ai.usage.input_tokens"],
            gen2.attributes["gen_ai.usage.output_tokens"], gen2.attributes["rl.end.output_tokens"]) == (
        "m2", 3, 5, 5)
    [tool] = phase_spans(spans, sid, "toolcall")
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "calculator"
    assert tool.attributes["gen_ai.conversation.id"] == gen.attributes["gen_ai.conversation.id"]
    [reward] = phase_spans(spans, sid, "reward")
    assert reward.attributes["rl.start.model"] == "rm-1"
    assert not [k for k in reward.attributes if k.startswith("gen_ai.")]


# ---- concurrency -------------------------------------------------------------------------------


def test_thousand_concurrent_sessions_across_tasks_and_threads_recorded_once(tmp_path: Path) -> None:
    per_task, loop_tasks, threads, thread_tasks = 4, 150, 4, 25

    @trace_session("reward")
    async def reward() -> float:
        await asyncio.sleep(0)
        return 1.0

    @session_context()
    async def collect() -> Any:
        async with atrace_session_phase("generate"):
            await asyncio.sleep(0)
        assert await reward() == 1.0
        return perf_tracer.get_session_id()

    async def executor(i: int) -> tuple[Any, list[Any]]:
        task_id = perf_tracer.register_task()
        perf_tracer.set_task_id(task_id)
        sids = await asyncio.gather(*[collect() for _ in range(per_task)])
        if i % 2:
            trace_session_event("mark_finalized", task_id=task_id, status="accepted")
        else:
            for sid in sids:
                trace_session_event("mark_finalized", session_id=sid, status="accepted")
        return task_id, list(sids)

    async def run_loop(n: int) -> list[tuple[Any, list[Any]]]:
        return await asyncio.gather(*[executor(i) for i in range(n)])

    results: list[tuple[Any, list[Any]]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def thread_main() -> None:
        try:
            start.wait(10)
            results.extend(asyncio.run(run_loop(thread_tasks)))
        except BaseException as exc:
            errors.append(exc)

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        dropped_before = rltrace.diagnostics()["dropped"]  # process-wide counter (see test_session_metrics)
        workers = [threading.Thread(target=thread_main) for _ in range(threads)]
        for w in workers:
            w.start()
        start.wait(10)
        results.extend(asyncio.run(run_loop(loop_tasks)))
        for w in workers:
            w.join(60)
        assert not errors, errors
        spans = cap.spans()
        records = session_records(cap)
        diag = rltrace.diagnostics()

    expected_task = {sid: task for task, sids in results for sid in sids}
    assert len(expected_task) == per_task * (loop_tasks + threads * thread_tasks) >= 1000
    assert len({task for task, _ in results}) == loop_tasks + threads * thread_tasks
    assert set(records) == set(expected_task)
    for sid, rec in records.items():
        assert rec["task_id"] == expected_task[sid]
        assert rec["status"] == "accepted"
        assert rec["phase_counts"] == {"generate": 1, "reward": 1}
    task_spans = spans_by_attr(spans, "rl.task", "rl.task.id")
    session_spans = spans_by_attr(spans, "rl.session", "rl.session.id")
    for sid, sess in session_spans.items():
        assert_child_of(sess, task_spans[expected_task[sid]])
    assert diag["misuse"] == {}
    assert diag["dropped"] == dropped_before
    assert diag["sessions"]["open_sessions"] == diag["sessions"]["open_tasks"] == 0


# ---- steps ---------------------------------------------------------------------------------------


def test_sessions_registered_inside_a_step_carry_it_in_records_and_spans(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        with rltrace.step(5):
            task = perf_tracer.register_task()
            sid = perf_tracer.register_session(task)
            with trace_session_phase("generate", session_id=sid):
                pass
        with rltrace.step(7):
            task7 = perf_tracer.register_task()
        late = perf_tracer.register_session(task7)  # outside the step: inherits the task's step
        outside = perf_tracer.register_session()
        for s in (sid, late, outside):
            trace_session_event("mark_finalized", session_id=s, status="accepted")
        spans = cap.spans()
        records = session_records(cap)
    assert (records[sid]["step"], records[late]["step"], records[outside]["step"]) == (5, 7, None)
    sess = spans_by_attr(spans, "rl.session", "rl.session.id")
    tasks = spans_by_attr(spans, "rl.task", "rl.task.id")
    assert sess[sid].attributes["rl.step"] == 5 and tasks[task].attributes["rl.step"] == 5
    assert phase_spans(spans, sid, "generate")[0].attributes["rl.step"] == 5
    assert sess[late].attributes["rl.step"] == 7
    assert "rl.step" not in sess[outside].attributes


# ---- disabled --------------------------------------------------------------------------------------


def _exercise_lifecycle_api() -> dict[str, Any]:
    """Run every lifecycle call in a context of its own (the ids it sets must not leak into
    later tests); return what they returned."""
    return contextvars.copy_context().run(_lifecycle_calls)


def _lifecycle_calls() -> dict[str, Any]:
    out: dict[str, Any] = {}

    @trace_session("reward")
    def reward(x: int) -> int:
        return x + 1

    @trace_session("generate")
    async def agen(x: int) -> int:
        await asyncio.sleep(0)
        return x * 2

    @session_context()
    def sample(x: int) -> int:
        with trace_session_phase("generate"):
            pass
        return reward(x)

    @session_context()
    async def asample(x: int) -> int:
        async with atrace_session_phase("toolcall"):
            pass
        return await agen(x)

    out["task"] = perf_tracer.register_task()
    perf_tracer.set_task_id(out["task"])
    out["sessions"] = [perf_tracer.register_session(out["task"]), perf_tracer.register_session()]
    perf_tracer.set_session_id(out["sessions"][0])
    out["current"] = (perf_tracer.get_task_id(), perf_tracer.get_session_id())
    out["sample"] = sample(1)
    out["asample"] = asyncio.run(asample(4))
    out["mark_start"] = trace_session_event("mark_generate_start")
    out["mark_end"] = trace_session_event("mark_generate_end")
    out["finalize"] = trace_session_event("mark_finalized", status="accepted")
    out["finalize_task"] = trace_session_event("mark_finalized", task_id=out["task"], status="rejected")
    return out


def _assert_lifecycle_noop(out: dict[str, Any]) -> None:
    assert isinstance(out["task"], int)
    s1, s2 = out["sessions"]
    assert isinstance(s1, int) and isinstance(s2, int) and s1 != s2
    assert out["current"] == (out["task"], s1)
    assert (out["sample"], out["asample"]) == (2, 8)
    assert out["mark_start"] is out["mark_end"] is out["finalize"] is out["finalize_task"] is None


def test_lifecycle_calls_are_noops_returning_ids_when_not_configured() -> None:
    assert not rltrace.is_configured()
    out = _exercise_lifecycle_api()
    _assert_lifecycle_noop(out)
    assert rltrace.runtime.RUNTIME.sessions.open_counts() == {"open_tasks": 0, "open_sessions": 0}
    assert runtime.RUNTIME.sessions.misuse == {}


def test_lifecycle_calls_record_nothing_when_session_tracer_is_off(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:  # span tracing on, session tracer off (the default)
        out = _exercise_lifecycle_api()
        spans = cap.spans()
        log_dir = cap.log_dir
        diag = rltrace.diagnostics()
    _assert_lifecycle_noop(out)
    assert not [s for s in spans if s.name in ("rl.task", "rl.session") or "rl.phase" in s.attributes]
    assert not (log_dir / "session_tracer").exists()
    assert diag["misuse"] == {} and "sessions" not in diag


def test_link_consumed_links_a_step_to_tasks_and_finished_sessions_through_their_task(
    tmp_path: Path,
) -> None:
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        task = rltrace.register_task()
        sid = rltrace.register_session(task)
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        with rltrace.step(3):
            assert rltrace.link_consumed(task_ids=[task], session_ids=[sid]) == 2
            assert rltrace.link_consumed(session_ids=["never-registered"]) == 0
        step, task_span = cap.one("train.step"), cap.one("rl.task")
    targets = [(lk.context.trace_id, lk.context.span_id) for lk in step.links]
    assert targets == [(task_span.context.trace_id, task_span.context.span_id)] * 2
    assert step.links[1].attributes["rl.session.id"] == sid


# ---- attributes set through the OTel API -----------------------------------------------------------


def test_attributes_set_on_session_and_phase_spans_reach_otel_spans_chrome_and_keep_rl_fields(
    tmp_path: Path,
) -> None:
    """Task, session and phase records build their ``rl.*`` attributes at export; attributes set
    through the OTel API (``get_current_span().set_attribute``) or a handle join them there, and
    finalization's status wins over a user-set one."""
    from opentelemetry import trace

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        task = perf_tracer.register_task()
        perf_tracer.set_task_id(task)

        @session_context()
        def sample() -> Any:
            trace.get_current_span().set_attribute("user.session_key", "s")
            trace.get_current_span().set_attribute("rl.session.status", "forged")
            with trace_session_phase("generate", {"model": "m"}, turn=2) as ph:
                trace.get_current_span().set_attribute("gen_ai.usage.output_tokens", 17)
                ph.set_end_payload(done=True)
            handle = trace_session_event("mark_reward_start")
            handle.set_attribute("user.reward_key", 0.5)
            trace_session_event("mark_reward_end", handle=handle, score=1.0)
            return perf_tracer.get_session_id()

        sid = contextvars.copy_context().run(sample)
        trace_session_event("mark_finalized", session_id=sid, status="rejected", reason="stale")
        spans = cap.spans()
        records = session_records(cap)
        chrome_path = rltrace.runtime.get_pipeline().chrome_path  # type: ignore[union-attr]
        rltrace.flush()
        chrome = [e for e in read_jsonl(chrome_path) if e.get("ph") == "X"]

    sess = spans_by_attr(spans, "rl.session", "rl.session.id")[sid]
    assert sess.attributes["user.session_key"] == "s"
    assert sess.attributes["rl.session.status"] == "rejected"
    assert sess.attributes["rl.session.reason"] == "stale"
    assert sess.attributes["rl.task.id"] == task
    assert sess.attributes["rl.session.total_s"] == pytest.approx(records[sid]["total_s"])
    (gen,) = phase_spans(spans, sid, "generate")
    assert gen.attributes["gen_ai.usage.output_tokens"] == 17
    assert gen.attributes["gen_ai.request.model"] == gen.attributes["rl.start.model"] == "m"
    assert gen.attributes["rl.end.done"] is True and gen.attributes["rl.turn"] == 2
    (rew,) = phase_spans(spans, sid, "reward")
    assert rew.attributes["user.reward_key"] == 0.5 and rew.attributes["rl.end.score"] == 1.0
    assert rew.attributes["rl.task.id"] == task and rew.attributes["rl.turn"] == 2
    by_name = {e["name"]: e["args"] for e in chrome if e["args"].get("rl.session.id") == sid}
    assert by_name["rl.session"]["user.session_key"] == "s"
    assert by_name["rl.session"]["rl.session.status"] == "rejected"
    assert by_name["generate"]["gen_ai.usage.output_tokens"] == 17
    assert by_name["reward"]["user.reward_key"] == 0.5
    assert records[sid]["status"] == "rejected" and records[sid]["turns"] == 3


def test_a_phase_object_records_one_execution_and_reuse_is_counted(tmp_path: Path) -> None:
    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session(perf_tracer.register_task())
        gen = trace_session_phase("generate", session_id=sid)
        with gen:
            pass
        with gen:  # misuse: the object already recorded its execution
            pass
        handle = trace_session_event("mark_reward_start", session_id=sid)
        with handle:  # a started handle used as a context manager ends with the block
            pass
        assert handle.closed
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        records = session_records(cap)
        misuse = rltrace.diagnostics()["misuse"]
    assert records[sid]["phase_counts"] == {"generate": 1, "reward": 1}
    assert misuse == {"phase_reused": 1}


def test_a_phase_ended_through_the_otel_span_api_is_recorded_with_that_end_time(tmp_path: Path) -> None:
    from opentelemetry import trace

    with capture_spans(tmp_path, **SESSIONS_ON) as cap:
        sid = perf_tracer.register_session(perf_tracer.register_task())
        with trace_session_phase("generate", session_id=sid) as ph:
            span = trace.get_current_span()
            assert span is ph and span.is_recording()
            t_end = ph.start_ns + 1_000_000
            span.end(end_time=t_end)  # what OTel instrumentation does with the current span
            assert not span.is_recording()
        with trace_session_phase("reward", session_id=sid) as ph2:
            ph2.end(ph2.start_ns + 2_000_000)  # positional, as Span.end(end_time)
        trace_session_event("mark_finalized", session_id=sid, status="accepted")
        records = session_records(cap)
        spans = cap.spans()
    (gen,) = phase_spans(spans, sid, "generate")
    assert gen.end_time == t_end and "rl.phase.interrupted" not in gen.attributes
    assert records[sid]["generate_s"] == pytest.approx(1e-3)
    assert records[sid]["reward_s"] == pytest.approx(2e-3)
