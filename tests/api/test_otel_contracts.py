"""OTel SDK contracts for rltrace spans (issue 17, item 2, in part): writes after a span ended
are ignored (one warning, then counted), ``add_event`` is bounded, and the SDK's span limits
(``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
``OTEL_SPAN_EVENT_COUNT_LIMIT``) apply to exported spans as they do to the SDK's own."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from conftest import clean_env, one_session
from opentelemetry import trace

import rltrace
from rltrace.testing import capture_spans, read_jsonl


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch, otel_prefix="OTEL_")


def test_writes_to_an_ended_span_are_ignored_with_one_warning_and_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("done") as span:
            span.set_attribute("inside", 1)
        with caplog.at_level(logging.WARNING, logger="rltrace"):
            span.set_attribute("late", 2)
            span.set_attributes({"late2": 3})
            span.add_event("late.event")
            span.set_status(trace.StatusCode.ERROR, "late")
            span.update_name("renamed")
        exported = cap.one("done")
        diag = rltrace.diagnostics()["span_api"]
    assert dict(exported.attributes)["inside"] == 1
    assert "late" not in exported.attributes and "late2" not in exported.attributes
    assert not exported.events and exported.status.status_code == trace.StatusCode.UNSET
    assert diag["writes_after_end"] == 5
    assert sum("after it ended is ignored" in r.getMessage() for r in caplog.records) == 1


def test_set_attribute_racing_scope_exit_never_lands_after_the_end(tmp_path: Path) -> None:
    """The review found 12,000 of 40,000 spans carrying attributes set after they ended.  A
    thread keeps writing to the latest span while the main thread opens and closes them; every
    write it issued to a span that had already ended must be refused and counted.  Every 10th
    span the main thread waits after the exit until the writer has written to it (ended), so
    writes after the end happen on every run, whatever the scheduler does with the rest."""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # interleave the two threads as finely as the GIL allows
    stop, wrote_after_end = threading.Event(), threading.Event()
    current: list[object] = [None]
    after_end: set[tuple[int, int]] = set()

    def writer() -> None:
        n = 0
        while not stop.is_set():
            span = current[0]
            if span is not None:
                n += 1
                ended = span.end_ns != 0  # type: ignore[attr-defined]
                span.set_attribute("racer", n)  # type: ignore[attr-defined]
                if ended:
                    after_end.add((id(span), n))
                    wrote_after_end.set()

    try:
        with capture_spans(tmp_path) as cap:
            t = threading.Thread(target=writer)
            t.start()
            try:
                for i in range(3000):
                    with rltrace.trace_scope(f"s{i % 4}") as span:
                        current[0] = span
                    if i % 10 == 0:  # the writer still holds this span, now ended
                        wrote_after_end.clear()
                        assert wrote_after_end.wait(30)
            finally:
                stop.set()
                t.join(30)
            spans = cap.spans()
            counted = rltrace.diagnostics()["span_api"]["writes_after_end"]
    finally:
        sys.setswitchinterval(old)
    assert len(spans) == 3000
    assert after_end  # (made on every 10th span at least: the waits above)
    assert counted >= len(after_end)
    landed = {(id(s.rltrace_record), s.attributes["racer"]) for s in spans  # type: ignore[attr-defined]
              if "racer" in s.attributes}
    assert not landed & after_end, "attributes set after the span ended were exported"


def test_add_event_is_bounded_by_the_span_event_limit_and_instants_are_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "10")
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("noisy") as span:
            for i in range(1000):
                span.add_event(f"e{i}")
        with rltrace.trace_scope("marks"):
            for i in range(30):
                rltrace.instant(f"mark{i}")
        noisy, marks = cap.one("noisy"), cap.one("marks")
        diag = rltrace.diagnostics()["span_api"]
        chrome = [e for f in cap.log_dir.rglob("traces-*.jsonl") for e in read_jsonl(f) if e.get("ph") == "i"]
    assert [e.name for e in noisy.events] == [f"e{i}" for i in range(10)]
    assert diag["dropped_events"] == 990 and diag["max_events"] == 10
    assert len(marks.events) == 10  # the OTel span honours the limit ...
    assert len([e for e in chrome if e["name"].startswith("mark")]) == 30  # ... the local file keeps all


def test_span_attribute_count_and_value_length_limits_apply_to_exported_spans(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "8")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("big", args={f"k{i}": "x" * 50 for i in range(20)}):
            pass
        span = cap.one("big")
    assert len(span.attributes) == 8 and span.dropped_attributes > 0
    assert all(len(v) <= 5 for v in span.attributes.values() if isinstance(v, str))


class _OnStart(rltrace.pipeline.loop.SpanProcessor):
    """A user's processor: notes every on_start and tags the span there (a common pattern)."""

    def __init__(self, fail: bool = False) -> None:
        self.started: list[tuple[str, int, object]] = []
        self.fail = fail

    def on_start(self, span: object, parent_context: object = None) -> None:
        current = trace.get_current_span(parent_context)  # type: ignore[arg-type]
        self.started.append((span.name, threading.get_ident(), current))  # type: ignore[attr-defined]
        if self.fail:
            raise RuntimeError("processor bug")
        span.set_attribute("tagged.on_start", True)  # type: ignore[attr-defined]


def test_on_start_of_a_users_processor_runs_as_rltrace_spans_start(tmp_path: Path) -> None:
    proc = _OnStart()
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        rltrace.add_span_processor(proc)
        try:
            with rltrace.trace_scope("outer") as outer:
                with rltrace.trace_scope("inner"):
                    pass
                one_session()
            rltrace.flush()
            names = [n for n, _, _ in proc.started]
            assert names == ["outer", "inner", "rl.task", "rl.session", "generate"]
            assert {t for _, t, _ in proc.started} == {threading.get_ident()}
            assert proc.started[1][2] is outer  # the parent context holds the enclosing span
            for name in names:  # what on_start set is on the exported span
                assert dict(cap.one(name).attributes)["tagged.on_start"] is True
        finally:
            rltrace.runtime.remove_span_processor(proc)
        with rltrace.trace_scope("after"):
            pass
        assert len(proc.started) == 5  # removed: no longer called


def test_a_failing_on_start_is_logged_and_the_span_still_recorded(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proc = _OnStart(fail=True)
    with capture_spans(tmp_path) as cap:
        rltrace.add_span_processor(proc)
        try:
            with caplog.at_level(logging.WARNING, logger="rltrace"), rltrace.trace_scope("kept"):
                pass
            rltrace.flush()
            assert cap.one("kept").name == "kept"
        finally:
            rltrace.runtime.remove_span_processor(proc)
    assert [n for n, _, _ in proc.started] == ["kept"]
    assert any("on_start" in r.getMessage() for r in caplog.records)


def test_span_limits_from_the_config_win_over_the_env_and_reach_otlp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "50")
    from rltrace.testing.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as rx, capture_spans(
            tmp_path, span_limits={"attribute_count": 6, "attribute_value_length": 4,
                                   "event_count": 2},
            otlp={"endpoint": rx.grpc_endpoint, "metrics": False}) as cap:
        with rltrace.trace_scope("limited", args={f"k{i}": "x" * 9 for i in range(10)}) as s:
            for i in range(5):
                s.add_event(f"e{i}")
        rltrace.flush()
        span = cap.one("limited")
        [sent] = rx.wait_for_spans("limited")
    assert len(span.attributes) == 6 and span.dropped_attributes == 10 + 4 - 6
    assert all(len(v) <= 4 for v in span.attributes.values() if isinstance(v, str))
    assert len(span.events) == 2
    assert len(sent.attributes) == 6 and all(len(v) <= 4 for v in sent.attributes.values()
                                             if isinstance(v, str))
    with pytest.raises(rltrace.config.ConfigError, match=r"span_limits.event_count.*>= 0"):
        rltrace.configure(fileroot=str(tmp_path), span_limits={"event_count": -1})
