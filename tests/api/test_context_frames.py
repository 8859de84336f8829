"""An rltrace record is made current as a *frame* over the OTel context (no OTel ``Context`` is
built for it), and OTel's runtime context is wrapped to see it.  Everything code written for
OpenTelemetry does with the current context must see the same spans as if the record were in
the OTel context itself: these tests drive the public OTel API around and inside rltrace
scopes, across threads, ``contextvars`` copies and asyncio tasks.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from opentelemetry import context, trace
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk.trace import TracerProvider

import rltrace
from rltrace.recording import otel_context
from rltrace.testing import capture_spans


def _parent_id(span: Any) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_inside_a_scope_the_otel_api_sees_it_and_after_it_the_context_is_the_same_object(
        tmp_path: Path) -> None:
    before = context.get_current()
    with capture_spans(tmp_path):
        with rltrace.trace_scope("outer") as outer:
            assert trace.get_current_span() is outer
            current = context.get_current()
            assert current is context.get_current()  # one Context per frame, built on first ask
            assert current.get(otel_context.SPAN_KEY) is outer
            with rltrace.trace_scope("inner") as inner:
                assert trace.get_current_span() is inner
            assert trace.get_current_span() is outer
        assert context.get_current() is before  # nothing was left behind
        assert isinstance(context._RUNTIME_CONTEXT, otel_context.FrameAwareContext)  # type: ignore[attr-defined]
    assert not isinstance(context._RUNTIME_CONTEXT, otel_context.FrameAwareContext)  # type: ignore[attr-defined]


def test_otel_spans_and_rltrace_scopes_nest_in_both_directions(tmp_path: Path) -> None:
    tracer = TracerProvider().get_tracer("user")
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("rl.outer") as outer:
            with tracer.start_as_current_span("otel.mid") as mid:
                assert trace.get_current_span() is mid
                with rltrace.trace_scope("rl.inner") as inner:
                    assert trace.get_current_span() is inner
                assert trace.get_current_span() is mid
            assert trace.get_current_span() is outer  # the OTel span's context was detached
            with rltrace.trace_scope("rl.after"):
                pass
        spans = {s.name: s for s in cap.spans()}
    mid_id = mid.get_span_context().span_id
    assert mid.parent is not None and mid.parent.span_id == outer.get_span_context().span_id
    assert _parent_id(spans["rl.inner"]) == mid_id
    assert spans["rl.inner"].context.span_id == inner.get_span_context().span_id
    assert _parent_id(spans["rl.after"]) == spans["rl.outer"].context.span_id


def test_attaching_the_context_from_before_a_scope_hides_the_scope_until_detached(tmp_path: Path) -> None:
    """Code that makes the context it saved before a scope current again (to run something
    outside it) gets exactly that context's span, although it is the object the scope's frame
    was made current over."""
    tracer = TracerProvider().get_tracer("user")
    with capture_spans(tmp_path) as cap:
        with tracer.start_as_current_span("otel.root") as root:
            saved = context.get_current()
            with rltrace.trace_scope("rl.scope") as scope:
                token = context.attach(saved)
                try:
                    assert trace.get_current_span() is root
                    with rltrace.trace_scope("rl.outside"):
                        pass
                finally:
                    context.detach(token)
                assert trace.get_current_span() is scope
        spans = {s.name: s for s in cap.spans()}
    assert _parent_id(spans["rl.outside"]) == root.get_span_context().span_id
    assert _parent_id(spans["rl.scope"]) == root.get_span_context().span_id


def test_values_set_in_the_otel_context_inside_a_scope_keep_the_scope_current(tmp_path: Path) -> None:
    key = context.create_key("user-key")
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("rl.scope") as scope:
            token = context.attach(context.set_value(key, 7))
            try:
                assert context.get_value(key) == 7 and trace.get_current_span() is scope
                with rltrace.trace_scope("rl.child"):
                    assert context.get_value(key) == 7
            finally:
                context.detach(token)
            assert context.get_value(key) is None and trace.get_current_span() is scope
        spans = {s.name: s for s in cap.spans()}
    assert _parent_id(spans["rl.child"]) == spans["rl.scope"].context.span_id


def test_a_context_carried_to_a_thread_a_copy_or_a_task_carries_the_scope(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("rl.parent") as parent:
            carried = context.get_current()

            def in_thread() -> Any:
                token = context.attach(carried)  # as OTel's thread-pool instrumentation does
                try:
                    with rltrace.trace_scope("rl.thread"):
                        pass
                    return trace.get_current_span()
                finally:
                    context.detach(token)

            with ThreadPoolExecutor(1) as pool:
                seen_in_thread = pool.submit(in_thread).result(timeout=60)

            def in_copy() -> Any:
                with rltrace.trace_scope("rl.copy"):
                    pass
                return trace.get_current_span()

            seen_in_copy = contextvars.copy_context().run(in_copy)

            async def in_task() -> Any:
                with rltrace.trace_scope("rl.task"):
                    pass
                return trace.get_current_span()

            async def main() -> Any:
                return await asyncio.create_task(in_task())

            seen_in_task = asyncio.run(main())
        spans = {s.name: s for s in cap.spans()}
    assert seen_in_thread is parent and seen_in_copy is parent and seen_in_task is parent
    pid = spans["rl.parent"].context.span_id
    assert [_parent_id(spans[n]) for n in ("rl.thread", "rl.copy", "rl.task")] == [pid, pid, pid]


def test_a_session_and_its_phase_are_current_for_otel_code_inside_them(tmp_path: Path) -> None:
    tracer = TracerProvider().get_tracer("user")
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid) as phase:
            assert trace.get_current_span() is phase
            with tracer.start_as_current_span("http.call") as call:
                pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        generate = cap.one("generate")
    assert call.parent is not None and call.parent.span_id == generate.context.span_id


def test_a_runtime_context_replaced_after_import_is_followed(tmp_path: Path, caplog: Any) -> None:
    """Sentry's OpenTelemetry integration installs a runtime context of its own, and vLLM puts a
    new default one in place of Sentry's: code doing so after rltrace was imported must not cut
    rltrace's scopes off from OpenTelemetry's spans.  ``configure`` follows a replacement made
    before it (silently: rltrace had not wrapped it yet), the export cycle one made after it,
    with a log line: that code replaced the context rltrace had wrapped."""
    tracer = TracerProvider().get_tracer("user")
    saved = context._RUNTIME_CONTEXT  # type: ignore[attr-defined]
    try:
        context._RUNTIME_CONTEXT = ContextVarsRuntimeContext()  # type: ignore[attr-defined]
        with caplog.at_level(logging.INFO, logger="rltrace"):
            with capture_spans(tmp_path) as cap:
                assert isinstance(context._RUNTIME_CONTEXT, otel_context.FrameAwareContext)  # type: ignore[attr-defined]
                assert "runtime context was replaced" not in caplog.text
                with tracer.start_as_current_span("otel.outer") as outer:
                    with rltrace.trace_scope("rl.mid") as mid:
                        assert trace.get_current_span() is mid
                        with tracer.start_as_current_span("otel.inner") as inner:
                            pass
                context._RUNTIME_CONTEXT = ContextVarsRuntimeContext()  # type: ignore[attr-defined]
                rltrace.flush()  # an export cycle follows it
                assert "runtime context was replaced (now a ContextVarsRuntimeContext)" in caplog.text
                with tracer.start_as_current_span("otel.later") as later:
                    with rltrace.trace_scope("rl.later"):
                        pass
                spans = {s.name: s for s in cap.spans()}
    finally:
        context._RUNTIME_CONTEXT = saved  # type: ignore[attr-defined]
        rltrace.recording.recorder.follow_runtime_context()
    assert _parent_id(spans["rl.mid"]) == outer.get_span_context().span_id
    assert inner.parent is not None and inner.parent.span_id == mid.get_span_context().span_id
    assert _parent_id(spans["rl.later"]) == later.get_span_context().span_id
    assert rltrace.recording.recorder.STATE.ctx_get() is context.get_current()  # back on the original one


def test_a_scope_left_in_another_context_gives_way_to_the_one_it_was_entered_over(tmp_path: Path) -> None:
    """An async generator closed by another task leaves its scope in a context other than the
    one it entered it in: the token cannot be reset there, and where the scope is still
    current the frame it was made current over becomes current again."""
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("outer") as outer:
            entered_in = contextvars.copy_context()
            inner = rltrace.trace_scope("inner")
            entered_in.run(inner.__enter__)
            left_in = entered_in.run(contextvars.copy_context)  # inner is current there too

            def leave() -> Any:
                inner.__exit__(None, None, None)
                return trace.get_current_span()

            assert left_in.run(leave) is outer
            assert trace.get_current_span() is outer  # this context never had inner current
        spans = {s.name: s for s in cap.spans()}
    assert _parent_id(spans["inner"]) == spans["outer"].context.span_id
