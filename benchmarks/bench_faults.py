"""Backend-fault benchmark: training step time and spans lost with the OTLP backend up, down,
erroring and stalled, against the same loop with no OTLP export at all.

Prints one JSON object.  The OTLP backend is rltrace's in-process receiver run in a *separate*
process (so its work is not charged to the training loop), driven through a pipe to inject the
faults.  Each scenario runs the same loop: ``--steps`` steps of ``--scopes`` scopes around a
little pure-Python work, with the Chrome and session exporters on.  Per scenario:

* ``step_ms_mean`` / ``step_ms_median`` / ``step_ms_p90``, ``ratio_vs_no_otlp`` (median over
  median) and ``mean_ratio_vs_no_otlp``;
* ``spans_sent``: spans handed to the OTLP exporter, and what became of them after shutdown:
  ``exported`` (acknowledged by the backend), ``failed`` (export errors), ``dropped`` (queue
  full or not sent within the shutdown timeout); ``lost`` = ``failed + dropped`` (counted, never
  silent: ``exported + failed + dropped == spans_sent``);
* ``chrome_micro_batch_spans_on_disk`` vs ``..._recorded``: the local Chrome file is complete
  whatever the backend does;
* ``received``: spans the backend accepted by the end of the scenario (a check on
  ``exported``); ``received_after_release``: spans of an export rltrace had already timed out and
  counted as failed that the stalled backend accepted once released.

The fault lasts from the first measured step through ``shutdown()`` (bounded by
``otlp.timeout_s``), so the lost counts are what a fault of that length costs.

Run: ``python benchmarks/bench_faults.py [--steps N] [--scopes K] [--protocol grpc|http/protobuf]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import rltrace
from rltrace import runtime


def _backend(conn: Any) -> None:
    """Child process: an OTLPReceiver obeying commands from the pipe."""
    from rltrace.testing.otlp_receiver import OTLPReceiver

    rx = OTLPReceiver().start()
    release = threading.Event()
    conn.send({"grpc": rx.grpc_endpoint, "http": rx.http_endpoint})
    while True:
        cmd = conn.recv()
        if cmd == "ok":
            rx.fail_with(None)
            rx.stall(None)
            release.set()
        elif cmd == "error":
            rx.fail_with(503)  # UNAVAILABLE / HTTP 503, as an overloaded collector answers
        elif cmd == "stall":
            release.clear()
            rx.stall(release, max_wait=300)
        elif cmd == "count":
            conn.send(len(rx.spans()))
            continue
        elif cmd == "clear":
            rx.clear()
        elif cmd == "quit":
            release.set()
            rx.stop()
            conn.send("bye")
            return
        conn.send("done")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loop(steps: int, scopes: int, work: int) -> list[float]:
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        with rltrace.step(i):
            task = rltrace.register_task()
            sid = rltrace.register_session(task)
            for _ in range(scopes):
                with rltrace.trace_scope("micro_batch"):
                    sum(range(work))
            with rltrace.trace_session_phase("generate", session_id=sid):
                pass
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        times.append(time.perf_counter() - t0)
    return times


def _scenario(name: str, root: str, args: argparse.Namespace, endpoint: str | None,
              conn: Any) -> dict[str, Any]:
    otlp: dict[str, Any] = {}
    if endpoint is not None:
        otlp = {"endpoint": endpoint, "protocol": args.protocol, "timeout_s": args.timeout,
                "max_queue_size": args.queue, "metrics": False}
    rltrace.configure(fileroot=root, trial_name=name, flush_at_exit=False, flush_interval_s=0.1,
                      session_tracer={"enabled": True}, otlp=otlp)
    p = runtime.get_pipeline()
    assert p is not None
    _loop(5, args.scopes, args.work)  # warm-up (connections, caches)
    if conn is not None:
        conn.send("clear")
        conn.recv()
    t0 = time.perf_counter()
    times = _loop(args.steps, args.scopes, args.work)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    rltrace.shutdown()  # the fault lasts through shutdown, which waits at most otlp.timeout_s
    shutdown_s = time.perf_counter() - t1
    received = late = None
    if conn is not None:
        conn.send("count")
        received = conn.recv()
    if name in ("erroring", "stalled"):  # the backend recovers for the next scenario
        conn.send("ok")
        conn.recv()
        conn.send("count")
        late = conn.recv() - received  # a request held by the stall is accepted on release
    on_disk = 0
    if p.chrome_path is not None and p.chrome_path.exists():
        with open(p.chrome_path, "rb") as fh:
            on_disk = sum(b'"name":"micro_batch"' in line for line in fh)
    out: dict[str, Any] = {
        "chrome_micro_batch_spans_on_disk": on_disk,
        "chrome_micro_batch_spans_recorded": (args.steps + 5) * args.scopes,
        "step_ms_mean": round(statistics.fmean(times) * 1e3, 3),
        "step_ms_median": round(statistics.median(times) * 1e3, 3),
        "step_ms_p90": round(sorted(times)[int(0.9 * (len(times) - 1))] * 1e3, 3),
        "wall_s": round(wall, 3),
        "shutdown_s": round(shutdown_s, 3),
    }
    if p.otlp is not None:
        s = p.otlp.stats()
        sent = s["exported"] + s["failed"] + s["dropped"] + s["queued"]
        out["spans"] = {"sent": sent, "exported": s["exported"], "failed": s["failed"],
                        "dropped": s["dropped"], "lost": s["failed"] + s["dropped"]}
        if received is not None:
            out["spans"]["received"] = received
        if late:  # counted as failed by rltrace (timed out), yet delivered: the count errs safe
            out["spans"]["received_after_release"] = late
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--scopes", type=int, default=100, help="scopes per step")
    ap.add_argument("--work", type=int, default=3000, help="sum(range(WORK)) inside each scope")
    ap.add_argument("--protocol", default="grpc", choices=["grpc", "http/protobuf"])
    ap.add_argument("--timeout", type=float, default=2.0, help="otlp.timeout_s")
    ap.add_argument("--queue", type=int, default=65_536, help="otlp.max_queue_size")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_backend, args=(child,), daemon=True)
    proc.start()
    endpoints = parent.recv()
    endpoint = endpoints["grpc" if args.protocol == "grpc" else "http"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        results["no_otlp"] = _scenario("no_otlp", root, args, None, None)
        results["backend_up"] = _scenario("up", root, args, endpoint, parent)
        results["backend_down"] = _scenario("down", root, args, f"http://127.0.0.1:{_free_port()}", None)
        parent.send("error")
        parent.recv()
        results["backend_erroring"] = _scenario("erroring", root, args, endpoint, parent)
        parent.send("stall")
        parent.recv()
        results["backend_stalled"] = _scenario("stalled", root, args, endpoint, parent)
    parent.send("quit")
    parent.recv()
    proc.join(10)
    base = results["no_otlp"]["step_ms_median"]
    base_mean = results["no_otlp"]["step_ms_mean"]
    for r in results.values():
        r["ratio_vs_no_otlp"] = round(r["step_ms_median"] / base, 3)
        r["mean_ratio_vs_no_otlp"] = round(r["step_ms_mean"] / base_mean, 3)
    out = {
        "benchmark": "faults",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "protocol": args.protocol,
        "steps": args.steps,
        "scopes_per_step": args.scopes,
        "work_per_scope": f"sum(range({args.work}))",
        "otlp_timeout_s": args.timeout,
        "otlp_max_queue_size": args.queue,
        "scenarios": results,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
