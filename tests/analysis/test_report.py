"""``rltrace report``: known answers on synthetic runs, JSON field by field, the CLI end to end."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

np = pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("rich", reason="needs pip install 'rltrace[analysis]'")

import orjson  # noqa: E402

sys.path.insert(0, str(HELPERS))
from synth_run import SynthSpec, SynthTruth, meta_events, session_record, write_run, x_event  # noqa: E402

from rltrace.analysis import ReportOptions, StepRange, build_report, load_run, report  # noqa: E402
from rltrace.config import current_user  # noqa: E402

PCTS = (50, 90, 99, 99.9)
T0 = 1_800_000_000


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", "report", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


# ---- the planted run: a straggler rank and a slow reward phase ----------------------------------

SPEC = SynthSpec(ranks=4, steps=6, sessions_per_step=64, straggler_rank=2, straggler_step=3,
                 slow_reward_rank=1, slow_reward_step=1, slow_reward_factor=200.0)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthTruth, dict[str, Any]]:
    logdir = tmp_path_factory.mktemp("planted")
    truth = write_run(logdir, SPEC)
    return logdir, truth, build_report(load_run(logdir))


def test_planted_straggler_rank_is_flagged_named_and_blamed_on_generate(planted: Any) -> None:
    _, truth, rep = planted
    sg = rep["stragglers"]
    hit = [o for o in sg["outliers"] if (o["step"], o["rank"]) == (3, 2)]
    assert hit, sg["outliers"]
    o = hit[0]
    assert o["slowest_rank_of_step"] is True
    assert o["rollout_s"] == pytest.approx(truth.rollout_s[(2, 3)], rel=1e-9)
    assert o["sessions"] and all(b["rank"] == 2 and b["step"] == 3 for b in o["sessions"])
    assert all(b["slow_phase"] == "generate" for b in o["sessions"])
    step3 = next(r for r in sg["per_step"] if r["step"] == 3)
    assert step3["slowest_rank"] == 2
    fastest = min(truth.rollout_s[(r, 3)] for r in range(SPEC.ranks))
    assert step3["barrier_wait_s"] == pytest.approx(truth.rollout_s[(2, 3)] - fastest, rel=1e-9)
    assert any("Step 3: rank 2 rollout took" in f["text"] for f in rep["findings"])


def test_planted_slow_reward_phase_is_named_in_phases_slowest_sessions_and_outliers(planted: Any) -> None:
    _, truth, rep = planted
    anomalies = rep["phases"]["session"]["anomalies"]
    assert {"step": 1, "phase": "reward"} in [{"step": a["step"], "phase": a["phase"]} for a in anomalies]
    assert any(f["kind"] == "phase" and "Step 1: reward takes" in f["text"] for f in rep["findings"])
    slow_ids = {sid for _, _, sid in truth.slow_reward_sessions}
    slowest = rep["longtail"]["slowest_sessions"]
    from_reward_step = [b for b in slowest if (b["rank"], b["step"]) == (1, 1)]
    assert from_reward_step, "the 10 s reward sessions are among the slowest"
    for b in from_reward_step:
        assert b["session_id"] in slow_ids
        assert b["slow_phase"] == "reward"
        assert b["slow_phase_x_median"] == pytest.approx(200.0, rel=1e-3)
    o = next(o for o in rep["stragglers"]["outliers"] if (o["step"], o["rank"]) == (1, 1))
    assert o["sessions"][0]["slow_phase"] == "reward"


def test_completion_percentiles_match_numpy_overall_and_per_step(planted: Any) -> None:
    _, truth, rep = planted
    comp, steps = np.array(truth.completion), np.array(truth.step)
    lt = rep["longtail"]
    want = np.percentile(comp, PCTS)
    got = [lt["overall"][k] for k in ("p50_s", "p90_s", "p99_s", "p999_s")]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert lt["overall"]["max_s"] == pytest.approx(comp.max(), rel=1e-12)
    assert lt["overall"]["count"] == comp.size
    for row in lt["per_step"]:
        vals = comp[steps == row["step"]]
        np.testing.assert_allclose([row[k] for k in ("p50_s", "p90_s", "p99_s", "p999_s")],
                                   np.percentile(vals, PCTS), rtol=1e-12)
        t_end, t80 = vals.max(), np.percentile(vals, 80)
        assert row["tail_fraction"] == pytest.approx((t_end - t80) / t_end, rel=1e-9)
        assert row["start_source"] == "rollout scope"


def test_turn_statistics_match_the_generated_sessions(planted: Any) -> None:
    _, truth, rep = planted
    tu = rep["turns"]
    turns = np.array(truth.turns)
    counts = np.bincount(turns)
    assert [(r["turns"], r["sessions"]) for r in tu["distribution"]] == [
        (t, int(counts[t])) for t in np.flatnonzero(counts)]
    for r in tu["generate_by_turn"]:
        g = truth.generate_by_turn[r["turn"]]
        assert r["executions"] == len(g)
        assert r["mean_s"] == pytest.approx(np.mean(g), rel=1e-9)
    own = np.array(truth.own)
    for r in tu["session_time_by_turns"]:  # own time: submit to the last phase's end
        assert r["mean_s"] == pytest.approx(own[turns == r["turns"]].mean(), rel=1e-6)  # float32 columns


def test_status_counts_and_run_summary_match_the_generated_run(planted: Any) -> None:
    _, truth, rep = planted
    st = rep["status"]
    values, counts = np.unique(np.array(truth.status), return_counts=True)
    assert st["counts"] == dict(zip(values.tolist(), counts.tolist(), strict=True))
    assert st["acceptance_rate"] == pytest.approx(truth.status.count("accepted") / len(truth.status))
    assert {(r["status"], r["reason"]) for r in st["reasons"]} == {
        ("rejected", "stale_weight"), ("failed", "TimeoutError: inference server timed out")}
    sm = rep["summary"]
    by = {r["name"]: r for r in sm["scopes"]}
    assert by["train.step"]["count"] == SPEC.ranks * SPEC.steps
    assert by["train.ppo_update"]["total_s"] == pytest.approx(5.0 * SPEC.ranks * SPEC.steps, rel=1e-6)
    for r in range(SPEC.ranks):
        assert sm["wall_s"][str(r)] == pytest.approx(truth.wall_s[r], rel=1e-9)
    (samples,) = sm["counters"]
    assert samples["name"] == "samples"
    assert samples["total"] == sum(truth.samples_counter.values())
    want_rate = sum(truth.samples_counter[r] / truth.wall_s[r] for r in range(SPEC.ranks))
    assert samples["rate_per_s"] == pytest.approx(want_rate, rel=1e-9)
    train = {r["scope"]: r for r in rep["phases"]["train"]["overall"]}
    assert train["untracked"]["total_s"] == pytest.approx(0.0, abs=1e-3)
    assert train["train.ppo_update"]["total_s"] == pytest.approx(5.0 * SPEC.ranks * SPEC.steps, rel=1e-6)


# ---- a tiny run computed by hand ----------------------------------------------------------------
#
# 2 ranks x 2 steps; each (rank, step) runs task 0/1 with three sessions submitted at the step start:
#   A: 1 turn, generate 1.0, reward 0.25                                  -> total 1.25
#   B: 2 turns, generate 0.5, toolcall 0.25, generate 1.5, reward 0.25    -> total 2.5
#   C: 3 turns, generate 0.5, tool 0.25, generate 0.5, tool 0.25, generate 2.0, reward 0.25 -> 3.75
# rank 1 in step 1 generates twice as slowly (totals 2.25, 4.5, 6.75).  B is rejected (stale_weight);
# C is accepted except on rank 1 step 1 (failed: TimeoutError).  train.rollout runs from the step start
# to the last session + 0.5 s, then train.ppo_update 2.0 s and train.weight_sync 0.5 s; a "samples"
# counter holds 3 after step 0 and 6 after step 1.

GEN = {"A": [1.0], "B": [0.5, 1.5], "C": [0.5, 0.5, 2.0]}


def write_tiny(logdir: Path) -> None:
    (logdir / "session_tracer").mkdir(parents=True)
    (logdir / "perf_tracer").mkdir(parents=True)
    for rank in (0, 1):
        sessions, events = [], meta_events(100 + rank, rank, 2)
        for step in (0, 1):
            start = float(T0 + 100 * step)
            slow = 2.0 if (rank, step) == (1, 1) else 1.0
            last = start
            for j, name in enumerate("ABC"):
                t = start
                phases: dict[str, list[tuple[float, float, int]]] = {"generate": []}
                for turn, g in enumerate(GEN[name]):
                    phases["generate"].append((t, t + g * slow, turn))
                    t += g * slow
                    if turn < len(GEN[name]) - 1:
                        phases.setdefault("toolcall", []).append((t, t + 0.25, turn))
                        t += 0.25
                phases["reward"] = [(t, t + 0.25, len(GEN[name]) - 1)]
                t += 0.25
                status, reason = "accepted", None
                if name == "B":
                    status, reason = "rejected", "stale_weight"
                elif name == "C" and slow > 1:
                    status, reason = "failed", "TimeoutError"
                sessions.append(session_record(task_id=step, session_id=3 * step + j, rank=rank, step=step,
                                               status=status, reason=reason, submit=start, phases=phases,
                                               final=t))
                last = max(last, t)
            rollout = last + 0.5 - start
            pid = 100 + rank
            events.append(x_event(pid, 1, start, rollout, "train.rollout"))
            events.append(x_event(pid, 1, start + rollout, 2.0, "train.ppo_update"))
            events.append(x_event(pid, 1, start + rollout + 2.0, 0.5, "train.weight_sync", "comm"))
            events.append(x_event(pid, 1, start, rollout + 2.5, "train.step", args={"rl.step": step}))
            end_us = int((start + rollout + 2.5) * 1e6)
            events.append(b'{"pid":%d,"tid":0,"ph":"C","ts":%d,"name":"samples","args":{"value":%d}}\n'
                          % (pid, end_us, 3 * (step + 1)))
        (logdir / "session_tracer" / f"sessions-r{rank}.jsonl").write_bytes(
            b"".join(orjson.dumps(s) + b"\n" for s in sessions))
        (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").write_bytes(b"".join(events))


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    logdir = tmp_path / "logs" / "u" / "exp" / "t0"
    write_tiny(logdir)
    return logdir


def json_report(logdir: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "out" / "report.json"
    proc = run_cli(str(logdir), "-o", str(out), "--format", "json", *extra)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout
    return orjson.loads(out.read_bytes())


def test_turn_statistics_match_hand_computed_values(tiny: Path, tmp_path: Path) -> None:
    tu = json_report(tiny, tmp_path)["turns"]
    assert tu["sessions"] == 12
    assert tu["mean_turns"] == 2.0
    assert tu["distribution"] == [{"turns": t, "sessions": 4, "fraction": 1 / 3} for t in (1, 2, 3)]
    # turn 0: 1.0+0.5+0.5 on three (rank, step)s, doubled on one: (3*2.0 + 4.0) / 12
    assert tu["generate_by_turn"] == [
        {"turn": 0, "executions": 12, "mean_s": pytest.approx(10 / 12, rel=1e-12)},
        {"turn": 1, "executions": 8, "mean_s": pytest.approx(10 / 8, rel=1e-12)},
        {"turn": 2, "executions": 4, "mean_s": pytest.approx(10 / 4, rel=1e-12)},
    ]
    assert tu["session_time_by_turns"] == [
        {"turns": 1, "sessions": 4, "mean_s": 1.5},   # (3 * 1.25 + 2.25) / 4
        {"turns": 2, "sessions": 4, "mean_s": 3.0},   # (3 * 2.5 + 4.5) / 4
        {"turns": 3, "sessions": 4, "mean_s": 4.5},   # (3 * 3.75 + 6.75) / 4
    ]


def test_json_report_field_by_field(tiny: Path, tmp_path: Path) -> None:
    rep = json_report(tiny, tmp_path)
    assert rep["rltrace_report"] == 1
    assert rep["logdir"] == str(tiny)
    assert rep["options"] == {"steps": "all", "k": 3.0, "top": 10, "step_scope": "train.step",
                              "rollout_scope": "train.rollout", "train_prefix": "train."}
    inp = rep["inputs"]
    assert inp["sessions"] == 12 and inp["sessions_outside_steps"] == 0
    assert inp["ranks"] == [0, 1] and inp["steps"] == [0, 1]
    assert inp["skipped_lines"] == 0 and inp["skipped"] == []
    assert [Path(p).name for p in inp["session_files"]] == ["sessions-r0.jsonl", "sessions-r1.jsonl"]
    assert inp["trace_events"] == 2 * 2 * 5
    assert rep["plots"] == {}

    # 1. long tail: completion = session total (all submitted at the rollout start)
    lt = rep["longtail"]
    normal, slow = [1.25, 2.5, 3.75], [2.25, 4.5, 6.75]
    every = [*normal * 3, *slow]
    want = dict(zip(("p50_s", "p90_s", "p99_s", "p999_s"), np.percentile(every, PCTS).tolist(), strict=True))
    assert lt["overall"] == {"count": 12, **want, "max_s": 6.75,
                             "tail_fraction": pytest.approx(_tail_sum([normal * 2, [*normal, *slow]]))}
    step0, step1 = lt["per_step"]
    assert step0["step"] == 0 and step0["count"] == 6 and step0["max_s"] == 3.75
    assert step0["p80_s"] == np.percentile(normal * 2, 80)
    assert step0["start_source"] == "rollout scope"
    assert step1["tail_fraction"] == pytest.approx(
        (6.75 - np.percentile([*normal, *slow], 80)) / 6.75)
    assert lt["cdf"]["fraction"][0] == 0.0 and lt["cdf"]["fraction"][-1] == 1.0
    assert lt["cdf"]["completion_s"][0] == 1.25 and lt["cdf"]["completion_s"][-1] == 6.75
    top = lt["slowest_sessions"][0]
    # the slow segment is one phase execution (with its turn) vs the median execution of that phase:
    # generate executions 1, .5, 1.5, .5, .5, 2 (x3) and 2, 1, 3, 1, 1, 4: median 1.0
    assert {k: top[k] for k in ("rank", "step", "task_id", "session_id", "status", "reason", "turns",
                                "completion_s", "slow_phase", "slow_turn", "slow_kind", "slow_phase_s",
                                "slow_phase_median_s", "slow_phase_x_median", "slow_share")} == {
        "rank": 1, "step": 1, "task_id": 1, "session_id": 5, "status": "failed", "reason": "TimeoutError",
        "turns": 3, "completion_s": 6.75, "slow_phase": "generate", "slow_turn": 2, "slow_kind": "phase",
        "slow_phase_s": 4.0, "slow_phase_median_s": 1.0, "slow_phase_x_median": 4.0, "slow_share": 4.0 / 6.75}
    assert top["total_s"] == 6.75 and top["own_s"] == 6.75
    assert top["decomposition_s"] == {"generate": 6.0, "toolcall": 0.5, "reward": 0.25}
    assert sum(top["shares"].values()) == pytest.approx(1.0)
    assert top["phases_s"] == {"generate": 6.0, "toolcall": 0.5, "reward": 0.25}
    assert top["generate_by_turn_s"] == [1.0, 1.0, 4.0]
    assert len(lt["slowest_sessions"]) == 10

    # 2. stragglers: rollout = last session + 0.5 s; rank 1 is 3 s slower in step 1
    sg = rep["stragglers"]
    assert sg["k"] == 3.0 and sg["ranks"] == [0, 1]
    assert sg["median_s"] == 4.25 and sg["mad_s"] == 0.0
    assert sg["threshold_s"] == pytest.approx(4.25 + 3 * 0.0425)  # MAD floored at 1% of the median
    held = [r.pop("held_by") for r in sg["per_step"]]  # the slowest rank's last session to finish its work
    assert [(h["rank"], h["step"], h["session_id"], h["slow_phase"], h["slow_turn"], h["slow_phase_s"])
            for h in held] == [(0, 0, 2, "generate", 2, 2.0), (1, 1, 5, "generate", 2, 4.0)]
    assert held[1]["slow_share"] == pytest.approx(4.0 / 6.75) and held[1]["completion_s"] == 6.75
    assert sg["per_step"] == [
        {"step": 0, "rollout_s": {"0": 4.25, "1": 4.25}, "fastest_rank": 0, "slowest_rank": 0,
         "fastest_s": 4.25, "slowest_s": 4.25, "barrier_wait_s": 0.0, "idle_rank_s": 0.0,
         "slowest_over_fastest": 1.0},
        {"step": 1, "rollout_s": {"0": 4.25, "1": 7.25}, "fastest_rank": 0, "slowest_rank": 1,
         "fastest_s": 4.25, "slowest_s": 7.25, "barrier_wait_s": 3.0, "idle_rank_s": 3.0,
         "slowest_over_fastest": pytest.approx(7.25 / 4.25)},
    ]
    (o,) = sg["outliers"]
    assert (o["step"], o["rank"], o["rollout_s"], o["median_s"]) == (1, 1, 7.25, 4.25)
    assert o["excess_mads"] == pytest.approx(3.0 / 0.0425)
    assert o["slowest_rank_of_step"] is True
    assert [b["session_id"] for b in o["sessions"]] == [5, 4, 3]  # last to finish first
    assert [b["slow_phase"] for b in o["sessions"]] == ["generate", "generate", "generate"]
    assert sg["per_rank"] == [
        {"rank": 0, "steps": 2, "mean_rollout_s": 4.25, "median_ratio_to_fastest": 1.0,
         "slowest_in_steps": 1, "outlier_steps": 0},
        {"rank": 1, "steps": 2, "mean_rollout_s": 5.75,
         "median_ratio_to_fastest": pytest.approx((1 + 7.25 / 4.25) / 2),
         "slowest_in_steps": 1, "outlier_steps": 1},
    ]
    assert sg["total_barrier_wait_s"] == 3.0 and sg["total_idle_rank_s"] == 3.0
    assert sg["total_step_s"] == pytest.approx(6.75 + 9.75)
    assert sg["barrier_wait_share"] == pytest.approx(3.0 / 16.5)

    # 3. phases
    ps = rep["phases"]["session"]
    assert ps["phases"] == ["generate", "reward", "toolcall"]  # no time outside phases: no "other"
    assert [(r["phase"], r["total_s"], r["sessions"]) for r in ps["overall"]] == [
        ("generate", 30.0, 12), ("reward", 3.0, 12), ("toolcall", 3.0, 8)]
    assert [r["share"] for r in ps["overall"]] == [pytest.approx(30 / 36), pytest.approx(3 / 36),
                                                   pytest.approx(3 / 36)]
    assert ps["overall"][0]["p50_s"] == 2.0 and ps["overall"][1]["mean_s"] == 0.25
    assert ps["per_step"][1]["phases_s"] == {"generate": 18.0, "toolcall": 1.5, "reward": 1.5}
    assert ps["anomalies"] == []  # two steps: too few to judge
    tr = rep["phases"]["train"]
    assert tr["scopes"] == ["train.rollout", "train.ppo_update", "train.weight_sync", "untracked"]
    assert [(r["scope"], pytest.approx(r["total_s"]), pytest.approx(r["share"])) for r in tr["overall"]] == [
        ("train.rollout", 20.0, 20 / 30), ("train.ppo_update", 8.0, 8 / 30),
        ("train.weight_sync", 2.0, 2 / 30), ("untracked", 0.0, 0.0)]
    assert tr["per_step"][1]["step_s_mean"] == pytest.approx((6.75 + 9.75) / 2)
    assert tr["per_step"][1]["mean_s"]["train.rollout"] == pytest.approx((4.25 + 7.25) / 2)

    # 5. status
    st = rep["status"]
    assert st["counts"] == {"accepted": 7, "rejected": 4, "failed": 1}
    assert st["acceptance_rate"] == 7 / 12
    assert st["per_step"] == [
        {"step": 0, "sessions": 6, "counts": {"accepted": 4, "rejected": 2}, "acceptance_rate": 4 / 6},
        {"step": 1, "sessions": 6, "counts": {"accepted": 3, "rejected": 2, "failed": 1},
         "acceptance_rate": 0.5},
    ]
    assert st["reasons"] == [
        {"status": "rejected", "reason": "stale_weight", "sessions": 4, "share_of_status": 1.0},
        {"status": "failed", "reason": "TimeoutError", "sessions": 1, "share_of_status": 1.0},
    ]
    tasks = st["tasks"]
    assert tasks["tasks"] == 4  # task ids repeat across ranks: tasks are (rank, task_id)
    assert tasks["mean_acceptance_rate"] == pytest.approx(7 / 12)
    assert tasks["all_accepted"] == 0 and tasks["none_accepted"] == 0
    assert [h["tasks"] for h in tasks["acceptance_histogram"]] == [0, 0, 0, 1, 0, 0, 3, 0, 0, 0]
    assert tasks["lowest"][0] == {"rank": 1, "task_id": 1, "sessions": 3, "accepted": 1,
                                  "acceptance_rate": 1 / 3}

    # 6. summary
    sm = rep["summary"]
    assert sm["wall_s"] == {"0": pytest.approx(106.75), "1": pytest.approx(109.75)}
    assert sm["trace_events"] == 20
    by = {r["name"]: r for r in sm["scopes"]}
    assert set(by) == {"train.step", "train.rollout", "train.ppo_update", "train.weight_sync"}
    assert by["train.step"]["count"] == 4 and by["train.step"]["total_s"] == pytest.approx(30.0)
    assert by["train.ppo_update"]["p50_s"] == pytest.approx(2.0)
    assert by["train.ppo_update"]["exact_percentiles"]
    assert by["train.rollout"]["p99_s"] == pytest.approx(np.percentile([4.25, 4.25, 4.25, 7.25], 99))
    assert by["train.step"]["wall_share"] == pytest.approx(30.0 / (106.75 + 109.75))
    assert sm["counters"] == [{"name": "samples", "total": 12.0,
                               "rate_per_s": pytest.approx(6 / 106.75 + 6 / 109.75),
                               "per_rank": {"0": {"total": 6.0, "rate_per_s": pytest.approx(6 / 106.75)},
                                            "1": {"total": 6.0, "rate_per_s": pytest.approx(6 / 109.75)}}}]

    kinds = [f["kind"] for f in rep["findings"]]
    assert kinds[0] == "group" and rep["findings"][0]["text"].startswith(
        "Slowest group: rank 1 step 1 task 1 (3 sessions) took 6.75 s; session 5 held it: "
        "generate turn 2 4.00 s (59.3% of its own time, 4.0× the median).")
    straggler = rep["findings"][kinds.index("straggler")]["text"]
    assert straggler.startswith("Step 1: rank 1 rollout took 7.25 s")
    assert "held by rank 1 step 1 task 1 session 5" in straggler
    assert "longtail" in kinds and "status" in kinds


def _tail_sum(steps: list[list[float]]) -> float:
    ends = [max(v) for v in steps]
    waits = [max(v) - np.percentile(v, 80) for v in steps]
    return sum(waits) / sum(ends)


def test_steps_range_selects_sessions_scopes_and_counters_of_those_steps(tiny: Path, tmp_path: Path) -> None:
    rep = json_report(tiny, tmp_path, "--steps", "1:2")
    assert rep["options"]["steps"] == "1:2"
    assert rep["inputs"]["sessions"] == 6 and rep["inputs"]["sessions_outside_steps"] == 6
    assert rep["inputs"]["steps"] == [1]
    assert [r["step"] for r in rep["longtail"]["per_step"]] == [1]
    by = {r["name"]: r for r in rep["summary"]["scopes"]}
    assert by["train.step"]["count"] == 2
    assert rep["summary"]["wall_s"] == {"0": pytest.approx(6.75), "1": pytest.approx(9.75)}
    (c,) = rep["summary"]["counters"]
    assert c["per_rank"]["0"]["total"] == 3.0  # 6 at the end of step 1 minus 3 before it
    assert StepRange.parse("3") == StepRange(3, 4) and StepRange.parse(":5") == StepRange(None, 5)


def test_truncated_last_line_is_skipped_and_reported(tiny: Path, tmp_path: Path) -> None:
    path = tiny / "session_tracer" / "sessions-r0.jsonl"
    with open(path, "ab") as fh:
        fh.write(b'{"task_id":9,"session_id":99,"rank":0,"status":"acc')  # a writer killed mid-line
    out = tmp_path / "r.json"
    proc = run_cli(str(tiny), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"{path}:7: truncated last line, skipped" in proc.stdout
    rep = orjson.loads(out.read_bytes())
    assert rep["inputs"]["sessions"] == 12
    assert rep["inputs"]["skipped_lines"] == 1
    assert rep["inputs"]["skipped"] == [f"{path}:7: truncated last line, skipped"]
    assert any(f["kind"] == "input" for f in rep["findings"])


def test_malformed_records_and_events_are_skipped_and_reported_and_the_rest_analysed(
        tiny: Path, tmp_path: Path) -> None:
    sessions, traces = tiny / "session_tracer" / "sessions-r0.jsonl", tiny / "perf_tracer" / "traces-r1.jsonl"
    with open(sessions, "ab") as fh:
        fh.write(b'{"step": 0, "rank": 0, "status": "accepted", "finalized_ts": "soon"}\n[1, 2]\n')
    with open(traces, "ab") as fh:
        fh.write(b'{"pid":101,"tid":1,"ph":"X","ts":"later","dur":1,"name":"train.step"}\n')
    rep = json_report(tiny, tmp_path)
    assert rep["inputs"]["skipped"] == [
        f"{traces}:14: malformed trace event (ts: expected a number of microseconds, got 'later'), skipped",
        f"{sessions}:7: malformed session record "
        "(finalized_ts: expected a number of seconds, got 'soon'), skipped",
        f"{sessions}:8: not a JSON object, skipped",
    ]
    assert rep["inputs"]["skipped_lines"] == 3 and rep["inputs"]["skipped_fields"] == 0
    assert rep["inputs"]["sessions"] == 12
    assert rep["status"]["counts"] == {"accepted": 7, "rejected": 4, "failed": 1}
    assert {r["name"]: r["count"] for r in rep["summary"]["scopes"]}["train.step"] == 4


def test_output_path_rules_and_formats(tiny: Path, tmp_path: Path) -> None:
    rep, files = report(tiny, tmp_path / "dir", options=ReportOptions(progress=False))
    assert files[0] == tmp_path / "dir" / "report.html"
    assert {p.name for p in files[1:]} == {f"report-{k}.png" for k in rep["plots"]}
    _, files = report(tiny, tmp_path / "x" / "run.md")
    assert files[0].read_text().startswith("# rltrace report")
    assert all((tmp_path / "x" / f"run-{k}.png").is_file() for k in ("cdf", "stragglers", "turns"))
    _, files = report(tiny, tmp_path / "y", "json")
    assert files == [tmp_path / "y" / "report.json"]
    _, files = report(tiny)
    assert files[0] == tiny / "report" / "report.html"


def test_cli_errors_name_the_problem(tmp_path: Path) -> None:
    proc = run_cli(str(tmp_path / "nope"))
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    proc = run_cli(str(tmp_path))
    assert proc.returncode == 2 and "no sessions-r*.jsonl or traces-r*.jsonl files" in proc.stderr
    write_tiny(tmp_path / "run")
    proc = run_cli(str(tmp_path / "run"), "--steps", "x:y")
    assert proc.returncode == 2 and "--steps 'x:y'" in proc.stderr
    proc = run_cli(str(tmp_path / "run"), "--steps", "7:9", "-o", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "no sessions or trace events in steps 7:9" in proc.stderr


def test_missing_analysis_extra_prints_the_install_command(tiny: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; from rltrace.cli import main; "
            f"sys.exit(main(['report', {str(tiny)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "matplotlib missing" in proc.stderr and "pip install 'rltrace[analysis]'" in proc.stderr


def test_core_package_and_cli_do_not_import_the_analysis_libraries() -> None:
    code = ("import sys, rltrace, rltrace.cli; rltrace.cli.build_parser(); "
            "print(sorted(m for m in ('matplotlib', 'jinja2', 'rich', 'rltrace.analysis') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- a real run ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "demo", "--fileroot", str(root),
                           "--ranks", "2", "--steps", "3", "--tasks", "4", "--samples", "3"],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root / "logs" / current_user() / "demo" / "trial0"


@pytest.mark.parametrize("fmt", ["html", "md", "json"])
def test_report_on_a_real_demo_run_exits_0_in_every_format(demo_logdir: Path, tmp_path: Path,
                                                          fmt: str) -> None:
    proc = run_cli(str(demo_logdir), "-o", str(tmp_path), "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / f"report.{fmt}"
    assert out.is_file() and out.stat().st_size > 1000
    records = sum(len(p.read_bytes().splitlines())
                  for p in (demo_logdir / "session_tracer").rglob("sessions-r*.jsonl"))
    if fmt == "json":
        rep = orjson.loads(out.read_bytes())
        assert rep["inputs"]["sessions"] == records == 2 * 3 * 4 * 3
        assert rep["inputs"]["ranks"] == [0, 1] and rep["inputs"]["steps"] == [0, 1, 2]
        assert {r["start_source"] for r in rep["longtail"]["per_step"]} == {"rollout scope"}
        assert {r["scope"] for r in rep["phases"]["train"]["overall"]} >= {
            "train.rollout", "train.ppo_update", "train.weight_sync"}
        assert {r["phase"] for r in rep["phases"]["session"]["overall"]} >= {"generate", "reward"}
        assert not math.isnan(rep["longtail"]["overall"]["p99_s"])
    else:
        pngs = sorted(p.name for p in tmp_path.glob("report-*.png"))
        assert len(pngs) >= 7, pngs
        text = out.read_text()
        assert "Long tail" in text and "Stragglers" in text and "Run summary" in text
