"""The direct OTLP encoder (``rltrace.pipeline.otlp_encode``) sends exactly what the SDK's path would.

Every test encodes the same recorded scopes twice: through rltrace's encoder and through the
SDK path (``SpanBuilder.build`` to a ``ReadableSpan``, then the SDK's own ``encode_spans``),
and compares the protobuf messages span by span.  The end-to-end tests send through the real
exporters (gRPC and HTTP) to the in-process OTLP receiver.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import one_session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider

import rltrace
from rltrace import runtime
from rltrace.pipeline.otlp_encode import RecordEncoder
from rltrace.recording.recorder import STATE
from rltrace.semconv import ATTR_STATUS
from rltrace.testing.otlp_receiver import OTLPReceiver


@pytest.fixture
def records(tmp_path: Path) -> Iterator[None]:
    """rltrace configured with no exporter thread activity: records stay in the buffer."""
    rltrace.configure(fileroot=str(tmp_path), flush_interval_s=3600, max_queue_size=1 << 20,
                      session_tracer={"enabled": True}, flush_at_exit=False)
    yield
    STATE.buffer.clear()
    rltrace.shutdown()


def _take() -> tuple[list[Any], Any]:
    """The buffered records, passed through the record processors as the exporter cycle does."""
    p = runtime.get_pipeline()
    assert p is not None
    recs = list(STATE.buffer)
    STATE.buffer.clear()
    for rec in recs:
        for rp in p.record_processors:
            rp.on_record(rec)
    return recs, p


def _by_id(req: ExportTraceServiceRequest) -> dict[bytes, Any]:
    out = {}
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                out[span.span_id] = span
    return out


def _assert_same(recs: list[Any], p: Any) -> RecordEncoder:
    enc = RecordEncoder(p.builder)
    mine = enc.request(recs)
    ref = encode_spans([p.builder.build(r) for r in recs])
    # one resource/scope envelope, equal to the SDK's
    assert len(mine.resource_spans) == len(ref.resource_spans) == 1
    assert mine.resource_spans[0].resource == ref.resource_spans[0].resource
    assert mine.resource_spans[0].scope_spans[0].scope == ref.resource_spans[0].scope_spans[0].scope
    a, b = _by_id(mine), _by_id(ref)
    assert a.keys() == b.keys() and len(a) == len(recs)
    for sid, span in b.items():
        assert a[sid] == span, (a[sid], span)
    # and the serialized request decodes to the same spans
    again = ExportTraceServiceRequest.FromString(mine.SerializeToString())
    assert _by_id(again) == a
    return enc


def test_plain_scopes_args_and_attributes_encode_as_the_sdk_does(records: None) -> None:
    with rltrace.trace_scope("outer", category="compute",
                             args={"global_step": 3, "lr": 1e-5, "tags": ["a", "b"], "ok": True,
                                   "nested": {"k": 1, "deep": {"x": "y"}}, "none": None,
                                   "big": 2**70, "bad": "\udcff", "mixed": [1, "a"]}) as s:
        s.set_attribute("user.attr", 7)
        s.set_attribute("user.flag", False)
        with rltrace.trace_scope("inner"):  # inherits rl.step from the parent's args
            pass
    rltrace.instant("mark", args={"v": 1.5})
    recs, p = _take()
    enc = _assert_same(recs, p)
    assert enc.fast == len(recs) and enc.slow == 0  # all on the fast path


def test_plain_scopes_of_any_category_thread_and_lane_encode_as_the_sdk_does(records: None) -> None:
    """Plain scopes take a cached prefix of their first four attributes: categories that are
    equal as dict keys but named differently (``True``/``1``/``1.0``, ``Category.IO``/"io"),
    an unhashable one, other threads, nested lanes and an inherited step all encode as the
    SDK encodes them."""
    import threading

    cats: list[Any] = [None, "io", rltrace.Category.IO, 1, True, 1.0, "1", ["x"]]

    def body() -> None:
        for cat in cats:
            with rltrace.trace_scope("plain", category=cat):
                with rltrace.trace_scope("nested", category=cat):
                    pass

    body()
    t = threading.Thread(target=body, name="other")
    t.start()
    t.join()
    with rltrace.trace_scope("stepped", args={"global_step": 9}):
        body()  # every plain scope below inherits rl.step = 9
    recs, p = _take()
    enc = _assert_same(recs, p)
    assert enc.fast == len(recs) == 3 * 2 * len(cats) + 1 and enc.slow == 0
    got = {(s.name, kv.value.string_value) for s in _by_id(enc.request(recs)).values()
           for kv in s.attributes if kv.key == "rl.category"}
    assert {c for n, c in got if n == "plain"} == {"misc", "io", "1", "True", "1.0", "['x']"}


def test_sessions_tasks_and_phases_encode_as_the_sdk_does(records: None) -> None:
    with rltrace.step(5):
        task = rltrace.register_task()
        sids = [rltrace.register_session(task) for _ in range(2)]
    for _turn in range(2):
        with rltrace.trace_session_phase("generate", {"model": "m", "input_tokens": 7},
                                         session_id=sids[0]):
            pass
        with rltrace.trace_session_phase("toolcall", session_id=sids[0]):
            pass
    with rltrace.trace_session_phase("reward", session_id=sids[1]):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sids[0], status="accepted")
    rltrace.trace_session_event("mark_finalized", session_id=sids[1], status="rejected",
                                reason="low reward")
    recs, p = _take()
    enc = _assert_same(recs, p)
    assert enc.fast == len(recs) >= 8 and enc.slow == 0
    # the session figures derived by the record processor are on the encoded session span
    sessions = [s for s in _by_id(enc.request(recs)).values() if s.name == "rl.session"]
    keys = {kv.key for s in sessions for kv in s.attributes}
    assert {"rl.session.total_s", "rl.session.turns", ATTR_STATUS} <= keys


def test_errors_events_links_and_status_take_the_sdk_path_and_still_match(records: None) -> None:
    with pytest.raises(ValueError), rltrace.trace_scope("boom"):
        raise ValueError("broken")
    with rltrace.trace_scope("evented") as s:
        s.add_event("ev", {"k": 1})
    task = rltrace.register_task()
    with rltrace.trace_scope("linked"):
        assert rltrace.link_consumed(task_ids=[task]) == 1
    with rltrace.trace_scope("status") as s3:
        s3.set_status(trace.Status(trace.StatusCode.OK))
    recs, p = _take()
    enc = _assert_same(recs, p)
    assert enc.slow == 4


def test_foreign_and_remote_parents_keep_their_flags(records: None) -> None:
    other = TracerProvider().get_tracer("other")
    with other.start_as_current_span("foreign-parent"), rltrace.trace_scope("under-foreign"):
        pass
    remote = trace.NonRecordingSpan(trace.SpanContext(
        0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("vendor", "v1")])))
    with trace.use_span(remote), rltrace.trace_scope("under-remote"):
        pass
    recs, p = _take()
    _assert_same(recs, p)
    spans = {s.name: s for s in _by_id(RecordEncoder(p.builder).request(recs)).values()}
    assert spans["under-remote"].flags & 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE
    assert spans["under-remote"].trace_id == (0x1234).to_bytes(16, "big")
    assert not spans["under-foreign"].flags & 0x200


def test_span_limits_send_records_through_the_sdk_limits(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "6")
    rltrace.configure(fileroot=str(tmp_path), flush_interval_s=3600, flush_at_exit=False)
    try:
        with rltrace.trace_scope("wide", args={f"k{i}": i for i in range(10)}):
            pass
        with rltrace.trace_scope("narrow"):
            pass
        recs, p = _take()
        enc = _assert_same(recs, p)
        assert (enc.fast, enc.slow) == (1, 1)
        wide = next(s for s in _by_id(enc.request(recs)).values() if s.name == "wide")
        assert len(wide.attributes) == 6 and wide.dropped_attributes_count == 8
    finally:
        STATE.buffer.clear()
        rltrace.shutdown()


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.dictionaries(st.text(min_size=1, max_size=8), _values, max_size=6),
       attrs=st.dictionaries(st.sampled_from(["a", "b", "rl.x"]),
                             st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=3),
                             max_size=3))
def test_any_args_and_attributes_encode_as_the_sdk_does(records: None, args: dict[str, Any],
                                                        attrs: dict[str, Any]) -> None:
    """Fuzzed: values of every kind, repeated across spans so the fragment cache is hit with
    equal-comparing values of different types (True, 1, 1.0)."""
    for _ in range(2):
        with rltrace.trace_scope("fuzz", args=args) as s:
            for k, v in attrs.items():
                s.set_attribute(k, v)
        with rltrace.trace_scope("fuzz") as s:
            for k, v in attrs.items():
                s.set_attribute(k, float(v) if type(v) is int and not math.isnan(v) else v)
    recs, p = _take()
    _assert_same(recs, p)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_records_reach_a_real_receiver_encoded_directly(tmp_path: Path, protocol: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("OTEL_"):
            monkeypatch.delenv(k, raising=False)
    with OTLPReceiver() as rx:
        endpoint = rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint
        rltrace.configure(fileroot=str(tmp_path), session_tracer={"enabled": True},
                          otlp={"endpoint": endpoint, "protocol": protocol, "timeout_s": 5.0},
                          flush_at_exit=False)
        try:
            other = rltrace.tracer_provider().get_tracer("other")  # foreign spans, same request
            with rltrace.trace_scope("train.step", args={"global_step": 2}):
                with other.start_as_current_span("foreign"):
                    pass
                one_session()
            rltrace.flush()
            p = runtime.get_pipeline()
            assert p is not None and p.otlp is not None and p.otlp.force_flush(10_000)
            stats = rltrace.diagnostics()["otlp"]
        finally:
            rltrace.shutdown()
        spans = {s.name: s for s in rx.wait_for_spans(5)}
    assert stats["encoded_direct"] == 4 and stats["encoded_by_sdk"] == 0
    assert stats["exported"] == 5 and stats["failed"] == 0
    assert spans["foreign"].parent_span_id == spans["train.step"].span_id
    assert spans["rl.session"].attributes["rl.step"] == 2
    assert spans["rl.session"].attributes[ATTR_STATUS] == "accepted"
    assert spans["train.step"].attributes["args.global_step"] == 2
