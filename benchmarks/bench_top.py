"""``rltrace top`` benchmark: per-refresh cost on 8 ranks x 100k sessions, and the publisher's cost.

Prints one JSON object.  Each rank is a fresh interpreter running a real pipeline: it finishes
``--sessions`` sessions over four steps (written to its session file), then opens as many again
in the current step (a third in generate, a third in toolcall, a third between phases), and
publishes its live state by hand, timing each publish (median of 7) and the due check the
exporter thread pays every cycle when nothing is due; rank 0 also times a publish at 1k and
10k open sessions on the way.  The ranks then exit without closing (their files keep the
in-flight state).  ``rltrace top``'s refresh (find the files, read them, build the frame, render
it to a 200-column console) is then timed in this process: median and max of ``--reps``.
Run: ``python benchmarks/bench_top.py [--ranks 8] [--sessions 100000] [--reps 30]``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

RANK = textwrap.dedent("""
    import json, os, statistics, sys, time
    import rltrace
    from rltrace.runtime import get_pipeline

    fileroot, rank, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rltrace.configure(fileroot=fileroot, experiment_name="bench", rank=rank, world_size=world,
                      session_tracer__enabled=True, live_interval_s=3600, flush_at_exit=False)
    p = get_pipeline()
    live = p.live

    def publish_ms(reps=7):
        times = []
        for _ in range(reps):
            with p._lock:
                t0 = time.perf_counter()
                assert live.publish()
                times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    for step in range(4):
        with rltrace.step(step):
            for i in range(n // 4):
                sid = rltrace.register_session()
                rltrace.trace_session_event("mark_finalized", session_id=sid,
                                            status="failed" if i % 50 == 0 else "accepted")
    rltrace.flush()
    out = {}
    with rltrace.step(4):
        for i in range(n):
            sid = rltrace.register_session()
            if i % 3 == 0:
                rltrace.trace_session_event("mark_generate_start", session_id=sid)
            elif i % 3 == 1:
                rltrace.trace_session_event("mark_toolcall_start", session_id=sid)
            if rank == 0 and i + 1 in (1_000, 10_000):
                out[f"publish_ms_{i + 1}_open"] = publish_ms()
    out[f"publish_ms_{n}_open"] = publish_ms()
    reps = 200_000
    live._next = time.monotonic() + 3600
    t0 = time.perf_counter()
    for _ in range(reps):
        live.maybe_publish()
    out["not_due_check_ns"] = (time.perf_counter() - t0) / reps * 1e9
    out["file_bytes"] = live.path.stat().st_size
    print(json.dumps(out), flush=True)
    os._exit(0)  # no shutdown: the file keeps the in-flight state
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=100_000, help="open (and finished) sessions per rank")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=2, help="rank processes building at once")
    args = ap.parse_args()
    from rich.console import Console

    from rltrace.cli.top import TopView, find_live_files, read_states
    from rltrace.config import current_user

    with tempfile.TemporaryDirectory(prefix="rltrace-bench-top-") as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK)
        t0 = time.perf_counter()
        ranks: list[dict[str, float]] = []
        for first in range(0, args.ranks, args.parallel):
            procs = [subprocess.Popen([sys.executable, str(script), tmp, str(r), str(args.ranks),
                                       str(args.sessions)], stdout=subprocess.PIPE, text=True)
                     for r in range(first, min(args.ranks, first + args.parallel))]
            for proc in procs:
                out, _ = proc.communicate()
                if proc.returncode != 0:
                    sys.exit(f"rank process failed ({proc.returncode})")
                ranks.append(json.loads(out.strip().splitlines()[-1]))
        build_s = time.perf_counter() - t0
        logdir = Path(tmp) / "logs" / current_user() / "bench" / "trial0"
        sessions_bytes = sum(f.stat().st_size for f in logdir.rglob("sessions-r*.jsonl"))
        view = TopView(logdir)
        states = view.states()
        assert len(states) == args.ranks, [s.path for s in states]
        assert all(s.doc["open"]["sessions"] == args.sessions for s in states)
        times, scans, reads = [], [], []
        for _ in range(args.reps):
            sink = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="truecolor")
            t1 = time.perf_counter()
            sink.print(view.frame())
            times.append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            files = find_live_files(logdir)
            scans.append(time.perf_counter() - t1)
            t1 = time.perf_counter()
            read_states(files)
            reads.append(time.perf_counter() - t1)
        frame = sink.file.getvalue()  # type: ignore[attr-defined]
    pub = [r[f"publish_ms_{args.sessions}_open"] for r in ranks]
    print(json.dumps({
        "ranks": args.ranks, "open_sessions_per_rank": args.sessions,
        "finished_sessions_per_rank": args.sessions // 4 * 4,
        "session_files_mb": round(sessions_bytes / 1e6, 1),
        "build_s": round(build_s, 1),
        "top_refresh_ms_median": round(statistics.median(times) * 1000, 2),
        "top_refresh_ms_max": round(max(times) * 1000, 2),
        "top_read_ms_median": round(statistics.median(reads) * 1000, 2),
        "top_rescan_ms_median": round(statistics.median(scans) * 1000, 2),
        "live_file_bytes_max": max(r["file_bytes"] for r in ranks),
        "publish_ms_median_per_rank": [round(x, 2) for x in pub],
        "publish_ms_1k_open": round(ranks[0]["publish_ms_1000_open"], 3),
        "publish_ms_10k_open": round(ranks[0]["publish_ms_10000_open"], 3),
        "not_due_check_ns": round(statistics.median(r["not_due_check_ns"] for r in ranks), 1),
        "frame_lines": frame.count("\n"),
    }))


if __name__ == "__main__":
    main()
