"""A minimal OTLP backend over TLS (HTTPS and gRPC with TLS) for tests/reliability/test_security.py.

:func:`self_signed_cert` makes a certificate for ``127.0.0.1`` with the ``openssl`` command;
:class:`TLSOTLPBackend` serves OTLP/HTTP on HTTPS and OTLP/gRPC with TLS on loopback ports,
decodes ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` with opentelemetry-proto
and records each request's headers (lower-case) and span / metric names.
"""

from __future__ import annotations

import gzip
import shutil
import ssl
import subprocess
import threading
import zlib
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def self_signed_cert(directory: Path) -> tuple[Path, Path] | None:
    """``(cert.pem, key.pem)`` valid for IP 127.0.0.1, or None when ``openssl`` is missing."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60)
    return cert, key


@dataclass
class Request:
    protocol: str
    signal: str
    headers: dict[str, str]
    names: list[str] = field(default_factory=list)


def _trace_names(req: Any) -> list[str]:
    return [s.name for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _metric_names(req: Any) -> list[str]:
    return [m.name for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


class TLSOTLPBackend:
    """HTTPS + gRPC/TLS OTLP receiver on 127.0.0.1; ``requests`` lists what arrived."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.requests: list[Request] = []
        self._cond = threading.Condition()
        self._http: ThreadingHTTPServer | None = None
        self._grpc: grpc.Server | None = None
        self.http_port = self.grpc_port = 0

    def _record(self, req: Request) -> None:
        with self._cond:
            self.requests.append(req)
            self._cond.notify_all()

    def wait_for(self, signal: str, name: str, timeout: float = 20.0) -> Request:
        """The first request of ``signal`` carrying a span/metric named ``name`` (bounded wait)."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: any(r.signal == signal and name in r.names for r in self.requests), timeout)
            if not ok:
                raise TimeoutError(f"no {signal} request with {name!r} within {timeout}s: {self.requests}")
            return next(r for r in self.requests if r.signal == signal and name in r.names)

    def start(self) -> TLSOTLPBackend:
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                enc = (self.headers.get("Content-Encoding") or "").lower()
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                headers = {k.lower(): v for k, v in self.headers.items()}
                if self.path.startswith("/v1/traces"):
                    req = Request("http", "traces", headers,
                                  _trace_names(trace_service_pb2.ExportTraceServiceRequest.FromString(body)))
                    out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                else:
                    req = Request("http", "metrics", headers, _metric_names(
                        metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)))
                    out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                backend._record(req)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        http.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        http.socket = ctx.wrap_socket(http.socket, server_side=True)
        self.http_port = http.server_address[1]
        threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self._http = http

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
                md = {m.key.lower(): m.value for m in context.invocation_metadata()}
                backend._record(Request("grpc", "traces", md, _trace_names(request)))
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
                md = {m.key.lower(): m.value for m in context.invocation_metadata()}
                backend._record(Request("grpc", "metrics", md, _metric_names(request)))
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        creds = grpc.ssl_server_credentials([(self.key.read_bytes(), self.cert.read_bytes())])
        self.grpc_port = server.add_secure_port("127.0.0.1:0", creds)
        server.start()
        self._grpc = server
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._grpc is not None:
            self._grpc.stop(None).wait(5)

    def __enter__(self) -> TLSOTLPBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
