"""``rltrace demo``: a simulated asynchronous RL run on the CPU, traced end to end.

Each rank is its own process.  Per step it rolls out ``tasks_per_step`` tasks with ``samples``
concurrent multi-turn sessions each (generate / toolcall / reward with long-tailed durations),
then runs a train step and a weight sync.  Everything is written to the log dir, the per-rank
Chrome traces are merged into one Perfetto file, and a short summary is printed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import orjson

import rltrace
from rltrace import Category

from .config import TracerConfig, log_dir


@dataclass
class DemoOptions:
    """Command-line options of ``rltrace demo``."""

    fileroot: str = "./rltrace-demo"
    experiment_name: str = "demo"
    trial_name: str = "trial0"
    ranks: int = 2
    steps: int = 4
    tasks_per_step: int = 8
    samples: int = 4
    seed: int = 0
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None
    #: scales every simulated duration (tests use a small value)
    time_scale: float = 1.0


def _lognormal_s(rng: random.Random, median_ms: float, sigma: float, scale: float) -> float:
    return rng.lognormvariate(0.0, sigma) * median_ms / 1000.0 * scale


async def _session(rng: random.Random, opts: DemoOptions, task: int, sample: int) -> None:
    turns = rng.choice((1, 1, 2, 3))
    with rltrace.trace_scope("session", Category.SCHEDULER, {"task_id": task, "sample": sample}):
        for turn in range(turns):
            async with rltrace.atrace_scope("generate", Category.COMPUTE, {"turn": turn}):
                await asyncio.sleep(_lognormal_s(rng, 8, 0.8, opts.time_scale))
            if turn < turns - 1:
                async with rltrace.atrace_scope("toolcall", Category.IO, {"turn": turn}):
                    await asyncio.sleep(_lognormal_s(rng, 3, 0.6, opts.time_scale))
        async with rltrace.atrace_scope("reward", Category.COMPUTE):
            await asyncio.sleep(_lognormal_s(rng, 2, 0.5, opts.time_scale))
        stale = rng.random() < 0.1
        rltrace.instant("session.done", Category.SCHEDULER,
                        {"status": "rejected" if stale else "accepted"})


@rltrace.trace_perf("rollout.arun_episode", category=Category.COMPUTE)
async def _episode(rng: random.Random, opts: DemoOptions, task: int) -> None:
    await asyncio.gather(*(_session(rng, opts, task, s) for s in range(opts.samples)))


@rltrace.trace_perf("train.ppo_update", category=Category.COMPUTE)
def _train_step(rng: random.Random, opts: DemoOptions) -> float:
    end = time.perf_counter() + _lognormal_s(rng, 30, 0.2, opts.time_scale)
    acc = 0.0
    while time.perf_counter() < end:  # real CPU work, like a backward pass would be
        acc += sum(i * 0.5 for i in range(200))
    return acc


def _rank_main(opts: DemoOptions, rank: int) -> None:
    rltrace.configure(
        TracerConfig(experiment_name=opts.experiment_name, trial_name=opts.trial_name,
                     fileroot=opts.fileroot, role="actor", world_size=opts.ranks),
        rank=rank, otlp__endpoint=opts.otlp_endpoint, otlp__protocol=opts.otlp_protocol,
    )
    rng = random.Random(opts.seed * 1000 + rank)

    async def rollout(step: int) -> None:
        base = step * opts.tasks_per_step * opts.ranks + rank * opts.tasks_per_step
        await asyncio.gather(*(_episode(rng, opts, base + t) for t in range(opts.tasks_per_step)))

    for step in range(opts.steps):
        with rltrace.trace_scope("train.step", Category.COMPUTE, {"global_step": step}):
            with rltrace.trace_scope("train.rollout", Category.COMPUTE, {"global_step": step}):
                asyncio.run(rollout(step))
            _train_step(rng, opts)
            with rltrace.trace_scope("train.weight_sync", Category.COMM, {"global_step": step}):
                time.sleep(_lognormal_s(rng, 10, 0.3, opts.time_scale))
        rltrace.save(step=step)
    rltrace.shutdown()


def _summarise(merged: Path) -> str:
    durations: dict[str, list[float]] = defaultdict(list)
    slow: list[tuple[float, int, dict]] = []
    doc = orjson.loads(merged.read_bytes())
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X":
            durations[ev["name"]].append(ev["dur"] / 1000.0)
            if ev["name"] == "session":
                slow.append((ev["dur"] / 1000.0, ev["pid"], ev.get("args", {})))
    lines = [f"{'scope':<24}{'count':>7}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}{'total s':>10}"]
    for name in sorted(durations, key=lambda n: -sum(durations[n])):
        d = sorted(durations[name])
        q = statistics.quantiles(d, n=100, method="inclusive") if len(d) > 1 else d * 99
        lines.append(f"{name:<24}{len(d):>7}{q[49]:>10.1f}{q[89]:>10.1f}{q[98]:>10.1f}"
                     f"{sum(d) / 1000:>10.2f}")
    slow.sort(key=lambda x: -x[0])
    lines.append("slowest sessions:")
    for dur, pid, args in slow[:3]:
        lines.append(f"  {dur:8.1f} ms  process {pid}  task {args.get('task_id')} "
                     f"sample {args.get('sample')}")
    return "\n".join(lines)


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; return a process exit code."""
    from .convert import convert

    t0 = time.perf_counter()
    cfg = TracerConfig(experiment_name=opts.experiment_name, trial_name=opts.trial_name,
                       fileroot=opts.fileroot)
    logdir = log_dir(cfg)
    old = logdir / "perf_tracer"
    if old.is_dir():  # a fresh run replaces the previous demo's traces
        for f in old.glob("traces-r*.jsonl"):
            f.unlink()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(opts, r), name=f"rltrace-demo-r{r}")
             for r in range(opts.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        print(f"rltrace demo: rank process(es) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    merged = logdir / "trace.json"
    res = convert([logdir], merged, progress=False)
    print(f"rltrace demo: {opts.ranks} rank(s) x {opts.steps} steps in "
          f"{time.perf_counter() - t0:.1f} s; artifacts in {logdir}")
    print(_summarise(merged))
    print(f"merged trace: {merged} ({res.events} events)")
    print(f"open it: https://ui.perfetto.dev -> Open trace file -> {merged.resolve()}")
    return 0
