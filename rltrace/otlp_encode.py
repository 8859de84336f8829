"""Encode recorded scopes straight into an OTLP ``ExportTraceServiceRequest``.

The SDK's path to OTLP builds a ``ReadableSpan`` per span (attributes validated under a lock)
and then re-encodes it attribute by attribute into protobuf messages: in a Python training
loop that costs more than recording the span did.  This encoder produces the same protobuf
``Span`` from the record itself: the same attributes in the same order
(:func:`rltrace.materialize.span_attributes`), ids, times, kind, status and flags, with
serialized pieces that repeat (a name with its kind and status, an attribute key with a
value seen before) cached and merged by the protobuf library (``MergeFromString`` of
concatenated messages of one type merges them: repeated fields append).

Records this fast path does not cover (events, links, an error or status, more attributes
than the span limits allow, a value-length limit) go through the SDK path
(``SpanBuilder.build`` and ``encode_spans``), so every span is encoded exactly as the SDK
would encode it; ``tests/test_otlp_encode.py`` checks both against the SDK's own encoding.
Foreign ``ReadableSpan``s (other instrumentation's spans ended through rltrace's provider)
are encoded by the SDK's encoder and sent in the same request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags, Status
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from .materialize import SpanBuilder, bound, span_attributes
from .recorder import RecordBase, Scope

_HAS_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_INTERNAL = PBSpan.SpanKind.SPAN_KIND_INTERNAL
_CACHE_MAX = 16_384  # serialized fragments kept (a bounded cache: cleared when full)


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
        self._kv: dict[tuple[str, type, Any], bytes] = {}
        #: spans encoded on the fast path / through the SDK's encoder (diagnostics)
        self.fast = 0
        self.slow = 0

    def request(self, items: Iterable[Any]) -> ExportTraceServiceRequest:
        """One request holding every item: rltrace records and foreign ``ReadableSpan``s."""
        req = ExportTraceServiceRequest()
        req.MergeFromString(self._envelope)
        spans = req.resource_spans[0].scope_spans[0].spans
        add = spans.add
        foreign: list[ReadableSpan] = []
        slow: list[ReadableSpan] = []
        for item in items:
            if not isinstance(item, RecordBase):
                foreign.append(item)
                continue
            if not self._fast(item, add):
                slow.append(self.builder.build(item))
        if slow:
            self.slow += len(slow)
            for rs in encode_spans(slow).resource_spans:  # same resource and scope: one list
                for ss in rs.scope_spans:
                    spans.extend(ss.spans)
        if foreign:
            req.resource_spans.extend(encode_spans(foreign).resource_spans)
        return req

    def _fast(self, rec: Scope, add: Any) -> bool:
        """Append the record's ``Span`` with ``add``; False when the SDK path must encode it."""
        extra = rec.extra
        if extra is not None and (len(extra) > 2 or not extra.keys() <= {"attrs", "instant"}):
            return False  # events, links, error, status: rare, and the SDK path has them
        attrs = span_attributes(rec)
        if len(attrs) > self._max_attrs or self._value_len is not None:
            return False  # the SDK's limits apply (oldest dropped, values truncated, counted)
        name = rec.name
        head = self._heads.get(name)
        if head is None:
            head = PBSpan(name=name, kind=_INTERNAL, status=Status()).SerializeToString()
            if len(self._heads) >= _CACHE_MAX:
                self._heads.clear()
            self._heads[name] = head
        parts = [head]
        kv_cache = self._kv
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
        span = add()
        span.MergeFromString(b"".join(parts))
        sc = rec.get_span_context()
        span.trace_id = sc.trace_id.to_bytes(16, "big")
        span.span_id = sc.span_id.to_bytes(8, "big")
        span.start_time_unix_nano = rec.start_ns
        span.end_time_unix_nano = rec.end_ns
        parent = rec.parent
        if parent is not None:
            psc = parent.get_span_context()
            span.parent_span_id = psc.span_id.to_bytes(8, "big")
            span.flags = _HAS_IS_REMOTE | _IS_REMOTE if psc.is_remote else _HAS_IS_REMOTE
        else:
            span.flags = _HAS_IS_REMOTE
        if sc.trace_state:
            span.trace_state = ",".join(f"{k}={v}" for k, v in sc.trace_state.items())
        self.fast += 1
        return True
