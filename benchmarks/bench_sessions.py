"""Session benchmark: µs per full session (register, generate, reward, finalize).

Prints one JSON object.  Session tracing on, Chrome exporter on.  Tasks hold ``--group``
sessions each (GRPO's group size; AReaL's n_samples), registered together and then run and
finalized one by one, so the task span's cost is shared as in a real run; ``--group 1`` gives
one task per session.  ``session_hot_path_us`` is the time on the caller's thread;
``session_amortized_us`` adds the exporter cycle that derives the session record, writes
``sessions-r0.jsonl`` and the Chrome file.
Run: ``python benchmarks/bench_sessions.py [--sessions N] [--repeats R] [--group G]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import rltrace
from rltrace import runtime

BATCH = 1000


def run(n: int, root: str, chrome: bool, group: int) -> tuple[float, float]:
    rltrace.configure(fileroot=root, flush_interval_s=3600, max_queue_size=64 * BATCH,
                      session_tracer={"enabled": True, "flush_threshold": 100},
                      exporters={"chrome": chrome})
    p = runtime.get_pipeline()
    assert p is not None
    register_task = rltrace.register_task
    register_session = rltrace.register_session
    phase = rltrace.trace_session_phase
    event = rltrace.trace_session_event
    hot = total = done = 0
    while done < n:
        k = min(BATCH, n - done)
        t0 = time.perf_counter_ns()
        for i in range(k):
            j = i % group
            if j == 0:  # a task's samples are registered together, then run (AReaL's n_samples)
                task = register_task()
                m = min(group, k - i)  # (harness cost kept small: no loop for a group of one)
                sids = [register_session(task)] if m == 1 else [register_session(task) for _ in range(m)]
            sid = sids[j]
            with phase("generate", session_id=sid):
                pass
            with phase("reward", session_id=sid):
                pass
            event("mark_finalized", session_id=sid, status="accepted")
        t1 = time.perf_counter_ns()
        p.flush()
        t2 = time.perf_counter_ns()
        hot += t1 - t0
        total += t2 - t0
        done += k
    written = p.session_processor.writer.written if p.session_processor else 0
    rltrace.shutdown()
    assert written == n, (written, n)
    return hot / n / 1000, total / n / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--group", type=int, default=4, help="sessions per task")
    a = ap.parse_args()
    res: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(a.repeats):
            for chrome in (True, False):
                res[chrome].append(run(a.sessions, root, chrome, a.group))
    m = statistics.median
    print(json.dumps({
        "benchmark": "sessions",
        "python": sys.version.split()[0],
        "sessions_per_repeat": a.sessions,
        "repeats": a.repeats,
        "sessions_per_task": a.group,
        "session_hot_path_us": round(m(h for h, _ in res[True]), 2),
        "session_hot_path_best_us": round(min(h for h, _ in res[True]), 2),
        "session_amortized_best_us": round(min(t for _, t in res[True]), 2),
        "session_amortized_us": round(m(t for _, t in res[True]), 2),
        "session_amortized_no_chrome_us": round(m(t for _, t in res[False]), 2),
        "target_us": 10.0,
        "areal_reference_us": "40-80 (DESIGN.md, same work on this machine class)",
    }, indent=2))


if __name__ == "__main__":
    main()
