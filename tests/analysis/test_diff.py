"""``rltrace diff``: two runs that differ by one planted slowdown; diff names it (and what it
makes longer) and nothing else, in the terminal and as HTML."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS

pytest.importorskip("jinja2", reason="rltrace diff needs the analysis extra")

sys.path.insert(0, str(HELPERS))
from synth_run import meta_events, session_record, x_event

T0 = 1_800_000_000.0
STEPS, RANKS, SESSIONS = 8, 2, 16
#: what the planted generate slowdown makes longer (everything else must stay unnamed)
FOLLOWS_GENERATE = {"step time", "session generate", "generate turn 0", "role actor", "scope train.rollout",
                    "goodput productive", "session group wait"}


def write_run(logdir: Path, seed: int, generate_extra_s: float) -> None:
    """Per rank and step: 16 sessions at once (generate ~1 s, toolcall ~0.2 s, reward ~0.1 s,
    all with step-to-step noise), then a ~5 s train step and a ~1 s weight sync."""
    rng = random.Random(seed)
    (logdir / "perf_tracer").mkdir(parents=True)
    (logdir / "session_tracer").mkdir(parents=True)
    for rank in range(RANKS):
        pid = 1000 + rank
        lines = list(meta_events(pid, rank, RANKS))
        recs: list[dict[str, Any]] = []
        for step in range(STEPS):
            t0 = T0 + step * 100.0
            end = t0
            for i in range(SESSIONS):
                g = rng.lognormvariate(0, 0.1) * 1.0 + generate_extra_s
                c = rng.lognormvariate(0, 0.1) * 0.2
                r = rng.lognormvariate(0, 0.1) * 0.1
                s = t0 + 0.001
                phases = {"generate": [(s, s + g, 0)], "toolcall": [(s + g, s + g + c, 0)],
                          "reward": [(s + g + c, s + g + c + r, 0)]}
                own = s + g + c + r
                end = max(end, own)
                recs.append(session_record(task_id=step * 100 + i // 4, session_id=step * 100 + i, rank=rank,
                                           step=step, status="accepted", reason=None, submit=s, phases=phases,
                                           final=own + 0.001))
            rollout = end + 0.01 - t0
            ppo = rng.gauss(5.0, 0.1)
            sync = rng.gauss(1.0, 0.05)
            lines += [x_event(pid, 1, t0, rollout, "train.rollout", args={"global_step": step}),
                      x_event(pid, 1, t0 + rollout, ppo, "train.ppo_update"),
                      x_event(pid, 1, t0 + rollout + ppo, sync, "train.weight_sync", "comm"),
                      x_event(pid, 1, t0, rollout + ppo + sync, "train.step", args={"rl.step": step})]
        (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").write_bytes(b"".join(lines))
        (logdir / "session_tracer" / f"sessions-r{rank}.jsonl").write_bytes(
            b"".join(orjson.dumps(x) + b"\n" for x in recs))


def diff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", "diff", *args], capture_output=True,
                          text=True, timeout=120)


def test_diff_names_the_planted_slowdown_and_nothing_else(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=1, generate_extra_s=0.0)
    write_run(tmp_path / "b", seed=2, generate_extra_s=0.5)
    proc = diff(str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "diff.json"))
    assert proc.returncode == 0, proc.stderr
    d = orjson.loads((tmp_path / "diff.json").read_bytes())
    changed = {r["quantity"] for r in d["changed"]}
    assert "session generate" in changed and "generate turn 0" in changed
    assert changed <= FOLLOWS_GENERATE, changed - FOLLOWS_GENERATE
    gen = next(r for r in d["changed"] if r["quantity"] == "session generate")
    assert gen["delta_s"] == pytest.approx(0.5, abs=0.05)
    assert d["step_time"]["changed"] and d["step_time"]["delta_s"] == pytest.approx(0.5, abs=0.1)
    unchanged = {r["quantity"] for r in d["unchanged"]}
    assert {"scope train.ppo_update", "scope train.weight_sync", "session toolcall",
            "session reward"} <= unchanged
    assert "what changed beyond the runs' step-to-step noise" in proc.stdout
    pattern = (r"\n  session generate: \d+\.\d ms -> 1\.5\d s "
               r"\(\+5\d\d\.\d ms, \+\d\d\.\d%, [\d.]+x its noise\)")
    assert re.search(pattern, proc.stdout), proc.stdout


def test_two_runs_with_the_same_behaviour_differ_in_nothing(tmp_path: Path) -> None:
    """Different noise, same distributions: nothing is named (the runs' own noise is not a change)."""
    write_run(tmp_path / "a", seed=1, generate_extra_s=0.0)
    write_run(tmp_path / "b", seed=3, generate_extra_s=0.0)
    proc = diff(str(tmp_path / "a"), str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert "nothing else changed beyond the runs' step-to-step noise" in proc.stdout
    assert "— within the runs' noise" in proc.stdout


def test_two_step_ranges_of_one_run_and_the_html_page(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=1, generate_extra_s=0.0)
    page = tmp_path / "diff.html"
    proc = diff(str(tmp_path / "a"), "--steps-a", "0:4", "--steps-b", "4:8", "-o", str(page))
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "a"
    assert f"A = {run} steps 0:4 (4 steps), B = {run} steps 4:8 (4 steps)" in proc.stdout
    html = page.read_text()
    assert "<h1>rltrace diff</h1>" in html and "session generate" in html


@pytest.mark.parametrize("args, message", [
    ((), "the following arguments are required: RUN_A"),
    (("RUN",), "give two runs (RUN_A RUN_B), or one run with --steps-a A:B and --steps-b C:D"),
    (("A", "B", "-o", "x.txt"), "-o x.txt: write .html or .json"),
])
def test_wrong_arguments_get_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    proc = diff(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_run_is_one_line(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=1, generate_extra_s=0.0)
    proc = diff(str(tmp_path / "a"), str(tmp_path / "nope"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("rltrace diff: ") and len(proc.stderr.strip().splitlines()) == 1
