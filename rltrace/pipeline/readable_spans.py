"""Turn recorded scopes into OpenTelemetry SDK ``ReadableSpan`` objects (exporter thread).

User values (``args``, ``set_attribute``) are flattened into valid OTel attributes
(``args.<key>``) by :mod:`rltrace.recording.user_values`.  Each span built here keeps a reference
to its record (``rltrace_record``) so rltrace's own exporters can encode from it directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.status import Status, StatusCode

from rltrace.recording.recorder import STATE, Scope
from rltrace.recording.user_values import category_name, flatten_into, text
from rltrace.semconv import (
    ARGS_PREFIX,
    ATTR_CATEGORY,
    ATTR_INSTANT,
    ATTR_LANE,
    ATTR_SESSION,
    ATTR_STEP,
    ATTR_THREAD_ID,
    ATTR_THREAD_NAME,
    DEFAULT_AGENT_NAME,
    DEFAULT_WORKFLOW_NAME,
    EVALUATION_EVENT,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION,
    GEN_AI_OPERATION,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_TOOL_NAME,
    GEN_AI_WORKFLOW_NAME,
    OP_EXECUTE_TOOL,
    OP_INVOKE_AGENT,
    OP_INVOKE_WORKFLOW,
    SEMCONV_OPT_IN_ENV,
    SESSION_SPAN,
    TASK_SPAN,
    conversation_id,
    genai_latest_experimental,
)
from rltrace.steps import step_of

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
    (:mod:`rltrace.pipeline.otlp_encode`), so both send the same attributes.
    """
    attrs: dict[str, Any] = {
        ATTR_CATEGORY: category_name(rec.category),
        ATTR_THREAD_ID: rec.thread,
        ATTR_THREAD_NAME: STATE.thread_names.name(rec.thread),
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
    name = rec.name
    if name in (SESSION_SPAN, TASK_SPAN):
        _genai_attrs(rec, name, attrs)
    elif own and GEN_AI_OPERATION in own:  # a generate or tool-call phase: its session's
        _conversation(rec, attrs)
    return attrs


def event_attributes(name: str, args: Mapping[str, object] | None, category: object) -> dict[str, Any]:
    """A recorded span event's OTel attributes: its category, then its args as ``args.<key>``;
    a GenAI evaluation's (``gen_ai.evaluation.result``) keep their convention's keys.  Shared by
    :meth:`SpanBuilder.build` and the direct OTLP encoder."""
    attrs: dict[str, Any] = {}
    if category is not None:
        attrs[ATTR_CATEGORY] = category_name(category)
    if args:
        flatten_into(attrs, "" if name == EVALUATION_EVENT else ARGS_PREFIX, args)
    return attrs


def _genai_attrs(rec: Scope, name: str, attrs: dict[str, Any]) -> None:
    """The OTel GenAI attributes of a session (an agent run: ``invoke_agent``, its conversation
    :func:`~rltrace.semconv.conversation_id`) or a task (a workflow: ``invoke_workflow``); what
    the span set itself (``set_attribute``) wins."""
    if name == SESSION_SPAN:
        attrs.setdefault(GEN_AI_OPERATION, OP_INVOKE_AGENT)
        attrs.setdefault(GEN_AI_AGENT_NAME, DEFAULT_AGENT_NAME)
        _conversation(rec, attrs)
    else:
        attrs.setdefault(GEN_AI_OPERATION, OP_INVOKE_WORKFLOW)
        attrs.setdefault(GEN_AI_WORKFLOW_NAME, DEFAULT_WORKFLOW_NAME)


def _conversation(rec: Scope, attrs: dict[str, Any]) -> None:
    """``gen_ai.conversation.id`` of a session, or of one of its generate and tool-call phases
    (:func:`~rltrace.semconv.conversation_id`: its trace and session ids), unless the span set
    its own."""
    sid = attrs.get(ATTR_SESSION)
    if sid is not None:
        attrs.setdefault(GEN_AI_CONVERSATION, conversation_id(rec.get_span_context().trace_id, sid))


#: GenAI operation -> the attribute that completes its span name (``{operation} {target}``)
_NAME_TARGET: Mapping[str, str] = MappingProxyType({
    OP_INVOKE_AGENT: GEN_AI_AGENT_NAME, OP_INVOKE_WORKFLOW: GEN_AI_WORKFLOW_NAME,
    OP_EXECUTE_TOOL: GEN_AI_TOOL_NAME,
})


def genai_span_name(name: str, attrs: dict[str, Any]) -> str:
    """The span name the latest experimental GenAI conventions give a span with these attributes
    (``invoke_agent rollout``, ``invoke_workflow task``, ``text_completion demo-7b``,
    ``execute_tool python``; the operation alone without its target), else ``name``."""
    op = attrs.get(GEN_AI_OPERATION)
    if type(op) is not str:
        return name
    target = attrs.get(_NAME_TARGET.get(op, GEN_AI_REQUEST_MODEL))
    return f"{op} {target}" if target is not None and target != "" else op


def genai_names_from_env() -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` selects the latest GenAI names (read when a
    pipeline is configured)."""
    return genai_latest_experimental(os.environ.get(SEMCONV_OPT_IN_ENV))



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
        #: span names per the latest experimental GenAI conventions (``OTEL_SEMCONV_STABILITY_OPT_IN=
        #: gen_ai_latest_experimental``), else rltrace's own; attributes are the same either way
        self.genai_names = genai_names_from_env()

    def build(self, rec: Scope) -> ReadableSpan:
        attrs = span_attributes(rec)
        events: list[Event] = []
        links: list[Link] = []
        status = _UNSET
        extra = rec.extra
        if extra is not None:
            for name, ts, ev_args, ev_cat in extra.get("events", ()):
                ev_attrs = event_attributes(name, ev_args, ev_cat)
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
            name=genai_span_name(rec.name, attrs) if self.genai_names else rec.name,
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
