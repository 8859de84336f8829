"""W3C trace-context propagation to and from inference servers.

Inside a ``generate`` phase (or any scope) the current span is rltrace's, so injecting the
context into a request's headers lets an OTel-enabled inference server (vLLM, SGLang, your
own) continue the trace under that span::

    async with rltrace.atrace_session_phase("generate"):
        resp = await client.post(url, json=req, headers=rltrace.inject_headers())

Works with any mutable mapping of headers (``dict``, ``httpx.Headers``, aiohttp's
``CIMultiDict``, ``requests``' ``CaseInsensitiveDict``) and needs none of those libraries;
:func:`httpx_event_hook` and :func:`aiohttp_trace_config` wire it into a client once.
On the server side :func:`extract_context` / :func:`server_span` continue an incoming trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Protocol

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

if TYPE_CHECKING:
    import aiohttp

__all__ = ["aiohttp_trace_config", "extract_context", "httpx_event_hook", "inject_headers",
           "server_span"]


def inject_headers(headers: MutableMapping[str, str] | None = None,
                   context: Context | None = None) -> MutableMapping[str, str]:
    """Add ``traceparent`` (and ``tracestate``/``baggage``) for the current span to ``headers``.

    Returns ``headers`` (a new dict when None was given).  Outside any span nothing is added.
    Uses the globally configured OTel propagator (W3C trace context + baggage by default).
    """
    if headers is None:
        headers = {}
    propagate.inject(headers, context=context)
    return headers


class _WithHeaders(Protocol):
    """An outgoing request (httpx's, aiohttp's request parameters): its mutable headers."""

    @property
    def headers(self) -> MutableMapping[str, str]: ...


def extract_context(headers: Mapping[str, object]) -> Context:
    """The OTel context carried by incoming request headers (case-insensitive lookup)."""
    return propagate.extract(_CaseInsensitive(headers))


@contextlib.contextmanager
def server_span(headers: Mapping[str, object], name: str = "generate.server",
                tracer: trace.Tracer | None = None,
                attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[trace.Span]:
    """Run a block as a SERVER span continuing the trace of an incoming request."""
    tracer = tracer or trace.get_tracer("rltrace.propagation")
    with tracer.start_as_current_span(name, context=extract_context(headers),
                                      kind=trace.SpanKind.SERVER,
                                      attributes=dict(attributes or {})) as span:
        yield span


def httpx_event_hook(request: _WithHeaders) -> None:
    """An ``httpx`` request event hook: ``httpx.AsyncClient(event_hooks={"request": [hook]})``.

    (For ``AsyncClient`` wrap it: ``async def hook(r): httpx_event_hook(r)``.)
    """
    inject_headers(request.headers)


def aiohttp_trace_config() -> aiohttp.TraceConfig:
    """An ``aiohttp.TraceConfig`` injecting the context into every request of a session."""
    import aiohttp  # only when asked for

    async def on_request_start(session: object, ctx: object, params: _WithHeaders) -> None:
        inject_headers(params.headers)

    cfg = aiohttp.TraceConfig()
    cfg.on_request_start.append(on_request_start)
    return cfg


class _CaseInsensitive(Mapping[str, object]):
    """Header lookup that ignores case (plain dicts from some servers keep the sender's case)."""

    def __init__(self, headers: Mapping[str, object]) -> None:
        self._h = headers
        self._lower = {str(k).lower(): k for k in headers}

    def __getitem__(self, key: str) -> object:
        return self._h[self._lower[key.lower()]]

    def get(self, key: str, default: object = None) -> object:
        k = self._lower.get(key.lower())
        return default if k is None else self._h[k]

    def __iter__(self) -> Iterator[str]:
        return iter(self._h)

    def __len__(self) -> int:
        return len(self._h)
