"""User record processors (``rltrace.add_record_processor``): every finished rltrace record,
on the exporter thread, before any ``ReadableSpan`` is built.

A record's ``record_attrs()`` gives its attributes (task, session and phase records build their
``rl.*`` attributes there, off the hot path) and ``rltrace.steps.step_of`` its training step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rltrace
from rltrace.steps import step_of


class Collect:
    """A record processor keeping what it saw (name, attributes, step)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any], Any]] = []
        self.flushes = 0

    def on_record(self, rec: Any) -> None:
        self.seen.append((rec.name, dict(rec.record_attrs() or {}), step_of(rec)))

    def force_flush(self) -> None:
        self.flushes += 1

    def by_name(self, name: str) -> list[dict[str, Any]]:
        return [attrs for n, attrs, _ in self.seen if n == name]


def test_record_processor_sees_scopes_tasks_sessions_and_phases_with_attributes_and_steps(
    tmp_path: Path,
) -> None:
    proc = Collect()
    rltrace.add_record_processor(proc)
    try:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                          session_tracer={"enabled": True})
        with rltrace.step(3):
            with rltrace.trace_scope("train.forward") as span:
                span.set_attribute("user.key", 1)
            task = rltrace.register_task()
            sid = rltrace.register_session(task)
        with rltrace.trace_session_phase("generate", {"model": "m"}, session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="rejected",
                                    reason="stale")
        rltrace.flush()
        flushes = proc.flushes
    finally:
        rltrace.remove_record_processor(proc)
    assert flushes >= 1
    (fwd,) = proc.by_name("train.forward")
    assert fwd["user.key"] == 1
    assert proc.by_name("train.step") == [{"rl.step": 3}]  # the step's own span
    (task_attrs,) = proc.by_name("rl.task")
    assert task_attrs == {"rl.task.id": task, "rl.step": 3}
    (sess,) = proc.by_name("rl.session")
    assert (sess["rl.session.id"], sess["rl.task.id"], sess["rl.session.status"],
            sess["rl.session.reason"], sess["rl.step"]) == (sid, task, "rejected", "stale", 3)
    (gen,) = proc.by_name("generate")
    assert (gen["rl.phase"], gen["rl.session.id"], gen["rl.task.id"], gen["rl.start.model"],
            gen["gen_ai.request.model"]) == ("generate", sid, task, "m", "m")
    steps = {name: step for name, _, step in proc.seen}
    assert steps == {"train.step": 3, "train.forward": 3, "rl.task": 3, "rl.session": 3,
                     "generate": 3}  # the phase inherits the step through its session


def test_a_record_processor_is_kept_across_reconfigure_and_stops_when_removed(tmp_path: Path) -> None:
    proc = Collect()
    rltrace.add_record_processor(proc)
    try:
        for i in range(2):
            rltrace.configure(fileroot=str(tmp_path / str(i)), flush_at_exit=False)
            with rltrace.trace_scope(f"run{i}"):
                pass
            rltrace.flush()
    finally:
        rltrace.remove_record_processor(proc)
    with rltrace.trace_scope("after.removal"):
        pass
    rltrace.flush()
    assert [name for name, _, _ in proc.seen] == ["run0", "run1"]


class Failing(Collect):
    """A record processor that raises for records named ``bad*``."""

    def on_record(self, rec: Any) -> None:
        if rec.name.startswith("bad"):
            raise RuntimeError(f"cannot take {rec.name}")
        super().on_record(rec)


def _record_through(tmp_path: Path, procs: tuple[Any, ...], names: list[str],
                    **config: Any) -> dict[str, Any]:
    """Record one empty scope per name with ``procs`` added, flush, and return the diagnostics."""
    for proc in procs:
        rltrace.add_record_processor(proc)
    try:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, **config)
        for name in names:
            with rltrace.trace_scope(name):
                pass
        rltrace.flush()
        rltrace.flush()  # a cycle with nothing queued: no processor is handed it
        return rltrace.diagnostics()
    finally:
        for proc in procs:
            rltrace.remove_record_processor(proc)


def _assert_only_exported(tmp_path: Path, names: list[str], good: list[str]) -> None:
    (trace,) = tmp_path.rglob("traces-r0.jsonl")
    text = trace.read_text()
    assert all(f'"name":"{n}"' in text for n in good)
    assert not any(f'"name":"{n}"' in text for n in names if n not in good)


def test_a_record_a_processor_fails_on_is_counted_and_not_exported_and_the_rest_are(
        tmp_path: Path) -> None:
    """A processor raising for a record: the error is counted, that record is not exported (no
    processor or exporter sees half of it), every other record of the same cycle is; the loop
    that recorded them never sees the error."""
    first, failing, last = Collect(), Failing(), Collect()
    names = [f"bad{i}" if i % 3 == 0 else f"good{i}" for i in range(30)]
    diag = _record_through(tmp_path, (first, failing, last), names)
    good = [n for n in names if n.startswith("good")]
    assert diag["errors"] == len(names) - len(good) == 10
    assert [n for n, _, _ in first.seen] == names  # it ran before the failing one
    assert [n for n, _, _ in failing.seen] == good
    assert [n for n, _, _ in last.seen] == good  # the rest of the chain is skipped for bad ones
    _assert_only_exported(tmp_path, names, good)


class Batched(Collect):
    """A record processor taking each export cycle whole (``on_records``); it fails on ``bad*``."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def on_record(self, rec: Any) -> None:  # pragma: no cover - on_records is used instead
        raise AssertionError("on_record called although on_records exists")

    def on_records(self, records: list[Any], on_error: Any) -> None:
        self.batches.append(len(records))
        for rec in records:
            if rec.name.startswith("bad"):
                on_error(rec, RuntimeError(f"cannot take {rec.name}"))
            else:
                super().on_record(rec)


def test_a_record_processor_with_on_records_takes_each_cycle_whole_and_reports_failures(
        tmp_path: Path) -> None:
    """``on_records(records, on_error)``: one call per export cycle with its records in order
    (none for a cycle with nothing queued); a record reported through ``on_error`` is counted
    and not exported, as one ``on_record`` raised for."""
    batched, last = Batched(), Collect()
    names = [f"bad{i}" if i % 4 == 0 else f"good{i}" for i in range(20)]
    # no timed cycle in between: the explicit flush is the one cycle
    diag = _record_through(tmp_path, (batched, last), names, flush_interval_s=3600)
    good = [n for n in names if n.startswith("good")]
    assert batched.batches == [len(names)]
    assert [n for n, _, _ in batched.seen] == good
    assert [n for n, _, _ in last.seen] == good
    assert diag["errors"] == len(names) - len(good) == 5
    _assert_only_exported(tmp_path, names, good)


class _Hooks:
    """A user's processor with every optional hook, counting the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_record(self, rec: Any) -> None:
        self.calls.append("record")

    def shutdown(self) -> None:
        self.calls.append("shutdown")

    def reset_after_fork(self) -> None:
        self.calls.append("reset")


def test_a_users_processor_gets_the_whole_contract_and_is_found_by_its_own_object() -> None:
    """Only ``on_record`` is required: the hooks it lacks do nothing, those it has are called,
    and the pipeline's wrapped entry compares equal to the user's object (so removal finds it)."""
    from rltrace.seams import RecordProcessor, as_record_processor

    class OnlyRecord:
        def on_record(self, rec: Any) -> None:
            return None

    bare = as_record_processor(OnlyRecord())
    assert bare.force_flush() is True
    bare.shutdown()
    bare.reset_after_fork()
    hooks = _Hooks()
    wrapped = as_record_processor(hooks)
    wrapped.on_records([object(), object()], lambda rec, exc: None)
    wrapped.shutdown()
    wrapped.reset_after_fork()
    assert hooks.calls == ["record", "record", "shutdown", "reset"]
    assert wrapped == hooks and hooks in [wrapped]
    own = RecordProcessor()
    assert as_record_processor(own) is own


def test_pipeline_close_leaves_the_users_record_processor_running(tmp_path: Path) -> None:
    """A user's processor outlives the pipeline (it is kept across reconfiguration): closing
    the pipeline shuts down rltrace's own processors, never the user's."""
    hooks = _Hooks()
    rltrace.add_record_processor(hooks)
    try:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
        with rltrace.trace_scope("one"):
            pass
        rltrace.shutdown()
    finally:
        rltrace.remove_record_processor(hooks)
    assert hooks.calls == ["record"]
