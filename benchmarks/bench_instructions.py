"""What tracing costs in CPU instructions: ``bench_compare``'s workloads under callgrind.

Wall time on a shared machine moves by a quarter between runs of the same code (other tenants,
frequency scaling); the number of instructions a workload executes does not.  This counts
them with Valgrind's callgrind for ``bench_compare``'s own workers (the same loops, the same
contenders, each exporter running on its own schedule, its final flush included), at two
sizes, and divides the difference by the difference in operations, so interpreter start-up,
imports and configuration cancel out::

    python benchmarks/bench_instructions.py [--sessions 1000,4000] [--spans 5000,25000]
        [--session-contenders rltrace,rltrace_noflight,areal] [--span-contenders rltrace,otel,areal]

One JSON document on stdout: instructions per operation for each contender and the ratios the
performance targets are stated in (session to AReaL's, span to raw OTel's).  Every thread is counted
(the exporter threads' work too).  What instructions do not show: cache misses and the kernel's
side of writes, so a contender's wall time can be a larger share than its instructions (the
README gives both).  Needs ``valgrind`` on PATH (absent: a clear error, exit code 2); AReaL's
contender needs ``RLTRACE_AREAL_WHEEL``, as ``bench_compare`` does.  About 20 s per run here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMPARE = HERE / "bench_compare.py"
_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")
#: a run's own deadline (a contender that hangs must not hang the benchmark)
RUN_TIMEOUT_S = 900


def callgrind(args: list[str], what: str) -> tuple[int, bytes]:
    """Instructions executed (every thread) by ``python ARGS`` under callgrind, and its stdout;
    ``RuntimeError`` naming ``what`` when the run fails.  Shared by the instruction benchmarks."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S, cwd=HERE.parent,
                          env=os.environ.copy())
    found = _REFS.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{what} failed: {' | '.join(tail)}")
    return int(found[-1].replace(b",", b"")), proc.stdout


def instructions(workload: str, contender: str, n: int) -> int:
    """Instructions executed by one ``bench_compare`` worker run (every thread)."""
    count, out = callgrind([str(COMPARE), "--worker", workload, contender, str(n)],
                           f"{workload}/{contender} n={n}")
    if b'"skipped"' in out:
        raise LookupError(json.loads(out.splitlines()[-1])["skipped"])
    return count


def per_op_of(run: Callable[[int], int], sizes: tuple[int, int]) -> dict[str, Any]:
    """Instructions per operation from ``run`` at two sizes (start-up cancels out); a run that
    raises ``LookupError`` (a contender not installed) gives ``{"skipped": why}``."""
    small, large = sizes
    try:
        with ThreadPoolExecutor(2) as pool:  # the two runs side by side (counts do not care)
            a, b = pool.map(run, (small, large))
    except LookupError as exc:
        return {"skipped": str(exc)}
    return {"per_op": round((b - a) / (large - small)), "runs": {str(small): a, str(large): b}}


def per_op(workload: str, contender: str, sizes: tuple[int, int]) -> dict[str, Any]:
    """Instructions per operation of one ``bench_compare`` workload and contender."""
    return per_op_of(lambda n: instructions(workload, contender, n), sizes)


def sizes_arg(text: str) -> tuple[int, int]:
    """An argparse type: two sizes, smaller first (``1000,4000``)."""
    small, large = (int(x) for x in text.split(","))
    if not 0 < small < large:
        raise argparse.ArgumentTypeError(f"{text!r}: two sizes, smaller first (e.g. 1000,4000)")
    return small, large


def require_valgrind(tool: str) -> None:
    """Exit with code 2 and one line on stderr when ``valgrind`` is not on PATH."""
    if shutil.which("valgrind") is None:
        print(f"{tool}: valgrind is not on PATH; install it (apt-get install valgrind)", file=sys.stderr)
        raise SystemExit(2)


def _ratio(doc: dict[str, Any], of: str, to: str) -> float | None:
    a, b = doc.get(of, {}).get("per_op"), doc.get(to, {}).get("per_op")
    return None if a is None or not b else round(a / b, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=sizes_arg, default=(1000, 4000))
    ap.add_argument("--spans", type=sizes_arg, default=(5000, 25000))
    ap.add_argument("--session-contenders", type=lambda s: s.split(","),
                    default=["rltrace", "rltrace_noflight", "areal"])
    ap.add_argument("--span-contenders", type=lambda s: s.split(","),
                    default=["rltrace", "otel", "areal"])
    a = ap.parse_args()
    require_valgrind("bench_instructions")
    sessions = {c: per_op("sessions", c, a.sessions) for c in a.session_contenders}
    spans = {c: per_op("spans", c, a.spans) for c in a.span_contenders}
    doc = {
        "machine": {"machine": platform.machine(), "python": platform.python_version()},
        "instructions_per_session": sessions,
        "instructions_per_span": spans,
        "ratios": {
            "session_rltrace_vs_areal": _ratio(sessions, "rltrace", "areal"),
            "session_rltrace_noflight_vs_areal": _ratio(sessions, "rltrace_noflight", "areal"),
            "span_rltrace_vs_otel": _ratio(spans, "rltrace", "otel"),
            "span_rltrace_vs_areal": _ratio(spans, "rltrace", "areal"),
        },
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
