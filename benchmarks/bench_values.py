"""What recording values costs, in CPU instructions: spans and sessions that carry args/payloads.

``bench_instructions`` measures spans and sessions without values; this measures the same loops
with the values a training loop passes (plain scalars, a short list of numbers, a numpy scalar,
phase payloads), so a change to how values are made safe (``rltrace.exporters.values``) shows
its cost on the hot path.  Each workload runs under Valgrind's callgrind at two sizes, every
thread counted (the exporter's conversion and final flush included); the difference divided by
the difference in operations is the cost of one operation, start-up cancelling out::

    python benchmarks/bench_values.py [--sizes 2000,8000] [--workloads span_plain,session_payload]

One JSON document on stdout.  Run it twice with ``PYTHONPATH`` pointing at two trees to compare
two versions.  Needs ``valgrind`` on PATH (absent: a clear error, exit code 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")
RUN_TIMEOUT_S = 900


def _span_plain(n: int) -> None:
    import rltrace
    scope = rltrace.trace_scope
    for i in range(n):
        with scope("step", args={"step": i, "lr": 1e-4, "name": "rollout", "done": False, "x": None}):
            pass


def _span_list(n: int) -> None:
    import rltrace
    scope = rltrace.trace_scope
    for i in range(n):
        with scope("step", args={"step": i, "lens": [1, 2, 3, 4, 5, 6, 7, 8]}):
            pass


def _span_numpy(n: int) -> None:
    import numpy as np

    import rltrace
    scope = rltrace.trace_scope
    loss = np.float32(0.25)
    for i in range(n):
        with scope("step", args={"step": i, "loss": loss}):
            pass


def _session_payload(n: int) -> None:
    import rltrace
    register_task, register_session = rltrace.register_task, rltrace.register_session
    phase, event = rltrace.trace_session_phase, rltrace.trace_session_event
    for _ in range(n):
        task = register_task()
        sid = register_session(task)
        with phase("generate", session_id=sid, start_payload={"prompt_tokens": 12, "model": "m"},
                   end_payload={"output_tokens": 30}):
            pass
        with phase("reward", session_id=sid, end_payload={"reward": 1.0}):
            pass
        event("mark_finalized", session_id=sid, status="accepted")


WORKLOADS: dict[str, Callable[[int], None]] = {
    "span_plain": _span_plain, "span_list": _span_list, "span_numpy": _span_numpy,
    "session_payload": _session_payload,
}


def worker(workload: str, n: int) -> None:
    """One run: configure (session tracing on), the loop, shutdown (the final flush)."""
    import rltrace
    with tempfile.TemporaryDirectory() as root:
        rltrace.configure({"fileroot": root, "experiment_name": "bench", "trial_name": "t",
                           "session_tracer": {"enabled": True}})
        WORKLOADS[workload](n)
        rltrace.shutdown()


def instructions(workload: str, n: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, str(Path(__file__).resolve()), "--worker", workload, str(n)]
    proc = subprocess.run(cmd, capture_output=True, timeout=RUN_TIMEOUT_S, env=os.environ.copy())
    found = _REFS.findall(proc.stderr)
    if proc.returncode != 0 or not found:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{workload} n={n} failed: {' | '.join(tail)}")
    return int(found[-1].replace(b",", b""))


def per_op(workload: str, sizes: tuple[int, int]) -> dict[str, Any]:
    small, large = sizes
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda n: instructions(workload, n), (small, large))
    return {"per_op": round((b - a) / (large - small)), "runs": {str(small): a, str(large): b}}


def _sizes(text: str) -> tuple[int, int]:
    small, large = (int(x) for x in text.split(","))
    if not 0 < small < large:
        raise argparse.ArgumentTypeError(f"{text!r}: two sizes, smaller first (e.g. 2000,8000)")
    return small, large


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=_sizes, default=(2000, 8000))
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], int(a.worker[1]))
        return
    unknown = [w for w in a.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    if shutil.which("valgrind") is None:
        print("bench_values: valgrind is not on PATH; install it (apt-get install valgrind)", file=sys.stderr)
        raise SystemExit(2)
    import rltrace
    doc = {"rltrace": str(Path(rltrace.__file__).parent),
           "instructions_per_op": {w: per_op(w, a.sizes) for w in a.workloads}}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
