"""Burst benchmark: N sessions finalized in a tight loop; every record on disk, memory bounded.

Prints one JSON object: ``sessions`` finalized, ``records_on_disk`` (lines of the session
files), ``spans_dropped`` (plain spans dropped under overload: none here, the loop records only
session data), ``backpressure_cycles`` (export cycles the loop ran itself because the queue was
full of session data), wall seconds, ``us_per_session``, ``peak_rss_mb`` (the process's
maximum resident set, from ``getrusage``), ``rss_before_mb`` and ``bytes_per_held_record``
(memory, measured with tracemalloc in a separate short phase, that 20,000 sessions' records
hold while they wait in the queue, no export cycle running meanwhile, per record).

Run: ``python benchmarks/bench_burst.py [--sessions 1000000] [--max-queue-size 262144]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import tracemalloc

import rltrace
from rltrace.recording.recorder import STATE


def _session() -> None:
    sid = rltrace.register_session()
    with rltrace.trace_session_phase("generate", session_id=sid):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")


def held_record_bytes(n: int = 20_000) -> float:
    """Bytes of memory one queued session (task, session, generate phase) holds until export."""
    with tempfile.TemporaryDirectory() as root:
        rltrace.configure(fileroot=root, flush_at_exit=False, flush_interval_s=3600,
                          max_queue_size=10 * n, session_tracer={"enabled": True})
        # the pipeline's lock held: no export cycle runs meanwhile (the exporter thread, woken
        # at its mark, waits), so every record is still queued when memory is read
        with rltrace.runtime.get_pipeline()._lock:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(n):
                _session()
            held = len(STATE.buffer)
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        rltrace.shutdown()
    return (after - before) / max(1, held)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1_000_000)
    ap.add_argument("--max-queue-size", type=int, default=None)
    args = ap.parse_args(argv)
    held_record_bytes(100)  # warm: what the first configuration loads is not the burst's
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as root:
        kw = {} if args.max_queue_size is None else {"max_queue_size": args.max_queue_size}
        rltrace.configure(fileroot=root, flush_at_exit=False, session_tracer={"enabled": True}, **kw)
        t0 = time.perf_counter()
        for _ in range(args.sessions):
            _session()
        rltrace.flush()
        wall = time.perf_counter() - t0
        diag = rltrace.diagnostics()
        cap = STATE.cap
        p = rltrace.runtime.get_pipeline()
        assert p is not None and p.sessions_path is not None
        with open(p.sessions_path, "rb") as fh:
            lines = sum(1 for _ in fh)
        rltrace.shutdown()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_record = held_record_bytes()  # after the burst: its records held at once raise the peak
    print(json.dumps({
        "sessions": args.sessions, "records_on_disk": lines,
        "records_written": diag["sessions"]["written"], "spans_dropped": diag["dropped"],
        "backpressure_cycles": diag["backpressure_cycles"], "max_queue_size": cap,
        "wall_s": round(wall, 2), "us_per_session": round(wall / args.sessions * 1e6, 2),
        "rss_before_mb": round(rss_before, 1),
        "peak_rss_mb": round(peak, 1),
        "bytes_per_held_record": round(per_record),
    }, indent=2))
    return 0 if lines == args.sessions else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
