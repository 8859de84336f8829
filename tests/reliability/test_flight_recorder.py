"""The flight recorder: after SIGKILL (an OOM kill, a watchdog's kill -9), every session that was
finalized before the kill is restored, by ``rltrace recover`` or by the next start on the log dir.

The sweep kills a real training loop at seeded random moments, with and without ``save()`` every
step.  The child says each session it finalized (after ``mark_finalized`` returned) on its
stdout; everything it said must be in the records file afterwards, exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

import rltrace
from rltrace.sessions import flight

LOOP = """
import sys, time, rltrace
fileroot, save = sys.argv[1], sys.argv[2] == "save"
step = int(sys.argv[3]) if len(sys.argv) > 3 else 0  # the first step: tells attempts apart
deadline = time.monotonic() + 120  # its own: it ends even if the test never kills it
rltrace.configure(fileroot=fileroot, experiment_name="kill", trial_name="t0", user="u",
                  session_tracer={"enabled": True}, flush_interval_s=0.2)
while time.monotonic() < deadline:
    with rltrace.step(step):
        task = rltrace.register_task()
        for _ in range(4):
            sid = rltrace.register_session(task)
            with rltrace.trace_session_phase("generate", session_id=sid,
                                             end_payload={"output_tokens": 7}):
                pass
            if sid % 3 == 0:
                h = rltrace.trace_session_event("mark_reward_start", session_id=sid)
            rltrace.trace_session_event("mark_finalized", session_id=sid,
                                        status="rejected" if sid % 5 == 0 else "accepted",
                                        reason="stale" if sid % 5 == 0 else None)
            print(sid, flush=True)
    if save:
        rltrace.save(step=step)
    step += 1
"""


def _records(logdir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted(logdir.rglob("sessions-*.jsonl")):
        for line in f.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _run_and_kill(root: Path, save: bool, after: int, first_step: int = 0) -> set[int]:
    """The loop, SIGKILLed once it said ``after`` sessions; the ids it said."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(root), "save" if save else "plain",
                             str(first_step)],
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    said: set[int] = set()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            said.add(int(line))
            if len(said) >= after:
                proc.send_signal(signal.SIGKILL)
                break
        rest = proc.communicate(timeout=60)[0]  # what it said before the kill landed
        said.update(int(x) for x in rest.split())
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return said


@pytest.mark.parametrize("save", [True, False], ids=["save-every-step", "no-save"])
def test_a_sigkill_sweep_loses_no_finished_session(tmp_path: Path, save: bool) -> None:
    rng = random.Random(30 + save)
    for kill in range(11):  # 22 kills in all, over both variants
        root = tmp_path / f"k{kill}"
        said = _run_and_kill(root, save, after=rng.randrange(1, 3000))
        logdir = root / "logs" / "u" / "kill" / "t0"
        before = {r["session_id"] for r in _records(logdir)}
        back = flight.recover(logdir)
        assert back.problems == [] and back.bad_entries == 0
        records = _records(logdir)
        ids = [r["session_id"] for r in records]
        assert said <= set(ids), f"kill {kill}: lost {sorted(said - set(ids))[:10]}"
        assert len(ids) == len(set(ids)), f"kill {kill}: a session written twice"
        recovered = [r for r in records if r.get("recovered")]
        assert back.sessions == len(recovered) == len(set(ids) - before)
        for r in recovered:  # whole records: status, reason, phases, step
            assert r["status"] in ("accepted", "rejected") and r["step"] is not None
            assert r["generate_s"] >= 0 and len(r["phases"]["generate"]) == 1
            assert (r["reason"] == "stale") == (r["status"] == "rejected")
            assert (r["session_id"] % 3 == 0) == ("reward" in r["phases"])
        assert not list(logdir.rglob("*.ring"))


def test_the_next_start_on_the_log_dir_recovers_by_itself(tmp_path: Path) -> None:
    said = _run_and_kill(tmp_path, save=False, after=500)
    logdir = tmp_path / "logs" / "u" / "kill" / "t0"
    assert list(logdir.rglob("*.ring"))
    rltrace.configure(fileroot=str(tmp_path), experiment_name="kill", trial_name="t0", user="u",
                      session_tracer={"enabled": True}, flush_at_exit=False)
    rltrace.shutdown()
    ids = [r["session_id"] for r in _records(logdir)]
    assert said <= set(ids) and len(ids) == len(set(ids))
    assert not list(logdir.rglob("*.ring"))  # its own ring went with its clean shutdown


def test_a_clean_run_leaves_no_ring_and_recovers_nothing(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="clean", trial_name="t0", user="u",
                      session_tracer={"enabled": True}, flush_at_exit=False)
    logdir = tmp_path / "logs" / "u" / "clean" / "t0"
    sid = rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    assert list(logdir.rglob("*.ring"))  # while it runs
    rltrace.shutdown()
    back = flight.recover(logdir)
    assert not list(logdir.rglob("*.ring")) and back.restored == [] and back.rings == 0
    assert [r.get("recovered") for r in _records(logdir)] == [None]


def test_the_ring_keeps_the_newest_entries_when_it_wraps_and_ignores_a_torn_one(tmp_path: Path) -> None:
    path = tmp_path / flight.ring_name(0, os.getpid())
    rec = flight.FlightRecorder(path, tmp_path / "sessions-r0.jsonl", capacity=4096)
    for i in range(500):
        rec.add(1, i, "accepted", None, i, i + 1, 0, [("generate", i, i + 1, 0, False)])
    ring = flight.read_ring(path)
    ids = [e[1] for e in ring.entries]
    assert ring.records_name == "sessions-r0.jsonl" and ids == list(range(ids[0], 500)) and len(ids) > 20
    # a kill in the middle of the next entry: its start is written (over the oldest entry's),
    # not its end: the newest entries are read as before, the cut one and the overwritten not
    rec._put(rec._written % rec.capacity, b'[7,77777,"accepted",null,')
    got = [e[1] for e in flight.read_ring(path).entries]
    assert got == ids[len(ids) - len(got):] and len(got) >= len(ids) - 1 and 77777 not in got
    rec.close(remove=False)


def test_rltrace_recover_restores_them_from_the_command_line(tmp_path: Path) -> None:
    said = _run_and_kill(tmp_path, save=False, after=300)
    logdir = tmp_path / "logs" / "u" / "kill" / "t0"
    cmd = [sys.executable, "-m", "rltrace.cli", "recover", str(logdir)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
    ids = [r["session_id"] for r in _records(logdir)]
    assert said <= set(ids) and len(ids) == len(set(ids))
    n = sum(1 for r in _records(logdir) if r.get("recovered"))
    assert f"restored {n} session(s) into" in first.stdout or n == 0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert again.returncode == 0 and "nothing to recover" in again.stdout


ATTEMPT = 1_000_000  # attempt k counts its steps from k * ATTEMPT: its records say which it was


def test_six_sigkilled_restarts_in_one_log_dir_with_default_ids_lose_no_session(tmp_path: Path) -> None:
    """Every restart reuses the log dir and its records file, and its session ids start at 0
    again: an earlier attempt's sessions must not hide the killed attempt's, and a session the
    killed attempt wrote itself must not come back twice."""
    rng = random.Random(40)
    logdir = tmp_path / "logs" / "u" / "kill" / "t0"
    said: dict[int, set[int]] = {}
    for attempt in range(6):  # each start recovers the attempt killed before it
        said[attempt] = _run_and_kill(tmp_path, save=False, after=rng.randrange(200, 1500),
                                      first_step=attempt * ATTEMPT)
    assert len(list(logdir.rglob("*.ring"))) == 1  # the last attempt's, for the command line
    cmd = [sys.executable, "-m", "rltrace.cli", "recover", str(logdir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    records = _records(logdir)
    got = [(r["step"] // ATTEMPT, r["session_id"]) for r in records]
    assert len(got) == len(set(got)), "a session written twice"
    for attempt, ids in said.items():
        mine = {sid for a, sid in got if a == attempt}
        assert ids <= mine, f"attempt {attempt}: lost {len(ids - mine)} of {len(ids)}"
    last = {sid for a, sid in got if a == 5}
    restored_last = {r["session_id"] for r in records if r.get("recovered") and r["step"] // ATTEMPT == 5}
    if restored_last:  # the command line restored the last attempt's and said so
        assert f"restored {len(restored_last)} session(s) into" in done.stdout
    else:
        assert said[5] <= last and "nothing to recover" in done.stdout
    assert sum(1 for r in records if r.get("recovered")) > 0  # the kills did cut sessions
    assert not list(logdir.rglob("*.ring"))
