"""Timings from spans: ``timeperf/<name>`` equals the durations of the captured OTel spans."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rltrace
from rltrace import stats
from rltrace.perf_tracer import atrace_session_phase, session_context
from rltrace.testing import capture_spans, deterministic, read_jsonl


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    stats.enable_span_timings()  # a fresh bridge: nothing from earlier tests
    stats.reset()
    yield
    stats.reset()
    stats.enable_span_timings()


def _span_seconds(spans: list[Any]) -> dict[tuple[Any, str], float]:
    """Sum of span durations per (rl.step, name), from the exported OTel spans."""
    out: dict[tuple[Any, str], int] = defaultdict(int)
    for s in spans:
        out[(s.attributes.get("rl.step"), s.name)] += s.end_time - s.start_time
    return {k: v / 1e9 for k, v in out.items()}


def _work(n: int) -> None:
    with rltrace.trace_scope("rollout"):
        for _ in range(n):
            with rltrace.trace_scope("generate"):
                pass
    with rltrace.trace_scope("train"):
        pass


def test_each_steps_span_durations_become_timeperf_scalars_equal_to_the_spans(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        exports = []
        for step in range(3):
            with rltrace.step(step):
                _work(step + 1)
            exports.append(stats.export())
        seconds = _span_seconds(cap.spans())
    for step, out in enumerate(exports):
        for name in ("rollout", "generate", "train", "train.step"):
            assert out[f"timeperf/{name}"] == pytest.approx(seconds[(step, name)], rel=1e-12, abs=1e-15)
            assert out[f"timeperf/{name}__count"] == 1.0
    # a repeated name is summed within the step
    assert len([s for s in cap.spans() if s.name == "generate" and s.attributes["rl.step"] == 2]) == 3


def test_exact_durations_with_a_deterministic_clock(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap, deterministic():
        with rltrace.step(7):
            _work(2)
        out = stats.export()
        seconds = _span_seconds(cap.spans())
    assert out["timeperf/generate"] == seconds[(7, "generate")]
    assert out["timeperf/rollout"] == seconds[(7, "rollout")]


def test_one_export_over_several_steps_is_the_mean_of_the_per_step_totals(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        for step in range(2):
            with rltrace.step(step):
                _work(step + 1)
        out = stats.export()
        seconds = _span_seconds(cap.spans())
    expected = (seconds[(0, "generate")] + seconds[(1, "generate")]) / 2
    assert out["timeperf/generate"] == pytest.approx(expected, rel=1e-12)
    assert out["timeperf/generate__count"] == 2.0


def test_spans_outside_any_step_are_summed_together(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        _work(2)
        out = stats.export()
        seconds = _span_seconds(cap.spans())
    assert out["timeperf/generate"] == pytest.approx(seconds[(None, "generate")], rel=1e-12)


def test_session_phases_are_summed_per_step_under_timeperf_session(tmp_path: Path) -> None:
    @session_context()
    async def sample() -> None:
        for _ in range(2):
            async with atrace_session_phase("generate"):
                await asyncio.sleep(0)
        async with atrace_session_phase("reward"):
            pass

    async def rollout() -> None:
        await asyncio.gather(sample(), sample())

    with capture_spans(tmp_path, session_tracer__enabled=True) as cap:
        with rltrace.step(3):
            rltrace.register_task()
            asyncio.run(rollout())
        rltrace.flush()
        out = stats.export()
        seconds = _span_seconds(cap.spans())
    assert out["timeperf/session/generate"] == pytest.approx(seconds[(3, "generate")], rel=1e-12)
    assert out["timeperf/session/reward"] == pytest.approx(seconds[(3, "reward")], rel=1e-12)
    assert "timeperf/generate" not in out and "timeperf/rl.task" not in out


def test_commit_at_step_n_contains_that_steps_span_timings(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        logger = stats.StatsLogger(console=False, otel=False)
        for step in range(2):
            with rltrace.step(step):
                _work(1)
                stats.scalar(loss=float(step))
            logger.commit(0, step, step, stats.export())
        logger.close()
        seconds = _span_seconds(cap.spans())
        rows = read_jsonl(cap.log_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert row["metrics"]["timeperf/rollout"] == pytest.approx(seconds[(row["step"], "rollout")])
        assert "timeperf/rollout__count" not in row["metrics"]


def test_disabled_span_timings_add_nothing_and_can_be_reenabled(tmp_path: Path) -> None:
    stats.disable_span_timings()
    assert stats.span_timings() is None
    with capture_spans(tmp_path):
        _work(1)
        assert stats.export() == {}
        bridge = stats.enable_span_timings(exclude=["train"])
        _work(1)
        out = stats.export()
        assert bridge.pending() == {}
    assert "timeperf/rollout" in out and "timeperf/train" not in out


def test_the_bridge_stays_installed_across_reconfiguration(tmp_path: Path) -> None:
    with capture_spans(tmp_path / "a"):
        _work(1)
    with capture_spans(tmp_path / "b"):
        _work(1)
        out = stats.export()
    assert out["timeperf/rollout__count"] == 1.0  # the sums of both runs, one scalar (step None)
