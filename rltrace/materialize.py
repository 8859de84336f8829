"""Turn recorded scopes into OpenTelemetry SDK ``ReadableSpan`` objects (exporter thread).

User values (``args``, ``set_attribute``) are flattened into valid OTel attributes
(``args.<key>``) by :mod:`rltrace.exporters.values`.  Each span built here keeps a reference
to its record (``rltrace_record``) so rltrace's own exporters can encode from it directly.
"""

from __future__ import annotations

import sys
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.status import Status, StatusCode

from rltrace.exporters.values import category_name, flatten_into, text, thread_name

from .recorder import Scope
from .semconv import (
    ARGS_PREFIX,
    ATTR_CATEGORY,
    ATTR_INSTANT,
    ATTR_LANE,
    ATTR_STEP,
    ATTR_THREAD_ID,
    ATTR_THREAD_NAME,
)
from .steps import step_of

_UNSET = Status(StatusCode.UNSET)
_INTERNAL = SpanKind.INTERNAL

def exception_event(error: tuple[str, str, str], ts: int) -> Event:
    etype, msg, stack = error
    return Event("exception", {
        "exception.type": etype, "exception.message": text(msg),
        "exception.stacktrace": text(stack), "exception.escaped": True,
    }, ts)


def span_attributes(rec: Scope) -> dict[str, Any]:
    """A record's OTel span attributes, in the order every encoding of it uses.

    Category, thread and lane first, then ``args.<key>`` (flattened), the record's own
    attributes, the instant flag, and ``rl.step`` inherited from the nearest enclosing scope
    that has one.  Shared by :meth:`SpanBuilder.build` and the direct OTLP encoder
    (:mod:`rltrace.otlp_encode`), so both send the same attributes.
    """
    attrs: dict[str, Any] = {
        ATTR_CATEGORY: category_name(rec.category),
        ATTR_THREAD_ID: rec.thread,
        ATTR_THREAD_NAME: thread_name(rec.thread),
        ATTR_LANE: rec.lane,
    }
    if rec.args:
        flatten_into(attrs, ARGS_PREFIX, rec.args)
    own = rec.record_attrs()
    if own:
        flatten_into(attrs, "", own)
    extra = rec.extra
    if extra is not None and extra.get("instant"):
        attrs[ATTR_INSTANT] = True
    if ATTR_STEP not in attrs:
        step = step_of(rec)
        if step is not None:
            attrs[ATTR_STEP] = step
    return attrs



def bound(limit: int | None) -> int:
    """A span limit as a number (the SDK's ``None`` is no limit)."""
    return sys.maxsize if limit is None else limit

class SpanBuilder:
    """Builds ``ReadableSpan``s for one pipeline (its resource and instrumentation scope)."""

    def __init__(self, resource: Resource, scope: InstrumentationScope,
                 limits: SpanLimits | None = None) -> None:
        self.resource = resource
        self.scope = scope
        #: the SDK's span limits (``OTEL_SPAN_*_LIMIT``, ``OTEL_ATTRIBUTE_*_LIMIT``), applied as
        #: the SDK applies them: attributes, events, links and value lengths, drops counted
        self.limits = limits if limits is not None else SpanLimits()

    def build(self, rec: Scope) -> ReadableSpan:
        attrs = span_attributes(rec)
        events: list[Event] = []
        links: list[Link] = []
        status = _UNSET
        extra = rec.extra
        if extra is not None:
            for name, ts, ev_args, ev_cat in extra.get("events", ()):
                ev_attrs: dict[str, Any] = {}
                if ev_cat is not None:
                    ev_attrs[ATTR_CATEGORY] = category_name(ev_cat)
                if ev_args:
                    flatten_into(ev_attrs, ARGS_PREFIX, ev_args)
                events.append(Event(text(name), BoundedAttributes(
                    self.limits.max_event_attributes, ev_attrs, immutable=True,
                    max_value_len=self.limits.max_attribute_length), ts))
            for target, link_attrs in extra.get("links", ()):
                sc = target if isinstance(target, SpanContext) else target.get_span_context()
                links.append(Link(sc, link_attrs))
            status = extra.get("status") or _UNSET
            error = extra.get("error")
            if error is not None:
                status = Status(StatusCode.ERROR, f"{error[0]}: {error[1]}")
                events.append(exception_event(error, rec.end_ns))
        limits = self.limits
        max_events, max_links = bound(limits.max_events), bound(limits.max_links)
        if len(events) > max_events:
            events = events[:max_events]
        if len(links) > max_links:
            links = links[:max_links]
        parent = rec.parent
        span = ReadableSpan(
            name=rec.name,
            context=rec.get_span_context(),
            parent=parent.get_span_context() if parent is not None else None,
            resource=self.resource,
            attributes=BoundedAttributes(limits.max_span_attributes, attrs, immutable=True,
                                         max_value_len=limits.max_span_attribute_length),
            events=events,
            links=links,
            kind=_INTERNAL,
            status=status,
            start_time=rec.start_ns,
            end_time=rec.end_ns,
            instrumentation_scope=self.scope,
        )
        span.rltrace_record = rec  # type: ignore[attr-defined]
        return span
