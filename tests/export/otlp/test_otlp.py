"""rltrace over OTLP (gRPC and HTTP) to a real in-process OTLP receiver.

The receiver (:mod:`rltrace.testing.otlp_receiver`) decodes what arrives on the wire, so these tests see
exactly what a collector would: resource attributes, span tree and links, metrics, headers,
compression, and what happens when the backend is down and comes back.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rltrace
from rltrace import runtime
from rltrace.testing.otlp_receiver import OTLPReceiver

PROTOCOLS = ["grpc", "http/protobuf"]


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as rx:
        yield rx


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("OTEL_EXPORTER_OTLP") or k in ("RANK", "WORLD_SIZE", "OTEL_SERVICE_NAME"):
            monkeypatch.delenv(k, raising=False)


def _endpoint(rx: OTLPReceiver, protocol: str) -> str:
    return rx.grpc_endpoint if protocol == "grpc" else rx.http_endpoint


def _configure(tmp_path: Path, rx: OTLPReceiver, protocol: str, **kw: Any) -> None:
    otlp = {"endpoint": _endpoint(rx, protocol), "protocol": protocol, "timeout_s": 5.0}
    otlp.update(kw.pop("otlp", {}))
    rltrace.configure(fileroot=str(tmp_path), experiment_name="exp-otlp", trial_name="t1",
                      role="actor", rank=kw.pop("rank", 3), world_size=kw.pop("world_size", 4),
                      session_tracer={"enabled": True}, otlp=otlp, flush_at_exit=False, **kw)


def _one_task_workflow() -> int:
    task = rltrace.register_task()
    sessions = [rltrace.register_session(task) for _ in range(2)]
    for i, sid in enumerate(sessions):
        with rltrace.trace_session_phase("generate", {"model": "m", "input_tokens": 7}, session_id=sid):
            pass
        with rltrace.trace_session_phase("reward", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid,
                                    status="accepted" if i == 0 else "rejected",
                                    reason=None if i == 0 else "stale_weight")
    return task


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_spans_arrive_with_resource_attributes_tree_and_links(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    _configure(tmp_path, receiver, protocol, service_name="rl-actor")
    task = _one_task_workflow()
    with rltrace.step(11):
        assert rltrace.link_consumed(task_ids=[task]) == 1
        with rltrace.trace_scope("train.ppo_update", args={"lr": 1e-5}):
            pass
    rltrace.shutdown()
    spans = receiver.wait_for_spans(lambda s: s.name == "train.step", timeout=15)
    spans = receiver.spans()
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    assert {k: len(v) for k, v in by_name.items()} == {
        "rl.task": 1, "rl.session": 2, "generate": 2, "reward": 2,
        "train.step": 1, "train.ppo_update": 1,
    }
    res = by_name["rl.task"][0].resource_attributes
    assert res["service.name"] == "rl-actor"
    assert (res["rl.rank"], res["rl.world_size"], res["rl.role"]) == (3, 4, "actor")
    assert (res["rl.experiment"], res["rl.trial"]) == ("exp-otlp", "t1")
    assert res["host.name"] == socket.gethostname() and res["process.pid"] == os.getpid()
    assert all(s.resource_attributes == res for s in spans)
    (task_span,) = by_name["rl.task"]
    assert task_span.parent_span_id is None and task_span.attributes["rl.task.id"] == task
    sessions = {s.span_id: s for s in by_name["rl.session"]}
    assert all(s.parent_span_id == task_span.span_id for s in sessions.values())
    assert sorted(s.attributes["rl.session.status"] for s in sessions.values()) == ["accepted", "rejected"]
    for phase in by_name["generate"] + by_name["reward"]:
        assert phase.parent_span_id in sessions and phase.trace_id == task_span.trace_id
    gen = by_name["generate"][0]
    assert gen.attributes["gen_ai.request.model"] == "m"
    assert gen.attributes["gen_ai.usage.input_tokens"] == 7
    step = by_name["train.step"][0]
    assert step.attributes["rl.step"] == 11
    update = by_name["train.ppo_update"][0]
    assert update.attributes["args.lr"] == pytest.approx(1e-5) and update.attributes["rl.step"] == 11
    assert update.parent_span_id == step.span_id and step.trace_id != task_span.trace_id
    assert [(t, s) for t, s, _ in step.links] == [(task_span.trace_id, task_span.span_id)]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_session_metrics_arrive_as_otlp_histograms_and_counters(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    _configure(tmp_path, receiver, protocol)
    _one_task_workflow()
    rltrace.shutdown()  # the periodic metric reader exports at shutdown
    receiver.wait_for_metrics(lambda m: m.name == "rl.sessions", timeout=15)
    metrics = {m.name: m for m in receiver.metrics()}
    counts = {p.attributes["rl.session.status"]: p.value for p in metrics["rl.sessions"].data_points}
    assert counts == {"accepted": 1, "rejected": 1}
    hist = metrics["rl.session.duration"]
    assert hist.kind == "histogram" and hist.unit == "s"
    assert sum(p.count for p in hist.data_points) == 2
    phases: dict[tuple[str, str], int] = {}
    for p in metrics["rl.phase.duration"].data_points:
        key = (p.attributes["rl.phase"], p.attributes["rl.session.status"])
        phases[key] = phases.get(key, 0) + p.count
    assert phases == {("generate", "accepted"): 1, ("generate", "rejected"): 1,
                      ("reward", "accepted"): 1, ("reward", "rejected"): 1}
    assert metrics["rl.sessions"].resource_attributes["rl.rank"] == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_headers_and_compression_from_rltrace_config_reach_the_backend(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    _configure(tmp_path, receiver, protocol, rank=0,
               otlp={"headers": {"authorization": "Bearer s3cret", "x-team": "rl"},
                     "compression": "gzip"})
    with rltrace.trace_scope("x"):
        pass
    rltrace.shutdown()
    reqs = receiver.wait_for_requests(lambda r: r.signal == "traces", timeout=15)
    assert all(r.protocol == ("grpc" if protocol == "grpc" else "http") for r in reqs)
    assert reqs[0].headers["authorization"] == "Bearer s3cret" and reqs[0].headers["x-team"] == "rl"
    assert reqs[0].compression == "gzip"
    config_yaml = (rltrace.config.log_dir(rltrace.get_config()) / "config.yaml").read_text()  # type: ignore[arg-type]
    assert "s3cret" not in config_yaml


def test_standard_otel_variables_configure_endpoint_protocol_and_headers(
    tmp_path: Path, receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.http_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=k123")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    with rltrace.trace_scope("env.scope"):
        pass
    rltrace.shutdown()
    (span,) = receiver.wait_for_spans("env.scope", timeout=15)
    assert span.resource_attributes["service.name"] == "from-env"
    req = receiver.requests[0]
    assert req.protocol == "http" and req.headers["x-api-key"] == "k123" and req.compression == "gzip"
    cfg_text = (rltrace.config.log_dir(rltrace.get_config()) / "config.yaml").read_text()  # type: ignore[arg-type]
    assert "k123" not in cfg_text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(n: int) -> list[float]:
    """A small training loop; returns each step's wall time."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        with rltrace.step(i):
            for _ in range(50):
                with rltrace.trace_scope("micro_batch"):
                    sum(range(300))
        times.append(time.perf_counter() - t0)
    return times


def test_backend_down_costs_no_step_time_counts_losses_and_export_resumes_when_it_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = _free_port()  # nothing listens here yet
    rltrace.configure(fileroot=str(tmp_path), trial_name="baseline", flush_at_exit=False)
    baseline = _steps(40)
    rltrace.shutdown()
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        rltrace.configure(fileroot=str(tmp_path), trial_name="down", flush_at_exit=False,
                          flush_interval_s=0.05,
                          otlp={"endpoint": f"http://127.0.0.1:{port}", "max_queue_size": 500,
                                "protocol": "http/protobuf", "timeout_s": 1.0})
        down = _steps(40)  # nothing may raise
        rltrace.flush()
        p = runtime.get_pipeline()
        assert p is not None and p.otlp is not None
        p.otlp.force_flush(3000)
        stats = rltrace.diagnostics()["otlp"]
        assert stats["exported"] == 0 and stats["dropped"] + stats["failed"] > 0
        # the step time does not grow: sending happens off the training thread
        assert statistics.median(down) <= statistics.median(baseline) * 1.5 + 0.002, (
            statistics.median(down), statistics.median(baseline))
        with OTLPReceiver(http_port=port) as rx:  # the backend comes back on the same port
            with rltrace.trace_scope("after.recovery"):
                pass
            rltrace.flush()
            got = rx.wait_for_spans("after.recovery", timeout=20)
            assert got and got[0].resource_attributes["service.name"] == "rltrace"
            assert p.otlp.force_flush(5000)  # the delivering export has returned
            assert rltrace.diagnostics()["otlp"]["exported"] >= 1
            rltrace.shutdown()
    assert any("did not reach the OTLP endpoint" in r.getMessage() for r in caplog.records)


def test_a_stalled_backend_never_blocks_the_caller(tmp_path: Path, receiver: OTLPReceiver) -> None:
    import threading

    release = threading.Event()
    receiver.stall(release, max_wait=20)
    _configure(tmp_path, receiver, "grpc", flush_interval_s=0.05,
               otlp={"timeout_s": 2.0, "max_queue_size": 200})
    try:
        t0 = time.perf_counter()
        for _ in range(2000):
            with rltrace.trace_scope("while.stalled"):
                pass
        rltrace.flush()  # hands spans to the OTLP queue; must not wait for the network
        elapsed = time.perf_counter() - t0
        assert elapsed < 2.0, elapsed  # the stall is 20 s: waiting on it would take >= 2 s
        assert rltrace.diagnostics()["otlp"]["dropped"] > 0  # bounded queue overflowed, counted
    finally:
        release.set()
        rltrace.shutdown()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_flush_with_wait_returns_once_the_spans_reached_the_backend(
    tmp_path: Path, receiver: OTLPReceiver, protocol: str
) -> None:
    """``flush()`` hands spans to the sender; ``flush(wait_s=...)`` returns only once they were
    sent (the receiver records a request before it answers it), so no waiting here after it."""
    _configure(tmp_path, receiver, protocol, flush_interval_s=3600)
    try:
        with rltrace.trace_scope("before.wait"):
            pass
        rltrace.flush(wait_s=10.0)
        assert [s.name for s in receiver.spans()] == ["before.wait"]
    finally:
        rltrace.shutdown()


def test_a_span_whose_ids_cannot_be_drawn_is_counted_and_the_others_are_sent(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    """The export cycle hands its records to the OTLP sender at once: one that raises (here its
    id source, as a user's IdGenerator might) is counted in ``errors`` and the rest of the
    cycle still reaches the backend and the Chrome file."""
    from rltrace.recording import recorder

    draws = iter(range(1, 10_000))

    def ids(bits: int) -> int:
        n = next(draws)
        if n == 5:  # the third span's trace id
            raise RuntimeError("id source failed")
        return n

    _configure(tmp_path, receiver, "grpc", flush_interval_s=3600)
    old = recorder.STATE.rand_bits
    recorder.set_id_source(ids)
    try:
        for i in range(6):
            with rltrace.trace_scope(f"s{i}"):
                pass
        rltrace.flush(wait_s=10.0)
        diag = rltrace.diagnostics()
    finally:
        recorder.set_id_source(old)
        rltrace.shutdown()
    assert diag["errors"] == 1
    assert sorted(s.name for s in receiver.spans()) == ["s0", "s1", "s3", "s4", "s5"]
    chrome = next(tmp_path.rglob("traces-r3.jsonl")).read_text()
    assert all(f'"name":"s{i}"' in chrome for i in range(6))


def test_a_batch_over_the_grpc_message_limit_is_sent_in_halves(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    """A batch of big spans (80 x 64 kB args, as values are cut: over gRPC's 4 MiB message
    limit, which the receiver enforces as the OTel Collector does) is sent as several
    requests, all accepted."""
    _configure(tmp_path, receiver, "grpc", flush_interval_s=3600)
    try:
        for i in range(80):
            with rltrace.trace_scope(f"big{i}", args={"blob": "x" * 100_000}):
                pass
        rltrace.flush(wait_s=20.0)
        otlp = rltrace.diagnostics()["otlp"]
    finally:
        rltrace.shutdown()
    assert (otlp["exported"], otlp["failed"], otlp["dropped"]) == (80, 0, 0)
    assert sorted(s.name for s in receiver.spans()) == sorted(f"big{i}" for i in range(80))
    traces = [r for r in receiver.requests if r.signal == "traces"]
    assert len(traces) >= 2 and all(r.outcome == "accepted" for r in traces)


WORKER = """
import sys, rltrace
rltrace.configure(fileroot=sys.argv[1], experiment_name="multi", flush_at_exit=False,
                  otlp={"endpoint": sys.argv[2], "protocol": "grpc"})
with rltrace.trace_scope("rank.work"):
    pass
rltrace.shutdown()
"""


def test_two_processes_export_to_one_backend_with_distinct_rank_resources(
    tmp_path: Path, receiver: OTLPReceiver
) -> None:
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), receiver.grpc_endpoint],
                                      env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    spans = receiver.wait_for_spans(lambda s: s.name == "rank.work", timeout=15, min_count=2)
    ranks = sorted(s.resource_attributes["rl.rank"] for s in spans)
    assert ranks == [0, 1]
    assert {s.resource_attributes["rl.world_size"] for s in spans} == {2}
    assert len({s.resource_attributes["process.pid"] for s in spans}) == 2
