"""One scripted workload through AReaL's *released* ``perf_tracer`` and through ``rltrace.perf_tracer``,
outputs compared field by field.

AReaL's module is the one in the ``areal`` 1.0.4 wheel (``tests/helpers/areal_wheel.py``); both
sides get the same AReaL ``PerfTracerConfig`` dataclass instance shape, each its own fileroot.
Every way rltrace's output deliberately differs from AReaL's is listed in ``DIFFERENCES``
below with its reason, and the comparison applies each entry explicitly by its key.
"""

from __future__ import annotations

import contextvars
import getpass
import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import areal_wheel  # tests/helpers/, on sys.path by conftest
import pytest

import rltrace
from rltrace import perf_tracer as rl_perf_tracer

pytestmark = pytest.mark.skipif(areal_wheel.skip_reason() is not None,
                                reason=areal_wheel.skip_reason() or "")

#: every deliberate difference between rltrace's output and AReaL's, with its reason
DIFFERENCES: dict[str, str] = {
    "config_yaml": "rank 0 writes the effective config to {log_dir}/config.yaml, so a run's "
                   "trace files say how they were produced",
    "live_state": "with session tracing on, each rank publishes its live state (open sessions, "
                  "current step) to {log_dir}/live/[{role}/]live-r{rank}.json for rltrace top",
    "record_fixed_schema": "every AReaL field is in every session record (reason null, "
                           "finalized_ts, total_s, generate_s/reward_s/toolcall_s 0.0 and phases "
                           "{} when AReaL omits them), so readers need no key checks",
    "record_extra_fields": "rltrace adds trace_id (the OTel trace of the task), turns, step and "
                           "phase_counts after AReaL's fields",
    "phase_turn": "each phase execution carries its turn (generate starts a new one)",
    "session_ids": "session ids are unique per process (AReaL restarts at 0 per tracer), so "
                   "they never repeat across reconfiguration or forked children",
    "session_spans_in_trace": "tasks, sessions and phases are OTel spans, so they also appear in "
                              "the Chrome trace (rl.task, rl.session, one X event per phase "
                              "execution with rl.* args); AReaL's trace has none",
    "scope_error_arg": "a scope left by an exception records error='Type: message' (and an "
                       "OTel ERROR status with an exception event) where AReaL records "
                       "exception='Type'",
    "process_name_host_pid": "the per-rank file already holds the name AReaL's converter gives "
                             "a process, '[role] Rank R, Process PID', plus ' · host', so ranks "
                             "on different hosts are told apart",
    "process_labels_meta": "a process_labels metadata event (rank, world size, role, host, "
                           "experiment, trial) and thread_sort_index events",
    "thread_lanes": "concurrent or overlapping scopes get their own lanes (tracks named "
                    "'Thread [n]'), because Perfetto drops overlapping slices on one track",
}

ROLE = "rollout"
EXPERIMENT, TRIAL = "diff", "t"
STEPS = 6
SAVE_INTERVAL = 3


# ---- the workload (written against AReaL's API only) ----------------------------------------------


def workload(pt: ModuleType, PerfTracerConfig: type, SessionTracerConfig: type, root: Path) -> None:
    """The same calls on either module: spans, instants, sessions with phases, counters, saves."""
    cfg = PerfTracerConfig(experiment_name=EXPERIMENT, trial_name=TRIAL, fileroot=str(root),
                           enabled=True, save_interval=SAVE_INTERVAL,
                           session_tracer=SessionTracerConfig(enabled=True, flush_threshold=2))
    tracer = pt.configure(cfg, rank=0, role=ROLE)
    for step in range(STEPS):
        with pt.trace_scope("train.step", category=pt.Category.COMPUTE,
                            args={"global_step": step, "lr": 1e-5, "tags": ["a", "b"],
                                  "nested": {"k": step}}):
            pt.instant("step.begin", category="instr", args={"global_step": step})
            task_id = 100 + step
            pt.register_task(task_id)
            pt.set_task_id(task_id)
            sid_a = pt.register_session(task_id)
            sid_b = pt.register_session(task_id)

            pt.set_session_id(sid_a)
            with pt.trace_session_phase("generate"):
                pass
            pt.trace_session_event("mark_toolcall_start", session_id=sid_a)
            pt.trace_session_event("increment_counter", session_id=sid_a, name="tool_calls")
            pt.trace_session_event("mark_toolcall_end", session_id=sid_a)
            with pt.trace_session_phase("generate"):
                pass
            with pt.trace_session_phase("reward"):
                pass
            pt.trace_session_event("increment_counter", session_id=sid_a, name="tokens", value=7)

            pt.set_session_id(sid_b)
            with pt.trace_session_phase("generate"):
                pass
            pt.trace_session_event("mark_reward_start", session_id=sid_b)
            pt.trace_session_event("mark_reward_end", session_id=sid_b)
            pt.trace_session_event("increment_counter", task_id=task_id, name="group")

            pt.trace_session_event("mark_finalized", session_id=sid_a, status="accepted")
            pt.trace_session_event("mark_finalized", session_id=sid_b, status="rejected",
                                   reason="low reward")
        with pt.trace_scope("io.sync", category="communication", args={"global_step": step}):
            pass
        if step == 4:
            try:
                with pt.trace_scope("flaky", category=pt.Category.IO):
                    raise ValueError("boom")
            except ValueError:
                pass
        pt.instant("step.end", args={"global_step": step})
        tracer.save(step=step)
    pt.save(force=True)
    pt.reset()


# ---- running both sides ----------------------------------------------------------------------------


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Path]]:
    areal_root = tmp_path_factory.mktemp("areal")
    rl_root = tmp_path_factory.mktemp("rltrace")
    with areal_wheel.areal_modules() as m:
        m.perf_tracer.reset()
        try:
            contextvars.copy_context().run(  # the workload's set_session_id stays in there
                workload, m.perf_tracer, m.cli_args.PerfTracerConfig,
                m.cli_args.SessionTracerConfig, areal_root)
        finally:
            m.perf_tracer.reset()
        rltrace.shutdown()
        try:  # the same AReaL config classes, unchanged, on rltrace's side
            contextvars.copy_context().run(
                workload, rl_perf_tracer, m.cli_args.PerfTracerConfig,
                m.cli_args.SessionTracerConfig, rl_root)
        finally:
            rl_perf_tracer.reset()
    return {"areal": _files(areal_root), "rltrace": _files(rl_root)}


def _logdir() -> str:
    return f"logs/{getpass.getuser()}/{EXPERIMENT}/{TRIAL}"


# ---- file layout ---------------------------------------------------------------------------------


def test_file_layout_matches_areal_role_folders_and_rank_file_names(outputs: dict) -> None:
    areal, mine = set(outputs["areal"]), set(outputs["rltrace"])
    expected = {f"{_logdir()}/perf_tracer/{ROLE}/traces-r0.jsonl",
                f"{_logdir()}/session_tracer/{ROLE}/sessions-r0.jsonl"}
    assert areal == expected
    extra = mine - areal
    assert extra == {f"{_logdir()}/config.yaml",  # DIFFERENCES["config_yaml"]
                     f"{_logdir()}/live/{ROLE}/live-r0.json"}, DIFFERENCES["live_state"]
    assert areal <= mine


# ---- session records ----------------------------------------------------------------------------

#: AReaL omits these when None / when the phase never ran; rltrace always writes them
_OMITTED_BY_AREAL = {"reason": None, "finalized_ts": float, "total_s": float, "generate_s": 0.0,
                     "reward_s": 0.0, "toolcall_s": 0.0, "phases": {}, "role": None}
_RLTRACE_EXTRA = {"trace_id", "turns", "step", "phase_counts"}


def _records(outputs: dict) -> tuple[list[dict], list[dict]]:
    name = f"{_logdir()}/session_tracer/{ROLE}/sessions-r0.jsonl"
    def key(r: dict[str, Any]) -> tuple[Any, str]:  # ids differ: DIFFERENCES["session_ids"]
        return r["task_id"], r["status"]

    return (sorted(_jsonl(outputs["areal"][name]), key=key),
            sorted(_jsonl(outputs["rltrace"][name]), key=key))


def test_session_records_have_areal_fields_in_areal_order(outputs: dict) -> None:
    areal, mine = _records(outputs)
    assert len(areal) == len(mine) == 2 * STEPS
    for a, r in zip(areal, mine, strict=True):
        a_keys = list(a)
        r_keys = [k for k in r if k in a]
        assert r_keys == a_keys, "AReaL's fields in AReaL's order"
        for k in r:
            if k in a:
                continue
            if k in _RLTRACE_EXTRA:
                continue  # DIFFERENCES["record_extra_fields"]
            assert k in _OMITTED_BY_AREAL, f"unexplained field {k!r}"
            want = _OMITTED_BY_AREAL[k]  # DIFFERENCES["record_fixed_schema"]
            assert (isinstance(r[k], want) if isinstance(want, type) else r[k] == want), (k, r[k])
        # the rltrace-only fields come after AReaL's
        last_areal = max(list(r).index(k) for k in a_keys)
        assert all(list(r).index(k) > last_areal for k in _RLTRACE_EXTRA if k in r)


def test_session_records_agree_on_status_reason_rank_role_and_counters(outputs: dict) -> None:
    areal, mine = _records(outputs)
    for a, r in zip(areal, mine, strict=True):
        for k in ("task_id", "rank", "role", "status", "counters"):
            assert r.get(k) == a.get(k), (k, a, r)
        assert r.get("reason") == a.get("reason")  # None vs absent: DIFFERENCES["record_fixed_schema"]
        assert isinstance(r["session_id"], int)  # values differ: DIFFERENCES["session_ids"]
        for k in ("submit_ts", "finalized_ts", "total_s", "generate_s", "reward_s"):
            assert isinstance(r[k], float) and isinstance(a[k], float), k
        assert r["finalized_ts"] >= r["submit_ts"]
    assert Counter(r["status"] for r in mine) == Counter({"accepted": STEPS, "rejected": STEPS})
    assert {r["counters"]["group"] for r in mine} == {1}
    accepted = [r for r in mine if r["status"] == "accepted"]
    assert all(r["counters"] == {"tool_calls": 1, "tokens": 7, "group": 1} for r in accepted)


def test_session_records_agree_on_phase_names_and_execution_counts(outputs: dict) -> None:
    areal, mine = _records(outputs)
    for a, r in zip(areal, mine, strict=True):
        assert set(r["phases"]) == set(a["phases"])
        for phase, spans in a["phases"].items():
            assert len(r["phases"][phase]) == len(spans), phase
            for entry in r["phases"][phase]:
                assert set(entry) - {"turn"} == {"start_ts", "end_ts"}  # DIFFERENCES["phase_turn"]
                assert entry["end_ts"] >= entry["start_ts"]
        for k in ("generate_s", "reward_s", "toolcall_s"):
            if k in a:
                assert r[k] > 0.0, k
            else:  # the phase never ran: DIFFERENCES["record_fixed_schema"]
                assert r[k] == 0.0, k


# ---- trace events -------------------------------------------------------------------------------


def _trace(outputs: dict, side: str) -> list[dict[str, Any]]:
    return _jsonl(outputs[side][f"{_logdir()}/perf_tracer/{ROLE}/traces-r0.jsonl"])


def _is_session_span(ev: dict[str, Any]) -> bool:
    """DIFFERENCES["session_spans_in_trace"]: rltrace's task/session/phase spans."""
    return ev["name"] in ("rl.task", "rl.session") or "rl.phase" in ev.get("args", {})


def _comparable(ev: dict[str, Any]) -> tuple[str, str, str, str]:
    args = dict(ev.get("args", {}))
    if "error" in args:  # DIFFERENCES["scope_error_arg"]
        args["exception"] = args.pop("error").split(":", 1)[0]
    return ev["ph"], ev["name"], ev.get("cat", ""), json.dumps(args, sort_keys=True)


def test_trace_events_agree_on_names_categories_and_args(outputs: dict) -> None:
    areal = [e for e in _trace(outputs, "areal") if e["ph"] != "M"]
    mine = [e for e in _trace(outputs, "rltrace") if e["ph"] != "M"]
    session_spans = [e for e in mine if _is_session_span(e)]
    assert len([e for e in session_spans if e["name"] == "rl.session"]) == 2 * STEPS
    mine = [e for e in mine if not _is_session_span(e)]
    assert Counter(map(_comparable, mine)) == Counter(map(_comparable, areal))
    flaky = [e for e in mine if e["name"] == "flaky"]
    assert len(flaky) == 1 and flaky[0]["args"]["error"] == "ValueError: boom"
    assert all(e["args"]["rank"] == 0 and e["args"]["role"] == ROLE for e in mine)


def test_trace_metadata_follows_areal_with_the_listed_additions(outputs: dict) -> None:
    areal = [e for e in _trace(outputs, "areal") if e["ph"] == "M"]
    mine = [e for e in _trace(outputs, "rltrace") if e["ph"] == "M"]
    a_names = {e["args"]["name"] for e in areal if e["name"] == "process_name"}
    r_names = {e["args"]["name"] for e in mine if e["name"] == "process_name"}
    assert a_names == {f"[{ROLE}] Rank 0, Process"}
    (r_name,) = r_names  # DIFFERENCES["process_name_host_pid"]
    assert r_name.startswith(f"[{ROLE}] Rank 0, Process ") and " · " in r_name
    a_sort = {e["args"]["sort_index"] for e in areal if e["name"] == "process_sort_index"}
    r_sort = {e["args"]["sort_index"] for e in mine if e["name"] == "process_sort_index"}
    assert a_sort == r_sort == {0}  # the rank, as in AReaL
    kinds = Counter(e["name"] for e in mine) - Counter(e["name"] for e in areal)
    assert set(kinds) <= {"process_labels", "thread_sort_index", "thread_name"}, \
        DIFFERENCES["process_labels_meta"]
    threads = {e["args"]["name"] for e in mine if e["name"] == "thread_name"}
    assert all(t.startswith("MainThread") for t in threads), DIFFERENCES["thread_lanes"]


def test_every_listed_difference_is_applied_by_a_comparison() -> None:
    source = Path(__file__).read_text()
    for key in DIFFERENCES:
        assert source.count(f'DIFFERENCES["{key}"]') >= 1, f"difference {key!r} is never applied"
