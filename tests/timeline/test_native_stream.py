"""A rank's native trace written as the run goes (``exporters.native``): the same builder as
``rltrace convert``, fed the rank's Chrome lines at each export cycle; loadable mid-run and after
SIGKILL, checked with Perfetto's real trace processor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS, REPO, need, perfetto_check

import rltrace
from rltrace.config import ConfigError, current_user

sys.path.insert(0, str(HELPERS))
from step_loop import loop

need("perfetto", "the native trace needs the perfetto package: pip install 'rltrace[perfetto]'")

#: every slice as (track name, name, ts, dur, depth): what a user sees on the timeline
SLICES = """select t.name as track, s.name, s.ts, s.dur, s.depth from slice s
  join track t on s.track_id = t.id order by s.ts, s.name"""
SESSIONS = """select s.name, extract_arg(s.arg_set_id, 'debug.rl_session_id') as sid from slice s
  where s.category = 'rl.session' and extract_arg(s.arg_set_id, 'debug.rl_session_status') is not null"""
COUNTERS = ("select t.name, count(*) as n from counter c join counter_track t on c.track_id = t.id "
            "group by t.name")
FLOWS = "select count(*) as n from flow"


def test_the_ranks_native_trace_grows_as_the_run_goes_and_draws_what_convert_draws(tmp_path: Path) -> None:
    from rltrace.cli.convert import ConvertError, convert

    rltrace.configure(fileroot=str(tmp_path), experiment_name="n", trial_name="t", flush_at_exit=False,
                      session_tracer={"enabled": True}, exporters={"native": True})
    logdir = tmp_path / "logs" / current_user() / "n" / "t"
    native = logdir / "perf_tracer" / "traces-r0.pftrace"
    seen = []
    for step in range(3):
        loop(step)
        rltrace.save()  # an export cycle: what ended is on disk
        rep = perfetto_check(native, SESSIONS)
        assert rep["ok"] is True and rep["import_errors"] == []
        seen.append(len(rep["queries"][SESSIONS]))
    assert seen == [4, 8, 12]  # each step's sessions on disk by the end of that step
    diag = rltrace.diagnostics()["native"]
    assert diag["events"] > 0 and diag["errors"] == diag["skipped"] == 0 and diag["stopped"] is False
    rltrace.shutdown()
    streamed = perfetto_check(native, SLICES, COUNTERS, FLOWS)
    merged = convert([logdir], tmp_path / "merged.pftrace", progress=False)
    converted = perfetto_check(merged.output, SLICES, COUNTERS, FLOWS)
    assert streamed["ok"] is True and streamed["import_errors"] == []
    # one builder: the same tracks and slices as convert draws from the same rank's lines, but
    # for the instants where the arrows from the samples end in the train step that used them
    # (which need every rank's lines: convert draws them)
    rows = streamed["queries"][SLICES]
    merged_rows = converted["queries"][SLICES]
    consumed = [r for r in merged_rows if r["name"].startswith("consumed ")]
    assert len(consumed) == 3 and not any(r["name"].startswith("consumed ") for r in rows)
    assert len(rows) > 12 * 4 and rows == [r for r in merged_rows if r not in consumed]
    # counters are written when the rank's trace closes; the same as convert's
    counters = {r["name"]: r["n"] for r in streamed["queries"][COUNTERS]}
    assert counters == {r["name"]: r["n"] for r in converted["queries"][COUNTERS]}
    assert {"sessions in flight", "accepted in step", "rejected in step"} <= set(counters)
    # the task -> session arrows are the rank's own; the 9 accepted samples' arrows are convert's
    flows, merged_flows = streamed["queries"][FLOWS][0]["n"], converted["queries"][FLOWS][0]["n"]
    assert flows == 12 and merged_flows == 12 + 9
    # the ranks' native traces merge by naming them: convert reads the lines they were drawn from
    again = convert([native], tmp_path / "again.pftrace", progress=False)
    assert (again.sessions, again.flows) == (merged.sessions, merged.flows) == (12, 9)
    lone = tmp_path / "lone" / "traces-r3.pftrace"
    lone.parent.mkdir()
    lone.write_bytes(native.read_bytes())
    with pytest.raises(ConvertError, match=r"traces-r3.jsonl\) is not beside it"):
        convert([lone], tmp_path / "x.pftrace", progress=False)


KILLED = """
import sys, time, rltrace
sys.path.insert(0, sys.argv[2])
from step_loop import loop
rltrace.configure(fileroot=sys.argv[1], experiment_name="n", trial_name="kill", user="u",
                  session_tracer={"enabled": True}, exporters={"native": True}, flush_interval_s=60)
step, deadline = 0, time.monotonic() + 120  # the test kills it long before
while time.monotonic() < deadline:
    loop(step)
    rltrace.save()
    print(step, flush=True)
    step += 1
"""


def test_a_killed_ranks_native_trace_loads_with_every_step_saved_before_the_kill(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), str(HELPERS)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            restore_signals=True, start_new_session=True)
    saved = -1
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            saved = int(line)
            if saved >= 4:
                proc.send_signal(signal.SIGKILL)
                break
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL and saved >= 4
    rep = perfetto_check(tmp_path / "logs" / "u" / "n" / "kill" / "perf_tracer" / "traces-r0.pftrace",
                         SESSIONS)
    assert rep["ok"] is True
    sids = {r["sid"] for r in rep["queries"][SESSIONS]}
    assert set(range(4 * (saved + 1))) <= sids  # every session of every saved step


def test_a_long_runs_counters_stop_at_the_cap_and_say_so(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The counters' samples wait for the rank's end: a rank keeps those of its first
    ``exporters.native_counter_cap`` sessions (a million by default: about 50 MB), and the
    slices all the same."""
    rltrace.configure(fileroot=str(tmp_path), experiment_name="n", trial_name="cap", flush_at_exit=False,
                      session_tracer={"enabled": True},
                      exporters={"native": True, "native_counter_cap": 5})
    for step in range(3):
        loop(step)
    rltrace.shutdown()
    assert "hold the first 5 sessions" in caplog.text
    trace = tmp_path / "logs" / current_user() / "n" / "cap" / "perf_tracer" / "traces-r0.pftrace"
    rep = perfetto_check(trace, COUNTERS, SESSIONS)
    counters = {r["name"]: r["n"] for r in rep["queries"][COUNTERS]}
    assert counters["accepted in step"] + counters["rejected in step"] == 5
    assert len(rep["queries"][SESSIONS]) == 12


def test_native_needs_the_chrome_lines_it_is_drawn_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'exporters.native': is drawn from the Chrome lines"):
        rltrace.configure(fileroot=str(tmp_path), exporters={"native": True, "chrome": False})


def test_a_native_trace_path_planted_as_a_link_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    folder = tmp_path / "logs" / current_user() / "n" / "link" / "perf_tracer"
    folder.mkdir(parents=True)
    (folder / "traces-r0.pftrace").symlink_to(target)
    rltrace.configure(fileroot=str(tmp_path), experiment_name="n", trial_name="link", flush_at_exit=False,
                      session_tracer={"enabled": True}, exporters={"native": True})
    loop(0)
    rltrace.flush()  # the lines are exported: the native trace meets the link
    assert rltrace.diagnostics()["native"]["stopped"] is True  # with a warning; tracing goes on
    rltrace.shutdown()
    assert target.read_bytes() == b"keep"
    assert (folder / "traces-r0.jsonl").stat().st_size > 0
