"""``rltrace convert`` at scale: a synthetic run of many ranks over hours, to Chrome JSON and to
Perfetto's native trace, in bounded memory; and how long Perfetto's real trace processor takes
to load each output.

Prints one JSON object: per format, wall seconds, seconds per million input events, peak RSS of
the ``rltrace convert`` child (``os.wait4``), output bytes against the input and the other
format, the files written (a run past ``--max-events`` is split by step range), and the load
time of each output file in Perfetto's trace processor (the WebAssembly build under node, via
``../shared/tools/perfetto/perfetto_check.py``; ``null`` with the reason when it cannot load one
within ``--load-timeout``).

The run (written in rltrace's exact JSONL layout, fast): per rank, one ``train.step`` per
``--step-s`` seconds holding ``train.rollout``, ``train.ppo_update`` and ``train.weight_sync``;
during the rollout, GRPO tasks of 4 sessions on 64 concurrent lanes, each session 1 to 3 turns
of generate (with token counts) and toolcall, then reward, ~10% rejected, ~2% failed; every
8th rank's file ends in a torn line (a rank killed mid-write).
Run: ``python benchmarks/bench_convert.py [--ranks 64] [--hours 1] [--events 20000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CHECK = Path(os.environ.get("RLTRACE_PERFETTO_CHECK",
                            REPO.parent / "shared" / "tools" / "perfetto" / "perfetto_check.py"))
T0_US = 1_800_000_000_000_000
LANES = 64
#: bytes per message when loading a trace into the trace processor (as the Perfetto UI does)
_CHUNK = 4 << 20
_X = b'{"pid":%d,"tid":%d,"ph":"X","ts":%d,"dur":%d.%03d,"name":"%s","cat":"%s","args":{%s}}\n'


def _x(pid: int, tid: int, start_ns: int, end_ns: int, name: bytes, cat: bytes, args: bytes) -> bytes:
    us = start_ns // 1000
    d = end_ns - us * 1000
    return _X % (pid, tid, us, d // 1000, d % 1000, name, cat, args)


def write_rank(path: Path, rank: int, world: int, seconds: float, step_s: float, events: int,
               torn: bool) -> int:
    """One rank's ``traces-r{rank}.jsonl``; returns the events written."""
    rng = random.Random(rank)
    pid = 10_000 + rank
    tail = b'"rank":%d,"role":"rollout"' % rank
    steps = max(1, int(seconds // step_s))
    per_step = events / steps
    # one session: rl.session + turns x (generate + toolcall) - 1 + reward: 2 turns + 1 = 5 events on
    # average (1 to 3 turns), and a task per 4 sessions: 5.25
    sessions_per_step = max(4, round(per_step / 5.25 / 4) * 4)
    written = 0
    with open(path, "wb") as f:
        head = b'{"pid":%d,"tid":0,"ph":"M","name":' % pid
        f.write(head + b'"process_name","args":{"name":"[rollout] Rank %d, Process %d \xc2\xb7 synth"}}\n'
                % (rank, pid))
        f.write(head + b'"process_labels","args":{"labels":"rank=%d,world_size=%d,role=rollout,'
                b'host=synth"}}\n' % (rank, world))
        for lane in range(LANES + 1):
            f.write(b'{"pid":%d,"tid":%d,"ph":"M","name":"thread_name","args":{"name":"MainThread [%d]"}}\n'
                    % (pid, lane + 1, lane))
        sid = 0
        for step in range(steps):
            start = (T0_US + int(step * step_s * 1e6)) * 1000
            rollout_end = start + int(step_s * 0.6e9)
            lines: list[bytes] = []
            lane_free = [start] * LANES
            for task in range(sessions_per_step // 4):
                task_id = step * 100_000 + task
                t_submit = start + int((task / (sessions_per_step // 4)) * step_s * 0.45e9)
                ends = []
                for _ in range(4):
                    lane = min(range(LANES), key=lane_free.__getitem__)
                    t = max(t_submit, lane_free[lane]) + 5_000
                    submit = t - 5_000
                    ids = b'"rl.session.id":%d,"rl.task.id":%d' % (sid, task_id)
                    turns = rng.choice((1, 2, 3))
                    for turn in range(turns):
                        g = int(rng.lognormvariate(0, 0.6) * 40e6)
                        lines.append(_x(pid, lane + 2, t, t + g, b"generate", b"compute",
                                        b'"rl.phase":"generate","rl.turn":%d,%s,"gen_ai.usage.output_tokens":%d,%s'
                                        % (turn, ids, rng.randint(20, 400), tail)))
                        t += g + 2_000
                        if turn < turns - 1:
                            c = int(rng.lognormvariate(0, 0.5) * 10e6)
                            lines.append(_x(pid, lane + 2, t, t + c, b"toolcall", b"io",
                                            b'"rl.phase":"toolcall","rl.turn":%d,%s,%s' % (turn, ids, tail)))
                            t += c + 2_000
                    r = int(rng.lognormvariate(0, 0.4) * 8e6)
                    lines.append(_x(pid, lane + 2, t, t + r, b"reward", b"compute",
                                    b'"rl.phase":"reward","rl.turn":%d,%s,%s' % (turns - 1, ids, tail)))
                    t += r
                    ends.append((sid, lane, submit, t))
                    lane_free[lane] = t + 1_000
                    sid += 1
                group_end = max(e for _, _, _, e in ends) + 1_000
                for k, (s, lane, submit, _) in enumerate(ends):
                    roll = rng.random()
                    status = (b'"accepted"' if roll > 0.12
                              else b'"rejected","rl.session.reason":"stale_weight"' if roll > 0.02
                              else b'"failed"')
                    lines.append(_x(pid, lane + 2, submit, group_end, b"rl.session", b"scheduler",
                                    b'"rl.session.id":%d,"rl.task.id":%d,"rl.session.status":%s,"rl.step":%d,%s'
                                    % (s, task_id, status, step, tail)))
                    del k
                lines.append(_x(pid, LANES + 2, t_submit, group_end + 1_000, b"rl.task", b"scheduler",
                                b'"rl.task.id":%d,"rl.step":%d,%s' % (task_id, step, tail)))
            rollout_end = max(rollout_end, max(lane_free) + 1_000)
            ppo_end = rollout_end + int(step_s * 0.3e9)
            step_end = ppo_end + int(step_s * 0.05e9)
            lines.append(_x(pid, 1, start, rollout_end, b"train.rollout", b"compute", b'"global_step":%d,%s'
                            % (step, tail)))
            lines.append(_x(pid, 1, rollout_end, ppo_end, b"train.ppo_update", b"compute", tail))
            lines.append(_x(pid, 1, ppo_end, step_end, b"train.weight_sync", b"comm", tail))
            lines.append(_x(pid, 1, start, step_end, b"train.step", b"compute", b'"rl.step":%d,%s'
                            % (step, tail)))
            f.writelines(lines)
            written += len(lines)
        if torn:
            f.write(b'{"pid":%d,"tid":1,"ph":"X","ts":%d,"dur":12' % (pid, T0_US))
    return written


def child(cmd: list[str], log: Path) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (bytes) and exit code of ``cmd`` in a child process."""
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def load(trace: Path, timeout_s: float) -> dict[str, Any]:
    """Seconds Perfetto's trace processor takes to load ``trace`` and count its slices and flows,
    in a child process (:func:`load_child`) with its peak RSS."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--load-child", str(trace)], capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"file": trace.name, "load_s": None, "why": f"not loaded within {timeout_s:.0f} s"}
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not rows:
        return {"file": trace.name, "load_s": None, "why": (proc.stderr or proc.stdout)[-400:]}
    return {"file": trace.name, "wall_s": round(time.perf_counter() - t0, 1), **json.loads(rows[-1])}


def load_child(trace: Path) -> None:
    """Load ``trace`` into the trace processor of ``perfetto_check.py`` (the WebAssembly build
    under node) the way the Perfetto UI does, in chunks (the checker sends a file as one message,
    which fails past ~100 MB), then count; print the timings as JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("perfetto_check", CHECK)
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    engine = check.Engine(check.web_dist())
    t0 = time.perf_counter()
    error = ""
    with open(trace, "rb") as f:
        while chunk := f.read(_CHUNK):
            def append(m: Any, r: Any, data: bytes = chunk) -> None:
                m.request = r.TPM_APPEND_TRACE_DATA
                m.append_trace_data = data

            error = error or engine._call(append).append_result.error

    def finalize(m: Any, r: Any) -> None:
        m.request = r.TPM_FINALIZE_TRACE_DATA

    engine._call(finalize)
    loaded = time.perf_counter() - t0
    slices = engine.query("select count(*) as n from slice")[0]["n"]
    flows = engine.query("select count(*) as n from flow")[0]["n"]
    errors = engine.query("select name, value from stats where value > 0 "
                          "and severity in ('error', 'data_loss')")
    engine.close()
    print(json.dumps({"file": trace.name, "load_s": round(loaded, 1), "slices": slices, "flows": flows,
                      "import_errors": errors, "append_error": error or None,
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e3, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--events", type=int, default=20_000_000, help="input events, all ranks")
    ap.add_argument("--step-s", type=float, default=60.0, help="seconds per training step")
    ap.add_argument("--max-events", type=int, default=None,
                    help="convert's --max-events (default: convert's own)")
    ap.add_argument("--formats", nargs="+", default=["json", "pftrace"], choices=["json", "pftrace"])
    ap.add_argument("--load-timeout", type=float, default=900.0)
    ap.add_argument("--no-load", action="store_true", help="skip the trace processor loads")
    ap.add_argument("--keep", type=Path, default=None, help="write the run and outputs here (kept)")
    ap.add_argument("--load-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_child is not None:
        load_child(args.load_child)
        return
    with tempfile.TemporaryDirectory(prefix="rltrace-bench-convert-") as tmp:
        root = args.keep or Path(tmp)
        logdir = root / "run"
        (logdir / "perf_tracer").mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        events = sum(write_rank(logdir / "perf_tracer" / f"traces-r{r}.jsonl", r, args.ranks,
                                args.hours * 3600, args.step_s, args.events / args.ranks, torn=r % 8 == 7)
                     for r in range(args.ranks))
        in_bytes = sum(p.stat().st_size for p in (logdir / "perf_tracer").iterdir())
        result: dict[str, Any] = {
            "benchmark": "convert", "ranks": args.ranks, "hours": args.hours, "input_events": events,
            "input_bytes": in_bytes, "torn_files": args.ranks // 8,
            "generate_s": round(time.perf_counter() - t0, 1),
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "formats": {}}
        for fmt in args.formats:
            out_dir = root / f"out-{fmt}"
            out_dir.mkdir(exist_ok=True)
            out = out_dir / f"trace.{fmt}"
            cmd = [sys.executable, "-m", "rltrace.cli", "convert", str(logdir), "-o", str(out),
                   "--no-progress"]
            if args.max_events is not None:
                cmd += ["--max-events", str(args.max_events)]
            wall, rss, code = child(cmd, out_dir / "convert.log")
            if code != 0:
                sys.exit(f"rltrace convert failed:\n{(out_dir / 'convert.log').read_text()[-3000:]}")
            files = sorted(p for p in out_dir.iterdir() if p.suffix == out.suffix)
            out_bytes = sum(p.stat().st_size for p in files)
            entry: dict[str, Any] = {
                "seconds": round(wall, 1), "s_per_million_events": round(wall / (events / 1e6), 2),
                "peak_rss_mb": round(rss / 1e6, 1), "output_bytes": out_bytes,
                "output_vs_input": round(out_bytes / in_bytes, 3), "files": len(files),
                "log_tail": (out_dir / "convert.log").read_text().splitlines()[:3]}
            if not args.no_load:
                entry["loads"] = [load(p, args.load_timeout) for p in files]
            result["formats"][fmt] = entry
        if {"json", "pftrace"} <= result["formats"].keys():
            result["pftrace_vs_json_bytes"] = round(result["formats"]["pftrace"]["output_bytes"]
                                                    / result["formats"]["json"]["output_bytes"], 3)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
