"""AReaL ``perf_tracer`` compatibility namespace.

Code written against AReaL's profiling guide works unchanged with
``from rltrace import perf_tracer``; every name here is the rltrace implementation.
"""

from .config import TracerConfig as PerfTracerConfig
from .phases import register_phase
from .pipeline import configure, flush, is_configured, save, shutdown
from .sessions import (
    atrace_session_phase,
    get_session_id,
    get_task_id,
    register_session,
    register_task,
    session_context,
    set_session_id,
    set_task_id,
    trace_session,
    trace_session_event,
    trace_session_phase,
)
from .spans import Category, atrace_scope, instant, trace_perf, trace_scope

__all__ = [
    "Category",
    "PerfTracerConfig",
    "atrace_scope",
    "atrace_session_phase",
    "configure",
    "flush",
    "get_session_id",
    "get_task_id",
    "instant",
    "is_configured",
    "register_phase",
    "register_session",
    "register_task",
    "save",
    "session_context",
    "set_session_id",
    "set_task_id",
    "shutdown",
    "trace_perf",
    "trace_scope",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
]
