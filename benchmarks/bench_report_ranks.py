"""``rltrace report`` benchmark in ranks: time and peak memory at 1k and 10k ranks, HTML and JSON.

Prints one JSON object.  Each run (``tests/helpers/synth_run.py``) is small per rank (one step of
4 sessions, a trace file with step scopes and a counter) so the cost measured is the cost per rank:
reading 2 files per rank, the per-rank analyses and, for HTML, the plots and tables, which past
64 ranks show the slowest ranks and a distribution instead of a row per rank.  ``rltrace report``
runs in a child process; its peak RSS is read with ``os.wait4``.
Run: ``python benchmarks/bench_report_ranks.py [--ranks 1000 10000] [--sessions 4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import SynthSpec, report, write_run  # the same child-process measurement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--sessions", type=int, default=4, help="sessions per rank")
    ap.add_argument("--formats", nargs="+", default=["html", "json"], choices=["html", "md", "json"])
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rltrace-bench-ranks-") as tmp:
        root = Path(tmp)
        for ranks in args.ranks:
            run = root / f"r{ranks}"
            write_run(run, SynthSpec(ranks=ranks, steps=1, sessions_per_step=args.sessions, straggler_step=0,
                                     slow_reward_step=0, truth=False))
            for fmt in args.formats:
                out = root / f"out-{ranks}-{fmt}"
                out.mkdir()
                wall, rss = report(run, out / f"report.{fmt}")
                results.append({"ranks": ranks, "format": fmt, "seconds": round(wall, 2),
                                "peak_rss_mb": round(rss / 1e6, 1)})
    print(json.dumps({"benchmark": "report_ranks", "sessions_per_rank": args.sessions, "steps": 1,
                      "cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
