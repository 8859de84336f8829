"""Hostile values: a value that cannot be encoded costs its own attribute, never a neighbour; the
caller's own code (``__str__``, ``tolist``, a ``shape`` property) never runs, neither on the
exporter's thread nor on the caller's; nothing a value does reaches the caller; what is recorded
is a copy.

Real runs write real Chrome files; every case goes through every entry point (span args,
``set_attribute``, ``add_event``, ``instant`` inside and outside a span, phase start and end
payloads, ``set_end_payload``, ``mark_<phase>_start``/``_end`` payloads).  The cases that would
hang the process before the fix run in a child process with its own deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import HELPERS, clean_env, need

import rltrace
from rltrace.exporters.chrome import ChromeEncoder
from rltrace.recording.recorder import Scope


def _configure(tmp_path: Path) -> Path:
    # no timed export cycle before shutdown(): a test that mutates a value after recording it
    # does so before anything was exported
    rltrace.configure(fileroot=str(tmp_path), experiment_name="hostile", trial_name="t0",
                      flush_at_exit=False, handle_sigterm=False, flush_interval_s=3600,
                      session_tracer={"enabled": True})
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


#: every entry point that records a caller's value; each records it under its own key
ENTRIES = ("scope_args", "set_attribute", "add_event", "instant", "lone_instant", "start_payload",
           "end_payload", "set_end_payload", "mark_start", "mark_end")


def _record_everywhere(make: Callable[[], Any]) -> None:
    """Record ``make()`` once through every entry point, under the entry's name."""
    sid = rltrace.register_session()
    with rltrace.trace_scope("scope", args={"scope_args": make()}) as span:
        span.set_attribute("set_attribute", make())
        span.add_event("event", {"add_event": make()})
        rltrace.instant("inst", args={"instant": make()})
    rltrace.instant("lone", args={"lone_instant": make()})
    with rltrace.trace_session_phase("generate", session_id=sid, start_payload={"start_payload": make()},
                                     end_payload={"end_payload": make()}) as phase:
        phase.set_end_payload(set_end_payload=make())
    handle = rltrace.trace_session_event("mark_reward_start", session_id=sid, mark_start=make())
    rltrace.trace_session_event("mark_reward_end", session_id=sid, handle=handle, mark_end=make())
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")


def _written(path: Path) -> dict[str, Any]:
    """What the Chrome file holds for each entry point's key."""
    out: dict[str, Any] = {}
    for e in _events(path):
        for k, v in e.get("args", {}).items():
            k = k.removeprefix("rl.start.").removeprefix("rl.end.")
            if k in ENTRIES:
                out[k] = v
    return out


def _marker(value: Any) -> str:
    t = type(value)
    return f"<{t.__module__}.{t.__qualname__} object at {id(value):#x}>"


class _Calls:
    """Counts calls of an object's own code, by name."""

    made: ClassVar[list[str]] = []


class _DtypeAttr:
    """Looks like an array to ``hasattr(type(x), "dtype")``."""

    dtype = "float32"

    def __str__(self) -> str:
        _Calls.made.append("__str__")
        return "dtype-attr"

    def __repr__(self) -> str:
        _Calls.made.append("__repr__")
        return "dtype-attr"


class _ShapeTolist:
    """Looks like an array to ``hasattr(x, "shape") and hasattr(x, "tolist")``."""

    shape = (2,)

    def tolist(self) -> list[int]:
        _Calls.made.append("tolist")
        return [1, 2]

    def item(self) -> int:
        _Calls.made.append("item")
        return 1

    def __str__(self) -> str:
        _Calls.made.append("__str__")
        return "shape-tolist"


@pytest.mark.parametrize("cls", [_DtypeAttr, _ShapeTolist], ids=["class_attr_dtype", "shape_and_tolist"])
def test_an_array_look_alike_is_recorded_as_its_type_and_id_and_none_of_its_code_runs(
        tmp_path: Path, monkeypatch: Any, cls: type) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    _Calls.made.clear()
    value = cls()
    _record_everywhere(lambda: value)
    rltrace.shutdown()
    assert _written(path) == dict.fromkeys(ENTRIES, _marker(value))
    assert _Calls.made == []


class _ShapeRaises:
    @property
    def shape(self) -> Any:
        raise ValueError("shape of a freed buffer")

    def tolist(self) -> list[int]:
        raise ValueError("freed")


class _GetattrRaises:
    def __getattr__(self, name: str) -> Any:
        raise KeyError(name)  # not an AttributeError: hasattr() lets it through


class _ClassRaises:
    @property  # type: ignore[misc]
    def __class__(self) -> Any:  # isinstance() reads it
        raise RuntimeError("no class")


class _Referent:
    pass


def _dead_proxy() -> Any:
    proxy = weakref.proxy(_Referent())  # the referent dies at once
    with pytest.raises(ReferenceError):
        str(proxy)
    return proxy


@pytest.mark.parametrize("make", [_dead_proxy, _ShapeRaises, _GetattrRaises, _ClassRaises],
                         ids=["dead_weakref_proxy", "shape_property_raises", "getattr_raises",
                              "class_property_raises"])
def test_an_object_that_raises_when_read_never_reaches_the_caller_on_any_entry_point(
        tmp_path: Path, monkeypatch: Any, make: Callable[[], Any]) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    value = make()
    _record_everywhere(lambda: value)  # raises nothing
    for bad_key in (value, [value], {"k": value}):
        with rltrace.trace_scope("keys") as span:
            span.set_attribute(bad_key, 1)  # type: ignore[arg-type]  # a key that is no string
            span.add_event(value, {"a": 1})  # type: ignore[arg-type]
            span.add_event("attrs", value)  # type: ignore[arg-type]  # attributes that are no mapping
            span.set_attributes(value)
            span.set_attributes({"set_attributes": value})
    with rltrace.trace_scope("category", category=value):  # type: ignore[arg-type]
        rltrace.instant("category", category=value)  # type: ignore[arg-type]
    diag = rltrace.diagnostics()
    rltrace.shutdown()
    assert _written(path) == dict.fromkeys(ENTRIES, _marker(value))
    names = [e["name"] for e in _events(path) if e["ph"] in ("X", "i")]
    assert names.count("keys") == 3 and names.count("category") == 2 and _marker(value) in names
    assert diag["errors"] == 0 and diag["ChromeTraceExporter"]["unencodable"] == 0


def test_a_recorded_container_is_a_copy_mutated_after_recording_it_is_written_as_recorded(
        tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    made: list[Any] = []

    def make() -> Any:
        value = {"list": [1, 2], "nested": {"d": [3, {"e": [4]}]}, "tuple": (5, [6]), "set": {7}}
        made.append(value)
        return value

    lists: list[list[int]] = []

    def make_list() -> list[int]:
        lists.append([1, 2])
        return lists[-1]

    _record_everywhere(make)
    for value in made:  # mutated after recording, before anything was exported
        value["list"].append(99)
        value["nested"]["d"][1]["e"][0] = 99
        value["tuple"][1].append(99)
        value["set"].add(99)
        value["new"] = 99
    rltrace.shutdown()
    expected = {"list": [1, 2], "nested": {"d": [3, {"e": [4]}]}, "tuple": [5, [6]], "set": "{7}"}
    assert _written(path) == dict.fromkeys(ENTRIES, expected)

    path = _configure(tmp_path / "lists")
    _record_everywhere(make_list)  # a plain list at the top: the common case
    for lst in lists:
        lst.append(99)
    rltrace.shutdown()
    assert _written(path) == {key: [1, 2] for key in ENTRIES}


def test_a_cpu_tensor_is_read_where_it_is_recorded_changed_in_place_later_it_is_written_as_recorded(
        tmp_path: Path, monkeypatch: Any) -> None:
    torch = need("torch", "tensor args cannot be tested")
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    tensors: list[Any] = []

    def make() -> Any:
        tensors.append(torch.tensor([1.5, 2.5]))
        return tensors[-1]

    _record_everywhere(make)
    for t in tensors:
        t.add_(10)
    rltrace.shutdown()
    assert _written(path) == {key: [1.5, 2.5] for key in ENTRIES}


def test_a_tensor_subclass_is_recorded_by_its_marker_its_overrides_never_run(
        tmp_path: Path, monkeypatch: Any) -> None:
    torch = need("torch", "tensor args cannot be tested")
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    calls: list[str] = []

    class Watched(torch.Tensor):  # type: ignore[misc]
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            calls.append(getattr(func, "__name__", "?"))
            return super().__torch_function__(func, types, args, kwargs or {})

    value = torch.ones(2).as_subclass(Watched)
    calls.clear()
    _record_everywhere(lambda: value)
    rltrace.shutdown()
    assert _written(path) == dict.fromkeys(ENTRIES, _marker(value))
    assert calls == []


@pytest.mark.skipif("not __import__('importlib').util.find_spec('torch') or "
                    "not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_a_cuda_tensor_is_copied_without_waiting_on_the_callers_thread_and_written_as_numbers(
        tmp_path: Path, monkeypatch: Any) -> None:
    import torch
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    tensors: list[Any] = []

    def make() -> Any:
        tensors.append(torch.tensor([1.5, 2.5], device="cuda"))
        return tensors[-1]

    _record_everywhere(make)
    for t in tensors:
        t.add_(10)  # queued after the copy: the copy holds the values as recorded
    big = torch.zeros(64, 64, device="cuda")
    with rltrace.trace_scope("big", args={"big": big}):
        pass
    rltrace.shutdown()
    assert _written(path) == {key: [1.5, 2.5] for key in ENTRIES}
    summary = next(e for e in _events(path) if e["name"] == "big")["args"]["big"]
    assert summary == "Tensor(shape=(64, 64), dtype=torch.float32, device='cuda:0')"


@pytest.mark.skipif("not __import__('importlib').util.find_spec('torch') or "
                    "not __import__('torch').cuda.is_available()", reason="needs a CUDA device")
def test_recording_a_cuda_tensor_behind_queued_work_never_waits_for_the_device() -> None:
    """The caller only queues the copy: right after recording, the copy is still behind the
    queued work (the device has not run it); the exporter waits a bounded time, then writes the
    summary; once the device caught up the numbers are read."""
    import torch

    from rltrace.recording.user_values import DeviceValue, ValueKinds, recorded

    torch.cuda.synchronize()
    torch.cuda._sleep(4_000_000_000)  # about two seconds of device time, queued
    value = torch.ones(2, device="cuda")
    kinds = ValueKinds()
    held = recorded({"v": value}, kinds)["v"]
    assert type(held) is DeviceValue
    assert held._ready is not None and not held._ready()  # the caller did not wait for the device
    assert held.resolve() == "Tensor(shape=(2,), dtype=torch.float32, device='cuda:0')"
    torch.cuda.synchronize()
    again = recorded({"v": value}, kinds)["v"]
    assert type(again) is DeviceValue and again.resolve() == [1.0, 1.0]


def test_values_of_ever_new_types_hold_a_bounded_memo_and_are_each_recorded_as_their_kind() -> None:
    """A loop that records an object of a class made afresh each step (a closure's class, a
    dataclass per call) must not grow the type -> kind memo without end."""
    from rltrace.recording.user_values import _MAX_KINDS, ValueKinds, recorded

    kinds = ValueKinds()
    for i in range(_MAX_KINDS + 10):
        fresh = type(f"Step{i}", (), {})
        number = type(f"Loss{i}", (float,), {})
        got = recorded({"obj": fresh(), "loss": number(0.5), "lens": [1, (2, 3)]}, kinds)
        assert got["obj"].startswith(f"<{__name__}.Step{i} object at 0x")
        assert type(got["loss"]) is float and got["loss"] == 0.5
        assert got["lens"] == [1, (2, 3)]
        assert len(kinds) <= _MAX_KINDS


def test_a_raising_str_becomes_a_marker_for_that_value_alone(tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    sid = rltrace.register_session()
    obj = _Raising()
    with rltrace.trace_scope("raising", args={"obj": obj, "ok": 1}) as span:
        span.set_attribute("attr", obj)
    with rltrace.trace_session_phase("generate", session_id=sid, start_payload={"obj": obj}):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.shutdown()
    events = {e["name"]: e for e in _events(path) if e["ph"] == "X"}
    assert events["raising"]["args"]["obj"] == _marker(obj)
    assert events["raising"]["args"]["ok"] == 1
    assert events["raising"]["args"]["attr"] == _marker(obj)
    assert events["generate"]["args"]["rl.start.obj"] == _marker(obj)


def test_user_str_never_runs_neither_where_the_value_is_recorded_nor_on_the_exporter(
        tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    _WhereStr.threads.clear()
    values = [_WhereStr() for _ in range(3)]
    _record_everywhere(lambda: {"w": values[0], "deep": {"w": [values[1]]}, "key": {values[2]: 1}})
    rltrace.shutdown()
    assert _WhereStr.threads == []
    expected = {"w": _marker(values[0]), "deep": {"w": [_marker(values[1])]},
                "key": {_marker(values[2]): 1}}
    assert _written(path) == dict.fromkeys(ENTRIES, expected)


class _BadMessage(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def test_an_exception_whose_str_raises_leaves_the_scope_as_itself_and_is_recorded(
        tmp_path: Path, monkeypatch: Any) -> None:
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    with pytest.raises(_BadMessage):
        with rltrace.trace_scope("failing"):
            raise _BadMessage
    rltrace.shutdown()
    assert [e["name"] for e in _events(path) if e["ph"] == "X"] == ["failing"]


def test_a_jax_array_is_written_as_numbers_once_computed_a_big_one_as_its_summary(
        tmp_path: Path, monkeypatch: Any) -> None:
    jnp = need("jax.numpy", "JAX array args cannot be tested")
    clean_env(monkeypatch)
    path = _configure(tmp_path)
    _record_everywhere(lambda: jnp.arange(3))
    with rltrace.trace_scope("big", args={"big": jnp.zeros((64, 64))}):
        pass
    rltrace.shutdown()
    assert _written(path) == {key: [0, 1, 2] for key in ENTRIES}
    summary = next(e for e in _events(path) if e["name"] == "big")["args"]["big"]
    assert summary == "ArrayImpl(shape=(64, 64), dtype=float32)"


def _run_loop(tmp_path: Path, sessions: int, queue: int) -> list[dict[str, Any]]:
    """The hanging-value loop in a child process, with its own deadline (a regression must fail
    this test, never hang the suite)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    try:
        proc = subprocess.run([sys.executable, str(HELPERS / "hostile_value_loop.py"), str(tmp_path),
                               str(sessions), str(queue)], capture_output=True, text=True,
                              timeout=120, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"the loop did not finish in 120 s (hung on a value?); its output: {out!r}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _written_files(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    chrome = next(tmp_path.rglob("traces-r0.jsonl"))
    sessions = next(tmp_path.rglob("sessions-r0.jsonl"))
    return _events(chrome), _events(sessions)


def test_a_never_returning_str_on_an_array_like_value_leaves_flush_bounded_and_the_loop_running(
        tmp_path: Path) -> None:
    lines = _run_loop(tmp_path, sessions=200, queue=262_144)
    assert lines[0] == {"loop_done": 200}
    assert lines[1]["flushed"] is True and lines[1]["diagnostics_errors"] == 0
    events, sessions = _written_files(tmp_path)  # written by flush() and the exit flush
    steps = [e for e in events if e["name"] == "step"]
    assert len(steps) == 200 and all(e["args"]["h"].startswith("<__main__.HangsWhenRead object at ")
                                     for e in steps)
    assert steps[0]["args"]["h2"] == steps[0]["args"]["h"] == steps[0]["cat"]
    assert len(sessions) == 200


def test_many_sessions_with_never_returning_values_under_backpressure_keep_the_loop_running(
        tmp_path: Path) -> None:
    """A small queue, so that an exporter stuck on a value would fill it within the run and
    backpressure would then stop the loop (the reported freeze came at the default queue's
    262,144 records)."""
    lines = _run_loop(tmp_path, sessions=3_000, queue=256)
    assert lines[0] == {"loop_done": 3_000}
    assert lines[1]["flushed"] is True and lines[1]["diagnostics_errors"] == 0
    events, sessions = _written_files(tmp_path)
    assert len(sessions) + sum(1 for e in events if e["name"] == "step") > 256  # export kept going


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
