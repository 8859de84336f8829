"""``rltrace demo``: a real multi-process run, end to end, from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import perfetto_check

from rltrace.config import current_user

RANKS, STEPS, TASKS, SAMPLES = 2, 2, 3, 2
Demo = tuple[subprocess.CompletedProcess[str], Path]
SLICE_COUNTS = "select name, count(*) as n from slice group by name"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """Run the demo once for the module; return the finished process and its log dir."""
    root = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "rltrace.cli", "demo", "--fileroot", str(root), "--ranks", str(RANKS),
         "--steps", str(STEPS), "--tasks", str(TASKS), "--samples", str(SAMPLES)],
        capture_output=True, text=True, timeout=120, cwd=root,
    )
    return proc, root / "logs" / current_user() / "demo" / "trial0"


def test_demo_exits_0_and_writes_config_rank_traces_and_merged_trace(demo: Demo) -> None:
    proc, logdir = demo
    assert proc.returncode == 0, proc.stderr
    assert (logdir / "config.yaml").is_file()
    for rank in range(RANKS):
        assert (logdir / "perf_tracer" / "actor" / f"traces-r{rank}.jsonl").is_file()  # role folder
    assert (logdir / "trace.json").is_file()
    assert f"merged trace: {logdir / 'trace.json'}" in proc.stdout


def test_demo_trace_files_hold_only_complete_json_lines(demo: Demo) -> None:
    proc, logdir = demo
    assert proc.returncode == 0, proc.stderr
    for rank in range(RANKS):
        data = (logdir / "perf_tracer" / "actor" / f"traces-r{rank}.jsonl").read_bytes()
        assert data.endswith(b"\n")
        lines = data.splitlines()
        assert len(lines) > 10
        for lineno, line in enumerate(lines, 1):
            ev = orjson.loads(line)  # raises on a broken line
            assert isinstance(ev, dict) and "ph" in ev, f"r{rank}:{lineno}: {line!r}"


def _session_records(logdir: Path) -> list[dict]:
    out = []
    for rank in range(RANKS):
        path = logdir / "session_tracer" / "actor" / f"sessions-r{rank}.jsonl"
        out.extend(orjson.loads(line) for line in path.read_bytes().splitlines())
    return out


def test_demo_writes_one_session_record_per_sample_with_statuses_and_phases(demo: Demo) -> None:
    proc, logdir = demo
    assert proc.returncode == 0, proc.stderr
    records = _session_records(logdir)
    assert len(records) == RANKS * STEPS * TASKS * SAMPLES
    assert len({(r["rank"], r["session_id"]) for r in records}) == len(records)
    for r in records:
        assert r["status"] in ("accepted", "rejected", "failed"), r
        assert r["step"] in range(STEPS)
        assert r["generate_s"] > 0 and r["turns"] >= 1
        assert (r["reason"] is None) == (r["status"] == "accepted"), r
        for execs in r["phases"].values():
            assert all(e["end_ts"] >= e["start_ts"] for e in execs)
    summary = proc.stdout
    assert f"sessions: {len(records)}" in summary
    assert "slowest sessions:" in summary


@pytest.mark.perfetto
def test_demo_merged_trace_loads_in_perfetto_with_every_scope(demo: Demo) -> None:
    proc, logdir = demo
    assert proc.returncode == 0, proc.stderr
    report = perfetto_check(logdir / "trace.json", SLICE_COUNTS)
    assert report["load_error"] is None
    assert report["import_errors"] == []
    assert report["ok"] is True
    assert report["processes"] == RANKS
    counts = {r["name"]: r["n"] for r in report["queries"][SLICE_COUNTS]}
    steps = RANKS * STEPS
    records = _session_records(logdir)
    expected = {"train.step": steps, "train.rollout": steps, "train.ppo_update": steps,
                "train.weight_sync": steps, "rollout.arun_episode": steps * TASKS,
                "rl.task": steps * TASKS, "rl.session": len(records)}
    for phase in ("generate", "toolcall", "reward"):
        expected[phase] = sum(len(r["phases"].get(phase, [])) for r in records)
    for name, n in expected.items():
        assert counts.get(name, 0) == n, (name, counts)


def test_demo_prints_goodput_tokens_and_staleness_and_top_shows_them(demo: Demo) -> None:
    """The summary's goodput line adds up to 100%; its token and thrown-away figures, and top's,
    are the session records' own."""
    import re

    proc, logdir = demo
    out = proc.stdout
    m = re.search(r"goodput \(step time of all ranks\): productive ([\d.]+)%, overhead ([\d.]+)%, "
                  r"idle ([\d.]+)%, wasted ([\d.]+)%", out)
    assert m is not None, out
    assert abs(sum(map(float, m.groups())) - 100.0) < 0.3
    records = _session_records(logdir)
    generated = sum(r["output_tokens"] for r in records)
    wasted = sum(r["output_tokens"] for r in records if r["status"] in ("rejected", "failed"))
    assert f"{100 * wasted / generated:.1f}% of generated tokens thrown away" in out
    assert "trained samples' policy version lag: 0 for 100.0%" in out  # a synchronous loop
    top = subprocess.run([sys.executable, "-m", "rltrace.cli", "top", str(logdir), "--once"],
                         capture_output=True, text=True, timeout=60)
    assert top.returncode == 0, top.stderr
    phase = lambda r: sum(r[p + "_s"] for p in r["phase_counts"])  # noqa: E731
    thrown = sum(phase(r) for r in records if r["status"] in ("rejected", "failed"))
    line = " ".join(top.stdout.split())  # rich may wrap the line
    assert (f"goodput: thrown away {100 * thrown / sum(map(phase, records)):.1f}% of phase time, "
            f"{100 * wasted / generated:.1f}% of tokens") in line, top.stdout
    assert "policy version lag at finalize: 0 for 100.0%" in line  # synchronous: finalized before the sync
