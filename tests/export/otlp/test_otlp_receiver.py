"""rltrace.testing.otlp_receiver against the real OTel SDK exporters, over real gRPC and HTTP sockets.

Plain SDK providers and OTLP exporters (no rltrace pipeline): what the exporters put on the wire
must come back decoded - ids, attribute types, resource, headers, compression, metrics - and the
fault injection (fail_with, stall, stop/restart) must show in the exporters' results.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from rltrace.testing.otlp_receiver import OTLPReceiver

PROTOCOLS = ["grpc", "http"]
_GRPC_COMPRESSION = {None: grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                     "deflate": grpc.Compression.Deflate}
_HTTP_COMPRESSION = {None: HttpCompression.NoCompression, "gzip": HttpCompression.Gzip,
                     "deflate": HttpCompression.Deflate}


def span_exporter(protocol: str, receiver: OTLPReceiver, compression: str | None = None,
                  **kw: Any) -> SpanExporter:
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                                compression=_GRPC_COMPRESSION[compression], **kw)
    return HttpSpanExporter(endpoint=receiver.http_endpoint + "/v1/traces",
                            compression=_HTTP_COMPRESSION[compression], **kw)


def metric_exporter(protocol: str, receiver: OTLPReceiver, compression: str | None = None) -> Any:
    if protocol == "grpc":
        return GrpcMetricExporter(endpoint=receiver.grpc_endpoint, insecure=True,
                                  compression=_GRPC_COMPRESSION[compression])
    return HttpMetricExporter(endpoint=receiver.http_endpoint + "/v1/metrics",
                              compression=_HTTP_COMPRESSION[compression])


def finished_spans(*names: str) -> list[ReadableSpan]:
    """Real SDK spans, to hand to an exporter's export() directly and see its result."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for name in names:
        provider.get_tracer("test").start_span(name).end()
    return list(memory.get_finished_spans())


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


@pytest.fixture
def shutdown_later(receiver: OTLPReceiver) -> Iterator[Callable[[Any], Any]]:
    """Register providers/exporters to shut down before the receiver stops (no exports into a void)."""
    objs: list[Any] = []
    yield lambda o: objs.append(o) or o
    for o in reversed(objs):
        o.shutdown()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sdk_span_exporter_delivers_ids_attributes_resource_headers_and_gzip(
    receiver: OTLPReceiver, shutdown_later: Callable[[Any], Any], protocol: str
) -> None:
    header = "x-rl-run" if protocol == "grpc" else "X-RL-Run"  # gRPC metadata keys must be lower-case
    exporter = span_exporter(protocol, receiver, "gzip", headers={header: "run-7"})
    resource = Resource.create({"service.name": "trainer", "rl.rank": 3})
    provider = shutdown_later(TracerProvider(resource=resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("rl.scope", "1.2")
    attrs = {"s": "a", "i": 7, "f": 0.5, "b": True,
             "ls": ["x", "y"], "li": [1, 2], "lf": [0.25], "lb": [True, False]}
    with tracer.start_as_current_span("parent") as parent:
        link = Link(parent.get_span_context(), {"why": "x"})
        with tracer.start_as_current_span("child", kind=SpanKind.CLIENT, attributes=attrs,
                                          links=[link]) as child:
            child.add_event("retry", {"attempt": 2})
            child.set_status(Status(StatusCode.ERROR, "boom"))

    got = {s.name: s for s in receiver.wait_for_spans(2)}
    p, c = got["parent"], got["child"]
    pctx, cctx = parent.get_span_context(), child.get_span_context()
    assert p.trace_id == c.trace_id == format(pctx.trace_id, "032x")
    assert (p.span_id, c.span_id) == (format(pctx.span_id, "016x"), format(cctx.span_id, "016x"))
    assert (p.parent_span_id, c.parent_span_id) == (None, p.span_id)
    assert c.attributes == attrs
    assert c.kind is SpanKind.CLIENT and p.kind is SpanKind.INTERNAL
    assert (c.status_code, c.status_message) == (StatusCode.ERROR, "boom")
    assert c.events == [("retry", {"attempt": 2})]
    assert c.links == [(p.trace_id, p.span_id, {"why": "x"})]
    assert c.resource_attributes["service.name"] == "trainer" and c.resource_attributes["rl.rank"] == 3
    assert (c.scope_name, c.scope_version) == ("rl.scope", "1.2")
    assert c.start_ns <= c.end_ns and p.start_ns <= c.start_ns
    assert c.protocol == protocol

    reqs = receiver.requests
    assert {(r.protocol, r.signal, r.outcome, r.compression) for r in reqs} == {
        (protocol, "traces", "accepted", "gzip")}
    assert all(r.headers["x-rl-run"] == "run-7" for r in reqs)
    if protocol == "http":
        assert reqs[0].headers["content-encoding"] == "gzip"
        assert reqs[0].headers["content-type"] == "application/x-protobuf"
    assert reqs[0].message.resource_spans[0].scope_spans[0].spans[0].name in ("parent", "child")


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_recorded_compression_is_what_the_exporter_sent(
    receiver: OTLPReceiver, protocol: str, compression: str | None
) -> None:
    exporter = span_exporter(protocol, receiver, compression)
    try:
        assert exporter.export(finished_spans("s")) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    (req,) = receiver.requests
    assert req.compression == compression
    assert [s.name for s in receiver.spans()] == ["s"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sdk_metric_exporter_delivers_histogram_and_counter(
    receiver: OTLPReceiver, shutdown_later: Callable[[Any], Any], protocol: str
) -> None:
    reader = PeriodicExportingMetricReader(metric_exporter(protocol, receiver, "gzip"),
                                           export_interval_millis=3_600_000)
    resource = Resource.create({"rl.job": "ppo"})
    provider = shutdown_later(MeterProvider(metric_readers=[reader], resource=resource))
    meter = provider.get_meter("rl.metrics")
    tokens = meter.create_counter("rl.tokens", unit="{token}")
    duration = meter.create_histogram("rl.step.duration", unit="s")
    tokens.add(5, {"phase": "rollout"})
    tokens.add(7, {"phase": "rollout"})
    for v in (0.5, 1.5, 4.0):
        duration.record(v, {"phase": "train"})
    assert reader.force_flush()

    (counter,) = receiver.wait_for_metrics("rl.tokens")
    assert (counter.kind, counter.unit, counter.is_monotonic, counter.temporality) == (
        "sum", "{token}", True, "cumulative")
    (point,) = counter.data_points
    assert (point.attributes, point.value) == ({"phase": "rollout"}, 12)
    assert counter.resource_attributes["rl.job"] == "ppo" and counter.scope_name == "rl.metrics"

    (hist,) = receiver.metrics("rl.step.duration")
    assert (hist.kind, hist.unit) == ("histogram", "s")
    (hp,) = hist.data_points
    assert (hp.attributes, hp.count, hp.sum, hp.min, hp.max) == ({"phase": "train"}, 3, 6.0, 0.5, 4.0)
    assert sum(hp.bucket_counts) == 3 and len(hp.bucket_counts) == len(hp.explicit_bounds) + 1
    assert {r.compression for r in receiver.requests} == {"gzip"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fail_with_makes_sdk_export_fail_until_cleared(receiver: OTLPReceiver, protocol: str) -> None:
    exporter = span_exporter(protocol, receiver, timeout=1)
    try:
        receiver.fail_with(grpc.StatusCode.UNAVAILABLE)
        assert exporter.export(finished_spans("lost")) is SpanExportResult.FAILURE
        assert receiver.requests and {r.outcome for r in receiver.requests} == {"rejected"}
        assert receiver.spans() == []

        receiver.fail_with(None)
        assert exporter.export(finished_spans("kept")) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert [s.name for s in receiver.spans()] == ["kept"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fail_with_count_and_retry_after_zero_lets_the_exporter_retry_and_succeed(
    receiver: OTLPReceiver, protocol: str
) -> None:
    exporter = span_exporter(protocol, receiver, timeout=5)
    receiver.fail_with(grpc.StatusCode.UNAVAILABLE, count=2, retry_after=0)
    try:
        t0 = time.monotonic()
        assert exporter.export(finished_spans("s")) is SpanExportResult.SUCCESS
        assert time.monotonic() - t0 < 1.0  # the exporter honoured the zero backoff
    finally:
        exporter.shutdown()
    assert [r.outcome for r in receiver.requests] == ["rejected", "rejected", "accepted"]
    assert [s.name for s in receiver.spans()] == ["s"]


def test_raw_clients_get_otlp_status_codes_for_faults_and_bad_requests(receiver: OTLPReceiver) -> None:
    def post(path: str, body: bytes, content_type: str = "application/x-protobuf") -> tuple[int, Any]:
        req = urllib.request.Request(receiver.http_endpoint + path, data=body, method="POST",
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.headers
        except urllib.error.HTTPError as e:
            return e.code, e.headers

    empty = trace_service_pb2.ExportTraceServiceRequest().SerializeToString()
    assert post("/v1/traces", empty)[0] == 200
    assert post("/v1/logs", empty)[0] == 404
    assert post("/v1/traces", b"{}", "application/json")[0] == 415
    assert post("/v1/traces", b"\xff\xff\xff")[0] == 400
    receiver.fail_with(503, retry_after=2)
    status, headers = post("/v1/traces", empty)
    assert (status, headers["Retry-After"]) == (503, "2")

    receiver.fail_with(429)
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=5)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        garbage = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                      request_serializer=lambda _: b"\xff\xff\xff")
        with pytest.raises(grpc.RpcError) as err:
            garbage(None, timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert [r.outcome for r in receiver.requests] == [
        "accepted", "invalid", "invalid", "rejected", "rejected", "invalid"]  # a 404 is not an export request
    assert "cannot decode ExportTraceServiceRequest" in (receiver.requests[-1].error or "")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_stall_holds_the_export_until_the_event_is_set(receiver: OTLPReceiver, protocol: str) -> None:
    exporter = span_exporter(protocol, receiver, timeout=10)
    release = threading.Event()
    receiver.stall(release)
    results: list[SpanExportResult] = []
    worker = threading.Thread(target=lambda: results.append(exporter.export(finished_spans("held"))))
    worker.start()
    try:
        (pending,) = receiver.wait_for_requests(lambda r: r.outcome == "pending")
        assert receiver.spans() == [] and results == []
        release.set()
        assert receiver.wait_for_spans("held")[0].name == "held"
        worker.join(10)
    finally:
        release.set()
        exporter.shutdown()
    assert results == [SpanExportResult.SUCCESS] and pending.outcome == "accepted"


def test_stall_is_bounded_by_max_wait(receiver: OTLPReceiver) -> None:
    receiver.stall(threading.Event(), max_wait=0.2)  # never set
    exporter = span_exporter("grpc", receiver, timeout=10)
    try:
        t0 = time.monotonic()
        assert exporter.export(finished_spans("late")) is SpanExportResult.SUCCESS
        assert 0.2 <= time.monotonic() - t0 < 5
    finally:
        exporter.shutdown()


def test_stop_ends_stalled_requests_promptly() -> None:
    receiver = OTLPReceiver().start()
    receiver.stall(threading.Event(), max_wait=60)  # never set
    exporter = span_exporter("http", receiver, timeout=1)
    worker = threading.Thread(target=exporter.export, args=(finished_spans("held"),))
    worker.start()
    try:
        receiver.wait_for_requests(lambda r: r.outcome == "pending")
        t0 = time.monotonic()
        receiver.stop()
        assert time.monotonic() - t0 < 2
        assert [r.outcome for r in receiver.requests] == ["aborted"]
        assert not receiver.running
    finally:
        receiver.stop()
        worker.join(10)
        exporter.shutdown()


def test_restart_on_the_same_ports_serves_the_same_exporters_again() -> None:
    first = OTLPReceiver().start()
    ports = (first.grpc_port, first.http_port)
    exporters = [span_exporter(p, first, timeout=10) for p in PROTOCOLS]
    try:
        for e in exporters:
            assert e.export(finished_spans("before")) is SpanExportResult.SUCCESS
        first.stop()
        with OTLPReceiver(grpc_port=ports[0], http_port=ports[1]) as second:
            assert (second.grpc_port, second.http_port) == ports
            for e in exporters:
                assert e.export(finished_spans("after")) is SpanExportResult.SUCCESS
            assert sorted(s.protocol for s in second.wait_for_spans(2)) == ["grpc", "http"]
        first.start()  # the same instance comes back on its ports too, keeping what it recorded
        assert first.grpc_endpoint == f"http://127.0.0.1:{ports[0]}"
        for e in exporters:
            assert e.export(finished_spans("again")) is SpanExportResult.SUCCESS
        assert [s.name for s in first.spans()] == ["before", "before", "again", "again"]
    finally:
        for e in exporters:
            e.shutdown()
        first.stop()


def test_wait_for_spans_times_out_saying_what_arrived(receiver: OTLPReceiver) -> None:
    with pytest.raises(TimeoutError, match="no requests arrived"):
        receiver.wait_for_spans(1, timeout=0.01)
    exporter = span_exporter("http", receiver)
    try:
        exporter.export(finished_spans("rollout", "train"))
    finally:
        exporter.shutdown()
    with pytest.raises(TimeoutError) as err:
        receiver.wait_for_spans("eval", timeout=0.05)
    message = str(err.value)
    assert "spans named 'eval' within 0.05s" in message
    assert "1 http traces accepted" in message and "['rollout', 'train']" in message
    with pytest.raises(TimeoutError, match=r"at least 3 spans .*found 2"):
        receiver.wait_for_spans(3, timeout=0.01)


def test_only_loopback_hosts_are_accepted_and_ports_are_known_after_start() -> None:
    with pytest.raises(ValueError, match="loopback"):
        OTLPReceiver(host="0.0.0.0")
    receiver = OTLPReceiver()
    with pytest.raises(RuntimeError, match="not started"):
        _ = receiver.grpc_endpoint
    with receiver:
        assert receiver.grpc_port > 0 and receiver.http_port > 0
        assert receiver.http_endpoint == f"http://127.0.0.1:{receiver.http_port}"
