"""The current task and session of a context (asyncio tasks inherit them), and the caller's task
when it runs in another process (propagated into the OTel context)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext

from rltrace.recording.recorder import context_value

TASK_CV: ContextVar[Any] = ContextVar("rltrace_task_id", default=None)
SESSION_CV: ContextVar[Any] = ContextVar("rltrace_session_id", default=None)
#: OTel context key: the caller's task in another process, ``(task_id, SpanContext)`` of its
#: ``rl.task`` span (propagation puts it there: ``rltrace.ray`` across ``.remote()`` calls)
CALLER_TASK_KEY = otel_context.create_key("rltrace-caller-task")


def caller_task() -> tuple[Any, SpanContext] | None:
    """The caller's task in another process, from the OTel context (see ``CALLER_TASK_KEY``)."""
    found = context_value(CALLER_TASK_KEY)  # otel_context.get_value, without its layers
    return found if type(found) is tuple else None



def set_task_id(task_id: Any) -> None:
    """Make ``task_id`` the current task for this context (asyncio tasks inherit it)."""
    TASK_CV.set(task_id)


def get_task_id() -> Any:
    """The current task id in this context (else the caller's task in another process, when
    propagated: a Ray actor method called under the driver's task), or None."""
    task_id = TASK_CV.get()
    if task_id is None:
        caller = caller_task()
        if caller is not None:
            return caller[0]
    return task_id


def set_session_id(session_id: Any) -> None:
    """Make ``session_id`` the current session for this context."""
    SESSION_CV.set(session_id)


def get_session_id() -> Any:
    """The current session id in this context, or None."""
    return SESSION_CV.get()


