"""The one place rltrace reaches past OpenTelemetry's public API, each use named and tested.

The hot path needs what the public API offers only at a higher cost (a contextvar ``get`` and
``set`` instead of ``context.get_current()``/``attach()`` with their token bookkeeping), and a
few things have no public API at all.  Everything private is taken here, once, with a fallback
where one exists; ``tests/api/test_otel_compat.py`` fails on an API/SDK version that breaks any of
them, so an upgrade that changes them is caught in CI, not in a user's training run.

- ``SPAN_KEY``: the context key under which the current span lives
  (``opentelemetry.trace.propagation._SPAN_KEY``); ``trace.set_span_in_context`` writes it.
- ``ctx_get``/``ctx_set``/``ctx_reset``: the contextvar behind the default runtime context
  (``ContextVarsRuntimeContext._current_context``), or the public ``get_current``/``attach``/
  ``detach`` when another runtime context was chosen with ``OTEL_PYTHON_CONTEXT``.
- ``frame_get``/``frame_set``/``frame_reset`` and :class:`FrameAwareContext`: an rltrace record
  is made current without building an OTel ``Context`` for it.  A contextvar of rltrace's own
  holds the innermost current record and the OTel context it was made current over (its
  *frame*); OTel's runtime context (``opentelemetry.context._RUNTIME_CONTEXT``) is wrapped, for
  the whole process, so that ``get_current()`` returns that context with the record as its
  span while the OTel context is still the frame's, and the OTel context itself once other
  code made another one current.  ``attach`` of the frame's own context object (code hiding
  the record on purpose) makes a copy current, so that it is not taken for the frame.
- ``SUPPRESS_INSTRUMENTATION_KEY``: the key OTel instrumentations check to stay silent
  (``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY``); rltrace's exporters run with it set
  so an instrumented HTTP client inside an exporter does not trace itself.
- ``remove_span_processor``: ``SynchronousMultiSpanProcessor`` has no ``remove``; its
  ``_span_processors`` tuple is replaced.
- ``encoded_span_exporter``: the SDK's OTLP span exporters take ``ReadableSpan``s only; rltrace
  encodes its records into the ``ExportTraceServiceRequest`` itself (:mod:`rltrace.otlp_encode`)
  and hands the request to the same exporter, keeping its transport, retries, headers,
  compression, TLS and timeouts.  gRPC: the exporter's ``_translate_data`` hook passes a
  pre-built request through; HTTP: ``_client.export(bytes)`` is what the exporter's own
  ``export`` calls after encoding.  Where the hook is missing the exporter is left as it is and
  rltrace builds ``ReadableSpan``s for it instead (slower, same spans).
- ``add_collect_source`` / ``reader_histogram_settings``: the SDK has no public way to add
  pre-aggregated points to what a ``MetricReader`` collects (the spec's MetricProducer is not
  in the Python SDK).  The reader's collect callback (``_collect``, set by the MeterProvider)
  is wrapped to append rltrace's session metrics, and the reader's preferred temporality and
  histogram aggregation (``_instrument_class_temporality``/``_aggregation``) are read so the
  points are what the SDK would have produced.  Without them rltrace records through the SDK.
- ``span_context_fields``: ``SpanContext`` is a tuple ``(trace_id, span_id, is_remote,
  trace_flags, trace_state, is_valid)`` whose ``__new__`` only fills defaults and computes
  ``is_valid``; rltrace's records build theirs as that tuple directly (the ids it draws are
  valid) when a probe shows the layout is still that one, else through ``SpanContext(...)``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context.context import Context, _RuntimeContext
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanContext, TraceFlags
from opentelemetry.trace.propagation import _SPAN_KEY

logger = logging.getLogger("rltrace")

SPAN_KEY = _SPAN_KEY
SUPPRESS_INSTRUMENTATION_KEY: str = otel_context._SUPPRESS_INSTRUMENTATION_KEY

#: the current OTel context (a ``dict``: its values typed ``Any`` here, read on the hot path),
#: read from the runtime context rltrace follows (:func:`follow_runtime_context`)
ctx_get: Callable[[], Any]
ctx_set: Callable[[Any], Any]
ctx_reset: Callable[[Any], Any]
FAST_CONTEXT = False
_followed: Any = None


def _follow(runtime: Any) -> None:
    global ctx_get, ctx_set, ctx_reset, FAST_CONTEXT, _followed
    if isinstance(runtime, ContextVarsRuntimeContext):
        cv = runtime._current_context
        ctx_get, ctx_set, ctx_reset, FAST_CONTEXT = cv.get, cv.set, cv.reset, True
    elif runtime is not None:  # another runtime context (OTEL_PYTHON_CONTEXT): its own methods
        ctx_get, ctx_set, ctx_reset = runtime.get_current, runtime.attach, runtime.detach
        FAST_CONTEXT = False
    else:  # pragma: no cover - an API without a runtime context object: the public functions
        ctx_get, ctx_set, ctx_reset = otel_context.get_current, otel_context.attach, otel_context.detach
        FAST_CONTEXT = False
    _followed = runtime


_follow(getattr(otel_context, "_RUNTIME_CONTEXT", None))

#: the innermost rltrace record made current: ``[record, the OTel context it was made current
#: over, the Context get_current() answers for it (built on first ask)]``; None: the OTel
#: context alone says what is current
FRAME: ContextVar[list[Any] | None] = ContextVar("rltrace_frame", default=None)
frame_get, frame_set, frame_reset = FRAME.get, FRAME.set, FRAME.reset


class FrameAwareContext(_RuntimeContext):
    """OTel's runtime context, wrapped so that it sees the rltrace record made current.

    ``get_current()`` is the OTel context with the frame's record as its span while the OTel
    context is the one the record was made current over, else the OTel context as it is (code
    made another one current inside the record, built from this method's answer: the record is
    in it as a parent).  Everything else is the wrapped runtime context's.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def attach(self, context: Any) -> Token[Any]:
        frame = frame_get()
        if frame is not None and context is frame[1]:
            context = Context(context)  # a copy: the same object would be taken for the frame
        token: Token[Any] = self.inner.attach(context)
        return token

    def get_current(self) -> Any:
        return effective_context(frame_get(), self.inner.get_current())

    def detach(self, token: Token[Any]) -> None:
        self.inner.detach(token)


def effective_context(frame: list[Any] | None, ctx: Any) -> Any:
    """What ``get_current()`` answers for this frame over this OTel context: for a frame over
    it, one Context with the frame's record as its span (the same object each time)."""
    if frame is not None and frame[1] is ctx:
        made = frame[2]
        if made is None:
            made = frame[2] = Context({**ctx, SPAN_KEY: frame[0]})
        return made
    return ctx


def follow_runtime_context() -> str | None:
    """Wrap OTel's runtime context and read the current context from it, again if other code
    replaced it since (Sentry's OpenTelemetry integration installs its own; vLLM puts a new
    default one in place of Sentry's).  Returns the replacing runtime context's type name when
    it followed a replacement, else None; the caller rebinds what it took of ``ctx_get``."""
    current = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    if current is None:  # pragma: no cover - an API without a runtime context object
        return None
    inner = current.inner if isinstance(current, FrameAwareContext) else current
    if inner is _followed and current is not inner:
        return None  # wrapped, and the one read from: the common case
    replaced = inner is not _followed
    _follow(inner)
    if current is inner:
        otel_context._RUNTIME_CONTEXT = FrameAwareContext(inner)
    if not replaced:
        return None
    name = type(inner).__qualname__
    logger.info("rltrace: OpenTelemetry's runtime context was replaced (now a %s) after rltrace "
                "was imported; rltrace follows the new one from now on", name)
    return name


follow_runtime_context()


def _probe_span_context_layout() -> Any:
    """OTel's default ``TraceState`` when ``SpanContext`` is still the tuple described above
    (a probe builds one both ways and compares every field), else None."""
    try:
        flags = TraceFlags(TraceFlags.SAMPLED)
        made = SpanContext(3, 5, False, flags)
        ours = tuple.__new__(SpanContext, (3, 5, False, flags, DEFAULT_TRACE_STATE, True))
        same = (made == ours and type(made) is type(ours) and ours.trace_id == 3
                and ours.span_id == 5 and ours.is_remote is False and ours.trace_flags is flags
                and ours.trace_state is made.trace_state and ours.is_valid is True)
        return DEFAULT_TRACE_STATE if same else None
    except Exception:  # pragma: no cover - another layout: SpanContext(...) is used
        return None


#: the ``trace_state`` of a ``SpanContext`` built as its tuple, or None: build it by calling
#: ``SpanContext(trace_id, span_id, False, flags)`` (a layout the probe did not recognise)
SPAN_CONTEXT_TRACE_STATE: Any = _probe_span_context_layout()
_TRACE_ID_MAX = (1 << 128) - 1
_SPAN_ID_MAX = (1 << 64) - 1
_tuple_new = tuple.__new__


def new_span_context(trace_id: int, span_id: int, flags: Any) -> SpanContext:
    """``SpanContext(trace_id, span_id, False, flags)``, built as its tuple when the layout
    allows and the ids are valid (what ``__new__`` would compute), else through ``__new__``."""
    state = SPAN_CONTEXT_TRACE_STATE
    if state is not None and flags is not None and 0 < trace_id <= _TRACE_ID_MAX \
            and 0 < span_id <= _SPAN_ID_MAX:
        return _tuple_new(SpanContext, (trace_id, span_id, False, flags, state, True))
    return SpanContext(trace_id, span_id, False, flags)


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


class EncodedBatch:
    """A request rltrace encoded itself, passed through an exporter's ``export``."""

    __slots__ = ("count", "request")

    def __init__(self, request: Any, count: int) -> None:
        self.request = request
        self.count = count

    def __len__(self) -> int:
        return self.count


def encoded_exporter_class(base: type) -> type | None:
    """A subclass of the SDK OTLP span exporter ``base`` that also sends an :class:`EncodedBatch`.

    None when ``base`` is not one of the SDK's OTLP span exporters or lacks the hook this
    relies on; the caller then uses ``base`` and exports ``ReadableSpan``s as usual.  An
    instance's ``accepts_encoded`` says whether it can take an :class:`EncodedBatch`.
    """
    module = base.__module__
    if module.startswith("opentelemetry.exporter.otlp.proto.grpc") and callable(
            getattr(base, "_translate_data", None)):

        class GrpcEncoded(base):  # type: ignore[misc]
            accepts_encoded = True

            def _translate_data(self, data: Any) -> Any:
                if isinstance(data, EncodedBatch):
                    return data.request
                return super()._translate_data(data)

        return GrpcEncoded
    if module.startswith("opentelemetry.exporter.otlp.proto.http") and "export" in vars(base):

        class HttpEncoded(base):  # type: ignore[misc]
            @property
            def accepts_encoded(self) -> bool:
                return callable(getattr(getattr(self, "_client", None), "export", None))

            def export(self, spans: Any) -> Any:
                if not isinstance(spans, EncodedBatch):
                    return super().export(spans)
                from opentelemetry.sdk.trace.export import SpanExportResult

                if getattr(self, "_shutdown", False):
                    return SpanExportResult.FAILURE
                result = self._client.export(spans.request.SerializePartialToString())
                return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

        return HttpEncoded
    return None


def reader_histogram_settings(reader: Any) -> tuple[tuple[float, ...], bool, bool, bool] | None:
    """``(bounds, record_min_max, histogram_is_delta, counter_is_delta)`` a metric reader wants
    for rltrace's histograms and counter, or None when it wants something else (or the SDK
    keeps these settings elsewhere)."""
    from opentelemetry.sdk.metrics._internal.aggregation import (
        _DEFAULT_EXPLICIT_BUCKET_HISTOGRAM_AGGREGATION_BOUNDARIES,
    )
    from opentelemetry.sdk.metrics._internal.instrument import _Counter, _Histogram
    from opentelemetry.sdk.metrics.export import AggregationTemporality
    from opentelemetry.sdk.metrics.view import (
        DefaultAggregation,
        ExplicitBucketHistogramAggregation,
        SumAggregation,
    )

    temporality = getattr(reader, "_instrument_class_temporality", None)
    aggregation = getattr(reader, "_instrument_class_aggregation", None)
    if not isinstance(temporality, dict) or not isinstance(aggregation, dict) \
            or getattr(reader, "_collect", None) is None:
        return None
    hist_agg, counter_agg = aggregation.get(_Histogram), aggregation.get(_Counter)
    if type(hist_agg) is DefaultAggregation:
        bounds, min_max = tuple(_DEFAULT_EXPLICIT_BUCKET_HISTOGRAM_AGGREGATION_BOUNDARIES), True
    elif type(hist_agg) is ExplicitBucketHistogramAggregation:
        given = getattr(hist_agg, "_boundaries", None)
        bounds = tuple(_DEFAULT_EXPLICIT_BUCKET_HISTOGRAM_AGGREGATION_BOUNDARIES if given is None
                       else given)
        min_max = bool(getattr(hist_agg, "_record_min_max", True))
    else:
        return None
    if type(counter_agg) not in (DefaultAggregation, SumAggregation):
        return None
    delta = AggregationTemporality.DELTA
    return (bounds, min_max, temporality.get(_Histogram) is delta,
            temporality.get(_Counter) is delta)


def add_collect_source(reader: Any, merge: Any) -> None:
    """Make ``reader`` pass what it collects through ``merge(metrics_data) -> metrics_data``."""
    original = reader._collect

    def collect(r: Any, *args: Any, **kwargs: Any) -> Any:
        return merge(original(r, *args, **kwargs))

    reader._collect = collect
