"""A training loop that records a value whose ``__str__``, ``__repr__`` and ``tolist`` never
return, and which looks like an array (a class attribute ``dtype``, ``shape`` and ``tolist``).

Run by ``tests/reliability/test_hostile_values.py`` in a child process with its own deadline:

    python hostile_value_loop.py FILEROOT SESSIONS MAX_QUEUE_SIZE

Each iteration records the value through span args and category, ``set_attribute``, a phase's
start payload and ``instant``; then ``flush(wait_s=1)`` runs and the interpreter exits (rltrace's exit flush
included).  It prints one JSON line after the loop and one after the flush, so the test can tell
which stage a hang was in.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import rltrace

_NEVER = threading.Event()


class HangsWhenRead:
    """Looks like an array; reading it as text or numbers, hashing or comparing it never returns."""

    dtype = "float32"
    shape = (2,)

    def tolist(self) -> list[float]:
        _NEVER.wait()
        return []

    def __str__(self) -> str:
        _NEVER.wait()
        return ""

    __repr__ = __str__

    def __hash__(self) -> int:  # as a category: an exporter's cache would hash it
        _NEVER.wait()
        return 0

    def __eq__(self, other: object) -> bool:
        _NEVER.wait()
        return False


def main() -> None:
    fileroot, sessions, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rltrace.configure(fileroot=fileroot, experiment_name="hang", trial_name="t0",
                      handle_sigterm=False, max_queue_size=queue, session_tracer={"enabled": True})
    value = HangsWhenRead()
    for i in range(sessions):
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid, start_payload={"h": value}):
            pass
        with rltrace.trace_scope("step", value, args={"h": value, "i": i}) as span:  # type: ignore[arg-type]
            span.set_attribute("h2", value)
            rltrace.instant("mark", value, args={"h": value})  # type: ignore[arg-type]
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    print(json.dumps({"loop_done": sessions}), flush=True)
    t0 = time.monotonic()
    rltrace.flush(wait_s=1.0)
    print(json.dumps({"flushed": True, "flush_s": round(time.monotonic() - t0, 3),
                      "diagnostics_errors": rltrace.diagnostics()["errors"]}), flush=True)


if __name__ == "__main__":
    main()
