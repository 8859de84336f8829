"""A real, in-process OTLP receiver for tests: gRPC and HTTP/protobuf, traces and metrics.

Point any OTLP exporter (the OTel SDK's, rltrace's, a user's own) at it and read back what
arrived, decoded from the wire with the ``opentelemetry-proto`` message classes::

    from rltrace.testing.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True)   # gRPC
        # or OTLPSpanExporter(endpoint=receiver.http_endpoint + "/v1/traces")         # HTTP
        ...                                      # export spans
        (span,) = receiver.wait_for_spans("train_step")   # waits on arrival, no sleeps
        assert span.attributes["rl.step"] == 3

What it offers:

* a gRPC server (``TraceService/Export`` and ``MetricsService/Export``) and an HTTP server
  (``POST /v1/traces`` and ``/v1/metrics``, ``application/x-protobuf``, optionally gzip- or
  deflate-compressed), both bound to a loopback address on free (or given) ports;
* :attr:`OTLPReceiver.requests`: every request with its protocol, headers (lower-cased keys),
  compression and decoded ``Export*ServiceRequest``;
* flattened, plain-Python views: :meth:`OTLPReceiver.spans` (:class:`ReceivedSpan`) and
  :meth:`OTLPReceiver.metrics` (:class:`ReceivedMetric`);
* :meth:`OTLPReceiver.wait_for_spans` / :meth:`OTLPReceiver.wait_for_metrics` /
  :meth:`OTLPReceiver.wait_for_requests`, which wait on a condition notified by every request and
  raise :class:`TimeoutError` saying what did arrive;
* fault injection: :meth:`OTLPReceiver.fail_with` (answer with an error, e.g. gRPC
  ``UNAVAILABLE`` / HTTP 503) and :meth:`OTLPReceiver.stall` (hold requests until an event is
  set), and :meth:`OTLPReceiver.stop` / :meth:`OTLPReceiver.start` to take the backend away and
  bring it back on the same ports.

gRPC compression: grpc's C core strips ``grpc-encoding`` from the metadata it hands to Python, so
the receiver turns grpc's own per-message decompression off and decompresses the message itself;
``compression`` is then what was actually on the wire ("gzip", "deflate" or None).
"""

from __future__ import annotations

import base64
import gzip
import ipaddress
import threading
import time
import typing
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.trace import SpanKind, StatusCode

__all__ = [
    "OTLPReceiver",
    "ReceivedDataPoint",
    "ReceivedMetric",
    "ReceivedRequest",
    "ReceivedSpan",
]

Protocol = Literal["grpc", "http"]
Signal = Literal["traces", "metrics"]
#: ``pending`` while being handled (e.g. stalled); ``accepted`` when answered with success;
#: ``rejected`` when answered with an injected fault; ``aborted`` when the receiver stopped while
#: the request was stalled; ``invalid`` when the body could not be decoded.
Outcome = Literal["pending", "accepted", "rejected", "aborted", "invalid"]

_T = TypeVar("_T")
Match = int | str | Callable[[_T], bool]

_TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
_METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
_TRACE_PATH = "/v1/traces"
_METRICS_PATH = "/v1/metrics"
_STALL_POLL_S = 0.05

# OTLP/HTTP <-> gRPC status mapping (https://opentelemetry.io/docs/specs/otlp/#failures).
_GRPC_TO_HTTP: Mapping[grpc.StatusCode, int] = MappingProxyType({
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.UNIMPLEMENTED: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNKNOWN: 500,
})
_HTTP_TO_GRPC: Mapping[int, grpc.StatusCode] = MappingProxyType({
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
})

_SPAN_KINDS: Mapping[int, SpanKind] = MappingProxyType({
    1: SpanKind.INTERNAL,
    2: SpanKind.SERVER,
    3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER,
    5: SpanKind.CONSUMER,
})
_TEMPORALITY: Mapping[int, Literal["delta", "cumulative"]] = MappingProxyType(
    {1: "delta", 2: "cumulative"})


# --------------------------------------------------------------------------- decoded views


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived, with ids as lower-case hex and attributes as plain Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource_attributes: dict[str, Any]
    scope_name: str
    scope_version: str
    status_code: StatusCode
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]
    protocol: Protocol


@dataclass(frozen=True)
class ReceivedDataPoint:
    """One metric data point; fields that do not apply to the metric's kind are None.

    ``value`` is set for sums and gauges; ``count``/``sum``/``min``/``max`` for histograms (and
    ``bucket_counts``/``explicit_bounds`` for explicit-bucket histograms) and summaries.
    """

    attributes: dict[str, Any]
    start_ns: int
    time_ns: int
    value: int | float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: list[int] | None = None
    explicit_bounds: list[float] | None = None


@dataclass(frozen=True)
class ReceivedMetric:
    """One metric of one export request.

    Cumulative readers export the whole state every time, so the same metric appears once per
    export; the last one is the latest state.
    """

    name: str
    description: str
    unit: str
    kind: Literal["gauge", "sum", "histogram", "exponential_histogram", "summary"]
    data_points: list[ReceivedDataPoint]
    resource_attributes: dict[str, Any]
    scope_name: str
    temporality: Literal["delta", "cumulative"] | None
    is_monotonic: bool | None
    protocol: Protocol


@dataclass
class ReceivedRequest:
    """One export request as received (mutable only while ``outcome`` is ``pending``)."""

    protocol: Protocol
    signal: Signal
    headers: dict[str, str]
    compression: str | None
    message: Message | None
    outcome: Outcome = "pending"
    error: str | None = None
    received_ns: int = field(default_factory=time.time_ns)
    _flat: Sequence[ReceivedSpan | ReceivedMetric] = field(default_factory=tuple, repr=False, compare=False)


def decode_any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value (arrays → list, kvlists → dict)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, which)


def decode_attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP ``KeyValue`` attributes as a dict of plain Python values."""
    return {kv.key: decode_any_value(kv.value) for kv in attributes}


def _hex_or_none(b: bytes) -> str | None:
    return b.hex() if b and any(b) else None


def _flatten_traces(
    req: trace_service_pb2.ExportTraceServiceRequest, protocol: Protocol
) -> list[ReceivedSpan]:
    out = []
    for rs in req.resource_spans:
        resource = decode_attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=_hex_or_none(s.parent_span_id),
                        kind=_SPAN_KINDS.get(s.kind, SpanKind.INTERNAL),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=decode_attributes(s.attributes),
                        resource_attributes=resource,
                        scope_name=ss.scope.name,
                        scope_version=ss.scope.version,
                        status_code=StatusCode(s.status.code),
                        status_message=s.status.message,
                        events=[(e.name, decode_attributes(e.attributes)) for e in s.events],
                        links=[
                            (lk.trace_id.hex(), lk.span_id.hex(), decode_attributes(lk.attributes))
                            for lk in s.links
                        ],
                        protocol=protocol,
                    )
                )
    return out


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _data_point(kind: str, p: Any) -> ReceivedDataPoint:
    common = {
        "attributes": decode_attributes(p.attributes),
        "start_ns": p.start_time_unix_nano,
        "time_ns": p.time_unix_nano,
    }
    if kind in ("gauge", "sum"):
        which = p.WhichOneof("value")
        return ReceivedDataPoint(**common, value=getattr(p, which) if which else None)
    if kind == "summary":
        return ReceivedDataPoint(**common, count=p.count, sum=p.sum)
    buckets: dict[str, Any] = {}
    if kind == "histogram":
        buckets = {"bucket_counts": list(p.bucket_counts), "explicit_bounds": list(p.explicit_bounds)}
    return ReceivedDataPoint(
        **common, count=p.count, sum=_opt(p, "sum"), min=_opt(p, "min"), max=_opt(p, "max"), **buckets
    )


def _flatten_metrics(
    req: metrics_service_pb2.ExportMetricsServiceRequest, protocol: Protocol
) -> list[ReceivedMetric]:
    out = []
    for rm in req.resource_metrics:
        resource = decode_attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind is None:
                    continue
                data = getattr(m, kind)
                temporality = getattr(data, "aggregation_temporality", None)
                out.append(
                    ReceivedMetric(
                        name=m.name,
                        description=m.description,
                        unit=m.unit,
                        kind=kind,
                        data_points=[_data_point(kind, p) for p in data.data_points],
                        resource_attributes=resource,
                        scope_name=sm.scope.name,
                        temporality=_TEMPORALITY.get(temporality) if temporality is not None else None,
                        is_monotonic=data.is_monotonic if kind == "sum" else None,
                        protocol=protocol,
                    )
                )
    return out


# --------------------------------------------------------------------------- wire handling

_SIGNALS: Mapping[Signal, tuple[type[Message], type[Message]]] = MappingProxyType({
    "traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
})


@dataclass
class _Fault:
    grpc_code: grpc.StatusCode
    http_status: int
    remaining: int | None
    retry_after: float | None


@dataclass
class _RawGrpcRequest:
    """What the gRPC request deserializer hands to the handler (it must never raise)."""

    compression: str | None
    message: Message | None
    error: str | None


def _grpc_deserializer(cls: type[Message]) -> Callable[[bytes], _RawGrpcRequest]:
    # grpc's per-message decompression is off, so a compressed message arrives as compressed
    # bytes. A serialized Export*ServiceRequest starts with 0x0a (field 1, length-delimited); gzip
    # starts with 1f 8b and zlib (grpc's "deflate") with 0x78.
    def deserialize(data: bytes) -> _RawGrpcRequest:
        compression = None
        try:
            if data[:2] == b"\x1f\x8b":
                data, compression = gzip.decompress(data), "gzip"
            elif data[:1] == b"\x78":
                data, compression = zlib.decompress(data), "deflate"
            return _RawGrpcRequest(compression, cls.FromString(data), None)
        except (OSError, zlib.error, DecodeError, EOFError) as e:
            return _RawGrpcRequest(compression, None, f"cannot decode {cls.__name__}: {e}")

    return deserialize


class _MetadataItem(typing.Protocol):
    """One item of gRPC invocation metadata."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> str | bytes: ...


def _grpc_metadata(metadata: Iterable[_MetadataItem]) -> dict[str, str]:
    out: dict[str, str] = {}
    for md in metadata:
        value = md.value
        if isinstance(value, bytes):  # "-bin" keys: base64, as they travel on the wire
            value = base64.b64encode(value).decode("ascii")
        key = md.key.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


class _HTTPServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    receiver: OTLPReceiver


class _HTTPHandler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.0"  # one request per connection: stop() leaves no keep-alive threads

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        paths: dict[str, Signal] = {_TRACE_PATH: "traces", _METRICS_PATH: "metrics"}
        signal = paths.get(self.path.split("?")[0])
        if signal is None:
            self._reply(404, b"unknown path; use /v1/traces or /v1/metrics", "text/plain")
            return
        headers: dict[str, str] = {}
        for k, v in self.headers.items():
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        encoding = headers.get("content-encoding", "").strip().lower() or None
        compression = None if encoding == "identity" else encoding
        length = headers.get("content-length")
        if length is None:
            self._reply(411, b"Content-Length required", "text/plain")
            return
        body = self.rfile.read(int(length))
        receiver = self.server.receiver
        request_cls, response_cls = _SIGNALS[signal]
        message, error, status = None, None, 400
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            if content_type != "application/x-protobuf":
                error, status = f"unsupported Content-Type {content_type!r}", 415
            elif compression not in (None, "gzip", "deflate"):
                error, status = f"unsupported Content-Encoding {compression!r}", 415
            else:
                if compression == "gzip":
                    body = gzip.decompress(body)
                elif compression == "deflate":
                    try:
                        body = zlib.decompress(body)
                    except zlib.error:
                        body = zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate
                message = request_cls.FromString(body)
        except (OSError, zlib.error, DecodeError, EOFError) as e:
            error = f"cannot decode {request_cls.__name__}: {e}"
        req = ReceivedRequest("http", signal, headers, compression, message, error=error)
        if message is None:
            receiver._finish(receiver._arrive(req), "invalid")
            self._reply(status, (error or "").encode(), "text/plain")
            return
        fault = receiver._handle(req)
        if fault is None:
            self._reply(200, response_cls().SerializeToString(), "application/x-protobuf")
            return
        code, text, retry_after = fault
        body = status_pb2.Status(code=code.value[0], message=text).SerializeToString()
        extra = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
        self._reply(_GRPC_TO_HTTP.get(code, 500), body, "application/x-protobuf", extra)

    def _reply(
        self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (e.g. its timeout while we were stalled)
            pass


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: _RawGrpcRequest, context: grpc.ServicerContext) -> Message:
        return self._receiver._grpc_export("traces", request, context)


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: _RawGrpcRequest, context: grpc.ServicerContext) -> Message:
        return self._receiver._grpc_export("metrics", request, context)


def _generic_handler(service: str, signal: Signal, servicer: _TraceServicer | _MetricsServicer
                     ) -> grpc.GenericRpcHandler:
    request_cls, response_cls = _SIGNALS[signal]
    return grpc.method_handlers_generic_handler(
        service,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                servicer.Export,
                request_deserializer=_grpc_deserializer(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
        },
    )


# --------------------------------------------------------------------------- the receiver


class OTLPReceiver:
    """An OTLP/gRPC + OTLP/HTTP receiver for traces and metrics, running in this process.

    Ports 0 pick free ports; pass the ports of a stopped receiver to bring a backend back on the
    same endpoints (or call :meth:`start` again on the same instance). Only loopback addresses
    are accepted for ``host``: the receiver has no authentication.
    """

    def __init__(self, host: str = "127.0.0.1", grpc_port: int = 0, http_port: int = 0) -> None:
        try:
            loopback = ipaddress.IPv4Address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"OTLPReceiver binds only to an IPv4 loopback address, not {host!r}")
        self.host = host
        self.grpc_port = grpc_port
        self.http_port = http_port
        self._cond = threading.Condition()
        self._requests: list[ReceivedRequest] = []
        self._fault: _Fault | None = None
        self._stall: tuple[threading.Event, float] | None = None
        self._stopping = threading.Event()
        self._grpc_server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._http_server: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._grpc_server is not None

    @property
    def grpc_endpoint(self) -> str:
        """``http://HOST:PORT`` for ``OTLPSpanExporter(endpoint=..., insecure=True)`` (gRPC)."""
        return f"http://{self.host}:{self._bound(self.grpc_port)}"

    @property
    def http_endpoint(self) -> str:
        """``http://HOST:PORT``; append ``/v1/traces`` or ``/v1/metrics`` for the HTTP exporters."""
        return f"http://{self.host}:{self._bound(self.http_port)}"

    def _bound(self, port: int) -> int:
        if port == 0:
            raise RuntimeError("OTLPReceiver is not started yet (its ports are picked on start())")
        return port

    def start(self) -> OTLPReceiver:
        """Bind both servers and start serving; returns self. A no-op when already running."""
        if self.running:
            return self
        self._stopping.clear()
        executor = futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="otlp-receiver-grpc")
        server = grpc.server(
            executor,
            handlers=[
                _generic_handler(_TRACE_SERVICE, "traces", _TraceServicer(self)),
                _generic_handler(_METRICS_SERVICE, "metrics", _MetricsServicer(self)),
            ],
            options=[
                ("grpc.so_reuseport", 0),  # a port still in use must fail to bind, not be shared
                ("grpc.per_message_decompression", 0),  # we decompress, to see the compression
            ],
        )
        try:
            grpc_port = server.add_insecure_port(f"{self.host}:{self.grpc_port}")
        except RuntimeError as e:
            executor.shutdown(wait=False)
            raise OSError(f"OTLPReceiver: cannot bind gRPC to {self.host}:{self.grpc_port}: {e}") from e
        try:
            http_server = _HTTPServer((self.host, self.http_port), _HTTPHandler)
        except OSError:
            server.stop(None).wait()
            executor.shutdown(wait=False)
            raise
        http_server.receiver = self
        server.start()
        self.grpc_port, self.http_port = grpc_port, http_server.server_address[1]
        self._grpc_server, self._executor, self._http_server = server, executor, http_server
        self._http_thread = threading.Thread(
            target=http_server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-receiver-http-{self.http_port}",
            daemon=True,
        )
        self._http_thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close both servers promptly: in-flight RPCs are cancelled and stalled requests end
        (recorded as ``aborted``). Recorded requests are kept; :meth:`start` serves again on the
        same ports."""
        if not self.running:
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
            # stalled handlers see _stopping within _STALL_POLL_S and answer "stopped"
            while any(r.outcome == "pending" for r in self._requests):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        assert self._grpc_server is not None and self._http_server is not None
        self._grpc_server.stop(grace=None).wait(timeout)
        self._http_server.shutdown()
        self._http_server.server_close()
        if self._http_thread is not None:
            self._http_thread.join(timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._grpc_server = self._http_server = self._http_thread = self._executor = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ fault injection

    def fail_with(
        self,
        status: grpc.StatusCode | int | None = grpc.StatusCode.UNAVAILABLE,
        *,
        count: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Answer subsequent exports with an error until ``fail_with(None)``.

        ``status`` is a gRPC status code (HTTP gets the OTLP-mapped status, e.g. ``UNAVAILABLE``
        → 503) or an HTTP status (gRPC gets the mapped code, e.g. 429 → ``RESOURCE_EXHAUSTED``).
        ``count`` limits the failure to the next ``count`` requests. ``retry_after`` (seconds)
        is sent as gRPC ``RetryInfo`` / HTTP ``Retry-After``, which the OTel exporters use as
        their backoff (0 makes retries immediate).
        """
        if status is None:
            fault = None
        elif isinstance(status, grpc.StatusCode):
            fault = _Fault(status, _GRPC_TO_HTTP.get(status, 500), count, retry_after)
        else:
            fault = _Fault(_HTTP_TO_GRPC.get(status, grpc.StatusCode.UNKNOWN), status, count, retry_after)
        with self._cond:
            self._fault = fault

    def stall(self, event: threading.Event | None, max_wait: float = 30.0) -> None:
        """Hold every subsequent request until ``event`` is set (``stall(None)`` stops stalling).

        A request is held for at most ``max_wait`` seconds, then answered normally; :meth:`stop`
        ends every held request at once. Held requests are listed in :attr:`requests` with
        outcome ``pending``, so a test can wait for them with :meth:`wait_for_requests`.
        """
        with self._cond:
            self._stall = None if event is None else (event, max_wait)

    # ------------------------------------------------------------------ recorded data

    @property
    def requests(self) -> list[ReceivedRequest]:
        """Every request received so far, in arrival order (a snapshot)."""
        with self._cond:
            return list(self._requests)

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        """Spans of every accepted trace request, in arrival order (optionally only ``name``)."""
        out = [x for x in self._accepted("traces") if isinstance(x, ReceivedSpan)]
        return out if name is None else [s for s in out if s.name == name]

    def metrics(self, name: str | None = None) -> list[ReceivedMetric]:
        """Metrics of every accepted metrics request, in arrival order (optionally only ``name``)."""
        out = [x for x in self._accepted("metrics") if isinstance(x, ReceivedMetric)]
        return out if name is None else [m for m in out if m.name == name]

    def _accepted(self, signal: Signal) -> list[ReceivedSpan | ReceivedMetric]:
        with self._cond:
            done = [r for r in self._requests if r.outcome == "accepted" and r.signal == signal]
        return [x for r in done for x in r._flat]

    def clear(self) -> None:
        """Forget every recorded request."""
        with self._cond:
            self._requests.clear()

    def wait_for_spans(
        self, match: Match[ReceivedSpan] = 1, timeout: float = 10.0, *, min_count: int = 1
    ) -> list[ReceivedSpan]:
        """Wait until spans arrive and return them.

        ``match`` is a number (at least that many spans; returns all spans), a span name, or a
        predicate on :class:`ReceivedSpan` (at least ``min_count`` matching spans; returns the
        matching ones). Raises :class:`TimeoutError` describing what arrived instead.
        """
        return self._wait("spans", self.spans, match, min_count, timeout)

    def wait_for_metrics(
        self, match: Match[ReceivedMetric] = 1, timeout: float = 10.0, *, min_count: int = 1
    ) -> list[ReceivedMetric]:
        """Like :meth:`wait_for_spans`, for :class:`ReceivedMetric` (a name matches metric names)."""
        return self._wait("metrics", self.metrics, match, min_count, timeout)

    def wait_for_requests(
        self, match: int | Callable[[ReceivedRequest], bool] = 1, timeout: float = 10.0, *, min_count: int = 1
    ) -> list[ReceivedRequest]:
        """Like :meth:`wait_for_spans`, for :attr:`requests` of any outcome (pending ones included)."""
        return self._wait("requests", lambda: self.requests, match, min_count, timeout)

    def _wait(
        self, what: str, collect: Callable[[], list[_T]], match: Any, min_count: int, timeout: float
    ) -> list[_T]:
        if isinstance(match, bool) or (not isinstance(match, int | str) and not callable(match)):
            raise TypeError(f"match must be a count, a name or a predicate, not {match!r}")
        if isinstance(match, int):
            predicate, need, wanted = None, match, f"at least {match} {what}"
        elif isinstance(match, str):
            name = match
            predicate, need, wanted = (lambda x: x.name == name), min_count, f"{what} named {match!r}"
        else:
            predicate, need = match, min_count
            wanted = f"{what} matching {getattr(match, '__qualname__', repr(match))}"
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                items = collect()
                found = items if predicate is None else [x for x in items if predicate(x)]
                if len(found) >= need:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"OTLPReceiver: no {wanted} within {timeout:g}s (found {len(found)}, need {need}); "
                        f"{self._summary()}"
                    )
                self._cond.wait(remaining)

    def _summary(self) -> str:
        reqs = self._requests
        if not reqs:
            return "no requests arrived" + ("" if self.running else " (the receiver is stopped)")
        outcomes: dict[str, int] = {}
        for r in reqs:
            key = f"{r.protocol} {r.signal} {r.outcome}"
            outcomes[key] = outcomes.get(key, 0) + 1
        spans = [s.name for s in self.spans()]
        metrics = sorted({m.name for m in self.metrics()})
        errors = sorted({r.error for r in reqs if r.error})
        parts = [
            f"{len(reqs)} request(s) arrived ({', '.join(f'{n} {k}' for k, n in outcomes.items())})",
            f"span names: {spans[:20]}{' ...' if len(spans) > 20 else ''}",
            f"metric names: {metrics[:20]}",
        ]
        if errors:
            parts.append(f"errors: {errors[:5]}")
        return "; ".join(parts)

    # ------------------------------------------------------------------ request handling

    def _arrive(self, req: ReceivedRequest) -> ReceivedRequest:
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()
        return req

    def _finish(self, req: ReceivedRequest, outcome: Outcome, error: str | None = None) -> None:
        flat: Sequence[ReceivedSpan | ReceivedMetric] = ()
        if outcome == "accepted" and req.message is not None:
            if req.signal == "traces":
                flat = _flatten_traces(req.message, req.protocol)
            else:
                flat = _flatten_metrics(req.message, req.protocol)
        with self._cond:
            req._flat = flat
            req.outcome = outcome
            if error is not None:
                req.error = error
            self._cond.notify_all()

    def _wait_out_stall(self) -> bool:
        """Block while stalled; False when the receiver stopped meanwhile."""
        with self._cond:
            stall = self._stall
        if stall is None:
            return True
        event, max_wait = stall
        deadline = time.monotonic() + max_wait
        while not event.is_set():
            if self._stopping.is_set():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event.wait(min(remaining, _STALL_POLL_S))
        return not self._stopping.is_set()

    def _handle(self, req: ReceivedRequest) -> tuple[grpc.StatusCode, str, float | None] | None:
        """Record a decoded request, stall/fail it as configured; None means answer success."""
        self._arrive(req)
        if not self._wait_out_stall():
            self._finish(req, "aborted", "the receiver stopped while the request was stalled")
            return grpc.StatusCode.UNAVAILABLE, "OTLPReceiver stopped", None
        with self._cond:
            fault = self._fault
            if fault is not None and fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._fault = None
        if fault is None:
            self._finish(req, "accepted")
            return None
        text = f"injected by OTLPReceiver.fail_with({fault.grpc_code.name})"
        self._finish(req, "rejected", text)
        return fault.grpc_code, text, fault.retry_after

    def _grpc_export(self, signal: Signal, raw: _RawGrpcRequest, context: grpc.ServicerContext) -> Message:
        headers = _grpc_metadata(context.invocation_metadata())
        req = ReceivedRequest("grpc", signal, headers, raw.compression, raw.message, error=raw.error)
        if raw.message is None:
            self._finish(self._arrive(req), "invalid")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, raw.error or "cannot decode request")
        fault = self._handle(req)
        if fault is None:
            return _SIGNALS[signal][1]()
        code, text, retry_after = fault
        if retry_after is not None:
            delay = error_details_pb2.RetryInfo()
            delay.retry_delay.FromNanoseconds(int(retry_after * 1e9))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", delay.SerializeToString()),))
        context.abort(code, text)
