"""``rltrace.recording.otel_context``: the private OpenTelemetry names rltrace relies on still mean what
rltrace assumes, on the installed API/SDK.  Each test fails on a version that breaks one."""

from __future__ import annotations

from pathlib import Path

from opentelemetry import context, trace
from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import rltrace
from rltrace.recording import otel_context


def test_span_key_is_where_the_api_keeps_the_current_span() -> None:
    span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
    ctx = trace.set_span_in_context(span)
    assert ctx.get(otel_context.SPAN_KEY) is span
    token = context.attach(ctx)
    try:
        assert otel_context.ContextAccess().get() is context.get_current()  # the fast path reads the same
        assert trace.get_current_span() is span
    finally:
        context.detach(token)


def test_the_fast_context_path_is_the_default_runtime_contexts_contextvar() -> None:
    access = otel_context.ContextAccess()
    assert access.fast
    ctx = context.set_value("rltrace-probe", 1)
    token = access.set(ctx)
    try:
        assert context.get_value("rltrace-probe") == 1  # set by us, seen by the public API
    finally:
        access.reset(token)
    assert context.get_value("rltrace-probe") is None


def test_the_suppression_key_is_the_one_instrumentations_check() -> None:
    # instrumentations (and the SDK's own batch processor) import this very key object
    assert otel_context.SUPPRESS_INSTRUMENTATION_KEY is context._SUPPRESS_INSTRUMENTATION_KEY
    assert context.get_value(otel_context.SUPPRESS_INSTRUMENTATION_KEY) is None
    with otel_context.instrumentation_suppressed():
        assert context.get_value(context._SUPPRESS_INSTRUMENTATION_KEY) is True
    assert context.get_value(otel_context.SUPPRESS_INSTRUMENTATION_KEY) is None


def test_remove_span_processor_drops_exactly_that_processor_from_an_sdk_multi_processor() -> None:
    multi = SynchronousMultiSpanProcessor()
    keep, drop = InMemorySpanExporter(), InMemorySpanExporter()
    pk, pd = SimpleSpanProcessor(keep), SimpleSpanProcessor(drop)
    multi.add_span_processor(pk)
    multi.add_span_processor(pd)
    otel_context.remove_span_processor(multi, pd)
    provider = TracerProvider(active_span_processor=multi, shutdown_on_exit=False)
    with provider.get_tracer("t").start_as_current_span("x"):
        pass
    assert [s.name for s in keep.get_finished_spans()] == ["x"] and not drop.get_finished_spans()


class _SelfTracingExporter(SpanExporter):
    """An exporter whose HTTP client would be instrumented: it records whether instrumentation
    was suppressed while it exported (what an instrumentation checks before tracing a call)."""

    def __init__(self) -> None:
        self.suppressed: list[bool] = []

    def export(self, spans: object) -> SpanExportResult:
        self.suppressed.append(bool(context.get_value(otel_context.SUPPRESS_INSTRUMENTATION_KEY)))
        return SpanExportResult.SUCCESS


def test_export_runs_with_instrumentation_suppressed(tmp_path: Path) -> None:
    exporter = _SelfTracingExporter()
    processor = SimpleSpanProcessor(exporter)
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    rltrace.add_span_processor(processor)
    try:
        with rltrace.trace_scope("exported"):
            pass
        rltrace.flush()
    finally:
        rltrace.shutdown()
        rltrace.runtime.remove_span_processor(processor)
    assert exporter.suppressed and all(exporter.suppressed)


def test_the_sdk_otlp_exporters_take_requests_rltrace_encoded_itself() -> None:
    """gRPC: ``_translate_data`` is the hook the exporter encodes through; HTTP: ``_client.export``
    sends the bytes.  On an SDK without them rltrace falls back to ReadableSpans (slower): this
    test says so by failing."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from rltrace.testing.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as rx:
        for base, endpoint in ((Grpc, rx.grpc_endpoint), (Http, rx.http_endpoint + "/v1/traces")):
            cls = otel_context.encoded_exporter_class(base)
            assert cls is not None and issubclass(cls, base)
            kwargs = {"insecure": True} if base is Grpc else {}
            exporter = cls(endpoint=endpoint, **kwargs)
            assert exporter.accepts_encoded
            req = ExportTraceServiceRequest()
            span = req.resource_spans.add().scope_spans.add().spans.add()
            span.name, span.trace_id, span.span_id = f"via-{base.__module__}", b"\1" * 16, b"\2" * 8
            assert exporter.export(otel_context.EncodedBatch(req, 1)) is SpanExportResult.SUCCESS
            exporter.shutdown()
        names = {s.name for s in rx.wait_for_spans(2)}
    assert names == {f"via-{Grpc.__module__}", f"via-{Http.__module__}"}


def test_span_contexts_built_as_their_tuple_are_the_ones_the_constructor_builds(
        tmp_path: Path) -> None:
    """``SpanContext`` is still the tuple ``otel_compat`` builds directly (the probe recognised
    this OTel version's layout), and every context built that way, valid ids or not, equals
    the constructor's in every field; the compiled ids path builds the same."""
    from opentelemetry.trace import TraceFlags

    assert otel_context.SPAN_CONTEXT_TRACE_STATE is not None  # else rltrace calls SpanContext()
    for flags in (TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)):
        for trace_id, span_id in ((1, 1), (2**128 - 1, 2**64 - 1), (0, 5), (2**128, 5),
                                  (5, 0), (5, 2**64), (-1, 3)):
            ours = otel_context.new_span_context(trace_id, span_id, flags)
            want = trace.SpanContext(trace_id, span_id, False, flags)
            assert type(ours) is type(want) and tuple(ours) == tuple(want)
            assert (ours.is_valid, ours.trace_flags, ours.trace_state, ours.is_remote) == \
                (want.is_valid, want.trace_flags, want.trace_state, want.is_remote)
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    with rltrace.trace_scope("root") as root, rltrace.trace_scope("child") as child:
        pass
    for rec in (root, child):
        sc = rec.get_span_context()
        want = trace.SpanContext(sc.trace_id, sc.span_id, False, sc.trace_flags)
        assert type(sc) is type(want) and tuple(sc) == tuple(want) and sc.is_valid
    assert child.get_span_context().trace_id == root.get_span_context().trace_id
