"""State in instances: the recorder state, the session registry, the phase registry, the device
defaults and the pipeline belong to the runtime (``Runtime``, which owns ``RecorderState``,
``SessionRegistry``, ``PhaseRegistry`` and the ``Pipeline``), and the module functions are bound to
the process's runtime and its registries.

Tests here build their own registries instead of patching module globals, and check that what
``configure`` sets lives on the instances it made (a test that patched a module global would not
see the instance's state, and vice versa).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import rltrace
from rltrace import device, runtime
from rltrace.recording.recorder import STATE, Scope
from rltrace.sessions import SessionRegistry
from rltrace.sessions.phases import PhaseRegistry, UnknownPhaseError
from rltrace.testing import capture_spans, read_jsonl


def _records(cap: Any) -> dict[Any, dict[str, Any]]:
    rltrace.flush()
    files = sorted((cap.log_dir / "session_tracer").glob("sessions-*.jsonl"))
    return {r["session_id"]: r for f in files for r in read_jsonl(f)}


def test_module_functions_are_bound_to_the_process_instances() -> None:
    assert rltrace.register_session.__self__ is runtime.RUNTIME.sessions  # type: ignore[attr-defined]
    assert rltrace.trace_session_phase.__self__ is runtime.RUNTIME.sessions  # type: ignore[attr-defined]
    assert rltrace.configure.__self__ is runtime.RUNTIME  # type: ignore[attr-defined]
    assert rltrace.flush.__self__ is runtime.RUNTIME  # type: ignore[attr-defined]
    assert rltrace.register_phase.__self__ is runtime.RUNTIME.phases  # type: ignore[attr-defined]
    assert runtime.RUNTIME.sessions.phases is runtime.RUNTIME.phases
    assert runtime.RUNTIME.state is STATE  # the one state the hot path reads


def test_a_runtime_of_its_own_owns_a_state_and_registries_of_its_own() -> None:
    mine = runtime.Runtime()
    assert mine.state is not STATE and mine.sessions is not runtime.RUNTIME.sessions
    assert mine.phases is mine.sessions.phases and mine.phases is not runtime.RUNTIME.phases
    assert mine.pipeline is None and mine.diagnostics() == {"queued": 0, "dropped": 0}


def test_the_value_kinds_the_hot_path_learns_are_its_runtimes_own_and_outlive_a_reconfigure(
        tmp_path: Path) -> None:
    class Reading:  # a type no runtime has classified yet
        pass

    mine = runtime.Runtime()
    assert mine.state.kinds is not STATE.kinds
    with capture_spans(tmp_path) as cap:
        value = Reading()
        with rltrace.trace_scope("step", args={"r": value}):
            pass
        assert cap.one("step").attributes["args.r"] == f"<{Reading.__module__}.{Reading.__qualname__} " \
                                                      f"object at {id(value):#x}>"
        assert Reading in STATE.kinds and Reading not in mine.state.kinds
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
        assert Reading in STATE.kinds  # a type's kind does not change with the config


def test_configure_switches_the_instances_it_owns_and_shutdown_switches_them_off(tmp_path: Path) -> None:
    tracing = runtime.RUNTIME
    with capture_spans(tmp_path, session_tracer={"enabled": True},
                       device={"annotate": False, "sync_categories": ["comm"]}):
        p = tracing.pipeline
        assert p is not None and rltrace.runtime.get_pipeline() is p
        assert tracing.config is rltrace.get_config()
        assert tracing.sessions.enabled is True
        assert p.registry is tracing.sessions
        # the device defaults are the pipeline's, put in force for the hot path
        assert STATE.device is p.device_defaults
        assert p.device_defaults is not None and p.device_defaults.sync == frozenset({"comm"})
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                          session_tracer={"enabled": False})
        assert tracing.pipeline is not p and tracing.sessions.enabled is False
        assert STATE.device is None  # the new config asks for no device options
    assert tracing.pipeline is None and STATE.device is None and STATE.enabled is False


def test_a_registry_of_its_own_records_through_the_pipeline_and_keeps_its_own_state(
        tmp_path: Path) -> None:
    phases = PhaseRegistry()
    phases.register("judge", category="compute")
    reg = SessionRegistry(phases=phases)
    reg.offset_ids(1)  # its ids apart from the process registry's (each counts on its own)
    assert reg.phases is phases and reg.enabled is False
    # off: ids are still handed out, nothing is registered
    sid0 = reg.register_session()
    assert reg.open_counts() == {"open_tasks": 0, "open_sessions": 0}
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        reg.enabled = True
        before = dict(runtime.RUNTIME.sessions.misuse)
        tid = reg.register_task()
        sid = reg.register_session(tid)
        assert sid != sid0
        assert reg.open_counts() == {"open_tasks": 1, "open_sessions": 1}
        assert runtime.RUNTIME.sessions.session(sid) is None  # the process's registry knows nothing
        with reg.trace_session_phase("judge", session_id=sid):
            pass
        # "judge" is this registry's phase only
        with pytest.raises(UnknownPhaseError):
            rltrace.trace_session_phase("judge", session_id=sid)
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        misused = runtime.RUNTIME.sessions.misuse.get("unknown_session", 0)
        assert misused == before.get("unknown_session", 0) + 1
        reg.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        reg.trace_session_event("mark_finalized", session_id=sid, status="accepted")  # again
        assert reg.misuse == {"unknown_session": 1}
        assert reg.open_counts() == {"open_tasks": 0, "open_sessions": 0}
        recs = _records(cap)
        reg.enabled = False
    assert recs[sid]["status"] == "accepted" and recs[sid]["task_id"] == tid
    assert list(recs[sid]["phases"]) == ["judge"]


def test_close_all_finalizes_only_its_own_registry(tmp_path: Path) -> None:
    reg = SessionRegistry()
    reg.offset_ids(1)
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        reg.enabled = True
        mine = reg.register_session()
        theirs = rltrace.register_session()
        assert reg.close_all(reason="test") == 1
        assert runtime.RUNTIME.sessions.session(theirs) is not None
        rltrace.trace_session_event("mark_finalized", session_id=theirs, status="rejected")
        recs = _records(cap)
        reg.enabled = False
    assert (recs[mine]["status"], recs[theirs]["status"]) == ("pending", "rejected")


def test_device_defaults_come_from_the_config_and_none_when_it_asks_for_none() -> None:
    cfg = rltrace.TracerConfig()
    assert device.DeviceDefaults.of(cfg.device) is None
    d = device.DeviceDefaults.of(rltrace.DeviceConfig(timing_categories=["compute"]))
    assert d is not None and d.timing == frozenset({"compute"}) and not d.sync and not d.annotate


def test_without_device_defaults_a_scope_is_a_plain_scope(tmp_path: Path) -> None:
    with capture_spans(tmp_path):
        assert STATE.device is None
        assert type(rltrace.trace_scope("plain", "comm")) is Scope
    with capture_spans(tmp_path, device={"annotate": True}):
        scope = rltrace.trace_scope("annotated", "comm")
        assert type(scope) is device.DeviceScope and scope.annotate  # the config's default
