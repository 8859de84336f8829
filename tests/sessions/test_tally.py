"""Session tallies survive a SIGKILL: the counts a killed process left say exactly how many of
its sessions never reached its files (what ``rltrace.ray`` reports for a ``ray.kill``-ed actor;
``tests/integrations/ray/test_ray.py`` checks that end to end on a real Ray cluster)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from rltrace.sessions.shared_counts import SessionTally, read_tally
from rltrace.testing import read_jsonl

CHILD = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import rltrace
    from rltrace import sessions
    from rltrace.sessions.shared_counts import SessionTally

    rltrace.configure(fileroot=sys.argv[1], flush_interval_s=3600, flush_at_exit=False,
                      handle_sigterm=False, session_tracer={"enabled": True, "flush_threshold": 1})
    p = rltrace.runtime.get_pipeline()
    tally = SessionTally(sys.argv[2])
    rltrace.runtime.RUNTIME.sessions.tally = p.session_processor.writer.tally = tally.view

    def session(finalize=True):
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        if finalize:
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")

    for _ in range(3):
        session()
    rltrace.flush()          # 3 records on disk
    for _ in range(2):
        session()            # finalized, not yet written
    session(finalize=False)  # still open
    print("ready", flush=True)
    sys.stdin.read()         # until killed
""")


def test_a_killed_process_leaves_exact_counts_of_its_unwritten_sessions(tmp_path: Path) -> None:
    path = tmp_path / "tally.bin"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "logs"), str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert read_tally(path) == {"registered": 6, "finalized": 5, "written": 3, "exited": 0,
                                "unwritten": 3}
    [records] = list((tmp_path / "logs").rglob("sessions-*.jsonl"))
    assert len(read_jsonl(records)) == 3  # what the file holds agrees with the count


def test_tally_counts_and_an_unreadable_file(tmp_path: Path) -> None:
    tally = SessionTally(tmp_path / "sub" / "t.bin")
    tally.view[0] += 2
    tally.view[2] += 1
    tally.view[3] = 1
    assert tally.counts() == {"registered": 2, "finalized": 0, "written": 1, "exited": 1}
    assert read_tally(tally.path) == {"registered": 2, "finalized": 0, "written": 1, "exited": 1,
                                      "unwritten": 1}
    assert read_tally(tmp_path / "missing.bin") is None
    (tmp_path / "short.bin").write_bytes(b"\0" * 24)  # a tally of fewer slots
    assert read_tally(tmp_path / "short.bin") is None
