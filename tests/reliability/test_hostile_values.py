"""Hostile values: a value that cannot be encoded costs its own attribute, never a neighbour, and
user code (``__str__``) never runs on the exporter's thread.

Real runs write real Chrome files; each case puts its bad value between good spans and checks
the neighbours, the process and track metadata, and the counts in ``diagnostics()``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, ClassVar

from conftest import clean_env

import rltrace
from rltrace.exporters.chrome import ChromeEncoder
from rltrace.recorder import Scope


def _configure(tmp_path: Path) -> Path:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="hostile", trial_name="t0",
                      flush_at_exit=False, handle_sigterm=False, session_tracer={"enabled": True})
    p = rltrace.runtime.get_pipeline()
    assert p is not None and p.chrome_path is not None
    return p.chrome_path


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class _Raising:
    def __str__(self) -> str:
        raise RuntimeError("boom")

    __repr__ = __str__


class _WhereStr:
    """Notes the thread its ``__str__`` ran on."""

    threads: ClassVar[list[str]] = []

    def __str__(self) -> str:
        _WhereStr.threads.append(threading.current_thread().name)
        return "where"


def test_a_recursive_value_beside_good_spans_loses_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    looped: list[Any] = [1]
    looped.append(looped)
    nested: dict[str, Any] = {"a": 1}
    nested["self"] = nested
    for i in range(30):
        with rltrace.trace_scope("before", args={"i": i}):
            pass
        with rltrace.trace_scope("bad", args={"looped": looped, "nested": nested, "i": i}):
            pass
        with rltrace.trace_scope("after", args={"i": i}):
            pass
        rltrace.save(step=i, force=True)
    diag = rltrace.diagnostics()
    rltrace.shutdown()
    events = _events(path)
    names = [e["name"] for e in events if e["ph"] == "X"]
    assert names.count("before") == names.count("bad") == names.count("after") == 30
    assert {"process_name", "thread_name"} <= {e["name"] for e in events if e["ph"] == "M"}
    bad = next(e for e in events if e["name"] == "bad")
    assert bad["args"]["i"] == 0 and bad["args"]["looped"][0] == 1 and "[...]" in json.dumps(bad)
    chrome = diag["ChromeTraceExporter"]
    assert (chrome["failed"], chrome["lost"], chrome["unencodable"], chrome["unwritable"]) == (0, 0, 0, 0)
    assert chrome["exported"] == 90 and diag["errors"] == 0


def test_a_raising_str_becomes_a_marker_for_that_value_alone(tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    sid = rltrace.register_session()
    with rltrace.trace_scope("raising", args={"obj": _Raising(), "ok": 1}) as span:
        span.set_attribute("attr", _Raising())
    with rltrace.trace_session_phase("generate", session_id=sid, start_payload={"obj": _Raising()}):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.shutdown()
    events = {e["name"]: e for e in _events(path) if e["ph"] == "X"}
    assert events["raising"]["args"]["obj"] == "<unprintable _Raising>"
    assert events["raising"]["args"]["ok"] == 1
    assert events["raising"]["args"]["attr"] == "<unprintable _Raising>"
    assert events["generate"]["args"]["rl.start.obj"] == "<unprintable _Raising>"


def test_user_str_runs_where_the_value_is_recorded_never_on_the_exporter(
        tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    _configure(tmp_path)
    _WhereStr.threads.clear()
    sid = rltrace.register_session()
    with rltrace.trace_scope("s", args={"w": _WhereStr(), "deep": {"w": [_WhereStr()]}}) as span:
        span.set_attribute("w", _WhereStr())
        span.add_event("e", {"w": _WhereStr()})
        rltrace.instant("i", args={"w": _WhereStr()})
    with rltrace.trace_session_phase("reward", session_id=sid, end_payload={"w": _WhereStr()}):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.shutdown()
    assert len(_WhereStr.threads) == 6 and set(_WhereStr.threads) == {threading.current_thread().name}


def test_the_encoder_isolates_a_record_it_cannot_encode() -> None:
    """An encoding failure inside the encoder (stood in for by an ``args_json`` that raises for
    one record: no real value reaches it unconverted any more) costs that record its args: it is
    written with a marker, counted, and the others are as they would be alone."""

    def rec(name: str, args: dict[str, Any], attrs: dict[str, Any] | None = None) -> Scope:
        r = Scope(name, "misc", args)
        if attrs:
            r.extras()["attrs"] = attrs
        r.begin_detached(None, from_context=False)
        r.finish(r.start_ns + 1000, hold=True)
        return r

    class Failing(ChromeEncoder):
        def args_json(self, args: dict[str, Any] | None) -> bytes:
            if args and "boom" in args:
                raise RecursionError("maximum recursion depth exceeded")
            return super().args_json(args)

    good = [rec("g1", {"a": 1}), rec("g2", {"b": 2})]
    for bad in (rec("bad", {"boom": 1}), rec("bad", {"x": 1}, attrs={"boom": 2})):  # both paths
        enc, alone = Failing(rank=0), ChromeEncoder(rank=0)
        out: list[bytes] = []
        enc.encode([good[0], bad, good[1]], out)
        expected: list[bytes] = []
        alone.encode(good, expected)
        lines = [json.loads(b) for b in out]
        assert [e["name"] for e in lines if e["ph"] == "X"] == ["g1", "bad", "g2"]
        marker = next(e for e in lines if e["name"] == "bad")["args"]
        assert list(marker) == ["rl.unencodable"] and "RecursionError" in marker["rl.unencodable"]
        assert [b for b in out if b"bad" not in b] == expected
        assert (enc.unencodable, enc.dropped) == (1, 0)
