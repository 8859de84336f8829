"""A torchrun worker finalizing sessions until its launcher terminates it.

Usage (under torchrun): ``torchrun_worker.py OUT_DIR``.  Each rank configures rltrace with the
rank torchrun gives it, finalizes sessions as fast as it can, appends each finalized id to
``counted-r{rank}.bin`` right after ``mark_finalized`` returned, and prints ``ready {rank}``
once it has finalized 200 sessions.  The test then sends SIGTERM to torchrun, which sends
SIGTERM to its workers (its death signal).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import rltrace


def main(out: Path) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the defaults, whatever torchrun inherited
    rltrace.configure(fileroot=str(out), experiment_name="torchrun", trial_name="t0",
                      flush_interval_s=3600, session_tracer={"enabled": True, "flush_threshold": 100_000})
    rank = int(os.environ["RANK"])
    fd = os.open(out / f"counted-r{rank}.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    n = 0
    while True:
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            sum(range(200))
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        os.write(fd, b"%d\n" % sid)
        n += 1
        if n == 200:  # one write: the two ranks share torchrun's stdout (python -u)
            os.write(1, b"ready %d\n" % rank)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
