"""``rltrace top`` and ``rltrace report`` give the same P50 for the same sessions.

Both use :mod:`rltrace.accounting.quantiles` (linear interpolation between the closest ranks, numpy's
default).  The report has every duration; top only the live file's 19%-wide buckets, so the
sessions here last exactly the middle of distinct buckets (where top's estimate of each value is
exact) and the two must agree; for arbitrary durations top is within a bucket of the report.

The same sessions reach both: their records are written to ``session_tracer/`` (what the report
reads) and handed to a real :class:`rltrace.pipeline.live_state.LivePublisher` (what writes ``live/``, which
top reads).  Each session is submitted at its step's rollout start and finalized at its own end,
so the report's completion time is top's duration (submit to finalize).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

np = pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("rich", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")

import orjson  # noqa: E402

sys.path.insert(0, str(HELPERS))
from synth_run import meta_events, session_record, x_event  # noqa: E402

from rltrace.accounting.quantiles import DEFINITION, quantile  # noqa: E402
from rltrace.analysis import ReportOptions, build_report, load_run  # noqa: E402
from rltrace.cli import top  # noqa: E402
from rltrace.pipeline.live_state import LivePublisher  # noqa: E402
from rltrace.sessions import SessionRegistry  # noqa: E402

START = 1000.0  # small epoch seconds: (START + d) - START == d to ~1e-13


class Feed:
    """What LivePublisher listens to: a session processor's listeners and session count."""

    def __init__(self) -> None:
        self.listeners: list[Any] = []
        self.sessions = 0

    def finish(self, rec: dict[str, Any]) -> None:
        self.sessions += 1
        for listen in self.listeners:
            listen(rec)


def write_sessions(logdir: Path, durations: list[float]) -> None:
    """One rank, step 0: a session per duration, and the live file of the same sessions."""
    (logdir / "session_tracer").mkdir(parents=True)
    (logdir / "perf_tracer").mkdir(parents=True)
    feed = Feed()
    pub = LivePublisher(logdir / "live" / "live-r0.json", interval_s=1.0, session_processor=feed, rank=0,
                        world_size=1, registry=SessionRegistry())
    lines = []
    for i, d in enumerate(durations):
        rec = session_record(task_id=i, session_id=i, rank=0, step=0, status="accepted", reason=None,
                             submit=START, phases={"generate": [(START, START + d, 0)]}, final=START + d)
        lines.append(orjson.dumps(rec) + b"\n")
        feed.finish(rec)
    pub.close()
    (logdir / "session_tracer" / "sessions-r0.jsonl").write_bytes(b"".join(lines))
    longest = max(durations)
    (logdir / "perf_tracer" / "traces-r0.jsonl").write_bytes(b"".join([
        *meta_events(100, 0, 1),
        x_event(100, 1, START, longest + 0.5, "train.rollout", args={"global_step": 0}),
        x_event(100, 1, START, longest + 1.0, "train.step", args={"rl.step": 0}),
    ]))


def report_p50(logdir: Path) -> float:
    rep = build_report(load_run(logdir, ReportOptions(progress=False)))
    (row,) = rep["longtail"]["per_step"]
    p50: float = row["p50_s"]
    return p50


def top_row(logdir: Path) -> Any:
    """Step 0 as top merges it from the live files (what its long-tail table shows)."""
    (row,) = top._merge_steps(top.read_states(top.find_live_files(logdir)))
    return row


def top_screen_p50(logdir: Path) -> str:
    """The p50 cell of step 0 in ``rltrace top LOGDIR --once``'s long-tail table."""
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "top", str(logdir), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert DEFINITION in re.sub(r"\s+", " ", text)  # top says which P50 it shows
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[:4] == ["step", "done", "flight", "p50"])
    row = next(ln.split() for ln in lines[at + 1:] if ln.split() and ln.split()[0] == "0")
    return row[3]


def middles(buckets: list[int]) -> list[float]:
    """The middle of each live histogram bucket."""
    return [sum(top.bucket_bounds(b)) / 2 for b in buckets]


@pytest.mark.parametrize("buckets", [[36, 40, 43, 47, 50, 52, 58], [36, 40, 43, 47, 50, 52, 58, 61],
                                     [44, 44, 44, 45, 70]], ids=["odd", "even", "shared bucket"])
def test_top_and_report_give_the_same_p50_for_the_same_sessions(tmp_path: Path, buckets: list[int]) -> None:
    durations = middles(buckets)
    if buckets == [44, 44, 44, 45, 70]:  # three in one bucket: evenly spread within it
        lo, hi = top.bucket_bounds(44)
        durations = [lo + (hi - lo) * (j + 0.5) / 3 for j in range(3)] + durations[3:]
    write_sessions(tmp_path, durations)
    want = statistics.median(durations)
    rep = report_p50(tmp_path)
    row = top_row(tmp_path)
    assert row.done == len(durations)
    shown = top._quantile(row.hist, 0.5, row.max_s)
    assert rep == pytest.approx(want, rel=1e-12)
    assert shown == pytest.approx(rep, rel=1e-9)
    assert top_screen_p50(tmp_path) == top._fmt_s(rep)


def test_for_any_durations_top_is_within_a_bucket_of_the_report(tmp_path: Path) -> None:
    durations = np.random.default_rng(7).lognormal(np.log(2.0), 0.8, size=301).tolist()
    write_sessions(tmp_path, durations)
    rep = report_p50(tmp_path)
    assert rep == pytest.approx(quantile(sorted(durations), 0.5), rel=1e-9)
    row = top_row(tmp_path)
    for q in (0.5, 0.9, 0.99):
        exact = quantile(sorted(durations), q)
        shown = top._quantile(row.hist, q, row.max_s)
        assert shown is not None and abs(np.log(shown / exact)) < np.log(2) / 4, (q, shown, exact)


def test_one_quantile_definition_is_numpys_and_statistics_inclusive() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 101, 1000):
        v = np.sort(rng.lognormal(0.0, 1.0, size=n))
        for p in (0.0, 1.0, 12.5, 50.0, 80.0, 90.0, 99.0, 99.9, 100.0):
            assert quantile(v, p / 100) == np.percentile(v, p)  # to the last bit
        if n > 1:
            inclusive = statistics.quantiles(v.tolist(), n=100, method="inclusive")
            np.testing.assert_allclose([quantile(v, k / 100) for k in range(1, 100)], inclusive, rtol=1e-12)
