"""What rltrace.ray adds to a Ray remote call (JSON): the round trip of a tiny remote function
and of a tiny actor method (``ray.get(x.remote())``, one at a time), measured in the same run
under a plain ``ray.init`` and under ``rltrace.ray.init`` with files only, with OTLP to the
in-process receiver (``flush_tasks="all"``, the default), and with OTLP and
``flush_tasks="files"``.  Each contender runs in a fresh interpreter with its own Ray cluster
(2 CPUs); reps interleave the contenders.  Under rltrace each remote function flushes its
worker when it returns (files written, OTLP sent while the collector answers): the figure
that pays for it.  Run: ``python benchmarks/bench_ray.py [--calls N] [--reps R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: contender -> (OTLP on, ``flush_tasks``)
CONTENDERS = {"plain": (False, ""), "rltrace_files": (False, "all"),
              "rltrace_otlp": (True, "all"), "rltrace_otlp_flush_files": (True, "files")}


def _one(contender: str, calls: int, root: str) -> dict[str, float]:
    import ray

    import rltrace
    import rltrace.ray
    from rltrace.testing.otlp_receiver import OTLPReceiver

    @ray.remote
    def task(x: int) -> int:
        with rltrace.trace_scope("work"):
            return x

    @ray.remote
    class Actor:
        def call(self, x: int) -> int:
            with rltrace.trace_scope("work"):
                return x

    rx = None
    opts: dict[str, Any] = dict(num_cpus=2, include_dashboard=False, log_to_driver=False,
                                object_store_memory=96 * 1024 * 1024)
    if contender == "plain":
        ray.init(**opts)
    else:
        otlp: dict[str, Any] = {}
        with_otlp, flush_tasks = CONTENDERS[contender]
        if with_otlp:
            rx = OTLPReceiver().start()
            otlp = {"endpoint": rx.grpc_endpoint, "metrics": False}
        rltrace.configure(fileroot=root, session_tracer={"enabled": True}, otlp=otlp)
        rltrace.ray.init(flush_tasks=flush_tasks, **opts)
    actor = Actor.remote()
    for i in range(20):  # warm: workers started, functions exported
        ray.get(task.remote(i))
        ray.get(actor.call.remote(i))
    out = {}
    for name, call in (("task", task.remote), ("actor_method", actor.call.remote)):
        t0 = time.perf_counter()
        for i in range(calls):
            ray.get(call(i))
        out[f"{name}_us"] = (time.perf_counter() - t0) / calls * 1e6
    ray.shutdown()
    if rx is not None:
        rx.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        with tempfile.TemporaryDirectory() as root:
            print(json.dumps(_one(args.one, args.calls, root)))
        return
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
    for _ in range(args.reps):
        for contender in CONTENDERS:  # interleaved, a fresh interpreter and cluster each
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one",
                                   contender, "--calls", str(args.calls)],
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"{contender} failed:\n{proc.stderr[-3000:]}")
            runs[contender].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result: dict[str, Any] = {"calls": args.calls, "reps": args.reps}
    for contender, rows in runs.items():
        for key in rows[0]:
            result[f"{contender}_{key}"] = round(statistics.median(r[key] for r in rows), 1)
    for key in ("task_us", "actor_method_us"):
        for contender in list(CONTENDERS)[1:]:
            result[f"{contender}_{key[:-3]}_added_us"] = round(
                result[f"{contender}_{key}"] - result[f"plain_{key}"], 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
