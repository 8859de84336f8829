"""The compiled hot paths (issue 15) against the pure-Python code they mirror: the scope
record's core (``rltrace._scope_accel``: ``__enter__``/``__exit__``, ``_start_under``,
``finish``) and the Chrome encoder's loop (``rltrace.exporters._chrome_accel``).

Both are optional: built by ``pip install`` where a C compiler is at hand (it is in CI), absent
without one, and switched off by ``RLTRACE_PURE_PYTHON=1`` (CI runs the whole suite a second
time that way).  Whatever runs, the output must be the same bytes: these tests encode the same
items with both Chrome loops and compare every line (real records of every kind from a
configured pipeline; generated plain scopes with awkward args and times, by hypothesis), and
run one workload (threads, asyncio tasks, a foreign parent, an error, a span processor's
``on_start``, a scope exited in another context) in two child processes, compiled and pure,
comparing the Chrome trace, the session records and what ``on_start`` saw.
"""

from __future__ import annotations

import enum
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rltrace.exporters import chrome
from rltrace.exporters.chrome import ChromeEncoder
from rltrace.exporters.values import PURE_PYTHON_ENV, pure_python, refresh_thread_names

import rltrace
from rltrace import recorder
from rltrace.recorder import Scope

PURE = pure_python()


def _compiler() -> str | None:
    cc = sysconfig.get_config_var("CC") or ""
    return shutil.which(shlex.split(cc)[0]) if cc.strip() else None


def _built(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _accel() -> Any:
    return _built("rltrace.exporters._chrome_accel")


needs_accel = pytest.mark.skipif(
    _accel() is None or _built("rltrace._scope_accel") is None,
    reason="the compiled hot paths are not built (no C compiler when rltrace was installed)")


def _pair(**kw: Any) -> tuple[ChromeEncoder, ChromeEncoder, list[Any]]:
    """A compiled and a Python encoder alike; items the compiled loop hands back are logged."""
    fast, slow = ChromeEncoder(accelerate=True, **kw), ChromeEncoder(accelerate=False, **kw)
    fast.accel = chrome.load_accel(honour_env=False)  # compiled even where switched off
    assert fast.accel is not None
    handed: list[Any] = []
    python_item = fast._encode_item

    def counted(item: Any, pid: int, out: list[bytes]) -> None:
        handed.append(item)
        python_item(item, pid, out)

    fast._encode_item = counted  # type: ignore[method-assign]
    return fast, slow, handed


def _both(fast: ChromeEncoder, slow: ChromeEncoder, batches: list[list[Any]]) -> list[bytes]:
    a: list[bytes] = []
    b: list[bytes] = []
    for batch in batches:
        fast.encode(batch, a)
        slow.encode(batch, b)
    assert a == b
    return a


def test_the_accelerators_are_built_where_a_compiler_is_and_used_unless_switched_off() -> None:
    if _compiler() is None:
        pytest.skip("no C compiler: rltrace installs and runs the Python code")
    assert _accel() is not None, "a C compiler is here but _chrome_accel was not built"
    assert _built("rltrace._scope_accel") is not None, "_scope_accel was not built"
    assert chrome.ACCELERATED is not PURE
    assert recorder.ACCELERATED is not PURE
    assert issubclass(Scope, _built("rltrace._scope_accel").ScopeCore) is not PURE
    assert (ChromeEncoder().accel is None) is PURE
    assert ChromeEncoder(accelerate=False).accel is None


class Collect:
    """A record processor keeping every finished record (the objects themselves)."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def on_record(self, rec: Any) -> None:
        self.records.append(rec)


class Kind(enum.Enum):
    LOOP = "rollout"


@needs_accel
def test_real_records_of_every_kind_encode_to_the_same_bytes(tmp_path: Path) -> None:
    proc = Collect()
    rltrace.add_record_processor(proc)
    try:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                          session_tracer={"enabled": True})
        with rltrace.step(2):
            with rltrace.trace_scope("plain"):
                pass
            with rltrace.trace_scope("with.args", args={"k": 1, "s": "x", "rank": 7}):
                with rltrace.trace_scope("nested", category=Kind.LOOP, args={"v": [1, 2.5]}):
                    rltrace.instant("mark", args={"a": 1})
            with rltrace.trace_scope("attrs") as span:
                span.set_attribute("user.key", "v")
            with pytest.raises(ValueError):
                with rltrace.trace_scope("boom"):
                    raise ValueError("no")
            rltrace.instant("alone")
            task = rltrace.register_task()
            for status in ("accepted", "rejected"):
                sid = rltrace.register_session(task)
                with rltrace.trace_session_phase("generate", {"model": "m"}, session_id=sid):
                    pass
                with rltrace.trace_session_phase("reward", session_id=sid):
                    pass
                rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)

            def other_thread() -> None:
                refresh_thread_names()  # its name is noted while it runs ("" for one of them)
                with rltrace.trace_scope("in.thread"):
                    pass

            for name in ("side", ""):  # a thread named "": its track is thread-<ident>
                t = threading.Thread(target=other_thread, name=name)
                t.start()
                t.join()
        rltrace.shutdown()
    finally:
        rltrace.remove_record_processor(proc)
    recs = proc.records
    kinds = {type(r).__name__ for r in recs}
    assert {"Scope", "TaskScope", "SessionScope", "PhaseScope"} <= kinds, kinds
    # foreign OTel spans (Python path) between the records
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("foreign", attributes={"x": 1}) as s:
        s.add_event("ev", {"y": 2})
    foreign = list(exporter.get_finished_spans())

    fast, slow, handed = _pair(rank=3, world_size=4, role="actor", host="h")
    lines = _both(fast, slow, [recs[:5], foreign + recs[5:]])
    assert len(lines) > len(recs)
    # the compiled loop encoded every record without ``extra`` itself
    expected = [r for r in recs if r.extra is not None] + foreign
    assert sorted(map(id, handed)) == sorted(map(id, expected))
    assert len(handed) < len(recs), "the compiled loop handed every record back"


class Opaque:
    """A value with no JSON form (written through ``json_default``)."""

    def __repr__(self) -> str:
        return "Opaque()"


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.just("\ud800"), st.builds(Opaque),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_keys = st.one_of(st.text(max_size=6), st.sampled_from(["rank", "role", "args.x", "rl.lane"]),
                  st.integers(-3, 3))
_args = st.one_of(st.none(), st.just({}), st.dictionaries(_keys, _values, max_size=4))
_times = st.one_of(st.integers(0, 2**62), st.integers(-(2**40), 2**40), st.just(2**64 + 5))


@st.composite
def _scope(draw: Any, threads: list[int]) -> Scope:
    rec = Scope(draw(st.one_of(st.text(max_size=10), st.just("\udc80"), st.just("same"))),
                draw(st.one_of(st.none(), st.sampled_from(["compute", "io"]), st.just(Kind.LOOP))),
                draw(_args))
    rec.thread = draw(st.sampled_from(threads))
    rec.lane = draw(st.integers(0, 3))
    rec.parent = None
    rec.start_ns = draw(_times)
    rec.end_ns = draw(st.one_of(st.integers(-2000, 10**9).map(lambda d: rec.start_ns + d),
                                st.sampled_from([-(2**63) + 5, -1, 2**63 + 7])))
    return rec


@needs_accel
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), role=st.sampled_from([None, "rollout"]))
def test_generated_scopes_encode_to_the_same_bytes(data: Any, role: str | None) -> None:
    threads = [threading.get_ident(), 2**40 + 17]  # this thread's name, and one never seen
    recs = data.draw(st.lists(_scope(threads), min_size=1, max_size=12))
    fast, slow, handed = _pair(rank=1, role=role, host="h")
    split = data.draw(st.integers(0, len(recs)))
    lines = _both(fast, slow, [recs[:split], recs[split:]])
    assert len(lines) >= len(recs)
    simple = [r for r in recs if 0 <= r.start_ns < 2**63 and r.end_ns - r.start_ns // 1000 * 1000 >= 0
              and r.end_ns < 2**63 and (not r.args or not ({"rank", "role"} & set(r.args)))
              and all(type(k) is str for k in (r.args or {}))]
    # what the compiled loop must cover itself: in-range times, str keys, no rank/role override
    # (values needing json_default or json_safe may go either way)
    assert not {id(r) for r in simple if all(_plain_json(v) for v in (r.args or {}).values())} \
        & {id(h) for h in handed}


def _plain_json(v: Any) -> bool:
    if v is None or type(v) in (bool, float):
        return True
    if type(v) is int:
        return -(2**63) <= v < 2**64
    if type(v) is str:
        return "\ud800" not in v
    if type(v) is list:
        return all(_plain_json(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain_json(x) for k, x in v.items())
    return False


_WORKLOAD = r"""
import asyncio, contextvars, random, sys, threading
import rltrace
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from rltrace.testing import deterministic

class OnStart(SpanProcessor):
    def on_start(self, span, parent_context=None):
        sc = span.get_span_context()
        parent = trace.get_current_span(parent_context).get_span_context()
        print("start", span.name, sc.trace_id, sc.span_id, int(sc.trace_flags), sc.is_valid,
              parent.span_id)

with deterministic():
    rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False, session_tracer={"enabled": True})
    rltrace.add_span_processor(OnStart())
    for i in range(30):
        with rltrace.trace_scope("step", args={"i": i}):
            task = rltrace.register_task()
            sid = rltrace.register_session(task)
            with rltrace.trace_session_phase("generate", session_id=sid):
                rltrace.instant("tok", args={"n": i})
                with rltrace.trace_scope("inner", "io"):
                    pass
            with rltrace.trace_session_phase("reward", session_id=sid):
                pass
            rltrace.trace_session_event("mark_finalized", session_id=sid,
                                        status="accepted" if i % 3 else "rejected")
    try:
        with rltrace.trace_scope("fails"):
            raise KeyError("k")
    except KeyError:
        pass

    async def rollout(k):
        with rltrace.trace_scope("rollout", args={"k": k}):
            await asyncio.sleep(0)
            with rltrace.trace_scope("turn"):
                await asyncio.sleep(0)

    async def main():
        with rltrace.trace_scope("gather"):
            await asyncio.gather(*(rollout(k) for k in range(4)))

    asyncio.run(main())

    def side():
        with rltrace.trace_scope("in.thread"):
            with rltrace.trace_scope("nested"):
                pass

    t = threading.Thread(target=side, name="side")
    t.start()
    t.join()
    remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(TraceFlags.SAMPLED))
    with trace.use_span(NonRecordingSpan(remote)):
        with rltrace.trace_scope("under.foreign"):
            pass
    elsewhere = rltrace.trace_scope("elsewhere")
    contextvars.copy_context().run(elsewhere.__enter__)
    elsewhere.__exit__(None, None, None)  # exited in another context than entered
    diag = rltrace.diagnostics()
    print("accelerated", diag["ChromeTraceExporter"]["accelerated"], diag["accelerated"])
    rltrace.shutdown()

# head sampling on: records under a sampler draw their ids through the Python method (seeded
# random ids: the ratio keeps some traces and drops others; OnStart is still registered)
with deterministic(ids=random.Random(7).getrandbits):
    rltrace.configure(fileroot=sys.argv[1] + "-sampled", flush_at_exit=False,
                      session_tracer={"enabled": True}, sampling={"mode": "ratio", "ratio": 0.5})
    for i in range(20):
        with rltrace.trace_scope("sampled.step"):
            sid = rltrace.register_session()
            with rltrace.trace_session_phase("generate", session_id=sid):
                pass
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    with trace.use_span(NonRecordingSpan(remote)):
        with rltrace.trace_scope("sampled.under.foreign"):
            pass
    rltrace.shutdown()
"""


@needs_accel
def test_a_whole_run_writes_the_same_files_with_and_without_the_accelerators(
    tmp_path: Path,
) -> None:
    """Two runs of one workload (deterministic clock and ids) in child processes, one compiled
    and one with ``RLTRACE_PURE_PYTHON=1``: the same Chrome trace, session records and span
    processor calls, byte for byte (the pid aside)."""
    runs = {}
    for pure in ("0", "1"):
        root = tmp_path / f"pure{pure}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
        env[PURE_PYTHON_ENV] = pure
        out = subprocess.run([sys.executable, "-c", _WORKLOAD, str(root)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, check=True)
        on = pure == "0"
        want = f"accelerated {int(on)} {{'scope': {on}, 'chrome': {on}}}"
        assert want in out.stdout.splitlines(), out.stdout[-2000:] + out.stderr
        (trace,) = root.rglob("traces-r0.jsonl")
        (sessions,) = root.rglob("sessions-r0.jsonl")
        text = re.sub(r'"pid":\d+', '"pid":P', trace.read_text())
        text = re.sub(r"Process \d+", "Process P", text)
        # the side thread has ended by export time: its track is named by its ident
        text = re.sub(r"thread-\d+", "thread-N", text)
        runs[pure] = (text, sessions.read_text(),
                      out.stdout.replace(want, ""), out.stderr)
    assert runs["0"] == runs["1"]
    chrome_text, session_text, on_start, _ = runs["0"]
    spans = 30 * 6 + 1 + 1 + 4 * 2 + 2 + 1 + 1  # step/task/session/phases/inner, fails, gather, ...
    assert chrome_text.count('"ph":"X"') == spans
    assert session_text.count("\n") == 30
    assert on_start.count("start ") == spans + 20 * 4 + 1
    flags = {line.split()[4] for line in on_start.splitlines() if line.startswith("start sampled")}
    assert flags == {"0", "1"}  # both decisions taken, the same ones compiled and not
    assert '"name":"under.foreign"' in chrome_text


_phase_names = st.sampled_from(["generate", "reward", "toolcall", "judge", "total", "x"])
_execs = st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62),
                            st.one_of(st.none(), st.integers(-2, 5)), st.booleans()),
                  min_size=1, max_size=4)
_attr_values = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.floats(allow_nan=False))


@needs_accel
@settings(max_examples=200, deadline=None)
@given(
    attrs=st.fixed_dictionaries(
        {"rl.session.id": _attr_values},
        optional={"rl.task.id": _attr_values, "rl.session.status": st.sampled_from(["accepted", "failed"]),
                  "rl.session.reason": _attr_values, "rl.step": _attr_values,
                  "rl.session.counter.tokens": st.integers(), "rl.session.counter.": st.floats(),
                  "other": st.integers()}),
    start=st.integers(0, 2**62), length=st.integers(-5, 10**12), trace_id=st.integers(1, 2**128 - 1),
    phases=st.dictionaries(_phase_names, _execs, max_size=4), rank=st.integers(0, 7),
    role=st.sampled_from([None, "rollout"]), custom=st.lists(_phase_names, max_size=2, unique=True),
    counters_possible=st.booleans(),
)
def test_the_compiled_session_record_is_the_python_one(
    attrs: dict[str, Any], start: int, length: int, trace_id: int,
    phases: dict[str, list[Any]], rank: int, role: str | None, custom: list[str],
    counters_possible: bool,
) -> None:
    import copy

    from rltrace import session_metrics

    build = session_metrics._load_build(_built("rltrace._scope_accel"))  # even where switched off
    args = (attrs, start, start + length, trace_id, phases, rank, role, tuple(custom),
            counters_possible)
    want = session_metrics.build_record(*copy.deepcopy(args))
    got = build(*copy.deepcopy(args))
    assert got is not None
    assert repr(got) == repr(want)  # the same keys in the same order, the same values
    assert got == want


def test_trace_scope_pickles_by_reference_compiled_or_not() -> None:
    """Ray and multiprocessing pickle functions that use ``trace_scope``: by reference."""
    import pickle

    for fn in (rltrace.trace_scope, rltrace.atrace_scope):
        assert pickle.loads(pickle.dumps(fn)) is fn


def test_a_queue_bound_beyond_64_bits_queues_and_writes_everything(tmp_path: Path) -> None:
    """``max_queue_size`` is any positive int: compiled, the bound is compared as Python does."""
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, max_queue_size=2**64,
                      session_tracer={"enabled": True})
    for _ in range(20):
        with rltrace.trace_scope("s"):
            sid = rltrace.register_session()
            with rltrace.trace_session_phase("generate", session_id=sid):
                pass
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.flush()
    diag = rltrace.diagnostics()
    assert diag["dropped"] == 0 and diag["errors"] == 0
    assert diag["sessions"]["written"] == 20
    (trace,) = tmp_path.rglob("traces-r0.jsonl")
    assert trace.read_text().count('"name":"s"') == 20
