"""The one place rltrace reaches past OpenTelemetry's public API, each use named and tested.

The hot path needs what the public API offers only at a higher cost (a contextvar ``get`` and
``set`` instead of ``context.get_current()``/``attach()`` with their token bookkeeping), and a
few things have no public API at all.  Everything private is taken here, once, with a fallback
where one exists; ``tests/test_otel_compat.py`` fails on an API/SDK version that breaks any of
them, so an upgrade that changes them is caught in CI, not in a user's training run.

- ``SPAN_KEY``: the context key under which the current span lives
  (``opentelemetry.trace.propagation._SPAN_KEY``); ``trace.set_span_in_context`` writes it.
- ``ctx_get``/``ctx_set``/``ctx_reset``: the contextvar behind the default runtime context
  (``ContextVarsRuntimeContext._current_context``), or the public ``get_current``/``attach``/
  ``detach`` when another runtime context was chosen with ``OTEL_PYTHON_CONTEXT``.
- ``SUPPRESS_INSTRUMENTATION_KEY``: the key OTel instrumentations check to stay silent
  (``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY``); rltrace's exporters run with it set
  so an instrumented HTTP client inside an exporter does not trace itself.
- ``remove_span_processor``: ``SynchronousMultiSpanProcessor`` has no ``remove``; its
  ``_span_processors`` tuple is replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace.propagation import _SPAN_KEY

SPAN_KEY = _SPAN_KEY
SUPPRESS_INSTRUMENTATION_KEY: str = otel_context._SUPPRESS_INSTRUMENTATION_KEY

_runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
if isinstance(_runtime, ContextVarsRuntimeContext):
    _cv = _runtime._current_context
    ctx_get, ctx_set, ctx_reset = _cv.get, _cv.set, _cv.reset
    FAST_CONTEXT = True
else:  # another runtime context (OTEL_PYTHON_CONTEXT): the public API
    ctx_get, ctx_set, ctx_reset = otel_context.get_current, otel_context.attach, otel_context.detach
    FAST_CONTEXT = False


@contextlib.contextmanager
def instrumentation_suppressed() -> Iterator[None]:
    """Run the block with OTel instrumentation suppressed (as the SDK's batch processor does)."""
    token = otel_context.attach(otel_context.set_value(SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        otel_context.detach(token)


def remove_span_processor(multi: Any, processor: Any) -> None:
    """Remove ``processor`` from an SDK multi span processor (there is no public ``remove``)."""
    procs = multi._span_processors
    multi._span_processors = tuple(p for p in procs if p is not processor)
