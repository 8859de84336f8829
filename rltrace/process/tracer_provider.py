"""A global OTel tracer provider that always forwards to rltrace's current pipeline.

OpenTelemetry lets a process set its global tracer provider only once, but
:func:`rltrace.configure` may be called again.  rltrace therefore installs this small
delegating provider globally; tracers obtained from it (by any instrumentation library) start
their spans in whichever pipeline is configured at that moment, and are no-ops while rltrace
is not configured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import Attributes


class DelegatingTracerProvider(trace.TracerProvider):
    """Hands out tracers that resolve the real SDK tracer at each span start."""

    def __init__(self, current: Callable[[], trace.TracerProvider | None]) -> None:
        self._current = current

    def get_tracer(
        self, instrumenting_module_name: str, instrumenting_library_version: str | None = None,
        schema_url: str | None = None, attributes: Attributes = None,
    ) -> trace.Tracer:
        return _DelegatingTracer(
            self._current, instrumenting_module_name, instrumenting_library_version,
            schema_url, attributes,
        )


class _DelegatingTracer(trace.Tracer):
    def __init__(self, current: Callable[[], trace.TracerProvider | None], name: str,
                 version: str | None, schema_url: str | None, attributes: Attributes) -> None:
        self._current = current
        self._key = (name, version, schema_url, attributes)
        self._provider: trace.TracerProvider | None = None
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def _real(self) -> trace.Tracer:
        provider = self._current()
        if provider is None:
            return trace.NoOpTracer()
        if provider is not self._provider:
            name, version, schema_url, attributes = self._key
            self._tracer = provider.get_tracer(name, version, schema_url, attributes)
            self._provider = provider
        return self._tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._real().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._real().start_as_current_span(*args, **kwargs)
