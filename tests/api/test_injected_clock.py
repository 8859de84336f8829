"""Clock and id generator injected through ``configure`` (issue 17, item 3), not patched globals.

``configure(clock=..., id_generator=...)`` gives every record of that pipeline its timestamps and
ids: rltrace's own scopes, sessions and phases, the device scopes and instants; the spans other
instrumentation starts through rltrace's tracer provider take their ids from the generator (the
OTel SDK times them itself: it has no clock to inject).  A later ``configure`` without them,
or ``shutdown``, returns to the wall clock and random ids.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import need, one_session

import rltrace
from rltrace.config import ConfigError
from rltrace.testing import IncrementingClock, SequentialIdGenerator, capture_spans, read_jsonl

START = 1_800_000_000_000_000_000
STEP = 1_000


def _ids(gen: SequentialIdGenerator) -> tuple[set[int], set[int]]:
    return set(gen.trace_ids), set(gen.span_ids)


def test_every_record_takes_its_time_and_ids_from_the_injected_clock_and_generator(tmp_path: Path) -> None:
    clock, gen = IncrementingClock(START, STEP), SequentialIdGenerator()
    with capture_spans(tmp_path, clock=clock, id_generator=gen, session_tracer={"enabled": True}) as cap:
        with rltrace.trace_scope("outer"):  # reads 0 (start) ...
            with rltrace.trace_scope("inner"):  # 1, 2
                pass
        # ... outer ends at read 3
        tracer = rltrace.tracer_provider().get_tracer("other-instrumentation")  # type: ignore[union-attr]
        with tracer.start_as_current_span("foreign"):
            pass
        one_session()
        spans = cap.spans()
        log_dir = cap.log_dir
    by_name = {s.name: s for s in spans}
    outer, inner = by_name["outer"], by_name["inner"]
    assert (outer.start_time, inner.start_time, inner.end_time, outer.end_time) == (
        START, START + STEP, START + 2 * STEP, START + 3 * STEP)
    # every timestamp of every rltrace record is one of the clock's readings (spans that other
    # instrumentation starts are timed by the OTel SDK, which has no clock to inject)
    for s in spans:
        if s.name == "foreign":
            continue
        for t in (s.start_time, s.end_time):
            assert t is not None and t >= START and (t - START) % STEP == 0, (s.name, t)
    # every id is the generator's: rltrace's records and the foreign span alike
    trace_ids, span_ids = _ids(gen)
    assert {s.context.trace_id for s in spans} <= trace_ids
    assert {s.context.span_id for s in spans} <= span_ids
    assert by_name["foreign"].context.span_id in span_ids
    assert len(trace_ids) >= 3  # outer, foreign, the task: each a trace root
    # the session record's times are the same clock's, in seconds
    (record,) = [r for f in sorted(log_dir.rglob("sessions-*.jsonl")) for r in read_jsonl(f)]
    assert START <= record["submit_ts"] * 1e9 < START + 1_000 * STEP
    assert record["trace_id"] == f"{by_name['rl.session'].context.trace_id:032x}"


def test_reconfiguring_without_them_returns_to_the_wall_clock_and_random_ids(tmp_path: Path) -> None:
    gen = SequentialIdGenerator()
    with capture_spans(tmp_path / "a", clock=IncrementingClock(START, STEP), id_generator=gen) as cap:
        with rltrace.trace_scope("injected"):
            pass
        assert cap.one("injected").start_time == START
    before = time.time_ns()
    with capture_spans(tmp_path / "b") as cap:
        with rltrace.trace_scope("wall"):
            pass
        wall = cap.one("wall")
    assert before <= wall.start_time <= time.time_ns()  # type: ignore[operator]
    assert wall.context.span_id not in gen.span_ids and wall.context.trace_id not in gen.trace_ids


def test_bad_clock_or_id_generator_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="clock must be a callable"):
        rltrace.configure(fileroot=str(tmp_path), clock=123)
    with pytest.raises(ConfigError, match="id_generator must be an OpenTelemetry IdGenerator"):
        rltrace.configure(fileroot=str(tmp_path), id_generator=object())
    assert not rltrace.is_configured()


def test_every_device_option_gets_exact_timestamps_from_the_injected_clock(tmp_path: Path) -> None:
    """With an injected clock each reading is ``START + k * STEP``, so a scope's times say which
    reading it took.  A device scope reads the clock at entry for the sync wait (two readings
    around the wait) then for its start, and at exit for the sync wait (two) then for its end:
    start = reading 2, end = reading 5, sync wait = 2 * STEP.  ``annotate`` and ``events``
    (without a CUDA device, recorded as unavailable) take no reading: start 0, end 1.  Before
    ``device.py`` read the clock through the module, an ``annotate=True`` span ended on the
    wall clock."""
    need("jax")
    options: list[tuple[str, dict[str, object], tuple[int, int], float | None]] = [
        ("annotate", {"annotate": True}, (0, 1), None),
        ("events", {"device_timing": "events"}, (0, 1), None),
        ("sync_jax", {"device_sync": "jax"}, (2, 5), 2 * STEP / 1e9),
        ("all", {"device_sync": "jax", "device_timing": "events", "annotate": True}, (2, 5), 2 * STEP / 1e9),
    ]
    for name, kwargs, (k_start, k_end), wait in options:
        with capture_spans(tmp_path / name, clock=IncrementingClock(START, STEP)) as cap:
            with rltrace.trace_scope(name, "compute", **kwargs):  # type: ignore[arg-type]
                pass
            span = cap.one(name)
        assert (span.start_time, span.end_time) == (START + k_start * STEP, START + k_end * STEP), name
        attrs = dict(span.attributes or {})
        if wait is None:
            assert "rl.device.sync_wait_s" not in attrs, name
        else:
            assert attrs["rl.device.sync"] == "jax" and attrs["rl.device.sync_wait_s"] == wait, (name, attrs)
