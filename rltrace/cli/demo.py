"""``rltrace demo``: a simulated asynchronous RL run on the CPU, traced end to end.

Each rank is its own process.  Per step (``rltrace.step``) a rollout executor submits
``tasks_per_step`` tasks with ``samples`` concurrent multi-turn sessions each (generate /
toolcall / a custom ``verify`` phase / reward, with long-tailed durations; ~2% fail with a
timeout, ~10% are rejected as stale), then a train step and a weight sync run.  Everything is
written to the log dir, the per-rank Chrome traces are merged into one Perfetto file, and a
summary is printed: sessions by status, phase percentiles, and (with the analysis extra) the
report's decomposition of session time, the sample that held each slowest group and why, and
the slowest sessions by their own time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

import rltrace
from rltrace import Category
from rltrace.accounting.quantiles import quantile
from rltrace.config import (
    ConfigError,
    SessionTracerConfig,
    TracerConfig,
    endpoint_problem,
    load_config,
    redact_endpoint,
)
from rltrace.logdir import layout as logdir_room
from rltrace.pipeline.otlp_exporter import otlp_endpoint, otlp_protocol
from rltrace.runtime import RUNTIME


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
    #: show ``rltrace top`` on the run while the ranks work (ranks publish their live state often)
    live: bool = False


def _lognormal_s(rng: random.Random, median_ms: float, sigma: float, scale: float) -> float:
    return rng.lognormvariate(0.0, sigma) * median_ms / 1000.0 * scale


class _Workflow:
    """A multi-turn agentic rollout written against the AReaL-style session API."""

    def __init__(self, rng: random.Random, opts: DemoOptions) -> None:
        self.rng = rng
        self.opts = opts

    @rltrace.trace_perf("rollout.arun_episode", category=Category.COMPUTE)
    async def arun_episode(self, task_id: int) -> list[Any]:
        results: list[Any] = await asyncio.gather(
            *(self._collect_sample(task_id) for _ in range(self.opts.samples)),
            return_exceptions=True,
        )
        return results

    @rltrace.session_context()
    async def _collect_sample(self, task_id: int) -> tuple[Any, float]:
        rng, scale = self.rng, self.opts.time_scale
        turns = rng.choice((1, 1, 2, 3, 4))
        for turn in range(turns):
            prompt = rng.randint(200, 800)
            async with rltrace.atrace_session_phase(
                "generate", start_payload={"model": "demo-7b", "input_tokens": prompt}
            ) as ph:
                await asyncio.sleep(_lognormal_s(rng, 8, 0.9, scale))
                ph.set_end_payload(output_tokens=rng.randint(20, 400))
            if rng.random() < 0.02:
                raise TimeoutError(f"inference server timed out (turn {turn})")
            if turn < turns - 1:
                async with rltrace.atrace_session_phase("toolcall",
                                                        start_payload={"tool_name": "python"}):
                    await asyncio.sleep(_lognormal_s(rng, 3, 0.7, scale))
        if rng.random() < 0.3:
            async with rltrace.atrace_session_phase("verify"):
                await asyncio.sleep(_lognormal_s(rng, 2, 0.4, scale))
        reward = await self._compute_reward()
        return rltrace.get_session_id(), reward

    async def _compute_reward(self) -> float:
        """The reward phase, its score reported as the phase's ``reward`` (an evaluation of the
        session in OTel's GenAI conventions: Phoenix shows it on the agent run)."""
        async with rltrace.atrace_session_phase("reward", start_payload={"reward_fn": "judge"}) as ph:
            await asyncio.sleep(_lognormal_s(self.rng, 2, 0.5, self.opts.time_scale))
            score = self.rng.random()
            ph.set_end_payload(reward=score)
        return score


@rltrace.trace_perf("train.ppo_update", category=Category.COMPUTE)
def _train_step(rng: random.Random, opts: DemoOptions) -> float:
    end = time.perf_counter() + _lognormal_s(rng, 30, 0.2, opts.time_scale)
    acc = 0.0
    while time.perf_counter() < end:  # real CPU work, like a backward pass would be
        acc += sum(i * 0.5 for i in range(200))
    return acc


async def _run_task(workflow: _Workflow, rng: random.Random, task_id: int) -> None:
    rltrace.set_task_id(rltrace.register_task(task_id))
    results = await workflow.arun_episode(task_id)
    for res in results:
        if isinstance(res, BaseException):
            continue  # session_context already finalized it as failed
        session_id, _reward = res
        if rng.random() < 0.1:
            rltrace.trace_session_event("mark_finalized", session_id=session_id,
                                        status="rejected", reason="stale_weight")
        else:
            rltrace.trace_session_event("mark_finalized", session_id=session_id,
                                        status="accepted")


def _rank_config(opts: DemoOptions, rank: int) -> tuple[TracerConfig, dict[str, Any]]:
    """The config a rank configures with, and its keyword overrides (``run_demo`` checks the same
    before it starts any rank)."""
    cfg = TracerConfig(experiment_name=opts.experiment_name, trial_name=opts.trial_name,
                       fileroot=opts.fileroot, role="actor", world_size=opts.ranks,
                       session_tracer=SessionTracerConfig(enabled=True, flush_threshold=64))
    overrides: dict[str, Any] = dict(
        rank=rank, otlp__endpoint=opts.otlp_endpoint, otlp__protocol=opts.otlp_protocol,
        live_interval_s=0.5 if opts.live else None, flush_interval_s=0.5 if opts.live else None,
        exporters__native=importlib.util.find_spec("perfetto") is not None,  # each rank's, as it goes
    )
    return cfg, overrides


def _rank_entry(opts: DemoOptions, rank: int, errors: Any) -> None:
    """A rank process: the demo's loop; a failure is sent to the parent as one line (the parent
    prints it once) and ends the process with exit code 2 (bad config) or 1, no traceback."""
    try:
        _rank_main(opts, rank)
    except ConfigError as exc:
        errors.put((rank, " ".join(str(exc).removeprefix("rltrace: ").split())))
        sys.exit(2)
    except Exception as exc:
        errors.put((rank, " ".join(f"{type(exc).__name__}: {exc}".split())))
        sys.exit(1)


def _rank_main(opts: DemoOptions, rank: int) -> None:
    cfg, overrides = _rank_config(opts, rank)
    rltrace.configure(cfg, **overrides)
    rltrace.register_phase("verify", category="compute")
    rng = random.Random(opts.seed * 1000 + rank)
    workflow = _Workflow(rng, opts)

    async def rollout(step: int) -> None:
        base = (step * opts.ranks + rank) * opts.tasks_per_step
        await asyncio.gather(*(_run_task(workflow, rng, base + t)
                               for t in range(opts.tasks_per_step)))

    rltrace.set_policy_version(0)  # the weights the rollouts generate with, and the trainer trains
    for step in range(opts.steps):
        with rltrace.step(step):
            with rltrace.trace_scope("train.rollout", Category.COMPUTE, {"global_step": step}):
                asyncio.run(rollout(step))
            _train_step(rng, opts)
            with rltrace.trace_scope("train.weight_sync", Category.COMM, {"global_step": step}):
                time.sleep(_lognormal_s(rng, 10, 0.3, opts.time_scale))
            rltrace.set_policy_version(step + 1)
        rltrace.save(step=step)
    rltrace.shutdown()


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """P50, P90, P99 by :data:`rltrace.accounting.quantiles.DEFINITION` (as ``rltrace report``
    and ``top``)."""
    v = sorted(values)
    p50, p90, p99 = (quantile(v, q) for q in (0.5, 0.9, 0.99))
    return p50, p90, p99


def _read_records(logdir: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for f in sorted((logdir / "session_tracer").rglob("sessions-r*.jsonl")):  # [role/] folders
        records.extend(orjson.loads(line) for line in f.read_bytes().splitlines() if line)
    return records


def _run_seconds(logdir: Path, took_s: float) -> float:
    """How long the ranks ran: first submit to last finalize in their records (not the time their
    exits took: a dead OTLP endpoint's bounded wait is not the run), else ``took_s``."""
    records = _read_records(logdir)
    if not records:
        return took_s
    return float(max(r["finalized_ts"] for r in records) - min(r["submit_ts"] for r in records))


def _phase_table(records: list[dict[str, Any]]) -> list[str]:
    """Sessions by status, then count and P50/P90/P99 of every phase's executions."""
    by_status: dict[str, int] = defaultdict(int)
    phase_times: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_status[r["status"]] += 1
        for name, execs in r["phases"].items():
            phase_times[name].extend((e["end_ts"] - e["start_ts"]) * 1000 for e in execs)
    lines = [f"sessions: {len(records)} — " + ", ".join(
        f"{k} {v}" for k, v in sorted(by_status.items(), key=lambda kv: -kv[1]))]
    lines.append(f"{'phase':<12}{'count':>7}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
    for name in sorted(phase_times, key=lambda n: -sum(phase_times[n])):
        p50, p90, p99 = _quantiles(phase_times[name])
        lines.append(f"{name:<12}{len(phase_times[name]):>7}{p50:>10.1f}{p90:>10.1f}{p99:>10.1f}")
    return lines


def _own_s(r: dict[str, Any]) -> float:
    """Submit to the session's last phase end (its own time, without waiting for its group)."""
    ends = [e["end_ts"] for execs in r["phases"].values() for e in execs]
    return float((max(ends) if ends else r["finalized_ts"]) - r["submit_ts"])


def _plain_causes(records: list[dict[str, Any]]) -> list[str]:
    """Without the analysis extra: the slowest sessions by their own time."""
    lines = ["slowest sessions: (own time: submit to last phase; causes: pip install 'rltrace[analysis]')"]
    for r in sorted(records, key=lambda r: -_own_s(r))[:3]:
        lines.append(f"  {_own_s(r) * 1000:7.1f} ms  rank {r['rank']} step {r.get('step')} task "
                     f"{r['task_id']} session {r['session_id']} ({r['status']}; {r['turns']} turns)")
    return lines


def _report_causes(logdir: Path) -> list[str]:
    """The report's analysis (rltrace.analysis): where time goes, who held groups, slowest sessions."""
    from rltrace.analysis import ReportOptions, build_report, load_run
    from rltrace.analysis.report import (
        fmt_pct,
        fmt_s,
        goodput_line,
        session_name,
        staleness_line,
        tokens_line,
        why_slow,
    )

    rep = build_report(load_run(logdir, ReportOptions(progress=False)))
    lines = [f"goodput (step time of all ranks): {goodput_line(rep['goodput']) or '–'}"]
    for line in (tokens_line(rep["goodput"]), staleness_line(rep["goodput"])):
        if line is not None:
            lines.append(f"  {line}")
    parts = ", ".join(f"{r['phase']} {fmt_pct(r['share'])}" for r in rep["phases"]["session"]["overall"][:6])
    lines += [f"session time: {parts}", "slowest groups (the sample that held each, and why):"]
    for g in rep["groups"]["groups"][:3]:
        lines.append(f"  {fmt_s(g['span_s']):>9}  rank {g['rank']} step {g['step']} task {g['task_id']}: "
                     f"session {g['holder']['session_id']} held it, {why_slow(g['holder'])}; "
                     f"{len(g['siblings_own_s'])} sibling(s) waited {fmt_s(g['group_wait_s'])}")
    lines.append("slowest sessions: (own time: submit to last phase)")
    for b in rep["longtail"]["slowest_sessions"][:3]:
        lines.append(f"  {fmt_s(b['own_s']):>9}  {session_name(b)} ({b['status']}): {why_slow(b)}")
    return lines


def _summarise(logdir: Path) -> str:
    records = _read_records(logdir)
    lines = _phase_table(records)
    try:
        lines += _report_causes(logdir)
    except ImportError:  # the analysis extra is optional
        lines += _plain_causes(records)
    return "\n".join(lines)


def rank_failures(failed: list[tuple[int, int | None]], reported: list[tuple[int, str]]) -> str:
    """One line for ranks that ended with a non-zero exit code: each distinct message a rank sent
    (rank numbers first), else the exit codes (a rank killed by a signal sends nothing)."""
    by_msg: dict[str, list[int]] = {}
    for rank, msg in sorted(reported):
        by_msg.setdefault(msg, []).append(rank)
    if by_msg:
        parts = [f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {msg}"
                 for msg, ranks in by_msg.items()]
        return "rltrace demo: " + "; ".join(parts)
    codes = ", ".join(f"rank {r} exit code {c}" if c is None or c >= 0 else f"rank {r} killed by signal {-c}"
                      for r, c in failed)
    return f"rltrace demo: rank process(es) failed: {codes}"


def check_options(opts: DemoOptions) -> str | None:
    """What is wrong with ``opts`` (one line naming the option and the fix), or None."""
    for flag, value in (("--ranks", opts.ranks), ("--steps", opts.steps),
                        ("--tasks", opts.tasks_per_step), ("--samples", opts.samples)):
        if value < 1:
            return f"rltrace demo: {flag} must be at least 1, got {value}"
    if opts.otlp_endpoint is not None:
        problem = endpoint_problem(opts.otlp_endpoint, opts.otlp_protocol)
        if problem is not None:
            return f"rltrace demo: --otlp-endpoint {problem}, got {redact_endpoint(opts.otlp_endpoint)!r}"
    return None


def run_demo(opts: DemoOptions) -> int:
    """Run the demo; return a process exit code (2, with one line on stderr, for bad options
    or a log dir that cannot be written)."""
    from rltrace.cli.convert import convert

    opts = replace(opts, fileroot=str(Path(opts.fileroot).expanduser().absolute()))  # config.yaml
    prepared = _prepare(opts)
    if isinstance(prepared, str):
        print(prepared, file=sys.stderr)
        return 2
    logdir = prepared
    t0 = time.perf_counter()
    _remove_previous_run(logdir)
    code = _run_ranks(opts, logdir)
    if code:
        return code
    took_s = time.perf_counter() - t0
    merged = logdir / "trace.json"
    res = convert([logdir], merged, progress=False)
    native, native_line = _native_trace(logdir)
    print(f"rltrace demo: {opts.ranks} rank(s) x {opts.steps} steps in {_run_seconds(logdir, took_s):.1f} s; "
          f"logs in {logdir}")
    print(_summarise(logdir))
    print(f"merged trace: {merged} ({res.events} events, Chrome JSON)")
    print(native_line)
    print(_next_steps(logdir, native or merged))
    return 0


def _prepare(opts: DemoOptions) -> Path | str:
    """The log dir the demo writes, made ready; or what is wrong (one line) with the options or
    with any rank's configuration (a rank that cannot configure is a bad option)."""
    problem = check_options(opts)
    if problem is not None:
        return problem
    try:
        base, overrides = _rank_config(opts, 0)
        cfg = load_config(base, **overrides)
        if otlp_endpoint(cfg.otlp) is not None:
            otlp_protocol(cfg.otlp)
        return logdir_room.prepare(cfg, RUNTIME.guarded)
    except ConfigError as exc:
        return f"rltrace demo: {str(exc).removeprefix('rltrace: ')}"


def _remove_previous_run(logdir: Path) -> None:
    """A fresh run replaces the previous demo's files."""
    for folder, pattern in (("perf_tracer", "traces-r*.jsonl"), ("session_tracer", "sessions-r*.jsonl"),
                            ("live", "live-r*.json")):
        for old in (logdir / folder).rglob(pattern):
            old.unlink()


def _run_ranks(opts: DemoOptions, logdir: Path) -> int:
    """Run every rank in its own process (watched live with ``--live``); 0 when all succeeded,
    else the exit code, with each failed rank's error on stderr."""
    ctx = multiprocessing.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank_entry, args=(opts, r, errors), name=f"rltrace-demo-r{r}")
             for r in range(opts.ranks)]
    for p in procs:
        p.start()
    if opts.live:
        from rltrace.cli.top import watch

        try:
            watch(logdir, interval_s=1.0, until=lambda: not any(p.is_alive() for p in procs))
        except KeyboardInterrupt:
            for p in procs:
                p.terminate()  # SIGTERM: each rank flushes what it has, then ends
    for p in procs:
        p.join()
    failed = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if not failed:
        return 0
    reported: list[tuple[int, str]] = []
    while not errors.empty():
        reported.append(errors.get())
    print(rank_failures(failed, reported), file=sys.stderr)
    return 2 if any(code == 2 for _, code in failed) else 1


def _native_trace(logdir: Path) -> tuple[Path | None, str]:
    """The run as Perfetto's native trace (``trace.pftrace``), and the line that names it."""
    from rltrace.cli.convert import ConvertError, convert

    native = logdir / "trace.pftrace"
    try:
        res = convert([logdir], native, progress=False)
    except ConvertError as exc:  # the perfetto extra is missing: say how to get it
        return None, f"native trace: not written ({exc})"
    per_rank = sorted(logdir.glob("perf_tracer/**/traces-r*.pftrace"))
    line = (f"native trace: {native} ({res.sessions} sessions on task/session tracks, "
            f"{res.flows} arrows to the train steps that used them, counters)")
    if per_rank:
        line += (f"\n  and each rank's, written as it ran: {per_rank[0].parent}/traces-r*.pftrace "
                 f"({len(per_rank)} files)")
    return native, line


def _next_steps(logdir: Path, trace: Path) -> str:
    """What to do with the run next, with the log dir actually used."""
    return "\n".join([
        "next:",
        f"  open the timeline   https://ui.perfetto.dev -> Open trace file -> {trace.resolve()}",
        "  query it with SQL   in that page: Query (SQL) in its left bar (Perfetto's trace processor, "
        "in the browser)",
        f"  read the report     rltrace report {logdir}",
        f"  watch a live run    rltrace top {logdir}   (or: rltrace demo --live)",
    ])
