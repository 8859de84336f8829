"""Bad input (issue 8, item 7): hypothesis drives the public API with random call sequences that
mix correct use with misuse — phases ended that never started, sessions finalized twice, unknown
and unhashable ids, unknown phases and methods, bad statuses, non-string names, huge and
non-serialisable args and payloads.

The property: every misuse gets the documented answer — a clear ``TypeError`` / ``ValueError`` /
``UnknownPhaseError`` at the call site, or a warning counted in ``rltrace.diagnostics()["misuse"]``
(exactly as many as the model predicts) — and nothing else changes: a control session run
alongside is recorded exactly, every fuzzed session has exactly the record the model expects,
and every line of every file parses.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rltrace
from rltrace import UnknownPhaseError, runtime
from rltrace.testing import read_jsonl

PHASES = ("generate", "toolcall", "reward")
STATUSES = ("accepted", "rejected", "failed", "dropped")


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)


class Opaque:
    """An arbitrary user object (no JSON form)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Opaque({self.n})"


class Unprintable:
    """A value whose ``str`` raises: only ever passed as span args or payload values."""

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        return "Unprintable()"


leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**64, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.binary(max_size=20),
    st.builds(Opaque, st.integers()), st.builds(Unprintable), st.just(1 << 200),
    st.sampled_from(["huge", "é\x00\n\"{}", "\u2028 \U0001f600"]).map(
        lambda s: "x" * 300_000 if s == "huge" else s),
    st.frozensets(st.integers(), max_size=3), st.just(math.pi),
)
values = st.recursive(leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner),
    st.dictionaries(st.one_of(st.text(max_size=5), st.integers(), st.tuples(st.integers())), inner,
                    max_size=4)), max_leaves=12)
args_dicts = st.dictionaries(st.one_of(st.text(max_size=8), st.integers(), st.none()), values, max_size=5)
foreign_ids = st.one_of(st.integers(min_value=10**9), st.text(min_size=1, max_size=8),
                        st.tuples(st.integers()))
bad_names = st.one_of(st.integers(), st.none(), st.binary(max_size=5), st.lists(st.text(), max_size=2),
                      st.builds(Opaque, st.integers()))
unknown_phases = st.text(max_size=12).filter(lambda s: s not in (*PHASES, "verify", "fuzz_custom"))
idx = st.integers(min_value=0, max_value=10**6)

ops = st.one_of(
    st.tuples(st.just("register")),
    st.tuples(st.just("phase"), idx, st.sampled_from(PHASES), st.one_of(st.none(), args_dicts)),
    st.tuples(st.just("phase_no_session"), st.sampled_from(PHASES)),
    st.tuples(st.just("phase_on_finalized"), idx, st.sampled_from(PHASES)),
    st.tuples(st.just("phase_unknown_session"), foreign_ids, st.sampled_from(PHASES)),
    st.tuples(st.just("mark_start"), idx, st.sampled_from(PHASES), st.one_of(st.none(), values)),
    st.tuples(st.just("mark_end"), idx, st.sampled_from(PHASES)),
    st.tuples(st.just("mark_end_handle"), idx, idx),
    st.tuples(st.just("end_closed_handle"), idx),
    st.tuples(st.just("finalize"), idx, st.sampled_from(STATUSES),
              st.one_of(st.none(), st.text(max_size=30), st.integers(), st.builds(Opaque, st.integers()))),
    st.tuples(st.just("finalize_task"), idx, st.sampled_from(STATUSES)),
    st.tuples(st.just("finalize_again"), idx),
    st.tuples(st.just("finalize_unknown"), foreign_ids),
    st.tuples(st.just("finalize_unknown_task"), foreign_ids),
    st.tuples(st.just("finalize_bad_status"), idx, st.one_of(st.text(max_size=10), st.integers(), st.none())),
    st.tuples(st.just("finalize_extra_kwarg"), idx),
    st.tuples(st.just("unhashable_session_id"), st.sampled_from(PHASES)),
    st.tuples(st.just("unknown_phase"), unknown_phases),
    st.tuples(st.just("unknown_mark"), unknown_phases),
    st.tuples(st.just("unknown_method"), st.text(max_size=15)),
    st.tuples(st.just("bad_turn"), idx),
    st.tuples(st.just("scope"), args_dicts, st.one_of(st.none(), st.text(max_size=5), st.integers())),
    st.tuples(st.just("scope_bad_name"), bad_names),
    st.tuples(st.just("instant"), args_dicts),
    st.tuples(st.just("instant_bad_name"), bad_names),
    st.tuples(st.just("register_phase_bad"), st.one_of(
        st.text(max_size=6).filter(lambda s: not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", s)), bad_names)),
    st.tuples(st.just("flush")),
)


@dataclass
class Model:
    """What the files must hold afterwards, and the misuse warnings that must have been counted."""

    open: dict[Any, dict[str, Any]] = field(default_factory=dict)  # sid -> counts, handles
    finalized: dict[Any, dict[str, Any]] = field(default_factory=dict)  # sid -> expected record
    closed_handles: list[Any] = field(default_factory=list)
    misuse: Counter[str] = field(default_factory=Counter)
    scopes: int = 0

    def pick_open(self, i: int) -> Any:
        return list(self.open)[i % len(self.open)] if self.open else None

    def pick_finalized(self, i: int) -> Any:
        return list(self.finalized)[i % len(self.finalized)] if self.finalized else None

    def finish(self, sid: Any, status: set[str]) -> None:
        s = self.open.pop(sid)
        self.finalized[sid] = {"status": status, "counts": s["counts"],
                               "interrupted": Counter(h.phase for h in s["handles"])}
        self.closed_handles.extend(s["handles"])


def _expect_error(exc_types: tuple[type[BaseException], ...], fn: Any, *a: Any, **k: Any) -> None:
    with pytest.raises(exc_types) as info:
        fn(*a, **k)
    assert str(info.value), "the error must say what is wrong"


def _error_or_counted(m: Model, kind: str, fn: Any, *a: Any, **k: Any) -> None:
    """Misuse answered by a clear TypeError/ValueError, or else ignored with a counted warning."""
    try:
        fn(*a, **k)
    except (TypeError, ValueError) as exc:
        assert str(exc)
    else:
        m.misuse[kind] += 1


def _apply(op: tuple[Any, ...], m: Model) -> None:
    kind = op[0]
    event = rltrace.trace_session_event
    if kind == "register":
        sid = rltrace.register_session()
        m.open[sid] = {"counts": Counter(), "handles": []}
    elif kind == "phase":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        with rltrace.trace_session_phase(op[2], op[3], op[3], session_id=sid):
            pass
        m.open[sid]["counts"][op[2]] += 1
    elif kind == "phase_no_session":
        with rltrace.trace_session_phase(op[1]):
            pass
        m.misuse["no_session"] += 1
    elif kind == "phase_on_finalized":
        sid = m.pick_finalized(op[1])
        if sid is None:
            return
        with rltrace.trace_session_phase(op[2], session_id=sid):
            pass
        m.misuse["unknown_session"] += 1
    elif kind == "phase_unknown_session":
        with rltrace.trace_session_phase(op[2], session_id=op[1]):
            pass
        m.misuse["unknown_session"] += 1
    elif kind == "mark_start":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        payload = {} if op[3] is None else {"payload": op[3]}
        h = event(f"mark_{op[2]}_start", session_id=sid, **payload)
        m.open[sid]["handles"].append(h)
        m.open[sid]["counts"][op[2]] += 1
    elif kind == "mark_end":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        handles = m.open[sid]["handles"]
        event(f"mark_{op[2]}_end", session_id=sid)
        oldest = next((h for h in handles if h.phase == op[2]), None)
        if oldest is None:
            m.misuse["phase_not_started"] += 1
        else:
            handles.remove(oldest)
            m.closed_handles.append(oldest)
    elif kind == "mark_end_handle":
        sid = m.pick_open(op[1])
        if sid is None or not m.open[sid]["handles"]:
            return
        handles = m.open[sid]["handles"]
        h = handles.pop(op[2] % len(handles))
        event(f"mark_{h.phase}_end", session_id=sid, handle=h)
        m.closed_handles.append(h)
    elif kind == "end_closed_handle":
        if not m.closed_handles:
            return
        h = m.closed_handles[op[1] % len(m.closed_handles)]
        event(f"mark_{h.phase}_end", session_id=h.session_id, handle=h)  # idempotent
    elif kind == "finalize":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        event("mark_finalized", session_id=sid, status=op[2], reason=op[3])
        m.finish(sid, {op[2]})
    elif kind == "finalize_task":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        task = next(r for r in _open_tasks() if sid in r[1])[0]
        event("mark_finalized", task_id=task, status=op[2])
        m.finish(sid, {op[2]})  # each fuzzed session has a task of its own
    elif kind == "finalize_again":
        sid = m.pick_finalized(op[1])
        if sid is None:
            return
        event("mark_finalized", session_id=sid, status="accepted")
        m.misuse["unknown_session"] += 1
    elif kind == "finalize_unknown":
        event("mark_finalized", session_id=op[1], status="accepted")
        m.misuse["unknown_session"] += 1
    elif kind == "finalize_unknown_task":
        event("mark_finalized", task_id=op[1], status="accepted")
        m.misuse["unknown_task"] += 1
    elif kind == "finalize_bad_status":
        sid = m.pick_open(op[1])
        _expect_error((ValueError,), event, "mark_finalized", session_id=sid, status=op[2])
    elif kind == "finalize_extra_kwarg":
        sid = m.pick_open(op[1])
        _expect_error((TypeError,), event, "mark_finalized", session_id=sid, status="accepted", bogus=1)
    elif kind == "unhashable_session_id":  # a TypeError, or ignored and counted like any unknown id
        def phase_on_unhashable() -> None:
            with rltrace.trace_session_phase(op[1], session_id=[1]):
                pass

        _error_or_counted(m, "unknown_session", phase_on_unhashable)
        _error_or_counted(m, "unknown_session", event, "mark_finalized", session_id={"a": 1},
                          status="accepted")
    elif kind == "unknown_phase":
        _expect_error((UnknownPhaseError,), rltrace.trace_session_phase, op[1])
        _expect_error((UnknownPhaseError,), rltrace.trace_session, op[1])
    elif kind == "unknown_mark":
        _expect_error((UnknownPhaseError,), event, f"mark_{op[1]}_start", session_id=m.pick_open(0))
    elif kind == "unknown_method":
        method = op[1]
        if method == "mark_finalized" or (method.startswith("mark_") and method.endswith(("_start", "_end"))):
            return
        _expect_error((ValueError,), event, method)
    elif kind == "bad_turn":
        sid = m.pick_open(op[1])
        if sid is None:
            return
        _expect_error((TypeError, ValueError), lambda: rltrace.trace_session_phase(
            "toolcall", session_id=sid, turn="three").__enter__())
    elif kind == "scope":
        with rltrace.trace_scope("fuzz.scope", op[2], op[1]):
            pass
        m.scopes += 1
    elif kind == "scope_bad_name":
        _expect_error((TypeError,), rltrace.trace_scope, op[1])
    elif kind == "instant":
        rltrace.instant("fuzz.instant", None, op[1])
    elif kind == "instant_bad_name":
        _expect_error((TypeError,), rltrace.instant, op[1])
    elif kind == "register_phase_bad":
        _expect_error((ValueError,), rltrace.register_phase, op[1])
    elif kind == "flush":
        rltrace.flush()
    else:  # pragma: no cover
        raise AssertionError(kind)


def _open_tasks() -> list[tuple[Any, set[Any]]]:

    return [(t.task_id, set(t.open)) for t in runtime.RUNTIME.sessions.tasks.values()]


#: every line of a JSONL file; each one (blank ones too) must parse
_lines = functools.partial(read_jsonl, strict=True)


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(ops, max_size=40))
def test_random_api_sequences_with_misuse_get_clear_errors_or_counted_warnings_and_corrupt_nothing(
    sequence: list[tuple[Any, ...]],
) -> None:
    root = tempfile.mkdtemp(prefix="rltrace-fuzz-")
    try:
        rltrace.configure(fileroot=root, flush_at_exit=False, flush_interval_s=3600,
                          session_tracer={"enabled": True, "flush_threshold": 3})
        p = runtime.get_pipeline()
        assert p is not None and p.sessions_path is not None and p.chrome_path is not None
        control_task = rltrace.register_task()
        control = rltrace.register_session(control_task)
        with rltrace.trace_scope("control.step", args={"step": 1}):
            with rltrace.trace_session_phase("generate", {"model": "m"}, session_id=control):
                pass
        m = Model()
        for op in sequence:
            _apply(op, m)
        with rltrace.trace_session_phase("reward", session_id=control):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=control, status="accepted", reason="ok")
        misuse = rltrace.diagnostics()["misuse"]
        assert Counter(misuse) == +m.misuse, (misuse, m.misuse)
        rltrace.shutdown()  # still-open fuzzed sessions are written as pending

        records = _lines(p.sessions_path)
        by_id = Counter(r["session_id"] for r in records)
        assert max(by_id.values()) == 1, "a session was recorded twice"
        recs = {r["session_id"]: r for r in records}
        c = recs.pop(control)
        assert (c["status"], c["reason"], c["task_id"]) == ("accepted", "ok", control_task)
        assert c["phase_counts"] == {"generate": 1, "reward": 1} and c["turns"] == 1
        assert not any(i.get("interrupted") for items in c["phases"].values() for i in items)
        for sid, s in m.open.items():  # open at shutdown
            m.finalized[sid] = {"status": {"pending"}, "counts": s["counts"],
                                "interrupted": Counter(h.phase for h in s["handles"])}
        assert set(recs) == set(m.finalized)
        for sid, exp in m.finalized.items():
            r = recs[sid]
            assert r["status"] in exp["status"]
            assert r["phase_counts"] == {k: v for k, v in exp["counts"].items() if v}
            got = Counter(ph for ph, items in r["phases"].items() for i in items if i.get("interrupted"))
            assert got == exp["interrupted"]
            assert all(i["end_ts"] is not None for items in r["phases"].values() for i in items)
        names = Counter(e.get("name") for e in _lines(p.chrome_path) if e.get("ph") == "X")
        assert names["control.step"] == 1
        assert names["fuzz.scope"] == m.scopes
    finally:
        rltrace.shutdown()
        shutil.rmtree(root, ignore_errors=True)


def test_a_reason_that_cannot_be_converted_to_text_never_loses_the_session(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, session_tracer={"enabled": True})
    p = runtime.get_pipeline()
    assert p is not None and p.sessions_path is not None
    sid = rltrace.register_session()
    with rltrace.trace_session_phase("generate", session_id=sid):
        pass
    try:
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="failed", reason=Unprintable())
    except Exception:
        # a clear error is acceptable only if the session can still be finalized afterwards
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="failed", reason="retry")
    rltrace.shutdown()
    records = _lines(p.sessions_path) if p.sessions_path.exists() else []
    assert [r["session_id"] for r in records] == [sid]
    assert records[0]["status"] == "failed" and records[0]["phase_counts"] == {"generate": 1}


def test_a_lone_surrogate_in_args_or_reason_loses_neither_the_batch_nor_the_session(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, flush_interval_s=3600,
                      session_tracer={"enabled": True})
    p = runtime.get_pipeline()
    assert p is not None and p.sessions_path is not None and p.chrome_path is not None
    with rltrace.trace_scope("before"):
        pass
    with rltrace.trace_scope("open_file", args={"path": os.fsdecode(b"/data/\xff.jsonl")}):
        pass
    sid = rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="failed",
                                reason=b"bad \xff".decode("utf-8", "surrogateescape"))
    rltrace.shutdown()
    names = Counter(e.get("name") for e in _lines(p.chrome_path) if e.get("ph") == "X")
    assert names["before"] == 1 and names["open_file"] == 1
    assert [r["session_id"] for r in _lines(p.sessions_path)] == [sid]
