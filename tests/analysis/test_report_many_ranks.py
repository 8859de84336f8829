"""Many ranks: past 64 ranks the HTML report draws the slowest ranks and a distribution.

A 2,000-rank run (one step of 2 sessions per rank) reports with a stragglers heatmap of bounded
height (the 24 slowest ranks, quantile bands over all ranks, the barrier wait) and a per-rank
table of the slowest and fastest ranks plus one line for the rest.  Timings are in
``benchmarks/bench_report_ranks.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import HELPERS

pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import SynthSpec, write_run

from rltrace.analysis import report

RANKS = 2000


@pytest.mark.timeout(120)
def test_html_report_of_2000_ranks_aggregates_per_rank_views(tmp_path: Path) -> None:
    from matplotlib.image import imread

    write_run(tmp_path / "run", SynthSpec(ranks=RANKS, steps=1, sessions_per_step=2, samples_per_task=2,
                                          straggler_step=0, slow_reward_step=0, truth=False))
    rep, files = report(tmp_path / "run", tmp_path / "out" / "report.html")
    html = files[0].read_text()
    png = imread(tmp_path / "out" / "report-stragglers.png")
    assert png.shape[0] < 1400, png.shape  # one row per rank would be ~50,000 px
    assert f"the 24 slowest of {RANKS:,} ranks" in html  # the plot's caption says what it shows
    assert f"distribution over all {RANKS:,} ranks per step" in html
    assert f"… and {RANKS - 25:,} more ranks within" in html  # 20 slowest + 5 fastest rows
    assert html.count("<tr><td>") < 400  # no row per rank anywhere
    assert f"{RANKS:,} ranks: min" in html  # wall time per rank summarized
    assert "<tr><td>2</td><td>1</td>" in html  # the planted straggler (rank 2) is among the rows shown
    assert rep["stragglers"]["per_rank"][RANKS - 1]["rank"] == RANKS - 1  # the JSON keeps every rank
