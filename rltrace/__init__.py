"""rltrace: OpenTelemetry-native tracing for reinforcement-learning training of LLMs.

One instrumentation, three outputs: OTel spans (OTLP), per-rank Chrome-trace files merged
into one Perfetto timeline, and per-session records and metrics.  The API is a superset of
AReaL's ``perf_tracer``: ``from rltrace import perf_tracer`` or ``import rltrace as perf_tracer``.

Table of contents
-----------------
configuration   configure, configure_child, is_configured, get_config, TracerConfig, ConfigError
spans           trace_scope, atrace_scope, trace_perf, instant, Category, current_span,
                step, current_step, set_policy_version, policy_version
flushing        save, flush, shutdown, diagnostics, summary, counter
sessions        register_task, set_task_id, get_task_id, register_session, set_session_id,
                get_session_id, session_context, trace_session, trace_session_phase,
                atrace_session_phase, trace_session_event, register_phase, SessionMetricsProcessor
metrics         stats (= stats_tracker): AReaL's stats_tracker, StatsLogger, timings from spans
OpenTelemetry   add_span_processor, tracer_provider, link_consumed,
                inject_headers, extract_context, server_span (W3C propagation)
records         add_record_processor, remove_record_processor, RecordProcessor (rltrace.seams)
"""

from rltrace import stats
from rltrace import stats as stats_tracker  # AReaL's name for the same module
from rltrace.config import (
    ConfigError,
    DeviceConfig,
    ExportersConfig,
    OTLPConfig,
    SessionTracerConfig,
    TracerConfig,
)
from rltrace.exporters.defaults import default_sinks
from rltrace.profiling import profile_steps
from rltrace.propagation import extract_context, inject_headers, server_span
from rltrace.recording.recorder import current_span
from rltrace.runtime import (
    RUNTIME,
    add_record_processor,
    add_span_processor,
    atrace_session_phase,
    configure,
    configure_child,
    counter,
    diagnostics,
    flush,
    get_config,
    is_configured,
    link_consumed,
    register_phase,
    register_session,
    register_task,
    remove_record_processor,
    save,
    session_context,
    shutdown,
    summary,
    trace_session,
    trace_session_event,
    trace_session_phase,
    tracer_provider,
)
from rltrace.seams import RecordProcessor
from rltrace.sessions import get_session_id, get_task_id, set_session_id, set_task_id
from rltrace.sessions.metrics_processor import SessionMetricsProcessor
from rltrace.sessions.phases import PhaseSpec, UnknownPhaseError
from rltrace.spans import Category, atrace_scope, instant, trace_perf, trace_scope
from rltrace.steps import current_step, policy_version, set_policy_version, step
from rltrace.version import __version__

# The composition point: the core builds no exporter, the package's face hands the runtime the
# sinks its pipelines write their local files with (rltrace.exporters depends on the core, never
# the reverse).
RUNTIME.sinks = default_sinks()

__all__ = [
    "Category",
    "ConfigError",
    "DeviceConfig",
    "ExportersConfig",
    "OTLPConfig",
    "PhaseSpec",
    "RecordProcessor",
    "SessionMetricsProcessor",
    "SessionTracerConfig",
    "TracerConfig",
    "UnknownPhaseError",
    "__version__",
    "add_record_processor",
    "add_span_processor",
    "atrace_scope",
    "atrace_session_phase",
    "configure",
    "configure_child",
    "counter",
    "current_span",
    "current_step",
    "diagnostics",
    "extract_context",
    "flush",
    "get_config",
    "get_session_id",
    "get_task_id",
    "inject_headers",
    "instant",
    "is_configured",
    "link_consumed",
    "policy_version",
    "profile_steps",
    "register_phase",
    "register_session",
    "register_task",
    "remove_record_processor",
    "save",
    "server_span",
    "session_context",
    "set_policy_version",
    "set_session_id",
    "set_task_id",
    "shutdown",
    "stats",
    "stats_tracker",
    "step",
    "summary",
    "trace_perf",
    "trace_scope",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
    "tracer_provider",
]
