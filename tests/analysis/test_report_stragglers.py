"""Stragglers judged against the run's own noise: a few percent in a noisy run is no finding, a
clear straggler still is.

Trace-only runs (``write_rollout_run``): 4 ranks x 12 steps of rollout times around 20 s with 5%
noise per (rank, step) and 10% per step (every rank of a step slower or faster together).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

np = pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import write_rollout_run  # noqa: E402

from rltrace.analysis import ReportOptions, build_report, load_run  # noqa: E402

RANKS, STEPS = 4, 12


def noisy(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return (20.0 * rng.lognormal(0.0, 0.05, size=(RANKS, STEPS))
            * rng.lognormal(0.0, 0.10, size=(1, STEPS)))


def analyse(tmp_path: Path, m: Any) -> dict[str, Any]:
    write_rollout_run(tmp_path / "run", m)
    rep: dict[str, Any] = build_report(load_run(tmp_path / "run", ReportOptions(progress=False)))
    return rep


def straggler_findings(rep: dict[str, Any]) -> list[str]:
    return [f["text"] for f in rep["findings"] if f["kind"] == "straggler"]


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_a_rank_3_percent_slower_in_a_noisy_run_is_no_straggler(tmp_path: Path, seed: int) -> None:
    m = noisy(seed)
    m[2] *= 1.03
    rep = analyse(tmp_path, m)
    sg = rep["stragglers"]
    assert sg["noise"]["excess_spread"] > 0.03  # the run varies more than the planted difference
    assert sg["outliers"] == []
    assert straggler_findings(rep) == []


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_a_4x_straggler_in_the_same_noisy_run_is_still_found(tmp_path: Path, seed: int) -> None:
    m = noisy(seed)
    m[2] *= 1.03
    m[1, 5] *= 4.0
    rep = analyse(tmp_path, m)
    assert [(o["step"], o["rank"]) for o in rep["stragglers"]["outliers"]] == [(5, 1)]
    (text,) = straggler_findings(rep)
    assert text.startswith("Step 5: rank 1 rollout took")


def test_a_rank_slower_in_every_step_beyond_the_noise_is_named(tmp_path: Path) -> None:
    m = noisy(0)
    m[3] *= 1.6
    rep = analyse(tmp_path, m)
    texts = straggler_findings(rep)
    assert any(t.startswith("Rank 3 is the slowest rank in 12 of 12 steps") for t in texts), texts
    assert {o["rank"] for o in rep["stragglers"]["outliers"]} == {3}


def test_a_whole_slow_step_is_no_straggler(tmp_path: Path) -> None:
    """Every rank 3x slower in step 4 (a slow batch): above median + k * MAD over the run, but no
    rank is slower than its step's others."""
    m = noisy(1)
    m[:, 4] *= 3.0
    rep = analyse(tmp_path, m)
    assert rep["stragglers"]["outliers"] == []
    assert straggler_findings(rep) == []
