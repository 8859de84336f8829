"""W3C trace-context propagation from a traced client to an OTel-instrumented HTTP server."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import need
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import rltrace
from rltrace.testing import capture_spans


class _InferenceServer:
    """A local HTTP 'inference server' instrumented with its own OTel SDK TracerProvider."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        tracer = provider.get_tracer("fake-vllm")

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with rltrace.server_span(self.headers, "vllm.generate", tracer=tracer,
                                         attributes={"prompt.bytes": len(body)}):
                    with tracer.start_as_current_span("vllm.decode"):
                        payload = json.dumps({"text": "ok"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/generate"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _InferenceServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_InferenceServer]:
    with _InferenceServer() as srv:
        yield srv


def _post(url: str, headers: dict[str, str]) -> dict:
    req = urllib.request.Request(url, data=b'{"prompt": "hi"}', method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_server_span_is_a_child_of_the_clients_generate_span(
    tmp_path: Path, server: _InferenceServer
) -> None:
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        task = rltrace.register_task()
        sid = rltrace.register_session(task)
        with rltrace.trace_session_phase("generate", session_id=sid):
            headers = dict(rltrace.inject_headers())
            assert _post(server.url, headers) == {"text": "ok"}
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        generate = cap.one("generate")
    served = {s.name: s for s in server.exporter.get_finished_spans()}
    srv = served["vllm.generate"]
    assert srv.kind is SpanKind.SERVER
    assert srv.context.trace_id == generate.context.trace_id
    assert srv.parent is not None and srv.parent.span_id == generate.context.span_id
    assert srv.parent.is_remote
    assert served["vllm.decode"].parent.span_id == srv.context.span_id
    assert headers["traceparent"] == (
        f"00-{generate.context.trace_id:032x}-{generate.context.span_id:016x}-01"
    )


def test_plain_trace_scope_propagates_too_and_nothing_is_injected_outside_spans(
    tmp_path: Path, server: _InferenceServer
) -> None:
    with capture_spans(tmp_path) as cap:
        assert rltrace.inject_headers() == {}
        with rltrace.trace_scope("rollout.request"):
            _post(server.url, dict(rltrace.inject_headers()))
        scope = cap.one("rollout.request")
    srv = next(s for s in server.exporter.get_finished_spans() if s.name == "vllm.generate")
    assert srv.parent.span_id == scope.context.span_id


def test_extract_context_reads_headers_case_insensitively(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("client"):
            carrier = rltrace.inject_headers()
        client = cap.one("client")
    mixed = {"TraceParent": carrier["traceparent"]}
    from opentelemetry import trace

    ctx = rltrace.extract_context(mixed)
    sc = trace.get_current_span(ctx).get_span_context()
    assert sc.trace_id == client.context.trace_id and sc.span_id == client.context.span_id


def test_httpx_event_hook_injects_into_real_httpx_requests(tmp_path: Path, server: _InferenceServer) -> None:
    httpx = need("httpx", "httpx is not installed (optional client)")
    from rltrace.propagation import httpx_event_hook

    with capture_spans(tmp_path) as cap:
        with httpx.Client(event_hooks={"request": [httpx_event_hook]}) as client:
            with rltrace.trace_scope("httpx.call"):
                client.post(server.url, json={"prompt": "hi"})
        scope = cap.one("httpx.call")
    srv = next(s for s in server.exporter.get_finished_spans() if s.name == "vllm.generate")
    assert srv.parent.span_id == scope.context.span_id
