"""What recording values costs, in CPU instructions: spans and sessions that carry args/payloads.

``bench_instructions`` measures spans and sessions without values; this measures the same loops
with the values a training loop passes (plain scalars, a short list of numbers, a numpy scalar,
phase payloads), so a change to how values are made safe (``rltrace.recording.user_values``) shows
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
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench_instructions import callgrind, per_op_of, require_valgrind, sizes_arg


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
    """Instructions executed by one worker run of ``workload`` (every thread)."""
    return callgrind([str(Path(__file__).resolve()), "--worker", workload, str(n)],
                     f"{workload} n={n}")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=sizes_arg, default=(2000, 8000))
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], int(a.worker[1]))
        return
    unknown = [w for w in a.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    require_valgrind("bench_values")
    import rltrace
    doc = {"rltrace": str(Path(rltrace.__file__).parent),
           "instructions_per_op": {w: per_op_of(lambda n, w=w: instructions(w, n), a.sizes)
                                   for w in a.workloads}}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
