"""Exit paths and crashes of a real traced process (issue 8, items 1 and 2).

Each test runs ``tests/helpers/exit_workload.py`` in a subprocess: spans and sessions are recorded
with nothing flushed yet (hour-long flush interval), some sessions are left open with a phase
running, and the process then leaves by a normal exit, ``sys.exit``, an unhandled exception,
SIGTERM, SIGINT or SIGKILL.  The test counts what is on disk afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS

from rltrace.testing import read_jsonl

HELPER = HELPERS / "exit_workload.py"
SPANS, DONE, OPEN = 300, 40, 3


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _start(tmp_path: Path, mode: str, *counts: int) -> subprocess.Popen[str]:
    """Start the helper; its stderr goes to ``stderr.txt`` (a full pipe would block it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with open(tmp_path / "stderr.txt", "w") as err:
        return subprocess.Popen([sys.executable, str(HELPER), str(tmp_path), mode, *map(str, counts)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                env=_env())


def _stderr(tmp_path: Path) -> str:
    return (tmp_path / "stderr.txt").read_text()


def _wait_ready(proc: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    """Wait (bounded) for the helper's JSON line and its ``ready`` line on stdout."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            lines.put(line)
            if line.strip() == "ready":
                return
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    info: dict[str, Any] = {}
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            proc.kill()
            raise AssertionError(f"no 'ready' from the helper within {timeout:g}s") from None
        if not line:
            proc.wait(timeout=30)
            raise AssertionError(f"helper ended (rc {proc.returncode}) before 'ready'")
        if line.startswith("{"):
            info = json.loads(line)
        elif line.strip() == "ready":
            return info


#: every line of a JSONL file; each one (blank ones too) must parse
_lines = functools.partial(read_jsonl, strict=True)


def _check_everything_ended_is_on_disk(info: dict[str, Any]) -> None:
    log_dir = Path(info["log_dir"])
    events = _lines(log_dir / "perf_tracer" / "traces-r0.jsonl")
    work = [e["name"] for e in events if e.get("ph") == "X" and e["name"].startswith("work.")]
    assert sorted(work) == sorted(f"work.{i}" for i in range(SPANS)), "spans lost or duplicated"
    assert any(e.get("ph") == "M" and e["name"] == "process_name" for e in events)
    records = _lines(log_dir / "session_tracer" / "sessions-r0.jsonl")
    by_id = {r["session_id"]: r for r in records}
    assert len(records) == len(by_id) == DONE + OPEN, "session records lost or duplicated"
    for sid in info["done"]:
        rec = by_id[sid]
        assert rec["status"] == "accepted"
        assert rec["phase_counts"] == {"generate": 1, "toolcall": 1, "reward": 1}
        assert not any(p.get("interrupted") for ps in rec["phases"].values() for p in ps)
    for sid in info["open"]:
        rec = by_id[sid]
        assert rec["status"] in ("pending", "dropped")
        (toolcall,) = rec["phases"]["toolcall"]
        assert toolcall["end_ts"] is not None and toolcall["interrupted"] is True
        assert toolcall["end_ts"] <= rec["finalized_ts"]
        assert rec["phases"]["generate"][0].get("interrupted") is None


@pytest.mark.parametrize(("mode", "returncode"), [("normal", 0), ("sys_exit", 3), ("exception", 1)])
def test_unflushed_spans_and_sessions_reach_disk_on_normal_exit_sys_exit_and_unhandled_exception(
    tmp_path: Path, mode: str, returncode: int
) -> None:
    proc = _start(tmp_path, mode, SPANS, DONE, OPEN)
    info = _wait_ready(proc)
    proc.communicate(timeout=60)
    err = _stderr(tmp_path)
    assert proc.returncode == returncode, err
    if mode == "exception":
        assert "boom: unhandled in the training loop" in err  # the user's traceback is intact
    _check_everything_ended_is_on_disk(info)


@pytest.mark.parametrize("wait", ["wait", "compute"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_a_running_process_flushes_ended_spans_and_closes_open_sessions(
    tmp_path: Path, sig: signal.Signals, wait: str
) -> None:
    proc = _start(tmp_path, wait, SPANS, DONE, OPEN)
    info = _wait_ready(proc)  # every span/session above ended before the signal
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    # SIGTERM: rltrace flushes, then the default action still terminates the process
    assert proc.returncode == -sig, (proc.returncode, _stderr(tmp_path))
    _check_everything_ended_is_on_disk(info)


def test_sigterm_while_rltrace_code_runs_on_the_main_thread_still_terminates_promptly(
    tmp_path: Path,
) -> None:
    procs = [_start(tmp_path / str(i), "busy") for i in range(10)]
    try:
        for p in procs:
            _wait_ready(p)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        hung = []
        deadline = time.monotonic() + 12  # a flush at SIGTERM takes well under a second here
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(i)
        assert not hung, f"{len(hung)} of {len(procs)} processes ignored SIGTERM (deadlocked)"
        assert all(p.returncode == -signal.SIGTERM for p in procs), [p.returncode for p in procs]
        for i in range(len(procs)):
            for f in (tmp_path / str(i)).rglob("*.jsonl"):
                _lines(f)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)


def test_os_exit_in_a_forked_child_after_flush_keeps_the_childs_spans_and_sessions(tmp_path: Path) -> None:
    code = f"""
import os, sys, rltrace
sys.path.insert(0, {str(HELPER.parent)!r})
from exit_workload import record
rltrace.configure(fileroot={str(tmp_path)!r}, rank=0, world_size=1, flush_interval_s=3600,
                  session_tracer={{"enabled": True, "flush_threshold": 100000}})
pid = os.fork()
if pid == 0:
    done, open_ = record(50, 7, 2)
    rltrace.flush()
    os._exit(0)  # no atexit, no finalizers: only what flush() wrote survives
_, status = os.waitpid(pid, 0)
print(pid, status)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=_env())
    assert proc.returncode == 0, proc.stderr
    child_pid, status = map(int, proc.stdout.split())
    assert status == 0
    log_dir = tmp_path / "logs"
    (traces,) = log_dir.rglob(f"traces-r0-p{child_pid}.jsonl")
    names = [e["name"] for e in _lines(traces) if e.get("ph") == "X"]
    assert sorted(n for n in names if n.startswith("work.")) == sorted(f"work.{i}" for i in range(50))
    (sessions_file,) = log_dir.rglob(f"sessions-r0-p{child_pid}.jsonl")
    records = _lines(sessions_file)
    # flush() writes finished sessions; the two still open stay open (os._exit skips shutdown)
    assert len(records) == 7 and {r["status"] for r in records} == {"accepted"}


# ---- crash safety ------------------------------------------------------------------------------


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", *args], capture_output=True, text=True,
                          timeout=120, env=_env())


def _report_available() -> bool:
    from rltrace import cli

    try:
        cli.build_parser().parse_args(["report", "x"])
    except SystemExit:
        return False
    try:
        import rltrace.analysis  # noqa: F401
    except ImportError:
        return False
    return True


def test_sigkill_mid_run_leaves_only_valid_lines_and_tools_report_a_truncated_last_line(
    tmp_path: Path,
) -> None:
    proc = _start(tmp_path, "stream")
    info = _wait_ready(proc)  # the child is writing both files every 10 ms
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    log_dir = Path(info["log_dir"])
    traces = log_dir / "perf_tracer" / "traces-r0.jsonl"
    sessions_file = log_dir / "session_tracer" / "sessions-r0.jsonl"
    for path in (traces, sessions_file):
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # a line cut by the kill itself is allowed
        parsed = [orjson.loads(x) for x in complete.splitlines()]  # every complete line is valid
        assert len(parsed) > 10, f"{path}: too little written before the kill"
    # A crash can cut the last line anywhere: cut both files mid-line, as a kill during write() does
    for path in (traces, sessions_file):
        data = path.read_bytes().rstrip(b"\n")
        cut = data.rfind(b"\n") + 1 + 7
        path.write_bytes(data[:cut])
    res = _run_cli("convert", str(log_dir), "-o", str(tmp_path / "merged.json"))
    assert res.returncode == 0, res.stderr
    assert "truncated last line" in res.stdout + res.stderr
    merged = orjson.loads((tmp_path / "merged.json").read_bytes())
    assert sum(e.get("ph") == "X" for e in merged["traceEvents"]) > 100
    if not _report_available():
        pytest.skip("rltrace report (rltrace.analysis) is not available here; convert checked")
    res = _run_cli("report", str(log_dir), "-o", str(tmp_path / "report.json"), "--format", "json")
    assert res.returncode == 0, res.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["inputs"]["skipped_lines"] == 2, rep["inputs"]
    assert all("truncated last line" in m for m in rep["inputs"]["skipped"])
    assert "truncated last line" in res.stdout + res.stderr  # and it says so
