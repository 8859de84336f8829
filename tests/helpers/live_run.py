"""One rank of a run the test steers: per step it opens sessions in generate and toolcall, then
waits for ``{control}/go-{step}`` before finalizing them, so the live state is stable while a
test looks at it.  Run: ``python live_run.py FILEROOT RANK WORLD STEPS CONTROL_DIR``.

Step ``s`` on rank ``r`` opens ``2 + r + s`` sessions in generate and ``1 + s`` in toolcall
(one of them in both), plus one between phases; at the go signal all but one are accepted and
one fails.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import rltrace


def expected(rank: int, step: int) -> dict[str, int]:
    """Open sessions of ``rank`` at ``step`` by phase (the figures ``rltrace top`` must show)."""
    gen, tool = 2 + rank + step, 1 + step
    # the last generate session also runs the first tool call; one more session is idle
    return {"generate": gen, "toolcall": tool, "idle": 1, "flight": gen + (tool - 1) + 1}


def main() -> None:
    fileroot, rank, world, steps, control = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4]), Path(sys.argv[5])
    rltrace.configure(fileroot=fileroot, experiment_name="live", rank=rank, world_size=world,
                      session_tracer__enabled=True, live_interval_s=0.2, flush_interval_s=0.1)
    for step in range(steps):
        with rltrace.step(step):
            want = expected(rank, step)
            sids = [rltrace.register_session() for _ in range(want["flight"])]
            gen, tool = want["generate"], want["toolcall"]
            for sid in sids[:gen]:
                rltrace.trace_session_event("mark_generate_start", session_id=sid)
            # the last generate session also runs a tool call: one session, two open phases
            for sid in sids[gen - 1:gen - 1 + tool]:
                rltrace.trace_session_event("mark_toolcall_start", session_id=sid)
            go = control / f"go-{step}"
            deadline = time.monotonic() + 300
            while not go.exists():  # the test's signal (bounded: a lost test must not leave us)
                if time.monotonic() > deadline:
                    sys.exit("no go signal")
                time.sleep(0.02)
            for i, sid in enumerate(sids):
                rltrace.trace_session_event("mark_finalized", session_id=sid,
                                            status="failed" if i == 0 else "accepted")
    rltrace.shutdown()


if __name__ == "__main__":
    main()
