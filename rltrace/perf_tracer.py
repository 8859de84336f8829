"""AReaL ``perf_tracer`` compatibility namespace.

Code written against AReaL's profiling guide works unchanged with
``from rltrace import perf_tracer``; every name here is the rltrace implementation.
"""

from .config import TracerConfig as PerfTracerConfig
from .pipeline import configure, flush, is_configured, save, shutdown
from .spans import Category, atrace_scope, instant, trace_perf, trace_scope

__all__ = [
    "Category",
    "PerfTracerConfig",
    "atrace_scope",
    "configure",
    "flush",
    "instant",
    "is_configured",
    "save",
    "shutdown",
    "trace_perf",
    "trace_scope",
]
