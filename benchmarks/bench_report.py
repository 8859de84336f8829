"""``rltrace report`` benchmark: time and peak memory on a synthetic 4-rank x 250k-session run.

Prints one JSON object.  The run (``tests/helpers/synth_run.py``: session records with 1-3 turns,
per-rank traces with step scopes and a counter; ``--session-spans`` adds an ``rl.session`` and a
span per phase execution to the traces, like a real run with span tracing on) is written to a
temporary directory; ``rltrace report`` then runs in a child process, once on the run and once
on a tiny run (baseline: interpreter, numpy, matplotlib), and the child's peak RSS is read with
``os.wait4``.
Run: ``python benchmarks/bench_report.py [--ranks 4] [--sessions 250000] [--format html]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from synth_run import SynthSpec, write_run


def report(logdir: Path, out: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of ``rltrace report logdir -o out`` in a child process."""
    t0 = time.perf_counter()
    with open(out.with_suffix(".log"), "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rltrace.cli", "report", str(logdir), "-o", str(out),
                                 "--no-progress"], stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"rltrace report failed:\n{out.with_suffix('.log').read_text()}")
    return wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=250_000, help="sessions per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--format", choices=["html", "md", "json"], default="html")
    ap.add_argument("--session-spans", action="store_true", help="also write per-session spans to the traces")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rltrace-bench-report-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        truth = write_run(root / "run", SynthSpec(ranks=args.ranks, steps=args.steps,
                                                  sessions_per_step=args.sessions // args.steps,
                                                  session_spans=args.session_spans, truth=False))
        gen_s = time.perf_counter() - t0
        write_run(root / "tiny", SynthSpec(ranks=args.ranks, steps=2, sessions_per_step=16, truth=False))
        base_s, base_rss = report(root / "tiny", root / f"tiny.{args.format}")
        wall, rss = report(root / "run", root / f"run.{args.format}")
    sessions = args.ranks * (args.sessions // args.steps) * args.steps
    print(json.dumps({
        "ranks": args.ranks, "sessions": sessions, "format": args.format,
        "session_spans": args.session_spans, "data_mb": round(truth.bytes_written / 1e6, 1),
        "generate_s": round(gen_s, 2), "report_s": round(wall, 2),
        "report_tiny_s": round(base_s, 2), "sessions_per_s": round(sessions / wall),
        "mb_per_s": round(truth.bytes_written / 1e6 / wall, 1),
        "peak_rss_mb": round(rss / 1e6, 1), "peak_rss_tiny_mb": round(base_rss / 1e6, 1),
        "rss_growth_bytes_per_session": round((rss - base_rss) / sessions, 1),
        "rss_growth_over_data": round((rss - base_rss) / truth.bytes_written, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
