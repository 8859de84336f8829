"""``rltrace report`` names causes: who held a GRPO group, a queue delay, a slow tool, AReaL steps.

Planted runs on real files (``write_grpo_run`` in ``tests/helpers/synth_run.py``; and
``tests/helpers/areal_style_run.py``, a real process instrumented exactly as AReaL's guide
shows), reported by the real ``rltrace report`` CLI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")

import orjson

sys.path.insert(0, str(HELPERS))
from synth_run import GrpoSpec, grpo_ids, write_grpo_run

from rltrace.config import current_user

SPEC = GrpoSpec()
Report = tuple[dict[str, Any], list[dict[str, Any]], Path]


def cli_report(logdir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "report", str(logdir), "-o", str(out),
                           "--no-progress", *extra], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def json_report(logdir: Path, out: Path, *extra: str) -> dict[str, Any]:
    cli_report(logdir, out, *extra)
    return orjson.loads(out.read_bytes())


@pytest.fixture(scope="module")
def grpo(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("grpo")
    records = write_grpo_run(root / "run", SPEC)
    return json_report(root / "run", root / "r.json"), records, root


@pytest.fixture(scope="module")
def areal(tmp_path_factory: pytest.TempPathFactory) -> Report:
    root = tmp_path_factory.mktemp("areal")
    records = write_grpo_run(root / "run", GrpoSpec(areal_style=True))
    return json_report(root / "run", root / "r.json"), records, root


def by_session(records: list[dict[str, Any]], rank: int, sid: int) -> dict[str, Any]:
    return next(r for r in records if (r["rank"], r["session_id"]) == (rank, sid))


def members(g: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    return {m["session_id"]: m for m in g["members"]}


# ---- a GRPO group held by one sample's slow second-turn generate ---------------------------------


def test_slow_second_turn_generate_names_the_sample_phase_and_turn(grpo: Report) -> None:
    rep, _, _ = grpo
    (where, turn) = SPEC.slow_generate  # type: ignore[misc]
    tid, sid = grpo_ids(SPEC, where)
    g = rep["groups"]["groups"][0]
    assert (g["rank"], g["step"], g["task_id"], g["sessions"]) == (1, 2, tid, SPEC.samples)
    h = g["holder"]
    assert (h["session_id"], h["slow_phase"], h["slow_turn"], h["slow_kind"]) == (
        sid, "generate", turn, "phase")
    assert h["slow_phase_s"] == pytest.approx(SPEC.slow_generate_s, rel=1e-9)
    assert h["slow_phase_x_median"] == pytest.approx(SPEC.slow_generate_s / SPEC.gen_s, rel=1e-9)
    assert h["slow_share"] == pytest.approx(SPEC.slow_generate_s / h["own_s"], rel=1e-9)
    text = rep["findings"][0]["text"]
    assert rep["findings"][0]["kind"] == "group"
    assert f"rank 1 step 2 task {tid} (4 sessions)" in text
    assert f"session {sid} held it: generate turn 1 6.00 s" in text
    assert rep["findings"][0]["session_id"] == sid and rep["findings"][0]["turn"] == 1


def test_every_sibling_shows_group_wait_for_the_holder_and_shares_add_to_100(grpo: Report) -> None:
    rep, records, _ = grpo
    tid, sid = grpo_ids(SPEC, SPEC.slow_generate[0])  # type: ignore[index]
    g = rep["groups"]["groups"][0]
    ms = members(g)
    holder_end = by_session(records, 1, sid)["own_end"]
    assert ms[sid]["held"] and ms[sid]["group_wait_s"] == 0.0
    for s, m in ms.items():
        rec = by_session(records, 1, s)
        assert sum(m["shares"].values()) == pytest.approx(1.0, abs=1e-12)
        # epoch-second timestamps: ~0.2 µs resolution
        assert sum(m["decomposition_s"].values()) == pytest.approx(rec["total_s"], abs=1e-6)
        assert m["decomposition_s"]["before finalize"] == pytest.approx(SPEC.finalize_s, abs=1e-6)
        assert m["total_s"] == pytest.approx(rec["total_s"])  # the record keeps AReaL's total
        if s != sid:
            assert not m["held"]
            assert m["group_wait_s"] == pytest.approx(holder_end - rec["own_end"], abs=1e-6)
            assert m["shares"]["group wait"] > 0.75  # a fast sample's time is mostly waiting
            assert m["own_s"] < 1.2
    assert g["group_wait_s"] == pytest.approx(sum(m["group_wait_s"] for m in ms.values()))
    # the slowest sessions are ranked by their own time: the holder first, no sibling blamed
    slow = rep["longtail"]["slowest_sessions"]
    assert (slow[0]["rank"], slow[0]["session_id"]) == (1, sid)
    assert all(b["own_s"] < 1.2 for b in slow if b["task_id"] == tid and b["session_id"] != sid)


def test_the_step_is_held_by_the_same_sample_and_session_time_has_no_other(grpo: Report) -> None:
    rep, _, _ = grpo
    _, sid = grpo_ids(SPEC, SPEC.slow_generate[0])  # type: ignore[index]
    step2 = next(r for r in rep["stragglers"]["per_step"] if r["step"] == 2)
    assert step2["slowest_rank"] == 1
    held = step2["held_by"]
    assert (held["session_id"], held["slow_phase"], held["slow_turn"]) == (sid, "generate", 1)
    barrier = next(f for f in rep["findings"] if f["kind"] == "barrier")
    assert "step 2 (" in barrier["text"] and f"session {sid}, done at" in barrier["text"]
    ps = rep["phases"]["session"]
    names = {r["phase"] for r in ps["overall"]}
    assert "other" not in names and {"generate", "toolcall", "reward", "group wait", "before finalize",
                                     "after generate, before toolcall"} <= names
    assert sum(r["share"] for r in ps["overall"]) == pytest.approx(1.0)
    for row in ps["per_step"]:
        assert sum(v for v in row["share"].values() if v) == pytest.approx(1.0)


def test_markdown_report_shows_the_group_with_its_holder(grpo: Report) -> None:
    _, _, root = grpo
    tid, sid = grpo_ids(SPEC, SPEC.slow_generate[0])  # type: ignore[index]
    cli_report(root / "run", root / "md" / "report.md")
    text = (root / "md" / "report.md").read_text()
    assert "## 1. Slow groups" in text
    assert f"### rank 1 step 2 task {tid}: 4 sessions" in text
    assert f"Held by session {sid}: generate turn 1 6.00 s" in text
    assert f"| **{sid}** (held it) |" in text
    assert (root / "md" / "report-group_1.png").is_file()


# ---- a planted queue delay and a planted slow tool ------------------------------------------------


def test_planted_queue_delay_is_named_as_queue_wait(grpo: Report) -> None:
    rep, _, _ = grpo
    rank, step, _, _ = SPEC.queued  # type: ignore[misc]
    tid, sid = grpo_ids(SPEC, SPEC.queued)  # type: ignore[arg-type]
    b = next(b for b in rep["longtail"]["slowest_sessions"] if (b["rank"], b["session_id"]) == (rank, sid))
    assert (b["slow_phase"], b["slow_kind"], b["slow_turn"]) == ("queue wait", "queue", None)
    assert b["slow_phase_s"] == pytest.approx(SPEC.queue_s, rel=1e-6)
    assert b["decomposition_s"]["queue wait"] == pytest.approx(SPEC.queue_s, rel=1e-6)
    g = next(g for g in rep["groups"]["groups"] if (g["rank"], g["step"], g["task_id"]) == (rank, step, tid))
    assert g["holder"]["session_id"] == sid and g["holder"]["slow_phase"] == "queue wait"
    queue = next(r for r in rep["phases"]["session"]["overall"] if r["phase"] == "queue wait")
    assert queue["kind"] == "queue" and queue["total_s"] == pytest.approx(SPEC.queue_s, rel=1e-6)
    assert queue["sessions"] == 1
    assert {"step": step, "phase": "queue wait"} in [{"step": a["step"], "phase": a["phase"]}
                                                    for a in rep["phases"]["session"]["anomalies"]]
    assert any(f"session {sid} held it: queue wait 3.00 s" in f["text"] for f in rep["findings"])


def test_planted_slow_tool_is_named_with_its_turn_and_in_the_tools_table(grpo: Report) -> None:
    rep, records, _ = grpo
    (where, turn) = SPEC.slow_tool  # type: ignore[misc]
    rank, step, _, _ = where
    tid, sid = grpo_ids(SPEC, where)
    g = next(g for g in rep["groups"]["groups"] if (g["rank"], g["step"], g["task_id"]) == (rank, step, tid))
    h = g["holder"]
    assert (h["session_id"], h["slow_phase"], h["slow_turn"]) == (sid, "toolcall", turn)
    assert h["slow_phase_x_median"] == pytest.approx(SPEC.slow_tool_s / SPEC.tool_s, rel=1e-6)
    (python,) = [t for t in rep["turns"]["tools"] if t["tool"] == SPEC.tools[turn]]
    calls = sum(len(r["phases"].get("toolcall", ())) for r in records)
    assert python["calls"] == calls and python["max_s"] == pytest.approx(SPEC.slow_tool_s, rel=1e-6)
    assert python["p50_s"] == pytest.approx(SPEC.tool_s, rel=1e-6)
    assert any(f["kind"] == "tools" and "max 4.00 s" in f["text"] for f in rep["findings"])
    tb = {r["turn"]: r for r in rep["turns"]["phase_by_turn"]["rows"]}
    assert tb[0]["executions"]["toolcall"] == calls
    assert tb[1]["executions"]["generate"] == len(records)
    workers = {(w["rank"], w["step"]): w for w in rep["turns"]["workers"]}
    assert set(workers) == {(r, s) for r in range(SPEC.ranks) for s in range(SPEC.steps)}
    slowest = rep["groups"]["groups"][0]["holder"]  # the slow generate, rank 1 step 2
    assert workers[(1, 2)]["max_own_s"] == pytest.approx(slowest["own_s"], rel=1e-6)


# ---- steps marked only in trace_scope args (AReaL's guide) ----------------------------------------


def per_step_keys(rep: dict[str, Any]) -> dict[str, list[Any]]:
    """The steps every section of the report groups by."""
    return {
        "inputs": rep["inputs"]["steps"],
        "longtail": [r["step"] for r in rep["longtail"]["per_step"]],
        "stragglers": [r["step"] for r in rep["stragglers"]["per_step"]],
        "phases": [r["step"] for r in rep["phases"]["session"]["per_step"]],
        "train": [r["step"] for r in rep["phases"]["train"]["per_step"]],
        "status": [r["step"] for r in rep["status"]["per_step"]],
        "turns": [r["step"] for r in rep["turns"]["generate_by_turn_per_step"]],
        "workers": sorted({w["step"] for w in rep["turns"]["workers"]}),
        "slowest": sorted({b["step"] for b in rep["longtail"]["slowest_sessions"]} - {None}),
    }


def test_areal_style_run_is_grouped_by_step_in_every_section(areal: Report, grpo: Report) -> None:
    rep, records, _ = areal
    assert all(r["step"] is None for r in records)
    assert rep["inputs"]["sessions_step_from_scopes"] == len(records)
    steps = list(range(SPEC.steps))
    for section, got in per_step_keys(rep).items():
        assert None not in got, section
        if section != "slowest":
            assert got == steps, section
    assert all(b["step"] is not None for b in rep["longtail"]["slowest_sessions"])
    assert all(g["step"] is not None for g in rep["groups"]["groups"])
    assert {o["step"] for o in rep["stragglers"]["outliers"]} == {1, 2, 3}
    assert all(r["start_source"] == "rollout scope" for r in rep["longtail"]["per_step"])
    # the same run marked with rltrace.step gives the same answers
    ref = grpo[0]
    # a step runs from its first train.* scope to the next step's: train.weight_sync (no step arg,
    # after train.ppo_update) is part of it, as under train.step
    assert [r["scope"] for r in rep["phases"]["train"]["overall"]] == [
        r["scope"] for r in ref["phases"]["train"]["overall"]] == [
        "train.ppo_update", "train.rollout", "train.weight_sync", "untracked"]
    assert rep["groups"]["groups"][0]["holder"] == ref["groups"]["groups"][0]["holder"]
    assert rep["longtail"]["per_step"] == ref["longtail"]["per_step"]
    assert rep["phases"]["session"]["per_step"] == ref["phases"]["session"]["per_step"]
    assert [{k: v for k, v in r.items() if k != "held_by"} for r in rep["stragglers"]["per_step"]] == [
        {k: v for k, v in r.items() if k != "held_by"} for r in ref["stragglers"]["per_step"]]
    assert any(f["kind"] == "input" and "128 session record(s) had no step" in f["text"]
               for f in rep["findings"])


def test_a_record_without_a_step_takes_a_window_of_its_rank_else_of_the_run_while_it_lasts() -> None:
    """StepResolver on its own: windows (start µs, end µs, step) of rank 0 only; rank 1 (a Ray
    actor, say) has none and borrows rank 0's, but not after the last one ended."""
    from rltrace.analysis.session_aggregates import StepResolver

    resolve = StepResolver({0: [(1e6, 2e6, 0), (3e6, 4e6, 1)]})
    for rank in (0, 1):
        assert resolve(rank, 1.5) == 0  # inside a window
        assert resolve(rank, 2.5) == 1 and resolve(rank, 0.5) == 0  # the next one collects it
        assert resolve(rank, None) is None
    assert resolve(0, 9.0) == 1  # its own last step's window: the last one before it
    assert resolve(1, 9.0) is None  # after the run's steps, in a process without steps


def test_areal_style_step_range_selects_sessions_by_their_scope_step(areal: Report) -> None:
    _, records, root = areal
    rep = json_report(root / "run", root / "r2.json", "--steps", "2")
    assert rep["inputs"]["sessions"] == sum(r["true_step"] == 2 for r in records)
    assert rep["inputs"]["sessions_outside_steps"] == len(records) - rep["inputs"]["sessions"]
    assert per_step_keys(rep)["longtail"] == [2] and rep["inputs"]["steps"] == [2]
    assert rep["groups"]["groups"][0]["holder"]["slow_turn"] == 1


def test_a_real_process_instrumented_as_areals_guide_shows(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(HELPERS / "areal_style_run.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    logdir = tmp_path / "logs" / current_user() / "areal" / "t0"
    records = [orjson.loads(line) for line in
               (logdir / "session_tracer" / "sessions-r0.jsonl").read_bytes().splitlines()]
    assert len(records) == 4 * 4 * 3
    # sessions registered inside the rollout scope carry its global_step in the record;
    # those of the executor thread (no scope open there) have none: the report finds it
    in_scope = [r for r in records if r["step"] is not None]
    assert len(in_scope) == 24 and {r["step"] for r in in_scope} == {0, 1, 2, 3}
    slow = [r for r in records
            if any(e["turn"] == 1 and e["end_ts"] - e["start_ts"] > 0.2 for e in r["phases"]["generate"])]
    assert len(slow) == 1 and slow[0]["step"] == 2
    rep = json_report(logdir, tmp_path / "r.json")
    assert rep["inputs"]["sessions_step_from_scopes"] == 24
    for section, got in per_step_keys(rep).items():
        assert None not in got, section
        if section not in ("slowest", "train"):
            assert got == [0, 1, 2, 3], section
    h = rep["groups"]["groups"][0]["holder"]
    assert rep["groups"]["groups"][0]["step"] == 2
    assert (h["session_id"], h["slow_phase"], h["slow_turn"]) == (slow[0]["session_id"], "generate", 1)
    held = next(r for r in rep["stragglers"]["per_step"] if r["step"] == 2)["held_by"]
    assert held["session_id"] == slow[0]["session_id"]
