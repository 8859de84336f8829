"""The one place rltrace reaches past OpenTelemetry's public API, each use named and tested.

The hot path needs what the public API offers only at a higher cost (a contextvar ``get`` and
``set`` instead of ``context.get_current()``/``attach()`` with their token bookkeeping), and a
few things have no public API at all.  Everything private is taken here, once, with a fallback
where one exists; ``tests/api/test_otel_context.py`` fails on an API/SDK version that breaks any of
them, so an upgrade that changes them is caught in CI, not in a user's training run.

- ``SPAN_KEY``: the context key under which the current span lives
  (``opentelemetry.trace.propagation._SPAN_KEY``); ``trace.set_span_in_context`` writes it.
- :class:`ContextAccess` (``get``/``set``/``reset``): the contextvar behind the default runtime
  context (``ContextVarsRuntimeContext._current_context``), or the runtime context's own
  ``get_current``/``attach``/``detach`` when another one was chosen with ``OTEL_PYTHON_CONTEXT``.
- ``frame_get``/``frame_set``/``frame_reset`` and :class:`FrameAwareContext`: an rltrace record
  is made current without building an OTel ``Context`` for it.  A contextvar of rltrace's own
  holds the innermost current record and the OTel context it was made current over (its
  *frame*); while rltrace is configured, OTel's runtime context
  (``opentelemetry.context._RUNTIME_CONTEXT``) is wrapped (:meth:`ContextAccess.wrap`; put back
  at ``shutdown``) so that ``get_current()`` returns that context with the record as its
  span while the OTel context is still the frame's, and the OTel context itself once other
  code made another one current.  ``attach`` of the frame's own context object (code hiding
  the record on purpose) makes a copy current, so that it is not taken for the frame.
- ``SUPPRESS_INSTRUMENTATION_KEY``: the key OTel instrumentations check to stay silent
  (``opentelemetry.context._SUPPRESS_INSTRUMENTATION_KEY``); rltrace's exporters run with it set
  so an instrumented HTTP client inside an exporter does not trace itself.
- ``remove_span_processor``: ``SynchronousMultiSpanProcessor`` has no ``remove``; its
  ``_span_processors`` tuple is replaced.
- ``encoded_span_exporter``: the SDK's OTLP span exporters take ``ReadableSpan``s only; rltrace
  encodes its records into the ``ExportTraceServiceRequest`` itself (:mod:`rltrace.pipeline.otlp_encode`)
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
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry.context.context import Context, _RuntimeContext
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import DEFAULT_TRACE_STATE, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation import _SPAN_KEY

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace.export import SpanExportResult

logger = logging.getLogger("rltrace")

SPAN_KEY = _SPAN_KEY
SUPPRESS_INSTRUMENTATION_KEY: str = otel_context._SUPPRESS_INSTRUMENTATION_KEY

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

    def __init__(self, inner: _RuntimeContext) -> None:
        self.inner = inner

    def attach(self, context: Context) -> Token[Context]:
        frame = frame_get()
        if frame is not None and context is frame[1]:
            context = Context(context)  # a copy: the same object would be taken for the frame
        return self.inner.attach(context)

    def get_current(self) -> Context:
        return effective_context(frame_get(), self.inner.get_current())

    def detach(self, token: Token[Context]) -> None:
        self.inner.detach(token)


def effective_context(frame: list[Any] | None, ctx: Context) -> Context:
    """What ``get_current()`` answers for this frame over this OTel context: for a frame over
    it, one Context with the frame's record as its span (the same object each time)."""
    if frame is not None and frame[1] is ctx:
        made: Context | None = frame[2]
        if made is None:
            made = frame[2] = Context({**ctx, SPAN_KEY: frame[0]})
        return made
    return ctx


def _runtime_context() -> _RuntimeContext | None:
    """OTel's process-wide runtime context object, as it is now."""
    current: _RuntimeContext | None = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    return current


class ContextAccess:
    """How rltrace reads and sets the current OTel context, and whether OTel sees its frames.

    ``get``/``set``/``reset`` are the contextvar behind OTel's default runtime context (``fast``)
    or, for another runtime context, its own ``get_current``/``attach``/``detach``.  They are
    right from the start: reading the context needs no wrapping.  :meth:`wrap` (at
    ``configure``) puts a :class:`FrameAwareContext` around OTel's runtime context so that OTel
    code sees rltrace's records as current spans; :meth:`unwrap` (at ``shutdown``) puts OTel's
    own back.  Importing rltrace changes nothing in OpenTelemetry.
    """

    __slots__ = ("fast", "followed", "get", "installed", "reset", "set")

    get: Callable[[], Context]
    set: Callable[[Context], Token[Context]]
    reset: Callable[[Token[Context]], object]

    def __init__(self) -> None:
        self.fast = False
        #: whether this object put the wrapper in place (and takes it away at :meth:`unwrap`)
        self.installed = False
        self.followed: _RuntimeContext | None = None
        self.follow(_runtime_context())

    def follow(self, runtime: _RuntimeContext | None) -> None:
        """Read and set the current context through ``runtime`` from now on."""
        if isinstance(runtime, ContextVarsRuntimeContext):
            cv = runtime._current_context
            self.get, self.set, self.reset, self.fast = cv.get, cv.set, cv.reset, True
        elif runtime is not None:  # another runtime context (OTEL_PYTHON_CONTEXT): its own methods
            self.get, self.set, self.reset = runtime.get_current, runtime.attach, runtime.detach
            self.fast = False
        else:  # pragma: no cover - an API without a runtime context object: the public functions
            self.get, self.set, self.reset = (otel_context.get_current, otel_context.attach,
                                              otel_context.detach)
            self.fast = False
        self.followed = runtime

    def wrap(self) -> str | None:
        """Wrap OTel's runtime context and read the current context from it, again if other code
        replaced it since (Sentry's OpenTelemetry integration installs its own; vLLM puts a new
        default one in place of Sentry's).  Returns the replacing runtime context's type name
        when it followed a replacement, else None."""
        current = _runtime_context()
        if current is None:  # pragma: no cover - an API without a runtime context object
            return None
        inner = current.inner if isinstance(current, FrameAwareContext) else current
        if inner is self.followed and current is not inner:
            return None  # wrapped, and the one read from: the common case
        self.installed = True
        replaced = inner is not self.followed
        self.follow(inner)
        if current is inner:
            otel_context._RUNTIME_CONTEXT = FrameAwareContext(inner)
        if not replaced:
            return None
        name = type(inner).__qualname__
        logger.info("rltrace: OpenTelemetry's runtime context was replaced (now a %s) while "
                    "rltrace was configured; rltrace follows the new one from now on", name)
        return name

    def refollow(self) -> None:
        """Read and set the current context through OTel's runtime context as it is now (other
        code may have replaced it), without wrapping it."""
        current = _runtime_context()
        inner = current.inner if isinstance(current, FrameAwareContext) else current
        if inner is not self.followed:
            self.follow(inner)

    def unwrap(self) -> None:
        """Put OTel's own runtime context back where rltrace's wrapper is the current one (a
        runtime context other code installed since is left as it is, and still followed)."""
        if not self.installed:
            return
        self.installed = False
        current = _runtime_context()
        if isinstance(current, FrameAwareContext):
            otel_context._RUNTIME_CONTEXT = current.inner
            self.follow(current.inner)
        else:
            self.refollow()


def _probe_span_context_layout() -> TraceState | None:
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
SPAN_CONTEXT_TRACE_STATE: TraceState | None = _probe_span_context_layout()
_TRACE_ID_MAX = (1 << 128) - 1
_SPAN_ID_MAX = (1 << 64) - 1
_tuple_new = tuple.__new__


def new_span_context(trace_id: int, span_id: int, flags: TraceFlags | None) -> SpanContext:
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


def remove_span_processor(multi: SynchronousMultiSpanProcessor, processor: SpanProcessor) -> None:
    """Remove ``processor`` from an SDK multi span processor (there is no public ``remove``)."""
    procs = multi._span_processors
    multi._span_processors = tuple(p for p in procs if p is not processor)


class EncodedRequest(Protocol):
    """An ``ExportTraceServiceRequest`` (a protobuf message): what the HTTP exporter sends."""

    def SerializePartialToString(self) -> bytes: ...

    def ByteSize(self) -> int: ...


class EncodedBatch:
    """A request rltrace encoded itself, passed through an exporter's ``export``."""

    __slots__ = ("count", "request")

    def __init__(self, request: EncodedRequest, count: int) -> None:
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

            def _translate_data(self, data: object) -> object:
                if isinstance(data, EncodedBatch):
                    return data.request
                return super()._translate_data(data)

        return GrpcEncoded
    if module.startswith("opentelemetry.exporter.otlp.proto.http") and "export" in vars(base):

        class HttpEncoded(base):  # type: ignore[misc]
            @property
            def accepts_encoded(self) -> bool:
                return callable(getattr(getattr(self, "_client", None), "export", None))

            def export(self, spans: object) -> SpanExportResult:
                if not isinstance(spans, EncodedBatch):
                    done: SpanExportResult = super().export(spans)
                    return done
                from opentelemetry.sdk.trace.export import SpanExportResult

                if getattr(self, "_shutdown", False):
                    return SpanExportResult.FAILURE
                result = self._client.export(spans.request.SerializePartialToString())
                return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

        return HttpEncoded
    return None


def reader_histogram_settings(reader: object) -> tuple[tuple[float, ...], bool, bool, bool] | None:
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


def add_collect_source(reader: Any, merge: Callable[[object], object]) -> None:
    """Make ``reader`` (an SDK ``MetricReader``: its private ``_collect``) pass what it collects
    through ``merge(metrics_data) -> metrics_data``."""
    original: Callable[..., object] = reader._collect

    def collect(r: object, *args: object, **kwargs: object) -> object:
        return merge(original(r, *args, **kwargs))

    reader._collect = collect
