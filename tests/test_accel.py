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


# printable ASCII and its neighbours (the compiled encoder writes plain ASCII itself)
_ascii = st.text(st.characters(min_codepoint=0x1E, max_codepoint=0x80), max_size=8)
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**63) - 2, max_value=2**63 + 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), _ascii,
    st.just("\ud800"), st.builds(Opaque),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_keys = st.one_of(st.text(max_size=6), _ascii, st.sampled_from(["rank", "role", "args.x", "rl.lane"]),
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
    start=st.integers(0, 2**64), length=st.integers(-5, 10**12), trace_id=st.integers(1, 2**129),
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


def _phase_scenarios(reg: Any) -> list[Any]:
    """Every way a ``with trace_session_phase(...)`` goes, on registry ``reg``; what each left:
    the phase records' fields, the session's turn and open phases, the OTel current span inside,
    the misuse counts (the caller compares two runs: compiled and Python)."""
    import contextvars

    from opentelemetry import trace

    from rltrace.sessions import _SESSION_CV

    seen: list[Any] = []
    tp = reg.trace_session_phase
    task = reg.register_task()
    sid = reg.register_session(task)
    sess = reg.sessions[sid]
    with tp("generate", session_id=sid) as g:  # the common path
        seen.append(("current", trace.get_current_span() is g))
    with tp("reward", {"score": 1}, session_id=sid):
        pass
    with tp("toolcall", session_id=sid) as t:
        seen.append(("open-attrs", dict(t.record_attrs()), t._attrs))  # not kept while open
        t.set_attribute("user", 1)
    seen.append(("unstarted-attrs", tp("generate", session_id=sid).record_attrs()))
    with tp("generate", turn=5, session_id=sid):  # an explicit turn moves the session's on
        pass
    with tp("generate", session_id=sid):
        pass
    token = _SESSION_CV.set(sid)  # the session from context
    try:
        with tp("toolcall"):
            pass
    finally:
        _SESSION_CV.reset(token)
    with tp("generate", session_id="nope"):  # unknown session: counted, not recorded
        seen.append(("current-unknown", trace.get_current_span() is not None))
    with tp("reward"):  # no session at all
        pass
    with pytest.raises(KeyError), tp("reward", session_id=sid):  # an error: interrupted
        raise KeyError("x")
    reused = tp("reward", session_id=sid)
    with reused:
        pass
    with reused:  # entered again after it ended: counted
        pass
    handle = reg.trace_session_event("mark_generate_start", session_id=sid)
    with handle:  # a started handle used in ``with``: closed at the exit
        pass
    ctx = contextvars.copy_context()
    other = tp("reward", session_id=sid)
    ctx.run(other.__enter__)
    other.__exit__(None, None, None)  # exited in another context: still closed once
    seen.append(("current-after", trace.get_current_span() is trace.INVALID_SPAN))
    with tp("generate", session_id=sid):  # finalized inside: closed by the finalize, once
        reg.trace_session_event("mark_finalized", session_id=sid, status="rejected")
    with tp("reward", session_id=sid):  # after the finalize: unknown
        pass
    reg.enabled = False
    with tp("generate", session_id=sid) as off:
        seen.append(("off", off.parent is None))
    seen.append(("session", sess.turn, list(sess.open_phases)))
    seen.append(("misuse", dict(reg.misuse)))
    return seen


def _phase_fields(rec: Any) -> Any:
    attrs = rec.record_attrs()
    return (type(rec).__name__, rec.name, list(attrs.items()), rec.record_attrs() is attrs,
            getattr(rec, "turn", None),
            getattr(rec, "session_id", None), rec.end_ns > 0, rec.start_ns > 0,
            sorted(((rec.extra or {}).get("attrs") or {}).items()),
            (rec.extra or {}).get("error", (None,))[0], getattr(rec, "_token", "unset"),
            type(rec.parent).__name__)


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the records are not compiled ones, so "
                                 "the compiled phase methods cannot run on them")
def test_compiled_phase_enter_and_exit_do_what_the_python_methods_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``PhaseScope.__enter__``/``__exit__``/``record_attrs`` run compiled
    (``ScopeCore.phase_enter``/``phase_exit``/``phase_attrs``); the same scenarios through them
    and through the Python methods leave the same records and attributes, turns, context and
    misuse counts."""
    from rltrace.phases import PhaseRegistry
    from rltrace.sessions import PhaseScope, SessionRegistry, SyncedPhaseScope

    core = _built("rltrace._scope_accel").ScopeCore
    assert PhaseScope.__enter__ is core.phase_enter and PhaseScope.__exit__ is core.phase_exit
    assert PhaseScope.record_attrs is core.phase_attrs
    assert SyncedPhaseScope.__enter__ is PhaseScope._enter  # device waits: the Python methods

    def run() -> tuple[list[Any], list[Any]]:
        buf = recorder.STATE.buffer
        buf.clear()
        reg = SessionRegistry(phases=PhaseRegistry())
        reg.enabled = True
        seen = _phase_scenarios(reg)
        records = [_phase_fields(r) for r in buf]
        buf.clear()
        return seen, records

    compiled = run()
    monkeypatch.setattr(PhaseScope, "__enter__", PhaseScope._enter)
    monkeypatch.setattr(PhaseScope, "__exit__", PhaseScope._exit)
    monkeypatch.setattr(PhaseScope, "record_attrs", PhaseScope._attrs_py)
    python = run()
    assert compiled == python
    seen, records = compiled
    names = [r[1] for r in records]
    assert names.count("generate") == 5 and names.count("reward") == 4  # the scenarios ran
    assert [r[2][:4] for r in records[:1]] == [[("rl.phase", "generate"), ("rl.turn", 0),
                                                 ("rl.session.id", 0), ("rl.task.id", 0)]]
    assert ("misuse", {"unknown_session": 2, "no_session": 1, "phase_reused": 1}) in seen


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the records are not compiled ones, so "
                                 "the compiled on_record hands them all to the Python method")
def test_the_compiled_on_record_holds_and_writes_what_the_python_one_does(tmp_path: Path) -> None:
    """``SessionMetricsProcessor.on_record`` runs compiled (``_scope_accel.observe_record``,
    installed per instance); fed the same records in the same awkward order (a phase after its
    session, more open sessions than ``max_open``, payloads, user attributes, an interrupted
    phase, plain scopes), the compiled and the Python processor hold and write the same."""
    from rltrace.session_metrics import SessionMetricsProcessor

    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, session_tracer={"enabled": True})
    state = recorder.STATE
    wake, help_at = state.wake_at, state.help_at
    state.wake_at = state.help_at = 1 << 60  # the records stay queued: this test feeds them
    try:
        state.buffer.clear()
        sids = []
        for i in range(6):
            with rltrace.trace_scope("step", args={"global_step": i}):
                sid = rltrace.register_session()
                sids.append(sid)
                with rltrace.trace_session_phase("generate", {"model": "m"} if i == 1 else None,
                                                 session_id=sid) as g:
                    if i == 2:
                        g.set_attribute("user", i)
                with pytest.raises(ValueError), rltrace.trace_session_phase("reward",
                                                                           session_id=sid):
                    if i == 3:
                        raise ValueError("x")
                    raise ValueError("y")
                if i != 4:
                    with rltrace.trace_session_phase("toolcall", session_id=sid):
                        pass
                if i == 1:  # a counter JSON has no form for: the record's line through dumps_line
                    from rltrace import sessions as _sessions

                    _sessions.REGISTRY.sessions[sid].set_attribute("rl.session.counter.odd", {1})
                rltrace.trace_session_event("mark_finalized", session_id=sid,
                                            status="accepted" if i % 2 else "rejected")
        records = list(state.buffer)
        state.buffer.clear()
    finally:
        state.wake_at, state.help_at = wake, help_at
    # a phase of session 0 fed again after its session (late); the spans of sessions 3-5
    # withheld, so their phases outnumber ``max_open`` and the oldest is evicted
    late = next(r for r in records if getattr(r, "session_id", None) == sids[0]
                and r.name == "generate")
    withheld = [r for r in records if r.name == "rl.session" and r.session_id in sids[3:]]
    feed = [r for r in records if r not in withheld] + [late]

    from rltrace.exporters.sessions import SessionRecordWriter

    def run(compiled: bool) -> Any:
        got: list[Any] = []
        path = tmp_path / f"sessions-{compiled}.jsonl"
        proc = SessionMetricsProcessor(SessionRecordWriter(path, flush_threshold=2), max_open=2)
        proc.listeners.append(got.append)
        if not compiled:
            del proc.on_record  # the class's Python method
        assert (proc.__dict__.get("on_record") is not None) == compiled
        for rec in feed:
            proc.on_record(rec)
        proc.force_flush()
        figures = []  # what the session spans got (their own attribute dicts), then taken off
        for rec in feed:
            if rec.name == "rl.session":
                attrs = rec.record_attrs()
                figures.append(sorted(attrs.items(), key=repr))
                for k in [k for k in attrs if k.endswith(("_s", ".turns"))]:
                    del attrs[k]
        return (got, dict(proc._acc), proc.late_phases, proc.orphaned, proc.sessions,
                [sorted(d) for d in proc._done], figures, path.read_bytes())

    compiled, python = run(True), run(False)
    assert repr(compiled) == repr(python)
    got, held, late_n, orphaned, sessions, _, figures, lines = compiled
    assert lines.count(b"\n") == 3 and all(("rl.session.turns", 1) in f for f in figures)
    assert b'"counters":{"odd":' in lines  # written through json_default, as the Python path
    assert sessions == 3 and late_n == 1 and orphaned == 1
    assert sorted(held) == sids[4:]  # session 3's phases were the oldest held
    assert [len(r["phases"]) for r in got] == [3, 3, 3]
    assert [r["phases"]["reward"][0].get("interrupted") for r in got] == [True] * 3
    assert got[1]["phases"]["generate"][0]["turn"] == 0


def _fields(rec: Any) -> dict[str, Any]:
    out = {}
    for name in ("name", "category", "args", "end_ns", "extra", "_attrs", "task_id", "open",
                 "spread", "step", "session_id", "turn", "open_phases", "spec", "start_payload",
                 "end_payload", "reg", "owns_lane", "thread", "task"):
        try:
            out[name] = getattr(rec, name)
        except AttributeError:
            out[name] = "<unset>"
    out["type"] = type(rec)
    out["parent"] = type(getattr(rec, "parent", None))
    out["started"] = type(getattr(rec, "start_ns", None))
    out["lane"] = type(getattr(rec, "lane", None))
    return out


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the compiled constructors make compiled "
                                 "records, which the Python classes do not")
def test_the_compiled_constructors_make_what_the_classes_make() -> None:
    """The registry makes its task, session and phase records with ``_scope_accel``'s
    ``new_task``/``new_session``/``new_phase`` (their ``__init__`` without the frame): every
    field is what calling the class sets, and they are started alike."""
    from rltrace.phases import PhaseRegistry
    from rltrace.sessions import _RECORDS, PhaseScope, SessionRegistry, SessionScope, TaskScope

    accel = _built("rltrace._scope_accel")
    assert (_RECORDS.task, _RECORDS.session, _RECORDS.phase) == \
        (accel.new_task, accel.new_session, accel.new_phase)
    reg = SessionRegistry(phases=PhaseRegistry())
    spec = reg.phases.get("generate")
    for step in (None, 7):
        tasks = [make("t", step) for make in (accel.new_task, TaskScope)]
        assert _fields(tasks[0]) == _fields(tasks[1])
        assert tasks[0].open is not tasks[1].open  # a set of its own
        sessions = [make(3, task, step) for make, task in
                    zip((accel.new_session, SessionScope), tasks, strict=True)]
        fs = [_fields(s) for s in sessions]
        assert fs[0] == fs[1] and sessions[0].task_rec is tasks[0]
        assert sessions[0].parent is tasks[0] and sessions[0].turn == -1
        for args in ((spec, None, None, None, None, reg), (spec, {"a": 1}, {"b": 2}, 4, 9, reg)):
            phases = [make(*args) for make in (accel.new_phase, PhaseScope)]
            assert _fields(phases[0]) == _fields(phases[1])
            assert phases[0].parent is None
    with pytest.raises(TypeError):
        accel.new_task("t")


def _status_of(status: Any) -> Any:
    return None if status is None else (status.status_code, status.description)


def _finalize_scenarios(reg: Any, event: Any) -> list[Any]:
    """Sessions finalized every way ``event`` (``trace_session_event``) is called; what each
    left: the records queued, the registry's tasks and sessions, misuse and tally counts."""
    from rltrace.tally import FINALIZED

    reg.tally = [0, 0, 0, 0]
    buf = recorder.STATE.buffer
    buf.clear()
    seen: list[Any] = []
    t1 = reg.register_task()
    s1, s2 = reg.register_session(t1), reg.register_session(t1)
    open_phase = reg.trace_session_event("mark_generate_start", session_id=s1)
    event("mark_finalized", session_id=s1, status="accepted")  # one of two: the task stays
    seen.append(("after-first", sorted(reg.tasks), sorted(reg.sessions), open_phase.end_ns > 0))
    event("mark_finalized", session_id=s2, status="rejected", reason="too long", task_id=None)
    seen.append(("after-second", sorted(reg.tasks), sorted(reg.sessions)))
    event("mark_finalized", session_id=s2, status="dropped")  # again: counted, ignored
    for status, reason in (("dropped", None), ("failed", "boom"), ("accepted", 3)):
        sid = reg.register_session()
        event("mark_finalized", session_id=sid, status=status, reason=reason)
    with pytest.raises(ValueError):
        event("mark_finalized", session_id=reg.register_session(), status="nope")
    with pytest.raises(TypeError):
        event("mark_finalized", session_id=reg.register_session(), status="accepted", x=1)
    reg.enabled = False
    event("mark_finalized", session_id=reg.register_session(), status="accepted")
    reg.enabled = True
    seen.append(("misuse", dict(reg.misuse), reg.tally[FINALIZED]))
    pending = reg.sessions[reg.register_session()]
    seen.append(("pending-attrs", dict(pending.record_attrs()), pending._attrs))  # not kept
    user = reg.register_session()
    reg.sessions[user].set_attribute("rl.step", 99)  # user-set attributes: the Python method
    with rltrace.step(5):
        stepped = reg.register_session()
    event("mark_finalized", session_id=user, status="accepted")
    event("mark_finalized", session_id=stepped, status="accepted", reason="r")
    for rec in buf:
        attrs = rec.record_attrs()
        seen.append(("attrs", type(rec).__name__, list(attrs.items()), rec.record_attrs() is attrs))
        seen.append((type(rec).__name__, rec.name, getattr(rec, "status", None),
                     getattr(rec, "reason", None), rec.end_ns > 0,
                     sorted(((rec.extra or {}).get("attrs") or {}).items()),
                     _status_of((rec.extra or {}).get("status")),
                     getattr(rec, "open_phases", None), getattr(rec, "open", "-")))
    buf.clear()
    return seen


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the records are not compiled ones, so "
                                 "the compiled finalize cannot run on them")
def test_the_compiled_mark_finalized_finalizes_as_the_python_method_does() -> None:
    """``trace_session_event`` runs ``mark_finalized`` of a known session compiled
    (``_scope_accel.RegistryCall``); the same calls through it and through the registry's Python
    method leave the same records, registry state, misuse and tally counts."""
    from rltrace import sessions
    from rltrace.phases import PhaseRegistry
    from rltrace.sessions import SessionRegistry

    accel = _built("rltrace._scope_accel")
    assert type(sessions.trace_session_event) is accel.RegistryCall
    assert sessions.trace_session_event.__name__ == "trace_session_event"

    core = accel.ScopeCore
    assert (sessions.TaskScope.record_attrs, sessions.SessionScope.record_attrs) == \
        (core.task_attrs, core.session_attrs)

    def run(compiled: bool) -> list[Any]:
        reg = SessionRegistry(phases=PhaseRegistry())
        reg.enabled = True
        event = accel.RegistryCall(reg.trace_session_event, reg, "event") if compiled \
            else reg.trace_session_event
        return _finalize_scenarios(reg, event)

    compiled = run(True)
    with pytest.MonkeyPatch.context() as mp:  # the records' attributes through Python too
        for cls in (sessions.TaskScope, sessions.SessionScope):
            mp.setattr(cls, "record_attrs", cls._attrs_py)
        python = run(False)
    assert compiled == python
    statuses = [s[2] for s in compiled if s[0] == "SessionScope"]
    assert statuses == ["accepted", "rejected", "dropped", "failed", "accepted", "accepted",
                        "accepted"]
    assert ("misuse", {"unknown_session": 1}, 5) in compiled
    attrs = [dict(s[2]) for s in compiled if s[0] == "attrs" and s[1] == "SessionScope"]
    assert attrs[1]["rl.session.reason"] == "too long" and attrs[-2]["rl.step"] == 99
    assert attrs[-1]["rl.step"] == 5 and attrs[-1]["rl.session.reason"] == "r"


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the compiled call makes compiled records, "
                                 "which the Python method does not")
def test_the_compiled_trace_session_phase_makes_what_the_method_makes() -> None:
    """``trace_session_phase``'s common call runs compiled (``_scope_accel.RegistryCall``): every
    form of call makes the record the registry's method makes, or raises what it raises."""
    from rltrace import sessions
    from rltrace.phases import PhaseRegistry, UnknownPhaseError
    from rltrace.sessions import SessionRegistry

    accel = _built("rltrace._scope_accel")
    assert type(sessions.trace_session_phase) is accel.RegistryCall
    assert sessions.trace_session_phase.__doc__ == SessionRegistry.trace_session_phase.__doc__
    reg = SessionRegistry(phases=PhaseRegistry())
    compiled = accel.RegistryCall(reg.trace_session_phase, reg, "phase")
    payload = {"model": "m"}
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("generate",), {}), (("reward", payload), {}), (("reward", None, payload), {}),
        (("generate", {}, {}), {"turn": 3, "session_id": 7}),
        (("toolcall",), {"start_payload": payload, "end_payload": None, "turn": None}),
        (("generate",), {"device_sync": False, "session_id": "s"}),
        (("generate",), {"device_sync": "cuda"}),  # the method's SyncedPhaseScope
    ]
    for args, kw in calls:
        got, want = compiled(*args, **kw), reg.trace_session_phase(*args, **kw)
        assert _fields(got) == _fields(want), (args, kw)
        if got.start_payload is not None:
            assert got.start_payload is not payload  # a copy, as the method makes
    bad: list[tuple[tuple[Any, ...], dict[str, Any], type[Exception]]] = [
        (("nope",), {}, UnknownPhaseError), ((3,), {}, TypeError),
        (("generate", [1]), {}, TypeError), (("generate",), {"turn": "1"}, TypeError),
        (("generate", None), {"start_payload": {}}, TypeError), (("generate",), {"x": 1}, TypeError),
    ]
    for args, kw, error in bad:
        with pytest.raises(error) as a:
            compiled(*args, **kw)
        with pytest.raises(error) as b:
            reg.trace_session_phase(*args, **kw)
        assert str(a.value) == str(b.value)


def _register_scenarios(reg: Any, task: Any, session: Any) -> list[Any]:
    """Tasks and sessions registered every way (``task``/``session``: ``register_task``/
    ``register_session``); what each left: ids, the records' fields, the registry's state."""
    from opentelemetry import context as otel_context
    from opentelemetry.trace import SpanContext, TraceFlags

    from rltrace.sessions import _TASK_CV, CALLER_TASK_KEY
    from rltrace.steps import CALLER_STEP_KEY

    reg.tally = [0, 0, 0, 0]
    buf = recorder.STATE.buffer
    buf.clear()
    out: list[Any] = []
    t1 = task()
    out += [t1, task(t1), task(task_id="named"), session(), session(t1), session(task_id="named")]
    token = _TASK_CV.set(t1)  # the current task
    try:
        out.append(session())
    finally:
        _TASK_CV.reset(token)
    with rltrace.step(12):  # the step from rltrace.step
        out += [task(), session()]
    with rltrace.trace_scope("rollout", args={"global_step": 4}):  # AReaL style: scope args
        out += [task(), session(t1), session()]
    ctx = otel_context.set_value(CALLER_STEP_KEY, 9)  # a remote caller's step
    tok = otel_context.attach(ctx)
    try:
        out += [task(), session()]
    finally:
        otel_context.detach(tok)
    remote = SpanContext(5, 6, True, TraceFlags(1))
    tok = otel_context.attach(otel_context.set_value(CALLER_TASK_KEY, ("caller", remote)))
    try:  # the caller's task of another process: a RemoteTaskScope
        out += [session(), session(), task("other")]
    finally:
        otel_context.detach(tok)
    for _ in range(2100):  # the recent ids roll over a generation
        session(t1)
    reg.enabled = False
    out += [task(), session()]
    reg.enabled = True
    with pytest.raises(TypeError):
        session(1, 2)
    with pytest.raises(TypeError):
        task(x=1)

    def fields(rec: Any) -> Any:
        return (type(rec).__name__, rec.name, getattr(rec, "task_id", None),
                getattr(rec, "session_id", None), rec.step, rec.start_ns > 0,
                getattr(getattr(rec, "task_rec", None), "task_id", None),
                sorted(rec.open) if isinstance(getattr(rec, "open", None), set) else None,
                getattr(rec, "parts", None), type(rec.parent).__name__)

    out.append(sorted((k, fields(v)) for k, v in reg.tasks.items() if type(k) is int) +
               sorted((str(k), fields(v)) for k, v in reg.tasks.items() if type(k) is not int))
    out.append(sorted((k, fields(v)) for k, v in reg.sessions.items()))
    out.append([sorted(g, key=repr) for g in (*reg.recent_tasks, *reg.recent_sessions)])
    out.append(list(reg.tally))
    buf.clear()
    return out


@needs_accel
@pytest.mark.skipif(PURE, reason="RLTRACE_PURE_PYTHON=1: the compiled calls make compiled "
                                 "records, which the Python methods do not")
def test_the_compiled_register_calls_register_what_the_methods_register(tmp_path: Path) -> None:
    """``register_task``/``register_session`` run compiled (``_scope_accel.RegistryCall``);
    the same registrations through them and through the registry's methods give the same ids,
    records, steps, registry state and tally counts."""
    from rltrace import sessions
    from rltrace.phases import PhaseRegistry
    from rltrace.sessions import SessionRegistry

    accel = _built("rltrace._scope_accel")
    assert type(sessions.register_task) is accel.RegistryCall
    assert type(sessions.register_session) is accel.RegistryCall
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)  # scopes record (their args)

    def run(compiled: bool) -> list[Any]:
        reg = SessionRegistry(phases=PhaseRegistry())
        reg.enabled = True
        if compiled:
            return _register_scenarios(reg, accel.RegistryCall(reg.register_task, reg, "task"),
                                       accel.RegistryCall(reg.register_session, reg, "session"))
        return _register_scenarios(reg, reg.register_task, reg.register_session)

    compiled, python = run(True), run(False)
    assert compiled == python
    tasks = dict(compiled[-4])
    assert {f[4] for f in tasks.values()} >= {None, 12, 4, 9}  # every source of the step
    assert any(f[0] == "RemoteTaskScope" and f[8] == 2 for f in tasks.values())
    assert compiled[-1][0] > 2100  # registered sessions counted
