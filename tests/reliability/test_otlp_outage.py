"""Backend faults beyond tests/export/otlp/test_otlp.py (issue 8, item 4): a collector answering with errors,
a collector restarted mid-run, and memory while the backend is away for a long burst.

Against the real in-process receiver (:class:`rltrace.testing.otlp_receiver.OTLPReceiver`).  Step times
are compared with what the same test measured against a healthy backend; every span handed to
OTLP must end up delivered or counted (exported + failed + dropped).
"""

from __future__ import annotations

import gc
import socket
import statistics
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import clean_env

import rltrace
from rltrace import runtime
from rltrace.pipeline import loop as pipeline
from rltrace.testing.otlp_receiver import OTLPReceiver

STEPS, MICRO = 30, 50
SPANS_PER_RUN = STEPS * (MICRO + 1)  # micro_batch scopes + one train.step per step


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch, "OTEL_")


def _configure(tmp_path: Path, endpoint: str, protocol: str, trial: str, **otlp: Any) -> pipeline.Pipeline:
    rltrace.configure(fileroot=str(tmp_path), trial_name=trial, flush_at_exit=False, flush_interval_s=0.05,
                      exporters={"chrome": False},
                      otlp={"endpoint": endpoint, "protocol": protocol, "timeout_s": 1.0,
                            "max_queue_size": 4 * SPANS_PER_RUN, "metrics": False, **otlp})
    p = runtime.get_pipeline()
    assert p is not None and p.otlp is not None
    return p


def _steps(tag: str, n: int = STEPS) -> list[float]:
    """A small training loop; returns each step's wall time."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        with rltrace.step(i):
            for _ in range(MICRO):
                with rltrace.trace_scope(tag):
                    sum(range(300))
        times.append(time.perf_counter() - t0)
    return times


def _flat(faulty: list[float], healthy: list[float]) -> None:
    assert statistics.median(faulty) <= statistics.median(healthy) * 1.5 + 0.002, (
        statistics.median(faulty), statistics.median(healthy))


def _endpoint(rx: OTLPReceiver, protocol: str) -> str:
    return rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint


def _accounted(p: pipeline.Pipeline) -> dict[str, int]:
    stats = p.otlp.stats()  # type: ignore[union-attr]
    return {k: stats[k] for k in ("exported", "failed", "dropped", "unsent_at_exit", "queued")}


@pytest.mark.parametrize(("protocol", "status"), [
    ("grpc", grpc.StatusCode.UNAVAILABLE),  # retryable: the exporter backs off within its timeout
    ("http/protobuf", 400),                  # not retryable: fails at once
], ids=["grpc-UNAVAILABLE", "http-400"])
def test_collector_returning_errors_costs_no_step_time_counts_every_failure_and_export_resumes(
    tmp_path: Path, protocol: str, status: Any
) -> None:
    with OTLPReceiver() as rx:
        _configure(tmp_path, _endpoint(rx, protocol), protocol, "healthy")
        healthy = _steps("micro_batch")
        rltrace.shutdown()
        rx.wait_for_spans("micro_batch", timeout=20, min_count=STEPS * MICRO)
        rx.clear()

        rx.fail_with(status)
        p = _configure(tmp_path, _endpoint(rx, protocol), protocol, "erroring")
        erroring = _steps("micro_batch")  # nothing may raise
        rltrace.flush()
        assert p.otlp.force_flush(30_000)  # type: ignore[union-attr]
        counts = _accounted(p)
        assert counts == {"exported": 0, "failed": SPANS_PER_RUN, "dropped": 0, "unsent_at_exit": 0,
                          "queued": 0}, counts
        assert rltrace.diagnostics()["otlp"]["failed"] == SPANS_PER_RUN
        reqs = rx.requests
        assert reqs and all(r.outcome == "rejected" for r in reqs if r.signal == "traces")
        _flat(erroring, healthy)

        rx.fail_with(None)  # the collector recovers
        with rltrace.trace_scope("after.recovery"):
            pass
        rltrace.flush()
        rx.wait_for_spans("after.recovery", timeout=20)
        assert p.otlp.force_flush(10_000)  # type: ignore[union-attr]
        assert rltrace.diagnostics()["otlp"]["exported"] == 1
        rltrace.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collector_restarted_mid_run_on_the_same_ports_receives_spans_again(
    tmp_path: Path, protocol: str
) -> None:
    first = OTLPReceiver().start()
    try:
        p = _configure(tmp_path, _endpoint(first, protocol), protocol, "restart")
        before = _steps("before.restart")
        rltrace.flush()
        first.wait_for_spans("before.restart", timeout=20, min_count=STEPS * MICRO)
        assert p.otlp.force_flush(10_000)  # type: ignore[union-attr]
    finally:
        first.stop()  # the collector goes away mid-run ...
    during = _steps("during.outage")
    rltrace.flush()
    p.otlp.force_flush(10_000)  # type: ignore[union-attr]
    lost = _accounted(p)
    assert lost["failed"] + lost["dropped"] > 0, lost
    _flat(during, before)
    after = 0
    with OTLPReceiver(grpc_port=first.grpc_port, http_port=first.http_port) as second:  # ... and returns
        got: list[Any] = []
        for _ in range(10):  # an export racing the restart may still fail; a later one must not
            after += 1
            with rltrace.trace_scope("after.restart"):
                pass
            rltrace.flush()
            try:
                got = second.wait_for_spans("after.restart", timeout=5)
                break
            except TimeoutError:
                continue
        assert got, "export never resumed after the collector restarted"
        assert got[0].resource_attributes["service.name"] == "rltrace"
        rltrace.shutdown()
    final = _accounted(p)
    assert final["queued"] == 0
    assert final["exported"] + final["failed"] + final["dropped"] + final["unsent_at_exit"] \
        == 2 * SPANS_PER_RUN + after, final


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _traced_mib() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 2**20


@pytest.mark.parametrize("fault", ["unreachable", "stalled"])
def test_memory_stays_bounded_by_the_otlp_queue_while_the_backend_is_away_for_a_long_burst(
    tmp_path: Path, fault: str
) -> None:
    release = threading.Event()
    rx = OTLPReceiver().start()
    try:
        if fault == "unreachable":
            endpoint = f"http://127.0.0.1:{_free_port()}"
        else:
            rx.stall(release, max_wait=60)
            endpoint = rx.grpc_endpoint
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, flush_interval_s=0.05,
                          exporters={"chrome": False},
                          otlp={"endpoint": endpoint, "protocol": "grpc", "timeout_s": 5.0,
                                "max_queue_size": 1000, "metrics": False})
        p = runtime.get_pipeline()
        assert p is not None and p.otlp is not None

        def burst(n: int) -> None:
            for i in range(n):
                with rltrace.trace_scope("burst", args={"i": i, "pad": "p" * 64}):
                    pass
                if i % 1000 == 999:
                    rltrace.flush()

        burst(3000)  # the queue is full from here on
        tracemalloc.start()
        try:
            base = _traced_mib()
            burst(30_000)
            grown = _traced_mib() - base
        finally:
            tracemalloc.stop()
        # 30k held spans would be tens of MiB; a queue of 1000 (+ a batch in flight) is ~1-2 MiB
        assert grown < 4.0, f"memory grew {grown:.1f} MiB over 30k spans with the backend {fault}"
        stats = rltrace.diagnostics()["otlp"]
        assert stats["queued"] <= 1000 and stats["dropped"] >= 30_000 - 1000 - 512, stats
        release.set()
        rltrace.shutdown()
        final = _accounted(p)
        assert final["exported"] + final["failed"] + final["dropped"] + final["unsent_at_exit"] \
            == 33_000, final
    finally:
        release.set()
        rx.stop()


def test_send_now_waits_for_a_collector_that_answers_and_only_wakes_the_sender_after_a_failure(
) -> None:
    """What a Ray pooled worker calls when each remote function returns (``flush_tasks="all"``):
    while the collector answers, the spans are sent before it returns; after a failed export
    it only wakes the sender's thread, so a dead collector costs one wait, not one per call.
    (The SDK's HTTP exporter into the real receiver; the sender's own schedule is an hour, so
    only ``send_now`` and its wake make it send.)"""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider

    from rltrace.pipeline.processors import BoundedBatchProcessor

    with OTLPReceiver() as rx:
        sender = BoundedBatchProcessor(
            OTLPSpanExporter(endpoint=rx.http_endpoint + "/v1/traces", timeout=5),
            schedule_delay_s=3600)
        provider = TracerProvider()
        provider.add_span_processor(sender)
        tracer = provider.get_tracer("send-now")

        def one(name: str) -> bool:
            tracer.start_span(name).end()  # queued for the sender
            return sender.send_now(5.0)

        assert one("sent.now") and [s.name for s in rx.spans()] == ["sent.now"]
        rx.fail_with(400)
        assert one("refused")  # this call waited: the export failed, the queue is empty
        assert sender.last_ok is False and sender.stats()["failed"] == 1
        refused = len(rx.requests)
        assert not one("left.to.sender")  # returns at once: the sender's thread sends it
        assert sender.force_flush(10_000)  # (waits for that send, or sends it)
        assert len(rx.requests) == refused + 1 and sender.stats()["failed"] == 2
        rx.fail_with(None)
        assert not one("recovered")  # still after a failure: woken, sent by the sender
        assert sender.force_flush(10_000) and sender.last_ok
        assert one("sent.now.again")
        assert [s.name for s in rx.spans()] == ["sent.now", "recovered", "sent.now.again"]
        provider.shutdown()
