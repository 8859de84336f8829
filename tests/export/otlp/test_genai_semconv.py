"""Sessions as agent runs in the OTel GenAI conventions (issue 41): what rltrace's OTel spans carry,
read from its span processors (``ReadableSpan``) and from the wire (the in-process OTLP receiver,
which decodes what a collector would get), with and without ``OTEL_SEMCONV_STABILITY_OPT_IN=
gen_ai_latest_experimental``.  Phoenix's reading of the same attributes is tested in
``test_otlp_phoenix.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rltrace
from rltrace.semconv import evaluation_result, genai_latest_experimental
from rltrace.testing import capture_spans, read_jsonl
from rltrace.testing.otlp_receiver import OTLPReceiver

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"


def agent_task(reward_payload: dict[str, Any] | None) -> Any:
    """A task of one session: generate, a ``python`` tool call and a reward phase with
    ``reward_payload`` as its end payload."""
    task = rltrace.register_task()
    sid = rltrace.register_session(task)
    with rltrace.trace_session_phase("generate", session_id=sid,
                                     start_payload={"model": "qwen", "input_tokens": 9},
                                     end_payload={"output_tokens": 4}):
        pass
    with rltrace.trace_session_phase("toolcall", session_id=sid, start_payload={"tool_name": "python"}):
        pass
    with rltrace.trace_session_phase("reward", session_id=sid, end_payload=reward_payload):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    return sid


def by_name(spans: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in spans:
        assert s.name not in out, f"two spans named {s.name}"
        out[s.name] = s
    return out


def test_sessions_are_invoke_agent_and_tasks_invoke_workflow_keeping_names_and_rl_attributes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPT_IN, raising=False)
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        sid = agent_task({"reward": 0.75, "label": "partial", "explanation": "2 of 3 tests pass"})
        spans = by_name(cap.spans())
    assert set(spans) == {"rl.task", "rl.session", "generate", "toolcall", "reward"}  # names kept
    sess, task = spans["rl.session"].attributes, spans["rl.task"].attributes
    conversation = f"{spans['rl.session'].context.trace_id:032x}-{sid}"
    assert (sess["gen_ai.operation.name"], sess["gen_ai.agent.name"], sess["gen_ai.conversation.id"]) == (
        "invoke_agent", "rollout", conversation)
    assert (sess["rl.session.id"], sess["rl.session.status"]) == (sid, "accepted")
    assert (task["gen_ai.operation.name"], task["gen_ai.workflow.name"]) == ("invoke_workflow", "task")
    assert "gen_ai.conversation.id" not in task
    assert spans["generate"].attributes["gen_ai.operation.name"] == "text_completion"
    assert spans["toolcall"].attributes["gen_ai.tool.name"] == "python"
    assert not [k for k in spans["reward"].attributes if k.startswith("gen_ai.")]
    [ev] = spans["rl.session"].events
    assert ev.name == "gen_ai.evaluation.result"
    assert dict(ev.attributes) == {
        "gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": 0.75,
        "gen_ai.evaluation.score.label": "partial", "gen_ai.evaluation.explanation": "2 of 3 tests pass",
        "rl.phase": "reward", "rl.turn": 0, "rl.session.id": sid}
    reward = spans["reward"]
    assert reward.end_time is not None and ev.timestamp == reward.end_time


def test_a_reward_phase_without_a_score_adds_no_evaluation(tmp_path: Path) -> None:
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        agent_task(None)
        agent_task({"note": "no score here"})
        sessions = [s for s in cap.spans() if s.name == "rl.session"]
    assert len(sessions) == 2 and all(list(s.events) == [] for s in sessions)


def test_evaluation_takes_score_or_reward_from_either_payload_and_the_evaluator_name() -> None:
    assert evaluation_result("reward", 0, {"score": 3}, None) == {
        "gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.value": 3.0,
        "rl.phase": "reward", "rl.turn": 0}
    ev = evaluation_result("verify", 2, {"evaluator": "unit_tests"}, {"reward": True, "label": "pass"})
    assert ev is not None
    assert (ev["gen_ai.evaluation.name"], ev["gen_ai.evaluation.score.value"],
            ev["gen_ai.evaluation.score.label"]) == ("unit_tests", 1.0, "pass")
    assert evaluation_result("reward", 0, None, {"label": "wrong"}) == {
        "gen_ai.evaluation.name": "reward", "gen_ai.evaluation.score.label": "wrong",
        "rl.phase": "reward", "rl.turn": 0}
    # a score that is no number is no score; a generate's tokens are no evaluation
    assert evaluation_result("reward", 0, None, {"score": "high"}) is None
    assert evaluation_result("generate", 0, {"model": "m", "input_tokens": 3}, {"output_tokens": 5}) is None


@pytest.mark.parametrize(("value", "on"), [
    (None, False), ("", False), ("http", False), ("gen_ai_latest_experimental", True),
    ("http, gen_ai_latest_experimental", True), ("gen_ai_latest_experimental_x", False)])
def test_the_opt_in_is_one_entry_of_a_comma_separated_list(value: str | None, on: bool) -> None:
    assert genai_latest_experimental(value) is on


def test_the_opt_in_gives_spans_the_conventions_names_in_processors_and_on_the_wire(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with OTLPReceiver() as rx, capture_spans(
            tmp_path, session_tracer={"enabled": True},
            otlp={"endpoint": rx.grpc_endpoint, "protocol": "grpc", "timeout_s": 5.0,
                  "metrics": False}) as cap:
        sid = agent_task({"score": 1.0})
        with rltrace.trace_scope("train.ppo_update"):
            pass
        local = sorted(s.name for s in cap.spans())
        rltrace.flush()
        wire = rx.wait_for_spans(lambda s: s.name == "train.ppo_update", timeout=15)
        wire = rx.spans()
    expected = ["execute_tool python", "invoke_agent rollout", "invoke_workflow task", "reward",
                "text_completion qwen", "train.ppo_update"]
    assert local == expected
    assert sorted(s.name for s in wire) == expected  # the direct encoder names them alike
    agent = next(s for s in wire if s.name == "invoke_agent rollout")
    assert agent.attributes["rl.session.id"] == sid
    assert agent.attributes["gen_ai.conversation.id"] == f"{agent.trace_id}-{sid}"
    tool = next(s for s in wire if s.name == "execute_tool python")
    assert tool.attributes["rl.phase"] == "toolcall"  # queries by rltrace's attributes keep working


def test_the_chrome_trace_and_session_records_keep_rltraces_names_under_the_opt_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        agent_task({"score": 0.5})
        log_dir = cap.log_dir
    names = {line.split(b'"name":', 1)[1].split(b",", 1)[0]
             for f in log_dir.rglob("traces-r*.jsonl") for line in f.read_bytes().splitlines()
             if b'"ph":"X"' in line}
    assert {b'"rl.session"', b'"rl.task"', b'"generate"', b'"toolcall"', b'"reward"'} <= names
    assert not [n for n in names if n.startswith((b'"invoke_', b'"execute_tool'))]


def test_an_agent_name_the_user_sets_on_the_session_wins_and_names_the_span(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import trace

    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")

    @rltrace.session_context()
    def collect() -> Any:
        trace.get_current_span().set_attribute("gen_ai.agent.name", "math-solver")
        with rltrace.trace_session_phase("generate", start_payload={"model": "m"}):
            pass
        return rltrace.get_session_id()

    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        rltrace.set_task_id(rltrace.register_task())
        rltrace.trace_session_event("mark_finalized", session_id=collect(), status="accepted")
        [agent] = [s for s in cap.spans() if s.name.startswith("invoke_agent")]
    assert agent.name == "invoke_agent math-solver"
    assert agent.attributes["gen_ai.agent.name"] == "math-solver"
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"


@pytest.mark.parametrize("latest", [False, True])
def test_a_scored_session_encodes_on_the_direct_path_exactly_as_the_sdk_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, latest: bool) -> None:
    """Every scored session carries an evaluation event: the direct OTLP encoder encodes it (no
    detour through the SDK's encoder) into the same protobuf spans the SDK makes of them."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from rltrace import runtime
    from rltrace.pipeline.otlp_encode import RecordEncoder
    from rltrace.recording.recorder import STATE

    if latest:
        monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    else:
        monkeypatch.delenv(OPT_IN, raising=False)
    rltrace.configure(fileroot=str(tmp_path), flush_interval_s=3600, max_queue_size=1 << 20,
                      session_tracer={"enabled": True}, flush_at_exit=False)
    try:
        agent_task({"reward": 0.5, "label": "half"})
        agent_task({"score": 2})
        p = runtime.get_pipeline()
        assert p is not None
        recs = list(STATE.buffer)
        STATE.buffer.clear()
        for rec in recs:  # as the exporter cycle does: the session figures are set here
            for rp in p.record_processors:
                rp.on_record(rec)
        enc = RecordEncoder(p.builder)
        mine = {s.span_id: s for rs in enc.request(recs).resource_spans for ss in rs.scope_spans
                for s in ss.spans}
        ref = {s.span_id: s for rs in encode_spans([p.builder.build(r) for r in recs]).resource_spans
               for ss in rs.scope_spans for s in ss.spans}
    finally:
        STATE.buffer.clear()
        rltrace.shutdown()
    assert (enc.fast, enc.slow) == (len(recs), 0) and len(recs) == 10
    assert mine == ref
    sessions = [s for s in mine.values() if s.name in ("rl.session", "invoke_agent rollout")]
    assert [len(s.events) for s in sessions] == [1, 1]
    assert all(s.name == ("invoke_agent rollout" if latest else "rl.session") for s in sessions)


#: one rank of a two-rank run: a task of one session (its id is 0 on every rank) sent by OTLP
RANK = """
import sys, rltrace
fileroot, rank, endpoint = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rltrace.configure(fileroot=fileroot, experiment_name="conv", trial_name="t", rank=rank,
                  world_size=2, session_tracer={"enabled": True}, flush_at_exit=False,
                  otlp={"endpoint": endpoint, "protocol": "grpc", "timeout_s": 5.0, "metrics": False})
sid = rltrace.register_session(rltrace.register_task())
with rltrace.trace_session_phase("generate", session_id=sid, start_payload={"model": "m"}):
    pass
with rltrace.trace_session_phase("toolcall", session_id=sid, start_payload={"tool_name": "sh"}):
    pass
rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
rltrace.shutdown()
"""


def test_two_ranks_session_0_are_two_conversations_each_leading_to_its_session_record(
        tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OTEL_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with OTLPReceiver() as rx:
        for rank in (0, 1):
            proc = subprocess.run([sys.executable, "-c", RANK, str(tmp_path), str(rank),
                                   rx.grpc_endpoint], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
        wire = rx.wait_for_spans(lambda s: s.name == "rl.session", min_count=2)
        phases = rx.wait_for_spans(lambda s: s.attributes.get("rl.phase") is not None, min_count=4)
    records = [r for f in sorted(tmp_path.glob("logs/*/conv/t/session_tracer/**/*.jsonl"))
               for r in read_jsonl(f)]
    assert sorted(r["rank"] for r in records) == [0, 1]
    assert {r["session_id"] for r in records} == {s.attributes["rl.session.id"] for s in wire} == {0}
    # the session record's own fields name its conversation
    from_records = {f"{r['trace_id']}-{r['session_id']}" for r in records}
    conversations = {s.attributes["gen_ai.conversation.id"] for s in wire}
    assert conversations == from_records and len(conversations) == 2
    for s in wire:  # each session's generate and tool call are in its conversation, not the other's
        mine = [p for p in phases if p.trace_id == s.trace_id]
        assert sorted(p.attributes["rl.phase"] for p in mine) == ["generate", "toolcall"]
        assert {p.attributes["gen_ai.conversation.id"] for p in mine} == {
            s.attributes["gen_ai.conversation.id"]}
