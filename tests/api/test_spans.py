"""The span API against the real OTel SDK and the real Chrome-trace file.

Covers ``trace_scope``/``atrace_scope``, ``trace_perf`` on every kind of function, concurrency
(asyncio tasks, threads) and timeline lanes, interplay with other OTel instrumentation,
exceptions, ``instant``, the disabled mode, conversion of awkward ``args`` values, and when
``save``/``shutdown`` put data on disk.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, need
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

import rltrace
from rltrace.runtime import remove_span_processor
from rltrace.testing import capture_spans, deterministic, read_jsonl

_I64 = 1 << 63


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank variables, OTLP endpoints and stray RLTRACE_* settings of the caller must not leak in."""
    clean_env(monkeypatch)


# ---- helpers -----------------------------------------------------------------------------------


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    out: dict[str, ReadableSpan] = {}
    for s in spans:
        assert s.name not in out, f"span name {s.name!r} recorded twice"
        out[s.name] = s
    return out


def assert_child_of(child: ReadableSpan, parent: ReadableSpan) -> None:
    assert child.parent is not None, f"{child.name} has no parent, expected {parent.name}"
    assert child.parent.span_id == parent.context.span_id, f"{child.name} is not a child of {parent.name}"
    assert child.context.trace_id == parent.context.trace_id


def chrome_file(log_dir: Path, rank: int = 0) -> Path:
    return log_dir / "perf_tracer" / f"traces-r{rank}.jsonl"


def chrome_events(log_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    path = chrome_file(log_dir, rank)
    return read_jsonl(path) if path.exists() else []


def x_events(log_dir: Path, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in chrome_events(log_dir) if e["ph"] == "X" and (name is None or e["name"] == name)]


def is_otel_attribute_value(v: Any) -> bool:
    """What OTel (and OTLP) accept: str/bool/int64/float, or a homogeneous sequence of one of them."""
    scalar = (str, bool, int, float)
    if type(v) in scalar:
        return not (type(v) is int and not -_I64 <= v < _I64)
    if isinstance(v, (tuple, list)):
        kinds = {type(x) for x in v}
        return len(kinds) <= 1 and all(type(x) in scalar and is_otel_attribute_value(x) for x in v)
    return False


def end_ns(ev: dict[str, Any]) -> int:
    return ev["ts"] * 1000 + round(ev["dur"] * 1000)


def assert_tracks_properly_nested(events: list[dict[str, Any]]) -> None:
    """On every Chrome track, X slices either nest or are disjoint (else Perfetto drops some)."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for track, evs in tracks.items():
        stack: list[dict[str, Any]] = []
        for e in sorted(evs, key=lambda e: (e["ts"] * 1000, -end_ns(e))):
            while stack and end_ns(stack[-1]) <= e["ts"] * 1000:
                stack.pop()
            if stack:
                assert end_ns(e) <= end_ns(stack[-1]), (
                    f"on track {track}, {e['name']} overlaps {stack[-1]['name']} without nesting"
                )
            stack.append(e)


class RecordingProcessor(SpanProcessor):
    """A user span processor that keeps the names of the spans it is given."""

    def __init__(self) -> None:
        self.ended: list[str] = []
        self.got = threading.Event()

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span.name)
        self.got.set()


@pytest.fixture
def user_processor() -> Iterator[RecordingProcessor]:
    proc = RecordingProcessor()
    rltrace.add_span_processor(proc)
    try:
        yield proc
    finally:
        remove_span_processor(proc)


# ---- scopes, categories, args -------------------------------------------------------------------


def test_nested_scopes_are_parent_and_child_in_one_trace(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("outer"):
            with rltrace.trace_scope("middle"), rltrace.trace_scope("inner"):
                pass
            with rltrace.trace_scope("sibling"):
                pass
        with rltrace.trace_scope("next_root"):
            pass
        spans = by_name(cap.spans())
    assert spans["outer"].parent is None
    assert_child_of(spans["middle"], spans["outer"])
    assert_child_of(spans["inner"], spans["middle"])
    assert_child_of(spans["sibling"], spans["outer"])
    assert spans["next_root"].parent is None
    assert spans["next_root"].context.trace_id != spans["outer"].context.trace_id
    assert len({s.context.span_id for s in spans.values()}) == len(spans)
    assert all(s.kind is trace.SpanKind.INTERNAL for s in spans.values())


def test_category_enum_string_passthrough_and_default_misc(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("enum", rltrace.Category.COMM):
            pass
        with rltrace.trace_scope("custom", "my-own-category"):
            pass
        with rltrace.trace_scope("default"):
            pass
        spans = by_name(cap.spans())
        cats = {e["name"]: e["cat"] for e in x_events(cap.log_dir)}
    assert spans["enum"].attributes["rl.category"] == "comm"
    assert spans["custom"].attributes["rl.category"] == "my-own-category"
    assert spans["default"].attributes["rl.category"] == "misc"
    assert cats == {"enum": "comm", "custom": "my-own-category", "default": "misc"}


def test_args_are_flattened_into_prefixed_attributes(tmp_path: Path) -> None:
    args = {"step": 3, "lr": 1e-5, "tag": "warmup", "ok": True, "a": {"b": 1, "c": {"d": "deep"}},
            "ids": [1, 2, 3]}
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("train.step", rltrace.Category.COMPUTE, args):
            pass
        attrs = dict(cap.one("train.step").attributes)
        chrome = x_events(cap.log_dir, "train.step")
    flattened = {k: v for k, v in attrs.items() if k.startswith("args.")}
    assert flattened == {"args.step": 3, "args.lr": 1e-5, "args.tag": "warmup", "args.ok": True,
                         "args.a.b": 1, "args.a.c.d": "deep", "args.ids": (1, 2, 3)}
    assert args == {"step": 3, "lr": 1e-5, "tag": "warmup", "ok": True, "a": {"b": 1, "c": {"d": "deep"}},
                    "ids": [1, 2, 3]}, "the caller's args were modified"
    assert chrome[0]["args"] == {**args, "rank": 0}  # AReaL adds the rank to every event's args


def test_scope_object_is_the_span_and_accepts_attributes_and_events(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("s") as span:
            assert rltrace.current_span() is span
            span.set_attribute("rl.custom", 7)
            span.add_event("checkpoint", {"n": 2})
        s = cap.one("s")
    assert s.attributes["rl.custom"] == 7
    assert [(e.name, dict(e.attributes)) for e in s.events] == [("checkpoint", {"args.n": 2})]


# ---- trace_perf ------------------------------------------------------------------------------


def test_trace_perf_traces_sync_and_async_functions_with_given_or_qualified_name(tmp_path: Path) -> None:
    @rltrace.trace_perf("engine.train_batch", category="compute")
    def named(x: int) -> int:
        with rltrace.trace_scope("named.inner"):
            return x * 2

    @rltrace.trace_perf
    def bare(x: int) -> int:
        return x + 1

    @rltrace.trace_perf()
    async def abare(x: int) -> int:
        with rltrace.trace_scope("abare.inner"):
            await asyncio.sleep(0)
        return x - 1

    with capture_spans(tmp_path) as cap:
        assert named(4) == 8
        assert bare(4) == 5
        assert asyncio.run(abare(4)) == 3
        spans = by_name(cap.spans())
    qual = "test_trace_perf_traces_sync_and_async_functions_with_given_or_qualified_name.<locals>."
    assert set(spans) == {"engine.train_batch", "named.inner", qual + "bare", qual + "abare", "abare.inner"}
    assert spans["engine.train_batch"].attributes["rl.category"] == "compute"
    assert spans[qual + "bare"].attributes["rl.category"] == "misc"
    assert_child_of(spans["named.inner"], spans["engine.train_batch"])
    assert_child_of(spans["abare.inner"], spans[qual + "abare"])
    assert bare.__name__ == "bare" and named.__name__ == "named", "functools.wraps lost the name"


def test_generator_span_covers_whole_iteration_and_only_body_scopes_are_children(tmp_path: Path) -> None:
    @rltrace.trace_perf("batches")
    def batches(n: int) -> Iterator[int]:
        for i in range(n):
            with rltrace.trace_scope(f"load{i}"):
                pass
            yield i

    with deterministic(), capture_spans(tmp_path) as cap:
        got = []
        for i in batches(2):
            with rltrace.trace_scope(f"consume{i}"):
                got.append(i)
        spans = by_name(cap.spans())
        events = chrome_events(cap.log_dir)
    assert got == [0, 1]
    gen = spans["batches"]
    for i in range(2):
        assert_child_of(spans[f"load{i}"], gen)
        assert spans[f"consume{i}"].parent is None, "the consumer's scope became the generator's child"
        assert gen.start_time < spans[f"load{i}"].start_time
    assert gen.start_time < spans["load0"].start_time
    assert gen.end_time > spans["consume1"].end_time, "the generator span ended before iteration did"
    assert gen.attributes["rl.lane"] != spans["consume0"].attributes["rl.lane"]
    assert_tracks_properly_nested(events)


def test_async_generator_span_covers_iteration_and_only_body_scopes_are_children(tmp_path: Path) -> None:
    @rltrace.trace_perf
    async def stream(n: int) -> Any:
        for i in range(n):
            async with rltrace.atrace_scope(f"produce{i}"):
                await asyncio.sleep(0)
            yield i

    async def consume() -> list[int]:
        out = []
        async for i in stream(2):
            with rltrace.trace_scope(f"use{i}"):
                out.append(i)
        return out

    with deterministic(), capture_spans(tmp_path) as cap:
        assert asyncio.run(consume()) == [0, 1]
        spans = by_name(cap.spans())
    gen = spans[stream.__qualname__]
    assert gen.name.endswith("<locals>.stream")
    for i in range(2):
        assert_child_of(spans[f"produce{i}"], gen)
        assert spans[f"use{i}"].parent is None
    assert gen.start_time < spans["produce0"].start_time
    assert gen.end_time > spans["use1"].end_time


def test_generator_closed_early_still_ends_its_span(tmp_path: Path) -> None:
    @rltrace.trace_perf("endless")
    def endless() -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    with capture_spans(tmp_path) as cap:
        g = endless()
        assert [next(g), next(g)] == [0, 1]
        g.close()
        span = cap.one("endless")
    assert span.end_time >= span.start_time
    assert span.status.status_code is StatusCode.UNSET


def test_function_decorated_before_configure_is_traced_once_configured(tmp_path: Path) -> None:
    assert not rltrace.is_configured()

    @rltrace.trace_perf("early")
    def early() -> str:
        return "ran"

    assert early() == "ran"  # not configured: runs untraced
    with capture_spans(tmp_path) as cap:
        assert early() == "ran"
        spans = cap.spans()
    assert [s.name for s in spans] == ["early"], "expected exactly the call made after configure()"


# ---- concurrency and lanes ------------------------------------------------------------------------


def test_concurrent_asyncio_tasks_get_right_parents_and_separate_lanes(tmp_path: Path) -> None:
    n = 4

    async def worker(i: int, started: list[int], all_open: asyncio.Event) -> None:
        async with rltrace.atrace_scope(f"task{i}"):
            started.append(i)
            if len(started) == n:
                all_open.set()
            await asyncio.wait_for(all_open.wait(), 10)  # every task's scope is open at once
            with rltrace.trace_scope(f"task{i}.child"):
                await asyncio.sleep(0)
                with rltrace.trace_scope(f"task{i}.grandchild"):
                    await asyncio.sleep(0)

    async def main() -> None:
        started: list[int] = []
        all_open = asyncio.Event()
        with rltrace.trace_scope("rollout"):
            await asyncio.gather(*(worker(i, started, all_open) for i in range(n)))

    with capture_spans(tmp_path) as cap:
        asyncio.run(main())
        spans = by_name(cap.spans())
        events = chrome_events(cap.log_dir)
    root = spans["rollout"]
    lanes = {}
    for i in range(n):
        task, child, grand = spans[f"task{i}"], spans[f"task{i}.child"], spans[f"task{i}.grandchild"]
        assert_child_of(task, root)
        assert_child_of(child, task)
        assert_child_of(grand, child)
        assert child.attributes["rl.lane"] == task.attributes["rl.lane"]
        assert grand.attributes["rl.lane"] == task.attributes["rl.lane"]
        lanes[i] = task.attributes["rl.lane"]
    assert len({s.attributes["thread.id"] for s in spans.values()}) == 1
    assert len(set(lanes.values())) == n, f"concurrent tasks share a lane: {lanes}"
    assert root.attributes["rl.lane"] not in lanes.values()
    assert_tracks_properly_nested(events)


def test_scopes_in_thread_pool_workers_get_right_parents(tmp_path: Path) -> None:
    n = 4
    barrier = threading.Barrier(n, timeout=10)

    def job(i: int) -> int:
        with rltrace.trace_scope(f"job{i}"):
            barrier.wait()  # all jobs' scopes open concurrently
            with rltrace.trace_scope(f"job{i}.child"):
                pass
        return threading.get_ident()

    with capture_spans(tmp_path) as cap:
        with ThreadPoolExecutor(max_workers=n) as pool:
            idents = list(pool.map(job, range(n)))
        spans = by_name(cap.spans())
        events = chrome_events(cap.log_dir)
    assert len(set(idents)) == n
    for i in range(n):
        job_span, child = spans[f"job{i}"], spans[f"job{i}.child"]
        assert job_span.parent is None
        assert_child_of(child, job_span)
        assert job_span.attributes["thread.id"] == idents[i]
        assert child.attributes["thread.id"] == idents[i]
        assert child.attributes["rl.lane"] == job_span.attributes["rl.lane"]
    assert len({spans[f"job{i}"].context.trace_id for i in range(n)}) == n
    assert_tracks_properly_nested(events)


def test_scope_opened_in_thread_with_copied_context_is_child_of_callers_scope(tmp_path: Path) -> None:
    def work() -> None:
        with rltrace.trace_scope("in_thread"):
            pass

    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("caller"):
            ctx = contextvars.copy_context()
            t = threading.Thread(target=ctx.run, args=(work,), name="ctx-worker")
            t.start()
            t.join(10)
        spans = by_name(cap.spans())
    assert_child_of(spans["in_thread"], spans["caller"])
    assert spans["in_thread"].attributes["thread.id"] != spans["caller"].attributes["thread.id"]


def test_thread_name_is_that_of_the_thread_that_recorded_the_span(tmp_path: Path) -> None:
    def work(tag: str) -> None:
        with rltrace.trace_scope(tag):
            pass
        rltrace.flush()  # exported while the thread is alive

    with capture_spans(tmp_path) as cap:
        threads = []
        for name in ("alpha", "beta"):
            t = threading.Thread(target=work, args=(name,), name=name)
            t.start()
            t.join(10)
            threads.append(t)
        spans = by_name(cap.spans())
    if threads[0].ident != threads[1].ident:
        pytest.skip("the OS did not reuse the thread ident, so the stale-name case did not arise")
    assert spans["alpha"].attributes["thread.name"] == "alpha"
    assert spans["beta"].attributes["thread.name"] == "beta"


# ---- other OpenTelemetry instrumentation -------------------------------------------------------


def test_foreign_otel_span_nests_under_scope_and_scope_nests_under_it(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        tracer = trace.get_tracer("some.instrumentation")
        with rltrace.trace_scope("rl.outer"), tracer.start_as_current_span("http.request") as foreign:
            assert foreign.is_recording(), "the global provider does not reach rltrace's pipeline"
            assert rltrace.current_span() is foreign
            with rltrace.trace_scope("rl.inside_foreign"):
                rltrace.instant("marker")
        spans = by_name(cap.spans())
        events = chrome_events(cap.log_dir)
    outer, foreign_span, inner = spans["rl.outer"], spans["http.request"], spans["rl.inside_foreign"]
    assert_child_of(foreign_span, outer)
    assert_child_of(inner, foreign_span)
    assert {outer.context.trace_id, foreign_span.context.trace_id, inner.context.trace_id} == {
        outer.context.trace_id}
    assert [e.name for e in inner.events] == ["marker"]
    assert {e["ph"] for e in events if e["name"] == "http.request"} == {"b", "e"}


# ---- exceptions ------------------------------------------------------------------------------


def test_exception_is_recorded_and_reraised_unchanged(tmp_path: Path) -> None:
    err = ValueError("bad batch 7")
    with capture_spans(tmp_path) as cap:
        with pytest.raises(ValueError) as info, rltrace.trace_scope("outer"), rltrace.trace_scope("failing"):
            raise err
        assert info.value is err
        spans = by_name(cap.spans())
        chrome = {e["name"]: e for e in x_events(cap.log_dir)}
    failing = spans["failing"]
    assert failing.status.status_code is StatusCode.ERROR
    assert "bad batch 7" in failing.status.description
    (event,) = [e for e in failing.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "bad batch 7"
    assert "raise err" in event.attributes["exception.stacktrace"]
    assert spans["outer"].status.status_code is StatusCode.ERROR  # it escaped the outer scope too
    assert chrome["failing"]["args"]["error"] == "ValueError: bad batch 7"


def test_exception_in_async_scope_and_traced_coroutine_is_recorded_and_reraised(tmp_path: Path) -> None:
    class StepFailed(RuntimeError):
        pass

    err = StepFailed("reward model down")

    @rltrace.trace_perf("reward")
    async def reward() -> None:
        async with rltrace.atrace_scope("call"):
            raise err

    with capture_spans(tmp_path) as cap:
        with pytest.raises(StepFailed) as info:
            asyncio.run(reward())
        assert info.value is err
        spans = by_name(cap.spans())
    for name in ("call", "reward"):
        assert spans[name].status.status_code is StatusCode.ERROR
        (event,) = [e for e in spans[name].events if e.name == "exception"]
        assert event.attributes["exception.type"].endswith(StepFailed.__qualname__)
        assert event.attributes["exception.message"] == "reward model down"


def test_exception_escaping_traced_generator_marks_its_span_error(tmp_path: Path) -> None:
    @rltrace.trace_perf("reader")
    def reader() -> Iterator[int]:
        yield 1
        raise OSError("disk gone")

    with capture_spans(tmp_path) as cap:
        with pytest.raises(OSError, match="disk gone"):
            list(reader())
        span = cap.one("reader")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in span.events if e.name == "exception"] == ["OSError"]


# ---- instant ---------------------------------------------------------------------------------


def test_instant_inside_scope_is_an_event_on_that_scope(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("step"):
            with rltrace.trace_scope("inner"):
                pass
            rltrace.instant("weights.updated", rltrace.Category.SYNC, {"version": 5})
        spans = by_name(cap.spans())
        inst = [e for e in chrome_events(cap.log_dir) if e["ph"] == "i"]
    assert set(spans) == {"step", "inner"}, "the instant became a span of its own"
    (event,) = spans["step"].events
    assert event.name == "weights.updated"
    assert dict(event.attributes) == {"rl.category": "sync", "args.version": 5}
    assert spans["step"].start_time <= event.timestamp <= spans["step"].end_time
    assert spans["inner"].events == ()
    assert [(e["name"], e["cat"], e["args"]) for e in inst] == [("weights.updated", "sync",
                                                                 {"version": 5, "rank": 0})]


def test_instant_outside_any_scope_is_kept_as_zero_length_span(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        rltrace.instant("run.started", args={"seed": 1})
        span = cap.one("run.started")
        inst = [e for e in chrome_events(cap.log_dir) if e["ph"] == "i"]
    assert span.attributes["rl.instant"] is True
    assert span.attributes["args.seed"] == 1
    assert span.start_time == span.end_time
    assert span.parent is None
    assert [e["name"] for e in inst] == ["run.started"]


def test_instant_does_not_mutate_or_alias_the_callers_args(tmp_path: Path) -> None:
    inside = {"k": 1}
    outside = {"k": 2}
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("s"):
            rltrace.instant("in", args=inside)
        rltrace.instant("out", "io", outside)
        assert inside == {"k": 1} and outside == {"k": 2}
        inside["k"] = 100  # later changes by the caller must not reach the recorded instant
        outside["k"] = 200
        spans = by_name(cap.spans())
    assert inside == {"k": 100} and outside == {"k": 200}
    assert dict(spans["s"].events[0].attributes) == {"args.k": 1}
    assert spans["out"].attributes["args.k"] == 2


# ---- disabled, bad names ------------------------------------------------------------------------


def test_disabled_tracing_returns_noop_for_sync_and_async_and_records_nothing(tmp_path: Path) -> None:
    rltrace.configure(enabled=False, fileroot=str(tmp_path / "off"), flush_at_exit=False)
    assert not rltrace.is_configured()
    scope = rltrace.trace_scope("nothing", args={"x": 1})
    with scope as s:
        s.set_attribute("y", 2)
        rltrace.instant("nothing.instant")

    async def use_async() -> str:
        async with rltrace.atrace_scope("nothing.async"), rltrace.trace_scope("nothing.async2"):
            return "done"

    @rltrace.trace_perf("nothing.fn")
    def fn() -> int:
        return 1

    assert asyncio.run(use_async()) == "done"
    assert fn() == 1
    assert rltrace.trace_scope("other") is scope, "disabled scopes should share one no-op object"
    assert not (tmp_path / "off").exists(), "a disabled configure created the log dir"
    with capture_spans(tmp_path / "on") as cap:  # nothing recorded while disabled may surface now
        with rltrace.trace_scope("after"):
            pass
        assert [s.name for s in cap.spans()] == ["after"]


@pytest.mark.parametrize("bad_name", [123, None, b"bytes", ("a", "b")])
def test_non_str_name_raises_type_error_naming_the_fix(tmp_path: Path, bad_name: Any) -> None:
    with capture_spans(tmp_path):
        for call in (lambda: rltrace.trace_scope(bad_name), lambda: rltrace.atrace_scope(bad_name),
                     lambda: rltrace.instant(bad_name)):
            with pytest.raises(TypeError, match=r"name must be a str.*pass a string"):
                call()
    if bad_name is not None:  # trace_perf(None) means "use the qualified name"
        with pytest.raises(TypeError, match=r"name must be a str.*pass a string"):
            rltrace.trace_perf(bad_name)


# ---- awkward args values ---------------------------------------------------------------------------


def record_args(tmp_path: Path, args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Record one scope with ``args``; return its Chrome args and its OTel ``args.*`` attributes."""
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("plain"):
            pass
        with rltrace.trace_scope("values", args=args):
            pass
        attrs = dict(cap.one("values").attributes)
        path = chrome_file(cap.log_dir)
        raw = path.read_bytes().splitlines() if path.exists() else []
        events = read_jsonl(path) if raw else []  # raises if any line is invalid JSON
    assert len(events) == len(raw)
    xs = {e["name"]: e for e in events if e["ph"] == "X"}
    assert set(xs) == {"plain", "values"}, "a span was lost from the Chrome file"
    for k, v in attrs.items():
        assert is_otel_attribute_value(v), f"attribute {k}={v!r} is not a valid OTel value"
    return xs["values"]["args"], {k[5:]: v for k, v in attrs.items() if k.startswith("args.")}


class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


def test_torch_tensor_args_are_converted_or_summarised(tmp_path: Path) -> None:
    torch = need("torch", "torch not installed; tensor args cannot be tested")
    args = {"small": torch.tensor([1.5, 2.5, 3.5]), "scalar": torch.tensor(7),
            "large": torch.zeros(64, 64), "grad": torch.ones(2, requires_grad=True)}
    chrome, otel = record_args(tmp_path, args)
    assert chrome["small"] == [1.5, 2.5, 3.5]
    assert otel["small"] == (1.5, 2.5, 3.5)
    assert chrome["scalar"] == 7 and otel["scalar"] == 7
    assert chrome["grad"] == [1.0, 1.0]
    for summary in (chrome["large"], otel["large"]):
        assert isinstance(summary, str)
        assert "shape=(64, 64)" in summary and "float32" in summary
        assert len(summary) < 200


def test_numpy_args_are_converted(tmp_path: Path) -> None:
    np = need("numpy", "numpy not installed; ndarray args cannot be tested")
    chrome, otel = record_args(tmp_path, {"arr": np.arange(4), "f32": np.float32(0.25),
                                          "i64": np.int64(-3), "flag": np.bool_(True)})
    assert chrome["arr"] == [0, 1, 2, 3] and otel["arr"] == (0, 1, 2, 3)
    assert chrome["f32"] == 0.25 and otel["f32"] == 0.25
    assert chrome["i64"] == -3 and otel["i64"] == -3
    assert chrome["flag"] is True and otel["flag"] is True


def test_large_numpy_array_is_summarised_in_chrome_file(tmp_path: Path) -> None:
    np = need("numpy", "numpy not installed; ndarray args cannot be tested")
    chrome, otel = record_args(tmp_path, {"logits": np.zeros((100, 100))})
    assert "shape=(100, 100)" in otel["logits"]
    assert isinstance(chrome["logits"], str) and "shape=(100, 100)" in chrome["logits"]


def test_object_and_non_json_args_are_stringified_without_breaking_the_file(tmp_path: Path) -> None:
    obj = Opaque()
    chrome, otel = record_args(tmp_path, {"obj": obj, "ids": {3}, "raw": b"\x00\xff", "z": 1 + 2j,
                                          "nan": float("nan"), "none": None, "mixed": [1, "a", obj]})
    # an object of a type rltrace does not know: its type and id, its own __str__ never runs
    assert chrome["obj"] == otel["obj"] == f"<test_spans.Opaque object at {id(obj):#x}>"
    assert chrome["ids"] == otel["ids"] == "{3}"
    assert chrome["raw"] == otel["raw"] == str(b"\x00\xff")
    assert chrome["z"] == otel["z"] == "(1+2j)"
    assert chrome["nan"] is None  # JSON has no NaN
    assert otel["nan"] != otel["nan"]
    assert chrome["none"] is None and otel["none"] == "None"
    assert chrome["mixed"] == [1, "a", f"<test_spans.Opaque object at {id(obj):#x}>"]
    assert isinstance(otel["mixed"], str)


@pytest.mark.parametrize("value", [2**70, {(1, 2): "tuple key"}], ids=["big_int", "tuple_key"])
def test_args_orjson_cannot_encode_do_not_lose_the_chrome_batch(tmp_path: Path, value: Any) -> None:
    chrome, otel = record_args(tmp_path, {"v": value})
    assert "v" in chrome or any(k.startswith("v.") for k in otel)


# ---- save, shutdown, processors ---------------------------------------------------------------


def test_save_flushes_only_on_the_last_step_of_each_save_interval_or_when_forced(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), save_interval=3, flush_interval_s=3600, flush_at_exit=False)
    log_dir = rltrace.runtime.get_pipeline().log_dir
    with rltrace.trace_scope("s1"):
        pass
    rltrace.save(0)
    rltrace.save(1)
    assert x_events(log_dir) == [], "save(step) wrote before the last step of the interval"
    rltrace.save(2)  # AReaL's rule: (step + 1) % save_interval == 0, i.e. steps 2, 5, 8, ...
    assert [e["name"] for e in x_events(log_dir)] == ["s1"]
    with rltrace.trace_scope("s2"):
        pass
    rltrace.save(3)
    assert [e["name"] for e in x_events(log_dir)] == ["s1"]
    rltrace.save(4, force=True)
    assert [e["name"] for e in x_events(log_dir)] == ["s1", "s2"]
    with rltrace.trace_scope("s3"):
        pass
    rltrace.save()  # no step: always flushes (AReaL semantics)
    assert [e["name"] for e in x_events(log_dir)] == ["s1", "s2", "s3"]


def test_shutdown_writes_everything_recorded(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_interval_s=3600, flush_at_exit=False)
    log_dir = rltrace.runtime.get_pipeline().log_dir
    n = 500
    for i in range(n):
        with rltrace.trace_scope("work", args={"i": i}):
            pass
    rltrace.instant("lonely")
    rltrace.shutdown()
    assert not rltrace.is_configured()
    xs = x_events(log_dir, "work")
    assert sorted(e["args"]["i"] for e in xs) == list(range(n))
    assert [e["name"] for e in chrome_events(log_dir) if e["ph"] == "i"] == ["lonely"]


def test_user_span_processor_receives_spans_and_keeps_them_after_reconfigure(
    tmp_path: Path, user_processor: RecordingProcessor
) -> None:
    rltrace.configure(fileroot=str(tmp_path / "a"), flush_at_exit=False)
    with rltrace.trace_scope("first"):
        pass
    rltrace.flush()
    assert user_processor.ended == ["first"]
    rltrace.configure(fileroot=str(tmp_path / "b"), flush_at_exit=False)
    with rltrace.trace_scope("second"):
        pass
    with trace.get_tracer("other").start_as_current_span("foreign"):
        pass
    rltrace.flush()
    assert user_processor.ended[0] == "first"
    assert sorted(user_processor.ended[1:]) == ["foreign", "second"]


def test_background_exporter_delivers_spans_without_explicit_flush(
    tmp_path: Path, user_processor: RecordingProcessor
) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_interval_s=0.05, flush_at_exit=False)
    with rltrace.trace_scope("background"):
        pass
    assert user_processor.got.wait(10), "the exporter thread never delivered the span"
    assert user_processor.ended == ["background"]


# ---- Chrome file layout ---------------------------------------------------------------------------


def test_chrome_file_has_process_and_thread_metadata_and_epoch_microsecond_times(tmp_path: Path) -> None:
    async def overlapping() -> None:
        async def one(i: int) -> None:
            async with rltrace.atrace_scope(f"task{i}"):
                await asyncio.sleep(0)

        await asyncio.gather(one(0), one(1))

    def in_thread() -> None:
        with rltrace.trace_scope("thread.work"):
            pass

    before = time.time_ns()
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("main.work"):
            rltrace.instant("tick")
        asyncio.run(overlapping())
        t = threading.Thread(target=in_thread, name="side-worker")
        t.start()
        t.join(10)
        rltrace.flush()
        after = time.time_ns()
        events = chrome_events(cap.log_dir)
    meta = [e for e in events if e["ph"] == "M"]
    process_names = [e["args"]["name"] for e in meta if e["name"] == "process_name"]
    assert len(process_names) == 1 and "Rank 0, Process" in process_names[0]
    named_tids = {e["tid"] for e in meta if e["name"] == "thread_name"}
    used_tids = {e["tid"] for e in events if e["ph"] in ("X", "i")}
    assert used_tids <= named_tids, f"tracks without thread_name metadata: {used_tids - named_tids}"
    assert len(used_tids) >= 3  # main lane, a second lane for the overlapping task, the thread
    xs = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in xs} == {"main.work", "task0", "task1", "thread.work"}
    for e in xs:
        assert type(e["ts"]) is int
        assert before // 1000 <= e["ts"] <= after // 1000
        assert e["dur"] >= 0
        assert end_ns(e) <= after
    assert all(type(e["ts"]) is int for e in events if e["ph"] == "i")
    assert {e["pid"] for e in events} == {__import__("os").getpid()}
    assert_tracks_properly_nested(events)


def test_chrome_times_are_exact_with_a_deterministic_clock(tmp_path: Path) -> None:
    with deterministic() as (clock, _), capture_spans(tmp_path) as cap:
        t0 = clock.now
        # outer starts at t0, inner runs t0+1µs .. t0+2µs, outer ends at t0+3µs
        with rltrace.trace_scope("outer"), rltrace.trace_scope("inner"):
            pass
        spans = by_name(cap.spans())
        xs = {e["name"]: e for e in x_events(cap.log_dir)}
    assert (xs["outer"]["ts"], xs["outer"]["dur"]) == (t0 // 1000, 3.0)
    assert (xs["inner"]["ts"], xs["inner"]["dur"]) == (t0 // 1000 + 1, 1.0)
    assert spans["outer"].start_time == t0 and spans["outer"].end_time == t0 + 3000
