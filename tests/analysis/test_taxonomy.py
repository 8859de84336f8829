"""The waste taxonomy (:mod:`rltrace.accounting.goodput`): runs recorded through rltrace's own API in
the shape
the framework integrations write them (verl's timers, TRL's nested profiled sections, task groups
with zero-advantage and truncated samples), and the report, ``rltrace top``'s live state and
``rltrace diff`` all splitting them the same way.

Expected buckets are computed in the tests from the trace events and session records the run
wrote (each scope's duration, each phase's interval), by the classes the brief names, so a
wrong class, a lost nested section or a wasted sample counted useful changes the figures.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import need

import rltrace
from rltrace import perf_tracer
from rltrace.accounting.goodput import (
    BUCKETS,
    TAXONOMY,
    TRUNCATED,
    ZERO_ADVANTAGE,
    classify,
    session_fate,
    taxonomy_markdown,
)
from rltrace.analysis import ReportOptions, build_report, load_run
from rltrace.analysis.diff import series_of
from rltrace.analysis.render import render_md
from rltrace.config import current_user

DOCS = Path(__file__).resolve().parents[2] / "docs" / "guide" / "waste.md"
TOL = 5e-5  # seconds: trace timestamps are floored to the µs, several per bucket


def busy(seconds: float) -> None:
    """Spend ``seconds`` of wall time in this thread (a section's work, not a synchronisation)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def configure(tmp_path: Path, trial: str) -> Path:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="tax", trial_name=trial, flush_at_exit=False,
                      session_tracer={"enabled": True}, live_interval_s=0.05)
    return tmp_path / "logs" / current_user() / "tax" / trial


def group(framework: str, n: int, rewards: list[float], *, truncate: set[int] = frozenset(),  # type: ignore[assignment]
          drop_zero: bool = False, each_s: float = 0.002) -> None:
    """One prompt group as the integrations record it: a task, a session per completion with a
    generate phase (tokens) and a reward phase, finalized by the contract's rules."""
    task = rltrace.register_task()
    sids = [rltrace.register_session(task_id=task) for _ in range(n)]
    for i, sid in enumerate(sids):
        with rltrace.trace_session_phase("generate", {"input_tokens": 8, "model": "tiny"},
                                         session_id=sid) as ph:
            busy(each_s)
            ph.set_end_payload(output_tokens=10 + i, finish_reason="length" if i in truncate else "stop")
        if i in truncate:
            perf_tracer.trace_session_event("increment_counter", session_id=sid, name=TRUNCATED, value=1)
        with rltrace.trace_session_phase("reward", {"reward_fn": "acc"}, session_id=sid):
            busy(each_s / 2)
    zero = max(rewards) == min(rewards)
    for sid in sids:
        if zero:
            rltrace.trace_session_event("mark_finalized", session_id=sid,
                                        status="dropped" if drop_zero else "accepted", reason=ZERO_ADVANTAGE)
        else:
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")


def scope(name: str, framework: str, seconds: float) -> None:
    with rltrace.trace_scope(name, args={"framework": framework}):
        busy(seconds)


def read_trace(logdir: Path) -> list[dict[str, Any]]:
    return [ev for f in sorted((logdir / "perf_tracer").rglob("traces-r*.jsonl"))
            for ev in map(orjson.loads, f.read_bytes().splitlines()) if ev.get("ph") == "X"]


def read_sessions(logdir: Path) -> list[dict[str, Any]]:
    return [r for f in sorted((logdir / "session_tracer").rglob("sessions-r*.jsonl"))
            for r in map(orjson.loads, f.read_bytes().splitlines())]


def steps_of(events: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """step -> (start, end) seconds of its train.step scope."""
    return {ev["args"]["rl.step"]: (ev["ts"] / 1e6, (ev["ts"] + ev["dur"]) / 1e6)
            for ev in events if ev["name"] == "train.step"}


def within(ev: dict[str, Any], lo: float, hi: float) -> bool:
    return lo <= ev["ts"] / 1e6 and (ev["ts"] + ev["dur"]) / 1e6 <= hi + 1e-6


def scope_s(events: list[dict[str, Any]], name: str, lo: float, hi: float) -> float:
    return sum(ev["dur"] / 1e6 for ev in events if ev["name"] == name and within(ev, lo, hi))


def phase_s(records: list[dict[str, Any]], step: int, wasted: bool) -> float:
    """Phase seconds of the step's sessions that the contract calls wasted (or useful)."""
    total = 0.0
    for r in records:
        if r["step"] != step:
            continue
        is_wasted = r["status"] != "accepted" or r.get("reason") == ZERO_ADVANTAGE
        if is_wasted == wasted:
            total += sum(e["end_ts"] - e["start_ts"] for execs in r["phases"].values() for e in execs)
    return total


def report_of(logdir: Path) -> dict[str, Any]:
    return build_report(load_run(logdir, ReportOptions(progress=False)))


def by_step(rep: dict[str, Any]) -> dict[int, dict[str, float]]:
    return {row["step"]: row["seconds"] for row in rep["goodput"]["by_step"]}


# -- the table --------------------------------------------------------------------------------


def test_every_section_name_means_one_class_in_every_framework() -> None:
    classes: dict[str, set[str]] = defaultdict(set)
    for s in TAXONOMY:
        classes[s.name].add(s.cls)
    assert {n: c for n, c in classes.items() if len(c) > 1} == {}
    for s in TAXONOMY:  # the name alone and the (framework, name) pair agree
        assert classify(f"train.{s.name}") == classify(f"train.{s.name}", s.framework) == s.cls


def test_weight_sync_validation_and_checkpoints_are_overhead_in_every_framework() -> None:
    for fw, name in (("verl", "update_weights"), ("verl", "sync_rollout_weights"), ("verl", "testing"),
                     ("verl", "save_checkpoint"), ("verl", "switch_to_rollout"), ("trl", "sync_weights"),
                     ("openrlhf", "broadcast_to_vllm"), ("rltrace", "weight_sync")):
        assert classify(f"train.{name}", fw) == "overhead", (fw, name)
    assert classify("train.gen", "verl") == "rollout"
    assert classify("train.switch_wait", "verl") == "idle"
    assert classify("train.update_actor", "verl") == "productive"
    assert classify("train.compute_loss", "trl") == "productive"


def test_unknown_names_fall_back_to_the_word_rule_at_the_top_and_to_their_parent_when_nested() -> None:
    assert classify("train.save_my_model") == "overhead"
    assert classify("train.my_forward") == "productive"
    assert classify("train.my_reward_fn", "trl", parent="rollout") == "rollout"  # a TRL reward function
    assert classify("train.my_reward_fn", "trl", parent="productive") == "productive"
    assert classify("train.custom", rollout_scope="train.custom") == "rollout"


def test_zero_advantage_samples_are_wasted_whether_trained_on_or_dropped() -> None:
    assert session_fate("accepted", ZERO_ADVANTAGE) == "wasted"
    assert session_fate("dropped", ZERO_ADVANTAGE) == "wasted"
    assert session_fate("accepted", None) == "useful"
    for status in ("rejected", "failed", "dropped"):
        assert session_fate(status, "filtered") == "wasted"
    assert session_fate("running", None) is None


def test_the_docs_show_the_table_the_code_holds() -> None:
    assert taxonomy_markdown() in DOCS.read_text(encoding="utf-8"), (
        "docs/guide/waste.md is out of date: paste rltrace.accounting.goodput.taxonomy_markdown() into it")


# -- verl's sections ------------------------------------------------------------------------------


@pytest.fixture
def verl_run(tmp_path: Path) -> Path:
    """Three verl-shaped steps: ``gen`` with four groups of two completions (one group with
    zero reward spread, dropped as DAPO's filter_groups does; one completion truncated), then
    ``reward``, ``old_log_prob``, ``update_actor``, ``update_weights``, ``switch_wait`` and, in
    step 1, ``testing`` and ``save_checkpoint``."""
    logdir = configure(tmp_path, "verl")
    for step in range(3):
        rltrace.set_policy_version(step)
        with rltrace.step(step):
            with rltrace.trace_scope("train.gen", args={"framework": "verl"}):
                busy(0.002)  # waiting on the engines before the first sample
                for g in range(4):
                    group("verl", 2, [0.0, 0.0] if g == 1 else [0.0, 1.0], truncate={1} if g == 0 else set(),
                          drop_zero=True)
            scope("train.reward", "verl", 0.002)
            scope("train.old_log_prob", "verl", 0.002)
            scope("train.update_actor", "verl", 0.004)
            scope("train.update_weights", "verl", 0.003)
            scope("train.switch_wait", "verl", 0.002)
            if step == 1:
                scope("train.testing", "verl", 0.003)
                scope("train.save_checkpoint", "verl", 0.002)
            busy(0.001)  # untraced
    rltrace.shutdown()
    return logdir


def test_verls_sections_split_into_the_taxonomys_buckets(verl_run: Path) -> None:
    events, records = read_trace(verl_run), read_sessions(verl_run)
    got = by_step(report_of(verl_run))
    for step, (lo, hi) in steps_of(events).items():
        s = {n: scope_s(events, f"train.{n}", lo, hi) for n in
             ("gen", "reward", "old_log_prob", "update_actor", "update_weights", "switch_wait", "testing",
              "save_checkpoint")}
        useful, wasted = phase_s(records, step, False), phase_s(records, step, True)
        untraced = (hi - lo) - sum(s.values())
        assert got[step]["productive"] == pytest.approx(
            s["reward"] + s["old_log_prob"] + s["update_actor"] + useful, abs=TOL)
        assert got[step]["overhead"] == pytest.approx(
            s["update_weights"] + s["testing"] + s["save_checkpoint"] + untraced, abs=TOL)
        assert got[step]["idle"] == pytest.approx(s["switch_wait"] + s["gen"] - useful - wasted, abs=TOL)
        assert got[step]["wasted"] == pytest.approx(wasted, abs=TOL)
        assert wasted > 0 and s["update_weights"] > 0
    assert got[1]["overhead"] > got[0]["overhead"]  # validation and checkpoint in step 1


def test_the_report_names_zero_advantage_waste_and_truncation(verl_run: Path, tmp_path: Path) -> None:
    rep = report_of(verl_run)
    gp = rep["goodput"]
    records = read_sessions(verl_run)
    zero = [r for r in records if r.get("reason") == ZERO_ADVANTAGE]
    assert gp["zero_advantage"]["groups"] == 3 and gp["zero_advantage"]["groups_total"] == 12
    assert gp["zero_advantage"]["sessions"] == len(zero) == 6
    zero_s = sum(e["end_ts"] - e["start_ts"] for r in zero for execs in r["phases"].values() for e in execs)
    assert gp["zero_advantage"]["seconds"] == pytest.approx(zero_s)
    assert gp["truncated"]["sessions"] == 3 and gp["truncated"]["of_sessions"] == 24
    texts = [f["text"] for f in rep["findings"]]
    assert any(t.startswith("3 of 12 groups had zero reward spread")
               and "of generation and reward wasted" in t for t in texts), texts
    assert any(t.startswith("3 of 24 completions (12.5%) were truncated") for t in texts), texts
    classes = {r["section"]: r["class"] for r in gp["sections"]}
    assert classes["train.update_weights"] == "overhead" and classes["train.gen"] == "rollout"
    assert classes["train.switch_wait"] == "idle" and classes["train.update_actor"] == "productive"
    md = render_md(rep, {})
    assert "| train.update_weights | overhead |" in md and "3 of 12 groups had zero reward spread" in md


def test_verls_gen_is_the_steps_rollout_for_the_critical_path_and_the_long_tail(verl_run: Path) -> None:
    """Without ``--rollout-scope``: the taxonomy's rollout section (verl's ``gen``) is the step's
    rollout, so the critical path names the session that ended it instead of the whole scope, and
    each session's completion time runs from the rollout's start."""
    rep = report_of(verl_run)
    for step in rep["critical_path"]["steps"]:
        kinds = {link["kind"]: link for link in step["links"]}
        assert "session" in kinds, step["links"]  # the rollout's link is its last session
        assert all(link["what"] != "train.gen" for link in step["links"])
    run = load_run(verl_run, ReportOptions(progress=False))
    for info in run.steps_info.values():
        assert info.rollout_scopes == 1 and info.rollout_start_us is not None


# -- TRL's nested sections --------------------------------------------------------------------------


@pytest.fixture
def trl_run(tmp_path: Path) -> Path:
    """Three TRL-shaped steps: ``_prepare_inputs`` holding ``sync_weights`` (overhead), the
    generate call, ``_calculate_rewards`` with a reward function named by the user, and a
    log-prob pass (productive); then ``compute_loss``.  TRL trains on zero-spread groups:
    accepted with reason zero_advantage."""
    logdir = configure(tmp_path, "trl")
    for step in range(3):
        rltrace.set_policy_version(step)
        with rltrace.step(step):
            with rltrace.trace_scope("train._prepare_inputs", args={"framework": "trl"}):
                scope("train.sync_weights", "trl", 0.003)
                with rltrace.trace_scope("train.transformers.generate", args={"framework": "trl"}):
                    for g in range(3):
                        group("trl", 2, [1.0, 1.0] if g == step % 3 else [0.0, 1.0])
                with rltrace.trace_scope("train._calculate_rewards", args={"framework": "trl"}):
                    scope("train.accuracy_reward", "trl", 0.002)
                scope("train._get_per_token_logps_and_entropies", "trl", 0.002)
            scope("train.compute_loss", "trl", 0.004)
    rltrace.shutdown()
    return logdir


def test_trls_sync_weights_inside_prepare_inputs_is_overhead_and_its_log_prob_pass_productive(
        trl_run: Path) -> None:
    events, records = read_trace(trl_run), read_sessions(trl_run)
    rep = report_of(trl_run)
    got = by_step(rep)
    for step, (lo, hi) in steps_of(events).items():
        s = {n: scope_s(events, f"train.{n}", lo, hi) for n in
             ("_prepare_inputs", "sync_weights", "_get_per_token_logps_and_entropies", "compute_loss")}
        useful, wasted = phase_s(records, step, False), phase_s(records, step, True)
        untraced = (hi - lo) - s["_prepare_inputs"] - s["compute_loss"]
        rollout = s["_prepare_inputs"] - s["sync_weights"] - s["_get_per_token_logps_and_entropies"]
        assert got[step]["overhead"] == pytest.approx(s["sync_weights"] + untraced, abs=TOL)
        assert got[step]["productive"] == pytest.approx(
            s["compute_loss"] + s["_get_per_token_logps_and_entropies"] + useful, abs=TOL)
        assert got[step]["wasted"] == pytest.approx(wasted, abs=TOL)
        assert got[step]["idle"] == pytest.approx(rollout - useful - wasted, abs=TOL)
        assert wasted > 0
    classes = {r["section"]: r["class"] for r in rep["goodput"]["sections"]}
    assert classes["train.sync_weights"] == "overhead"
    assert classes["train.accuracy_reward"] == "rollout"  # a reward function: its parent's class
    assert rep["goodput"]["zero_advantage"]["groups"] == 3


# -- top and diff agree with the report --------------------------------------------------------------


@pytest.mark.parametrize("run", ["verl_run", "trl_run"])
def test_top_and_diff_split_each_step_as_the_report_does(run: str, request: pytest.FixtureRequest) -> None:
    logdir: Path = request.getfixturevalue(run)
    loaded = load_run(logdir, ReportOptions(progress=False))
    rep = build_report(loaded)
    want = by_step(rep)
    (live,) = (logdir / "live").rglob("live-r*.json")
    doc = orjson.loads(live.read_bytes())
    assert doc["closed"] is True
    top = {e["step"]: e["seconds"] for e in doc["goodput"]}
    assert sorted(top) == sorted(want)
    diff = series_of(loaded, rep)
    for step, sec in want.items():
        for b in BUCKETS:
            assert top[step][b] == pytest.approx(sec[b], abs=TOL), (step, b)
            assert diff[f"goodput {b}"][step] == pytest.approx(sec[b]), (step, b)
    fin = doc["finished"]
    assert fin["tokens"]["wasted"] == rep["goodput"]["tokens"]["wasted"]
    assert fin["tokens"]["zero_advantage"] == sum(r["output_tokens"] for r in read_sessions(logdir)
                                                  if r.get("reason") == ZERO_ADVANTAGE)


# -- a real TRL run ---------------------------------------------------------------------------------


def test_every_section_of_a_real_trl_grpo_run_is_in_the_table_and_truncation_matches_trl(
        tmp_path: Path) -> None:
    """A real ``GRPOTrainer`` (tests/integrations/trl/tiny_grpo.py) traced by the TRL integration:
    each section it records is one the table names (none classified by the fallback rule), and
    the truncated completions are TRL's own ``completions/clipped_ratio``."""
    need("trl")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations" / "trl"))
    try:
        import tiny_grpo
    finally:
        sys.path.pop(0)
    from rltrace.integrations import trl as rl_trl

    logdir = configure(tmp_path, "realtrl")
    trainer = tiny_grpo.trainer(str(tmp_path / "out"))
    rl_trl.instrument(trainer)
    trainer.train()
    rltrace.shutdown()
    gp = report_of(logdir)["goodput"]
    reward_fns = {"train.reward_len", "train.reward_has_cat"}  # nested: their parent's class
    named = {f"train.{s.name}" for s in TAXONOMY if s.framework == "trl"}
    seen = {r["section"]: r["class"] for r in gp["sections"]}
    assert set(seen) - reward_fns <= named and "train._prepare_inputs" in seen
    assert {seen[n] for n in reward_fns & set(seen)} == {"rollout"}
    logs = [h for h in trainer.state.log_history if "completions/clipped_ratio" in h]
    per_step = trainer.args.per_device_train_batch_size * trainer.args.gradient_accumulation_steps
    assert gp["truncated"]["sessions"] == round(sum(h["completions/clipped_ratio"] * per_step for h in logs))
    assert gp["truncated"]["sessions"] > 0
