"""rltrace: OpenTelemetry-native tracing for reinforcement-learning training of LLMs.

One instrumentation, three outputs: OTel spans (OTLP), per-rank Chrome-trace files merged
into one Perfetto timeline, and per-session records and metrics.  The API is a superset of
AReaL's ``perf_tracer``: ``from rltrace import perf_tracer`` or ``import rltrace as perf_tracer``.

Table of contents
-----------------
configuration   configure, is_configured, get_config, TracerConfig, ConfigError
spans           trace_scope, atrace_scope, trace_perf, instant, Category, current_span
flushing        save, flush, shutdown, diagnostics
OpenTelemetry   add_span_processor, tracer_provider
"""

from .config import ConfigError, ExportersConfig, OTLPConfig, SessionTracerConfig, TracerConfig
from .pipeline import (
    add_span_processor,
    configure,
    diagnostics,
    flush,
    get_config,
    is_configured,
    save,
    shutdown,
    tracer_provider,
)
from .recorder import current_span
from .spans import Category, atrace_scope, instant, trace_perf, trace_scope
from .version import __version__

__all__ = [
    "Category",
    "ConfigError",
    "ExportersConfig",
    "OTLPConfig",
    "SessionTracerConfig",
    "TracerConfig",
    "__version__",
    "add_span_processor",
    "atrace_scope",
    "configure",
    "current_span",
    "diagnostics",
    "flush",
    "get_config",
    "instant",
    "is_configured",
    "save",
    "shutdown",
    "trace_perf",
    "trace_scope",
    "tracer_provider",
]
