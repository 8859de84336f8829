"""A task registered in one process, its sessions registered in another (``rltrace.ray``).

The caller's task travels beside ``traceparent`` (``CallerContextPropagator``); in the callee,
a session registered without a task joins it: a child of the caller's ``rl.task`` span, in
its trace, with the caller's task id in its record.  Here both sides run in one process, on
two pipelines one after the other (the caller's task is gone from the registry when the
callee runs, as it is in another process); ``tests/integrations/ray/test_ray.py`` does it across real Ray
actors.  No Ray cluster is needed: the propagator is plain OpenTelemetry.
"""

from __future__ import annotations

import contextvars
from pathlib import Path

from opentelemetry import context as otel_context

import rltrace
from rltrace.ray import CallerContextPropagator as Propagator
from rltrace.ray import RankAllocator, actor_options
from rltrace.testing import capture_spans, read_jsonl


def _caller(tmp_path: Path) -> tuple[dict[str, str], int, str, str]:
    """Register a task, make it current, inject; returns the carrier and the task's ids."""
    carrier: dict[str, str] = {}
    with capture_spans(tmp_path / "caller", session_tracer={"enabled": True}) as cap:

        def call() -> int:
            task = rltrace.register_task()
            rltrace.set_task_id(task)
            with rltrace.step(7):
                Propagator().inject(carrier)
            rltrace.trace_session_event("mark_finalized", task_id=task, status="accepted")
            return int(task)

        task_id = contextvars.copy_context().run(call)
        span = cap.one("rl.task")
    return carrier, task_id, f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def test_a_session_registered_without_a_task_joins_the_callers_task(tmp_path: Path) -> None:
    carrier, task_id, trace_id, span_id = _caller(tmp_path)
    assert set(carrier) == {"rltrace-step", "rltrace-task"}
    with capture_spans(tmp_path / "callee", session_tracer={"enabled": True}) as cap:

        def callee() -> None:
            token = otel_context.attach(Propagator().extract(carrier))
            try:
                assert rltrace.get_task_id() == task_id
                sid = rltrace.register_session()
                with rltrace.trace_session_phase("generate", session_id=sid):
                    pass
                rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
            finally:
                otel_context.detach(token)

        contextvars.Context().run(callee)  # empty, as in the actor's process
        spans = cap.spans()
        log_dir = cap.log_dir
    names = [s.name for s in spans]
    assert "rl.task" not in names  # the task's span is the caller's: recorded once, there
    (session,) = [s for s in spans if s.name == "rl.session"]
    assert f"{session.context.trace_id:032x}" == trace_id
    assert session.parent is not None and f"{session.parent.span_id:016x}" == span_id
    assert session.parent.is_remote
    assert session.attributes is not None and session.attributes["rl.task.id"] == task_id
    (record,) = [r for f in log_dir.rglob("sessions-*.jsonl") for r in read_jsonl(f)]
    assert (record["task_id"], record["trace_id"], record["step"]) == (task_id, trace_id, 7)


def test_without_a_caller_task_a_session_gets_a_task_of_its_own(tmp_path: Path) -> None:
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        token = otel_context.attach(Propagator().extract({"rltrace-task": "not json"}))
        try:
            sid = rltrace.register_session()
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        finally:
            otel_context.detach(token)
        task, session = cap.one("rl.task"), cap.one("rl.session")
    assert session.parent is not None and session.parent.span_id == task.context.span_id


def test_task_ids_that_are_not_int_or_str_are_not_propagated(tmp_path: Path) -> None:
    carrier: dict[str, str] = {}
    with capture_spans(tmp_path, session_tracer={"enabled": True}):

        def call() -> None:
            rltrace.set_task_id(rltrace.register_task(("tuple", 1)))
            Propagator().inject(carrier)

        contextvars.copy_context().run(call)
    assert "rltrace-task" not in carrier


def test_actor_ranks_are_unique_across_roles_unless_given() -> None:
    ranks = RankAllocator()
    assert [ranks.take(None), ranks.take(3), ranks.take(None), ranks.take(None), ranks.take(None)] \
        == [1, 3, 2, 4, 5]
    opts = actor_options("reward", name="rm", runtime_env={"env_vars": {"A": "1"}})
    env = opts["runtime_env"]["env_vars"]
    assert opts["name"] == "rm" and env["A"] == "1" and env["RLTRACE_ROLE"] == "reward"
    assert int(env["RLTRACE_RANK"]) >= 1
    other = actor_options("rollout")["runtime_env"]["env_vars"]["RLTRACE_RANK"]
    assert other != env["RLTRACE_RANK"]
