"""Encode recorded scopes straight into an OTLP ``ExportTraceServiceRequest``.

The SDK's path to OTLP builds a ``ReadableSpan`` per span (attributes validated under a lock)
and then re-encodes it attribute by attribute into protobuf messages: in a Python training
loop that costs more than recording the span did.  This encoder produces the same protobuf
``Span`` from the record itself: the same attributes in the same order
(:func:`rltrace.pipeline.readable_spans.span_attributes`), ids, times, kind, status and flags, with
serialized pieces that repeat (a name with its kind and status, an attribute key with a
value seen before) cached and merged by the protobuf library (``MergeFromString`` of
concatenated messages of one type merges them: repeated fields append).

Records this fast path does not cover (events other than GenAI evaluations, links, an error
or status, more attributes or events than the span limits allow, a value-length limit) go
through the SDK path
(``SpanBuilder.build`` and ``encode_spans``), so every span is encoded exactly as the SDK
would encode it; ``tests/export/otlp/test_otlp_encode.py`` checks both against the SDK's own encoding.
Foreign ``ReadableSpan``s (other instrumentation's spans ended through rltrace's provider)
are encoded by the SDK's encoder and sent in the same request.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags, Status
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from rltrace.pipeline.readable_spans import (
    SpanBuilder,
    bound,
    event_attributes,
    genai_span_name,
    span_attributes,
)
from rltrace.recording.recorder import STATE, RecordBase, Scope
from rltrace.recording.user_values import category_name
from rltrace.semconv import (
    ATTR_CATEGORY,
    ATTR_LANE,
    ATTR_STEP,
    ATTR_THREAD_ID,
    ATTR_THREAD_NAME,
    EVALUATION_EVENT,
)
from rltrace.steps import step_of

_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INTERNAL = PBSpan.SpanKind.SPAN_KIND_INTERNAL
_CACHE_MAX = 16_384  # serialized fragments kept (a bounded cache: cleared when full)
# Span fields 7 and 8 (fixed64 times, tags 0x39 and 0x41) and 16 (fixed32 flags, tag 133 as
# the varint 0x85 0x01, little-endian 0x0185), packed in one call
_TIMES_FLAGS = struct.Struct("<BQBQHI")
_FLAGS_TAG = 0x0185
_LOCAL_PARENT = int(_HAS_IS_REMOTE)
_REMOTE_PARENT = int(_HAS_IS_REMOTE | _IS_REMOTE)
#: the ``extra`` keys of a record the fast path encodes (with "events": evaluations only)
_PLAIN_EXTRA = frozenset(("attrs", "instant"))
#: an evaluation event's time (tag 0x09, fixed64) and name (field 2) fields
_EVENT_TIME = struct.Struct("<BQ")
_EVAL_NAME_FIELD = b"\x12" + bytes([len(EVALUATION_EVENT)]) + EVALUATION_EVENT.encode()
_EVAL_EXTRA = frozenset(("attrs", "instant", "events"))


def _varint(n: int) -> bytes:
    """``n`` as a protobuf varint (one or two bytes for a span's length, mostly)."""
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _any(value: Any) -> AnyValue:
    """An attribute value as ``AnyValue`` (the SDK encoder's mapping: bool before int)."""
    t = type(value)
    if t is str:
        return AnyValue(string_value=value)
    if t is bool:
        return AnyValue(bool_value=value)
    if t is int:
        return AnyValue(int_value=value)
    if t is float:
        return AnyValue(double_value=value)
    if t is tuple or t is list:
        return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
    if t is bytes:
        return AnyValue(bytes_value=value)
    raise TypeError(type(value))  # never from span_attributes: it yields OTel attribute values


class RecordEncoder:
    """Builds OTLP requests for one pipeline (its resource, scope and span limits)."""

    def __init__(self, builder: SpanBuilder) -> None:
        self.builder = builder
        limits = builder.limits
        self._max_attrs = bound(limits.max_span_attributes)
        self._value_len = limits.max_span_attribute_length
        # the request envelope (resource and instrumentation scope) exactly as the SDK encodes
        # it, taken from the SDK's encoder once
        probe = ReadableSpan(name="probe", context=SpanContext(1, 1, False, TraceFlags(1)),
                             resource=builder.resource,
                             instrumentation_scope=builder.scope)
        envelope = encode_spans([probe])
        envelope.resource_spans[0].scope_spans[0].ClearField("spans")
        self._envelope = envelope.SerializeToString()
        self._heads: dict[str, bytes] = {}
        self._genai_names = builder.genai_names
        self._kv: dict[tuple[str, type, object], bytes] = {}
        #: a plain scope's first four attributes, serialized, by its category (type and
        #: value), thread, thread name and lane
        self._prefixes: dict[tuple[type, object, int, str, int], bytes] = {}
        #: spans encoded on the fast path / through the SDK's encoder (diagnostics)
        self.fast = 0
        self.slow = 0

    def request(self, items: Iterable[Any]) -> ExportTraceServiceRequest:
        """One request holding every item: rltrace records and foreign ``ReadableSpan``s."""
        req = ExportTraceServiceRequest()
        req.MergeFromString(self._envelope)
        scope_spans = req.resource_spans[0].scope_spans[0]
        blobs: list[bytes] = []  # the fast path's spans, as ScopeSpans.spans fields
        keep = blobs.append
        foreign: list[ReadableSpan] = []
        slow: list[ReadableSpan] = []
        for item in items:
            if not isinstance(item, RecordBase):
                foreign.append(item)
                continue
            span = self._fast(item)
            if span is None:
                slow.append(self.builder.build(item))
                continue
            keep(b"\x12" + _varint(len(span)) + span)  # field 2, length-prefixed
        if blobs:  # one parse for the lot: merging a ScopeSpans appends its spans
            scope_spans.MergeFromString(b"".join(blobs))
            self.fast += len(blobs)
        if slow:
            self.slow += len(slow)
            for rs in encode_spans(slow).resource_spans:  # same resource and scope: one list
                for ss in rs.scope_spans:
                    scope_spans.spans.extend(ss.spans)
        if foreign:
            req.resource_spans.extend(encode_spans(foreign).resource_spans)
        return req

    def _fast(self, rec: Scope) -> bytes | None:
        """The record's serialized ``Span``; None when the SDK path must encode it.

        Built from wire-format pieces: the cached name/kind/status head, the ids, times and
        flags (fields 1, 2, 4, 7, 8, 16), the cached attribute fragments (field 9) and the
        trace state (field 3); the parser takes fields in any order."""
        extra = rec.extra
        events = b""
        if extra is not None and not extra.keys() <= _PLAIN_EXTRA:
            if not extra.keys() <= _EVAL_EXTRA:
                return None  # links, error, status, other events: rare, and the SDK path has them
            evals = self._evaluations(extra["events"])  # a scored session: every session, often
            if evals is None:
                return None
            events = evals
        if self._value_len is not None:
            return None  # the SDK's limits apply (values truncated, counted)
        attr_bytes = self._plain_attrs(rec) if extra is None and not rec.args \
            and not rec.slot_attrs else None
        attrs = None  # a plain scope's (no GenAI attributes among them)
        if attr_bytes is None:
            attrs = span_attributes(rec)
            if len(attrs) > self._max_attrs:
                return None  # the SDK's limits apply (oldest dropped, counted)
            attr_bytes = self._attrs_bytes(attrs)
        name = rec.name
        if self._genai_names and attrs is not None:  # OTEL_SEMCONV_STABILITY_OPT_IN names
            name = genai_span_name(name, attrs)
        head = self._heads.get(name)
        if head is None:
            head = PBSpan(name=name, kind=_INTERNAL, status=Status()).SerializeToString()
            if len(self._heads) >= _CACHE_MAX:
                self._heads.clear()
            self._heads[name] = head
        # SpanContext fields by index: 0 trace_id, 1 span_id, 2 is_remote, 4 trace_state
        sc = rec.get_span_context()
        parts = [head, b"\x0a\x10", sc[0].to_bytes(16, "big"), b"\x12\x08",
                 sc[1].to_bytes(8, "big")]
        flags = _LOCAL_PARENT
        parent = rec.parent
        if parent is not None:
            psc = parent.get_span_context()
            parts += (b"\x22\x08", psc[1].to_bytes(8, "big"))
            if psc[2]:
                flags = _REMOTE_PARENT
        parts += (_TIMES_FLAGS.pack(0x39, rec.start_ns, 0x41, rec.end_ns, _FLAGS_TAG, flags),
                  attr_bytes, events)
        if sc[4]:
            parts.append(PBSpan(trace_state=",".join(f"{k}={v}" for k, v in sc[4].items()))
                         .SerializeToString())
        return b"".join(parts)

    def _evaluations(self, events: list[tuple[str, int, Any, Any]]) -> bytes | None:
        """A session's ``gen_ai.evaluation.result`` events as serialized ``Span.events`` fields
        (field 11), attributes as :func:`~rltrace.pipeline.readable_spans.event_attributes` gives them; None
        when another event is among them or the span limits apply (the SDK path then)."""
        limits = self.builder.limits
        if len(events) > bound(limits.max_events):
            return None
        max_attrs = bound(limits.max_event_attributes)
        out: list[bytes] = []
        for name, ts, args, cat in events:
            if name != EVALUATION_EVENT:
                return None
            attrs = event_attributes(name, args, cat)
            if len(attrs) > max_attrs:
                return None
            # Event: time (field 1, fixed64), name (2), attributes (3): the cached Span.attributes
            # fragments (field 9, one-byte tag 0x4a) with the tag of field 3 (0x1a)
            body = b"".join([_EVENT_TIME.pack(0x09, ts), _EVAL_NAME_FIELD,
                             *(b"\x1a" + f[1:] for f in self._attr_fragments(attrs))])
            out += (b"\x5a", _varint(len(body)), body)  # Span.events (field 11)
        return b"".join(out)

    def _attrs_bytes(self, attrs: dict[str, Any]) -> bytes:
        """``attrs`` as serialized ``Span.attributes`` fields (each key/value cached)."""
        return b"".join(self._attr_fragments(attrs))

    def _attr_fragments(self, attrs: dict[str, Any]) -> list[bytes]:
        """``attrs`` as serialized ``Span.attributes`` fields, one per attribute (each cached)."""
        kv_cache = self._kv
        parts = []
        for key, value in attrs.items():
            t = type(value)
            if t is tuple or t is list:  # sequences: not cached ((True,) == (1,))
                parts.append(PBSpan(attributes=[KeyValue(key=key, value=_any(value))])
                             .SerializeToString())
                continue
            ck = (key, t, value)  # the type too: True == 1 == 1.0 as dict keys
            frag = kv_cache.get(ck)
            if frag is None:
                frag = PBSpan(attributes=[KeyValue(key=key, value=_any(value))]).SerializeToString()
                if len(kv_cache) >= _CACHE_MAX:
                    kv_cache.clear()
                kv_cache[ck] = frag
            parts.append(frag)
        return parts

    def _plain_attrs(self, rec: Scope) -> bytes | None:
        """A plain scope's attributes (no args, attributes, events or instant): what
        :func:`span_attributes` gives it, serialized, from a cache of its first four (category,
        thread id and name, lane) and the step it inherits; None where that cannot apply."""
        if self._max_attrs < 5:
            return None
        thread, category = rec.thread, rec.category
        # the category's type too: True == 1 as dict keys, but their names differ
        key = (type(category), category, thread, STATE.thread_names.name(thread), rec.lane)
        try:
            prefix = self._prefixes.get(key)
        except TypeError:  # an unhashable category: the general path
            return None
        if prefix is None:
            prefix = self._attrs_bytes({ATTR_CATEGORY: category_name(category),
                                        ATTR_THREAD_ID: thread, ATTR_THREAD_NAME: key[3],
                                        ATTR_LANE: key[4]})
            if len(self._prefixes) >= _CACHE_MAX:
                self._prefixes.clear()
            self._prefixes[key] = prefix
        parent = rec.parent  # a plain scope has no step of its own: its nearest ancestor's
        step = None if parent is None else step_of(parent)
        if step is None:
            return prefix
        return prefix + self._attrs_bytes({ATTR_STEP: step})
