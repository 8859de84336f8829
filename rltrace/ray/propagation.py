"""The caller's step and task across ``.remote()``: carried beside ``traceparent``.

Ray's own trace propagation carries the caller's trace context into each remote call; the
:class:`CallerContextPropagator` added to OpenTelemetry's global propagator carries, in the same
carrier, the caller's step (``rltrace.step(n)``, or AReaL's ``args={"global_step": n}``) and its
current task (``set_task_id``), so what the callee records carries the step and its sessions
join the caller's task.
"""

from __future__ import annotations

import json

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.trace import SpanContext, TraceFlags

from rltrace import runtime, sessions, steps

#: the context key the caller's step is extracted under, in the callee
STEP_KEY = steps.CALLER_STEP_KEY
_STEP_HEADER = "rltrace-step"
_TASK_HEADER = "rltrace-task"

class CallerContextPropagator(TextMapPropagator):
    """Carries the caller's step (``rltrace.step(n)`` or AReaL's ``global_step`` arg) and task
    (``set_task_id``: its id and its ``rl.task`` span) beside ``traceparent``, in
    ``rltrace-step`` and ``rltrace-task`` fields; extracted into the callee's context, where
    sessions registered without a task join the caller's task (in the caller's trace) and
    spans, tasks and sessions carry the step."""

    def inject(self, carrier: CarrierT, context: Context | None = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        step: object = steps.current_step()
        if step is None:
            step = steps.scope_arg_step()
        if step is None and context is not None:
            step = context.get(STEP_KEY)
        if step is None:
            step = otel_context.get_value(STEP_KEY)
        if step is not None:
            setter.set(carrier, _STEP_HEADER, str(step))
        task = _task_field()
        if task is not None:
            setter.set(carrier, _TASK_HEADER, task)

    def extract(self, carrier: CarrierT, context: Context | None = None,
                getter: Getter[CarrierT] = default_getter) -> Context:
        if context is None:
            context = otel_context.get_current()
        values = getter.get(carrier, _STEP_HEADER)
        if values:
            try:
                context = otel_context.set_value(STEP_KEY, int(values[0]), context)
            except ValueError:
                pass
        values = getter.get(carrier, _TASK_HEADER)
        if values:
            caller = _parse_task_field(values[0])
            if caller is not None:
                context = otel_context.set_value(sessions.CALLER_TASK_KEY, caller, context)
        return context

    @property
    def fields(self) -> set[str]:
        return {_STEP_HEADER, _TASK_HEADER}


def _task_field() -> str | None:
    """``[task_id, trace_id, span_id, flags]`` of the current task's span, as JSON (None when
    there is no current task, its id is not an int or str, or its span is unknown here)."""
    task_id = sessions.get_task_id()
    if task_id is None or type(task_id) not in (int, str):
        return None
    sc = runtime.RUNTIME.sessions.task_span_context(task_id, spread=True)
    if sc is None:
        caller = sessions.caller_task()  # a task this process runs for its own caller
        if caller is None or caller[0] != task_id:
            return None
        sc = caller[1]
    return json.dumps([task_id, f"{sc.trace_id:032x}", f"{sc.span_id:016x}", int(sc.trace_flags)])


def _parse_task_field(value: str) -> tuple[int | str, SpanContext] | None:
    try:
        task_id, trace_id, span_id, flags = json.loads(value)
        sc = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                         trace_flags=TraceFlags(int(flags)))
    except (ValueError, TypeError):
        return None
    return (task_id, sc) if sc.is_valid and type(task_id) in (int, str) else None


def install_propagator() -> None:
    """Add :class:`CallerContextPropagator` to the global propagator (once)."""
    current = propagate.get_global_textmap()
    props = getattr(current, "_propagators", [current])
    if any(isinstance(p, CallerContextPropagator) for p in props):
        return
    propagate.set_global_textmap(CompositePropagator([current, CallerContextPropagator()]))



def tracing_hook() -> None:
    """Ray's tracing startup hook: the tracer provider is rltrace's (set by ``configure``)."""
    install_propagator()
