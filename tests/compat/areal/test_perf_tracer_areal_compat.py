"""``rltrace.perf_tracer`` as a drop-in for AReaL's ``perf_tracer``: behaviours of AReaL's own unit
tests (``tests/test_perf_tracer.py`` in inclusionAI/AReaL), re-written against rltrace.

Real components only: rltrace's pipeline writing real files, the real ``torch.profiler``,
OmegaConf, a YAML file, real subprocesses for two roles of one rank.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import areal_wheel  # tests/helpers/, on sys.path by conftest
import pytest
from conftest import REPO, need

import rltrace
from rltrace import perf_tracer
from rltrace.cli.convert import convert
from rltrace.perf_tracer import Category, SessionTraceEvent


# AReaL's config classes have this shape (api/cli_args.py); the wheel's own are used when present
@dataclass
class SessionTracerConfig:
    enabled: bool = False
    flush_threshold: int = 256


@dataclass
class PerfTracerConfig:
    experiment_name: str = "???"
    trial_name: str = "???"
    fileroot: str = "???"
    enabled: bool = False
    save_interval: int = 1
    profile_steps: list[int] | None = None
    session_tracer: SessionTracerConfig | None = None


def _config(root: Path, **kw: Any) -> PerfTracerConfig:
    kw.setdefault("enabled", True)
    return PerfTracerConfig(experiment_name=kw.pop("experiment", "exp"), trial_name=kw.pop("trial", "t"),
                            fileroot=str(root), **kw)


def _log_dir(root: Path, experiment: str = "exp", trial: str = "t") -> Path:
    return root / "logs" / getpass.getuser() / experiment / trial


def _trace_path(root: Path, rank: int = 0, role: str | None = None, **kw: str) -> Path:
    base = _log_dir(root, **kw) / "perf_tracer"
    return (base / role if role else base) / f"traces-r{rank}.jsonl"


def _session_path(root: Path, rank: int = 0, role: str | None = None, **kw: str) -> Path:
    base = _log_dir(root, **kw) / "session_tracer"
    return (base / role if role else base) / f"sessions-r{rank}.jsonl"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _names(path: Path) -> set[str]:
    return {e["name"] for e in _lines(path) if e["ph"] != "M"} if path.exists() else set()


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    perf_tracer.reset()
    yield
    perf_tracer.reset()
    perf_tracer.set_session_id(None)  # tests that set them run in the test's own context
    perf_tracer.set_task_id(None)


# ---- public surface ---------------------------------------------------------------------------------

AREAL_ALL = ["PerfTracer", "SessionTracer", "PerfTraceCategory", "Category", "SessionTraceEvent",
             "trace_session_event", "trace_session_phase", "atrace_session_phase", "trace_perf",
             "trace_session", "session_context", "set_session_id", "get_session_id", "set_task_id",
             "get_task_id", "register_task", "register_session", "GLOBAL_TRACER", "get_tracer",
             "get_session_tracer", "configure", "reset", "trace_scope", "atrace_scope", "instant",
             "save"]
AREAL_DATA = ["PhaseSpan", "PhaseSpec", "EventBinding", "FieldSpec", "SessionRecord", "is_configured"]


def test_every_public_name_of_areals_module_exists() -> None:
    names = list(AREAL_ALL)
    if areal_wheel.skip_reason() is None:
        with areal_wheel.areal_modules() as m:
            names = list(m.perf_tracer.__all__)
            assert set(AREAL_ALL) <= set(names)
    for name in [*names, *AREAL_DATA]:
        assert hasattr(perf_tracer, name), name
    assert [c.value for c in Category] == ["compute", "comm", "io", "sync", "scheduler", "instr",
                                           "misc"]
    assert perf_tracer.PerfTraceCategory is Category
    assert {e.value for e in SessionTraceEvent} == {
        "finalized", "generate_start", "generate_end", "reward_start", "reward_end",
        "toolcall_start", "toolcall_end"}


def test_profiler_is_torch_profiler_as_in_areals_module() -> None:
    torch_profiler = need("torch.profiler", "AReaL's module exposes torch.profiler as ``profiler``")
    assert perf_tracer.profiler is torch_profiler


def test_areal_data_structures_have_the_fields_areal_users_read(tmp_path: Path) -> None:
    def fields(cls: type) -> list[str]:
        return list(cls.__dataclass_fields__)

    assert fields(perf_tracer.PhaseSpan) == ["start_ts", "end_ts"]
    assert fields(perf_tracer.PhaseSpec)[:3] == ["name", "start_event", "end_event"]
    assert [p.name for p in perf_tracer.SessionRecord.PHASE_CONFIGS] == ["generate", "reward",
                                                                         "toolcall"]
    perf_tracer.configure(_config(tmp_path, session_tracer=SessionTracerConfig(True, 1)), rank=0,
                          role="actor")
    st = perf_tracer.get_session_tracer()
    sid = st.register_session(7)
    st.record_event(sid, SessionTraceEvent.GENERATE_START)
    st.record_event(sid, SessionTraceEvent.GENERATE_END)
    st.record_event(sid, SessionTraceEvent.FINALIZED, status="accepted")
    perf_tracer.reset()
    (line,) = _lines(_session_path(tmp_path, role="actor"))
    rec = perf_tracer.SessionRecord.from_dict(line)
    assert (rec.task_id, rec.session_id, rec.rank, rec.role, rec.status) == (7, sid, 0, "actor",
                                                                              "accepted")
    assert len(rec.phases["generate"]) == 1 and rec.is_ready_to_flush()
    assert "trace_id" in rec.extra
    assert list(rec.to_dict())[:5] == ["task_id", "session_id", "rank", "role", "status"]


# ---- configure / reset ---------------------------------------------------------------------------


def test_configure_returns_the_tracer_and_a_second_configure_without_reset_raises(tmp_path: Path) -> None:
    tracer = perf_tracer.configure(_config(tmp_path), rank=0)
    assert isinstance(tracer, perf_tracer.PerfTracer)
    assert perf_tracer.get_tracer() is tracer and perf_tracer.GLOBAL_TRACER is tracer
    with pytest.raises(RuntimeError, match="reset"):
        perf_tracer.configure(_config(tmp_path), rank=1)
    with tracer.trace_scope("unit-block", category=Category.INSTR, args={"step": 1}):
        tracer.instant("inner-mark", args={"value": 42})
    tracer.instant("outer-mark")
    tracer.save()
    assert {"unit-block", "inner-mark", "outer-mark"} <= _names(_trace_path(tmp_path))


def test_reset_writes_unsaved_events_then_allows_configure_again(tmp_path: Path) -> None:
    perf_tracer.configure(_config(tmp_path, save_interval=100), rank=0)
    perf_tracer.instant("unsaved")
    perf_tracer.reset()  # AReaL drops unsaved events here; rltrace writes them
    assert "unsaved" in _names(_trace_path(tmp_path))
    assert not perf_tracer.is_configured() and perf_tracer.GLOBAL_TRACER is None
    with pytest.raises(RuntimeError, match="configure"):
        perf_tracer.get_tracer()
    assert perf_tracer.get_session_tracer() is None
    tracer = perf_tracer.configure(_config(tmp_path, trial="again"), rank=0)
    assert tracer.enabled


def test_rltrace_configure_keeps_reconfiguring_outside_the_areal_namespace(tmp_path: Path) -> None:
    perf_tracer.configure(_config(tmp_path), rank=0)
    rltrace.configure(_config(tmp_path, trial="second"), rank=0, flush_at_exit=False)
    rltrace.configure(_config(tmp_path, trial="third"), rank=0, flush_at_exit=False)
    assert perf_tracer.get_tracer()._output_path.endswith("third/perf_tracer/traces-r0.jsonl")
    perf_tracer.configure(_config(tmp_path, trial="fourth"), rank=0)  # replaces rltrace's pipeline


def test_a_perf_tracer_built_directly_configures_the_process_pipeline(tmp_path: Path) -> None:
    tracer0 = perf_tracer.PerfTracer(_config(tmp_path), rank=0)
    with tracer0.trace_scope("rank0-step", args={"rank": 0}):
        pass
    tracer0.save()
    tracer1 = perf_tracer.PerfTracer(_config(tmp_path), rank=1)  # one pipeline per process
    tracer1.instant("rank1-mark")
    tracer1.save()
    assert _names(_trace_path(tmp_path, 0)) == {"rank0-step"}
    assert _names(_trace_path(tmp_path, 1)) == {"rank1-mark"}
    assert tracer1._rank == 1 and not tracer0.enabled and tracer1.enabled
    with pytest.raises(ValueError):
        perf_tracer.PerfTracer(_config(tmp_path), rank=-1)


# ---- configs ----------------------------------------------------------------------------------


def _areal_config_classes() -> tuple[type, type]:
    if areal_wheel.skip_reason() is None:
        with areal_wheel.areal_modules() as m:
            return m.cli_args.PerfTracerConfig, m.cli_args.SessionTracerConfig
    return PerfTracerConfig, SessionTracerConfig


def test_areal_config_dataclass_with_session_tracer_none_traces_spans_only(tmp_path: Path) -> None:
    PTC, _ = _areal_config_classes()
    cfg = PTC(experiment_name="exp", trial_name="t", fileroot=str(tmp_path), enabled=True)
    assert cfg.session_tracer is None
    tracer = perf_tracer.configure(cfg, rank=0)
    assert tracer.session_tracer is None and perf_tracer.get_session_tracer() is None
    with perf_tracer.trace_scope("s"):
        pass
    perf_tracer.save()
    assert _names(_trace_path(tmp_path)) == {"s"}


def test_areal_config_dataclass_with_session_tracer_writes_session_records(tmp_path: Path) -> None:
    PTC, STC = _areal_config_classes()
    cfg = PTC(experiment_name="exp", trial_name="t", fileroot=str(tmp_path), enabled=True,
              save_interval=2, profile_steps=[1],
              session_tracer=STC(enabled=True, flush_threshold=1))
    perf_tracer.configure(cfg, rank=2, role="critic")
    effective = rltrace.get_config()
    assert (effective.save_interval, effective.profile_steps, effective.session_tracer.flush_threshold) \
        == (2, [1], 1)
    st = perf_tracer.get_session_tracer()
    assert st._role == "critic" and st._rank == 2
    st.register_task(456)
    sid = st.register_session(456)
    assert st.get_session_ids(456) == [sid]
    st.record_event(sid, SessionTraceEvent.GENERATE_START)
    st.record_event(sid, SessionTraceEvent.GENERATE_END)
    st.record_event(sid, SessionTraceEvent.FINALIZED, status="accepted")
    perf_tracer.get_tracer().save(force=True)
    (rec,) = _lines(_session_path(tmp_path, rank=2, role="critic"))
    assert rec["status"] == "accepted" and rec["role"] == "critic" and rec["rank"] == 2
    assert list(rec)[:4] == ["task_id", "session_id", "rank", "role"]


def test_omegaconf_dictconfig_is_accepted(tmp_path: Path) -> None:
    omegaconf = need("omegaconf", "pip install omegaconf (the dev extra)")
    root = omegaconf.OmegaConf.create({"experiment_name": "exp", "trial_name": "t",
                                       "cluster": {"fileroot": str(tmp_path)}})
    section = omegaconf.OmegaConf.create({
        "perf_tracer": {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}",
                        "fileroot": "${cluster.fileroot}", "enabled": True, "save_interval": 1,
                        "profile_steps": [3, 4], "session_tracer": {"enabled": True,
                                                                    "flush_threshold": 100}}})
    cfg = omegaconf.OmegaConf.merge(root, section)
    structured = omegaconf.OmegaConf.structured(_config(tmp_path, session_tracer=None))
    perf_tracer.configure(structured, rank=0)
    assert rltrace.get_config().session_tracer.enabled is False
    perf_tracer.reset()
    perf_tracer.configure(cfg.perf_tracer, rank=0)
    effective = rltrace.get_config()
    assert effective.fileroot == str(tmp_path) and effective.profile_steps == [3, 4]
    assert effective.session_tracer.enabled is True


def test_the_yaml_section_areal_writes_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k_grpo.yaml"
    path.write_text(f"""experiment_name: gsm8k-grpo
trial_name: trial0
cluster:
  fileroot: {tmp_path}
perf_tracer:
  experiment_name: ${{experiment_name}}
  trial_name: ${{trial_name}}
  fileroot: ${{cluster.fileroot}}
  enabled: true
  save_interval: 1
  profile_steps: null
  session_tracer:
    enabled: true
    flush_threshold: 100
""")
    perf_tracer.configure(str(path), rank=0)
    effective = rltrace.get_config()
    assert (effective.experiment_name, effective.trial_name) == ("gsm8k-grpo", "trial0")
    assert effective.session_tracer.enabled and effective.profile_steps is None
    path.write_text(path.read_text().replace("  session_tracer:\n    enabled: true\n    "
                                             "flush_threshold: 100\n", "  session_tracer: null\n"))
    perf_tracer.reset()
    perf_tracer.configure(str(path), rank=0)
    assert rltrace.get_config().session_tracer.enabled is False


# ---- save_interval ---------------------------------------------------------------------------------


def test_save_interval_writes_on_the_last_step_of_each_interval_as_areal(tmp_path: Path) -> None:
    tracer = perf_tracer.configure(_config(tmp_path, save_interval=3), rank=0,
                                   flush_interval_s=3600)
    path = _trace_path(tmp_path)
    written_at = []
    for step in range(9):
        tracer.instant(f"mark-{step}", args={"step": step})
        before = _names(path)
        tracer.save(step=step)
        if _names(path) != before:
            written_at.append(step)
    assert written_at == [2, 5, 8]
    tracer.instant("mark-9")
    tracer.save(step=9)
    assert "mark-9" not in _names(path)
    tracer.save(force=True)
    assert {f"mark-{i}" for i in range(10)} <= _names(path)


# ---- roles, ranks, process names -------------------------------------------------------------------

_ROLE_SCRIPT = """
import sys
from rltrace import perf_tracer
sys.path[:0] = ["tests/compat/areal", "tests", "tests/helpers"]  # the test module and what it imports
from test_perf_tracer_areal_compat import _config, SessionTracerConfig
root, role = sys.argv[1], sys.argv[2]
tracer = perf_tracer.configure(_config(__import__("pathlib").Path(root),
                               session_tracer=SessionTracerConfig(True, 1)), rank=0, role=role)
with perf_tracer.trace_scope(f"{role}-step", category="compute"):
    perf_tracer.instant(f"{role}-mark")
sid = perf_tracer.register_session(1)
perf_tracer.trace_session_event("mark_finalized", session_id=sid, status="accepted")
tracer.save(force=True)
"""


def test_two_processes_of_one_rank_with_different_roles_never_share_a_file(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _ROLE_SCRIPT, str(tmp_path), role], cwd=REPO)
             for role in ("actor", "rollout")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for role in ("actor", "rollout"):
        events = [e for e in _lines(_trace_path(tmp_path, role=role)) if e["ph"] != "M"]
        mine = {e["name"] for e in events if not e["name"].startswith("rl.")}
        assert mine == {f"{role}-step", f"{role}-mark"}
        assert all(e["args"]["role"] == role and e["args"]["rank"] == 0 for e in events)
        (rec,) = _lines(_session_path(tmp_path, role=role))
        assert rec["role"] == role
        names = [e["args"]["name"] for e in _lines(_trace_path(tmp_path, role=role))
                 if e["name"] == "process_name"]
        assert len(names) == 1 and names[0].startswith(f"[{role}] Rank 0, Process ")
    out = tmp_path / "merged.json"
    res = convert([_log_dir(tmp_path)], out, progress=False)
    assert res.processes == 2
    merged = json.loads(out.read_text())["traceEvents"]
    pnames = sorted(e["args"]["name"].split(", Process")[0] for e in merged
                    if e["name"] == "process_name")
    assert pnames == ["[actor] Rank 0", "[rollout] Rank 0"]  # AReaL's converter names


def test_events_carry_rank_and_role_in_args_and_the_callers_args_win(tmp_path: Path) -> None:
    perf_tracer.configure(_config(tmp_path), rank=1, role="learner")
    args = {"phase": "enter"}
    with perf_tracer.trace_scope("role-step", category=Category.INSTR, args=args):
        perf_tracer.instant("role-inside", args={"task": "train"})
    perf_tracer.instant("own-rank", args={"rank": 9})
    perf_tracer.save()
    assert args == {"phase": "enter"}, "the caller's args were modified"
    events = {e["name"]: e for e in _lines(_trace_path(tmp_path, rank=1, role="learner"))
              if e["ph"] != "M"}
    assert events["role-step"]["args"] == {"phase": "enter", "rank": 1, "role": "learner"}
    assert events["role-inside"]["args"] == {"task": "train", "rank": 1, "role": "learner"}
    assert events["own-rank"]["args"] == {"rank": 9, "role": "learner"}
    assert events["role-step"]["cat"] == "instr"


def test_no_role_gives_areals_unbracketed_folders_and_bracketed_process_name(tmp_path: Path) -> None:
    perf_tracer.configure(_config(tmp_path), rank=0)
    perf_tracer.instant("m")
    perf_tracer.save()
    meta = [e for e in _lines(_trace_path(tmp_path)) if e["name"] == "process_name"]
    assert meta[0]["args"]["name"].startswith("[Rank 0, Process ")


def test_concurrent_async_scopes_overlap_and_each_keeps_its_args(tmp_path: Path) -> None:
    tracer = perf_tracer.configure(_config(tmp_path), rank=0)

    async def main() -> None:
        gate = asyncio.Event()
        await asyncio.gather(run("a", gate), run("b", gate))

    async def run(sid: str, gate: asyncio.Event) -> None:
        async with perf_tracer.atrace_scope("session", category=f"session.{sid}", args={"sid": sid}):
            with perf_tracer.trace_scope("rollout", args={"sid": sid}):
                if sid == "a":
                    await gate.wait()
                else:
                    gate.set()

    asyncio.run(main())
    tracer.save()
    xs = [e for e in _lines(_trace_path(tmp_path)) if e["ph"] == "X"]
    assert {(e["args"]["sid"], e["name"]) for e in xs} == {("a", "session"), ("a", "rollout"),
                                                           ("b", "session"), ("b", "rollout")}
    sa = next(e for e in xs if e["name"] == "session" and e["args"]["sid"] == "a")
    sb = next(e for e in xs if e["name"] == "session" and e["args"]["sid"] == "b")
    assert sb["ts"] < sa["ts"] + sa["dur"] and sa["tid"] != sb["tid"]  # overlap on own lanes


# ---- sessions: phases, counters -----------------------------------------------------------------


def _session_config(root: Path) -> PerfTracerConfig:
    return _config(root, session_tracer=SessionTracerConfig(enabled=True, flush_threshold=1))


def test_atrace_session_phase_records_phases_even_when_the_body_raises(tmp_path: Path) -> None:
    perf_tracer.configure(_session_config(tmp_path), rank=0)
    st = perf_tracer.get_session_tracer()
    st.register_task(345)
    sid = st.register_session(345)

    async def body() -> None:
        perf_tracer.set_session_id(sid)
        async with perf_tracer.atrace_session_phase("generate"):
            await asyncio.sleep(0)
        with pytest.raises(ValueError):
            async with perf_tracer.atrace_session_phase("reward"):
                raise ValueError("Simulated error")

    asyncio.run(body())
    st.record_event(sid, SessionTraceEvent.FINALIZED, status="failed")
    st.flush(force=True)
    (rec,) = _lines(_session_path(tmp_path))
    assert rec["status"] == "failed"
    for phase in ("generate", "reward"):
        (span,) = rec["phases"][phase]
        assert span["end_ts"] >= span["start_ts"] > 0
    assert rec["generate_s"] > 0 and rec["reward_s"] > 0


def test_increment_counter_by_session_by_task_and_from_context(tmp_path: Path) -> None:
    perf_tracer.configure(_session_config(tmp_path), rank=0)
    perf_tracer.register_task(1)
    a, b = perf_tracer.register_session(1), perf_tracer.register_session(1)
    perf_tracer.trace_session_event("increment_counter", session_id=a, name="tool_calls")
    perf_tracer.trace_session_event("increment_counter", session_id=a, name="tool_calls", value=2)
    perf_tracer.trace_session_event("increment_counter", task_id=1, name="group", value=5)
    perf_tracer.set_session_id(b)
    perf_tracer.trace_session_event("increment_counter", name="retries")
    perf_tracer.get_session_tracer().increment_counter(b, "retries")
    for sid in (a, b):
        perf_tracer.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    perf_tracer.trace_session_event("increment_counter", session_id=a, name="late")  # ignored
    perf_tracer.save(force=True)
    recs = {r["session_id"]: r for r in _lines(_session_path(tmp_path))}
    assert recs[a]["counters"] == {"tool_calls": 3, "group": 5}
    assert recs[b]["counters"] == {"group": 5, "retries": 2}
    assert list(recs[a]).index("counters") == list(recs[a]).index("phases") + 1  # AReaL's order
    assert rltrace.diagnostics()["misuse"]["unknown_session"] == 1
    with pytest.raises(ValueError, match="name"):
        perf_tracer.trace_session_event("increment_counter", session_id=a)


def test_unknown_session_event_and_phase_raise_a_clear_error(tmp_path: Path) -> None:
    perf_tracer.configure(_session_config(tmp_path), rank=0)
    sid = perf_tracer.register_session(1)
    with pytest.raises(ValueError, match="did you mean 'generate'"):
        perf_tracer.trace_session_event("mark_generat_start", session_id=sid)  # AReaL: silently nothing
    with pytest.raises(ValueError, match="register_phase"):
        perf_tracer.trace_session_phase("planning")


# ---- torch.profiler -------------------------------------------------------------------------------


def _profiles(root: Path) -> list[Path]:
    return sorted((_log_dir(root) / "torch_profiler").glob("*.json"))


def test_enable_profiler_runs_torch_profiler_only_on_profile_steps(tmp_path: Path) -> None:
    torch = need("torch")
    perf_tracer.configure(_config(tmp_path, profile_steps=[3]), rank=0)
    with perf_tracer.trace_scope("skip", enable_profiler=True, args={"global_step": 2}):
        torch.ones(4).sum()
    with perf_tracer.trace_scope("plain", args={"global_step": 3}):  # not requested
        torch.ones(4).sum()
    assert _profiles(tmp_path) == []
    with perf_tracer.trace_scope("hit", enable_profiler=True, args={"global_step": 3}):
        torch.ones(4).sum()
    assert [p.name for p in _profiles(tmp_path)] == ["step3-r0-hit.json"]


def test_profiler_trace_covers_the_scope_and_convert_merges_it_on_the_epoch_clock(tmp_path: Path) -> None:
    torch = need("torch")
    perf_tracer.configure(_config(tmp_path, profile_steps=[0]), rank=0, role="actor")
    with perf_tracer.trace_scope("train.step", enable_profiler=True,
                                 profiler_args={"record_shapes": True}, args={"global_step": 0}):
        a = torch.randn(200, 200)
        a @ a
    perf_tracer.reset()
    (path,) = _profiles(tmp_path)
    assert path.name == "actor-step0-r0-train.step.json"
    out = tmp_path / "merged.json"
    res = convert([_log_dir(tmp_path)], out, progress=False)
    assert path.resolve() in res.files
    events = json.loads(out.read_text())["traceEvents"]
    (scope,) = [e for e in events if e.get("name") == "train.step" and e["ph"] == "X"]
    (mm,) = [e for e in events if e.get("name") == "aten::mm"]
    assert "Input Dims" in mm["args"]  # profiler_args reached torch.profiler
    assert scope["ts"] <= mm["ts"] and mm["ts"] + mm["dur"] <= scope["ts"] + scope["dur"]
    assert any(e.get("name") == "process_name" and "torch.profiler" in e["args"]["name"]
               for e in events)


def test_a_nested_profiler_request_is_skipped_and_the_step_comes_from_the_enclosing_scope(
    tmp_path: Path,
) -> None:
    need("torch")
    perf_tracer.configure(_config(tmp_path, profile_steps=[0, 5]), rank=0)
    with perf_tracer.trace_scope("outer", enable_profiler=True, args={"global_step": 0}):
        with perf_tracer.trace_scope("inner", enable_profiler=True, args={"global_step": 0}):
            pass
    assert [p.name for p in _profiles(tmp_path)] == ["step0-r0-outer.json"]
    with perf_tracer.trace_scope("train.step", args={"global_step": 5}):
        with perf_tracer.trace_scope("fwd", enable_profiler=True):
            pass
    with rltrace.step(5, name="step5"):
        with perf_tracer.trace_scope("bwd", enable_profiler=True):
            pass
    assert {p.name for p in _profiles(tmp_path)} == {"step0-r0-outer.json", "step5-r0-fwd.json",
                                                     "step5-r0-bwd.json"}


def test_merge_profiler_trace_writes_an_aligned_file_convert_merges(tmp_path: Path) -> None:
    import time

    tracer = perf_tracer.configure(_config(tmp_path), rank=0)
    start = time.perf_counter_ns()
    written = tracer.merge_profiler_trace(
        {"traceEvents": [{"ph": "X", "name": "kernel", "ts": 5.0, "dur": 2.0, "pid": 1, "tid": 1}]},
        base_time_ns=start, args={"global_step": 1})
    assert written is not None and written.exists()
    out = tmp_path / "merged.json"
    convert([_log_dir(tmp_path)], out, progress=False)
    (kernel,) = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("name") == "kernel"]
    assert abs(kernel["ts"] - time.time_ns() / 1000) < 60e6  # on the epoch clock (µs)
