"""Rank start skew is no step time, and one rank is no straggler against itself (issue 41, items 1-2).

Real multi-rank runs: each rank is its own process running rltrace's API
(``tests/helpers/skew_rank.py``) with an injected clock, so a planted start offset (rank 0
launched 2.46 s after rank 1) is exact and no test sleeps.  The ranks never wait on each other,
as in ``rltrace demo``: the same run with and without the offset must give the same step lengths
in the report's critical path and nothing changed in ``rltrace diff``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS

pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="rltrace diff needs the analysis extra")

from rltrace.analysis import ReportOptions, build_report, load_run
from rltrace.config import current_user

SKEW_S = 2.46
WORKER = HELPERS / "skew_rank.py"


def _env() -> dict[str, str]:
    """This environment without the caller's rank, OTLP or rltrace settings."""
    return {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and not k.startswith(("OTEL_", "RLTRACE_"))}


def run_ranks(root: Path, experiment: str, offsets: list[float], slow_step: int | None = None) -> Path:
    """Run one ``skew_rank.py`` process per offset (rank i starts ``offsets[i]`` s late), at once."""
    extra = [] if slow_step is None else [str(slow_step)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(root), experiment, str(rank),
                               str(len(offsets)), str(off), *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
             for rank, off in enumerate(offsets)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    return root / "logs" / current_user() / experiment / "trial0"


def report(logdir: Path) -> dict[str, Any]:
    rep: dict[str, Any] = build_report(load_run(logdir, ReportOptions(progress=False)))
    return rep


def step_scopes(logdir: Path) -> dict[tuple[int, int], float]:
    """(rank, step) -> seconds of that rank's ``train.step`` scope, read from its trace file."""
    out: dict[tuple[int, int], float] = {}
    for f in sorted(logdir.rglob("traces-r*.jsonl")):
        for line in f.read_bytes().splitlines():
            ev = orjson.loads(line)
            if ev.get("name") == "train.step" and ev.get("ph") == "X":
                out[(ev["args"]["rank"], ev["args"]["rl.step"])] = ev["dur"] / 1e6
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("skew")
    return {"aligned": run_ranks(root, "aligned", [0.0, 0.0]),
            "skewed": run_ranks(root, "skewed", [SKEW_S, 0.0])}


def test_a_planted_rank_start_skew_changes_no_step_length(runs: dict[str, Path]) -> None:
    aligned, skewed = report(runs["aligned"]), report(runs["skewed"])
    scopes = step_scopes(runs["skewed"])
    assert scopes == step_scopes(runs["aligned"])  # the same work, only started at another time
    steps = {st["step"]: st for st in skewed["critical_path"]["steps"]}
    assert sorted(steps) == [0, 1, 2, 3]
    for n, st in steps.items():
        longest = max(v for (_, s), v in scopes.items() if s == n)
        # the longest rank's own step, never rank 1's start to rank 0's end (2.46 s + a step)
        assert st["length_s"] == pytest.approx(longest, abs=1e-6)
        assert st["length_s"] < SKEW_S
        assert scopes[(st["ended_by_rank"], n)] == pytest.approx(longest, abs=1e-6)
        for link in st["links"]:  # link starts within the step, on the rank's own clock
            if link["kind"] == "scope":
                assert 0.0 <= link["start_s"] < st["length_s"]
    assert [(s["step"], round(s["length_s"], 6), s["ended_by_rank"], round(s["what_if_s"], 6))
            for s in skewed["critical_path"]["steps"]] == [
        (s["step"], round(s["length_s"], 6), s["ended_by_rank"], round(s["what_if_s"], 6))
        for s in aligned["critical_path"]["steps"]]


def test_rltrace_diff_of_the_same_run_with_and_without_the_skew_finds_no_change(
        runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "diff.json"
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "diff", str(runs["aligned"]),
                           str(runs["skewed"]), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    d = orjson.loads(out.read_bytes())
    st = d["step_time"]
    assert st is not None and st["changed"] is False
    assert st["delta_s"] == pytest.approx(0.0, abs=1e-6)
    assert st["a_mean_s"] < SKEW_S
    assert d["changed"] == [], [r["quantity"] for r in d["changed"]]


def test_a_one_rank_run_flags_no_straggler_against_itself(tmp_path: Path) -> None:
    # step 2's generate phases take three times as long: a slow step, but no other rank was faster
    logdir = run_ranks(tmp_path, "one", [0.0], slow_step=2)
    rep = report(logdir)
    sg = rep["stragglers"]
    assert sg["ranks"] == [0]
    rollouts = [r["rollout_s"]["0"] for r in sg["per_step"]]
    assert max(rollouts) > 2 * min(rollouts)  # the slow step is there to be (wrongly) flagged
    assert sg["outliers"] == []
    assert [f for f in rep["findings"] if f["kind"] in ("straggler", "barrier")] == []
    assert sg["total_barrier_wait_s"] == 0.0


def test_a_one_rank_run_draws_no_barrier_wait_and_says_why(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
    from rltrace.analysis.plots import ONE_RANK_CAPTION, plot_stragglers, write_plots

    rep = report(run_ranks(tmp_path, "one", [0.0], slow_step=2))
    fig = plot_stragglers(rep)
    assert fig is not None
    (ax,) = fig.axes  # the rollout per step only: no heatmap of ratios of 1, no empty wait bars
    assert "no straggler or barrier wait" in ax.get_title()
    assert not any("barrier" in a.get_ylabel() for a in fig.axes)
    plots = {p.key: p for p in write_plots(rep, tmp_path / "plots", "report")}
    assert plots["stragglers"].caption == ONE_RANK_CAPTION and plots["stragglers"].path.stat().st_size > 0


def test_two_ranks_still_get_the_ratio_heatmap_and_barrier_wait(runs: dict[str, Path]) -> None:
    pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
    from rltrace.analysis.plots import plot_stragglers

    fig = plot_stragglers(report(runs["skewed"]))
    assert fig is not None
    assert any("barrier wait" in a.get_ylabel() for a in fig.axes)
