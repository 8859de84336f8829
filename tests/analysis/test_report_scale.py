"""Scale: a 4-rank x 250k-session run (~0.7 GB of JSONL) reports in bounded memory.

The report runs in a child process whose peak RSS (``os.wait4``) is compared with the same
command on a tiny run: the difference must stay far below the data size (the reader keeps ~50
bytes of numpy columns per session and aggregates everything else while streaming).
``benchmarks/bench_report.py`` times the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS

pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import SynthSpec, write_run

RANKS, STEPS, PER_STEP = 4, 10, 25_000  # 250k sessions per rank


def report_peak_rss(logdir: Path, out: Path) -> tuple[int, int, str]:
    """Run ``rltrace report`` in a child; return (exit code, peak RSS bytes, stdout)."""
    log = out.with_suffix(".log")
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "rltrace.cli", "report", str(logdir), "-o", str(out),
                                 "--no-progress"], stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, log.read_text()


@pytest.mark.timeout(300)
def test_million_sessions_report_in_bounded_memory(tmp_path: Path) -> None:
    big = tmp_path / "big"
    truth = write_run(big, SynthSpec(ranks=RANKS, steps=STEPS, sessions_per_step=PER_STEP, truth=False))
    small = tmp_path / "small"
    write_run(small, SynthSpec(ranks=RANKS, steps=2, sessions_per_step=16, truth=False))
    rc, base_rss, out = report_peak_rss(small, tmp_path / "small.html")
    assert rc == 0, out
    rc, rss, out = report_peak_rss(big, tmp_path / "big.html")
    assert rc == 0, out
    sessions = RANKS * STEPS * PER_STEP
    assert f"rltrace report: {sessions} sessions, {RANKS} rank(s), {STEPS} step(s)" in out
    assert "Step 3: rank 2 rollout took" in out  # the planted straggler is still found
    grown = rss - base_rss
    print(f"data {truth.bytes_written / 1e6:.0f} MB, peak RSS {rss / 1e6:.0f} MB "
          f"(tiny run {base_rss / 1e6:.0f} MB): {grown / sessions:.0f} B/session")
    assert grown < truth.bytes_written / 4, (rss, base_rss, truth.bytes_written)
    assert grown / sessions < 250  # compact columns, not records
    assert len(list(tmp_path.glob("big-*.png"))) == 11  # 8 + the 3 slowest groups' timelines
