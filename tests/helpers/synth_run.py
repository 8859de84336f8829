"""Synthetic rltrace runs with known answers, for the ``rltrace report`` tests and benchmark.

``write_run(logdir, SynthSpec(...))`` writes, per rank, ``session_tracer/sessions-r{rank}.jsonl``
and ``perf_tracer/traces-r{rank}.jsonl`` in rltrace's exact formats: session records (AReaL
fields, then ``trace_id``, ``turns``, ``step``, ``verify_s``, ``phase_counts``) and Chrome
events (process metadata, ``train.step`` with ``{"rl.step": n}`` enclosing ``train.rollout``,
``train.ppo_update`` and ``train.weight_sync``, a ``samples`` counter).  Every step starts at
``t0 + step * step_period_s`` on every rank (whole seconds, so trace timestamps are exact).

Planted problems: a straggler rank whose generate phases are ``straggler_factor`` times slower
in one step, and a slow reward phase (``slow_reward_factor`` times) in a fraction of one rank's
sessions in one step.  With ``truth=True`` the returned :class:`SynthTruth` holds what the
report must find (completion times, rollout times per rank and step, turns, statuses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

PPO_S, SYNC_S, TOOL_S, REWARD_S, VERIFY_S, GAP_S = 5.0, 1.0, 0.1, 0.05, 0.02, 0.002


@dataclass
class SynthSpec:
    ranks: int = 4
    steps: int = 6
    sessions_per_step: int = 64  # per rank
    samples_per_task: int = 4
    seed: int = 0
    straggler_rank: int | None = 2
    straggler_step: int | None = 3
    straggler_factor: float = 4.0
    slow_reward_rank: int | None = 1
    slow_reward_step: int | None = 1
    slow_reward_every: int = 8  # every 8th session of that rank and step
    slow_reward_factor: float = 60.0
    reject_every: int = 10  # session index % 10 == 9: rejected (stale_weight)
    fail_every: int = 50  # session index % 50 == 7: failed (timeout)
    session_spans: bool = False  # also write rl.session + phase X events to the traces
    step_period_s: int = 100
    t0: int = 1_800_000_000
    truth: bool = True


@dataclass
class SynthTruth:
    completion: list[float] = field(default_factory=list)  # final - rollout start, per session
    step: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    generate_by_turn: dict[int, list[float]] = field(default_factory=dict)
    rollout_s: dict[tuple[int, int], float] = field(default_factory=dict)
    slow_reward_sessions: list[tuple[int, int, int]] = field(default_factory=list)  # rank, step, sid
    samples_counter: dict[int, float] = field(default_factory=dict)  # rank -> last value
    wall_s: dict[int, float] = field(default_factory=dict)
    bytes_written: int = 0


def session_record(*, task_id: Any, session_id: Any, rank: int, step: int | None, status: str,
                   reason: str | None, submit: float, phases: dict[str, list[tuple[float, float, int]]],
                   final: float, trace_id: str = "0" * 32) -> dict[str, Any]:
    """One record exactly as rltrace's SessionMetricsProcessor writes it."""
    totals = {p: sum(e - s for s, e, _ in ex) for p, ex in phases.items()}
    turns = max((t for ex in phases.values() for _, _, t in ex), default=-1) + 1
    return {
        "task_id": task_id, "session_id": session_id, "rank": rank, "status": status, "reason": reason,
        "submit_ts": submit, "finalized_ts": final, "total_s": final - submit,
        "generate_s": totals.get("generate", 0.0), "reward_s": totals.get("reward", 0.0),
        "toolcall_s": totals.get("toolcall", 0.0),
        "phases": {p: [{"start_ts": s, "end_ts": e, "turn": t} for s, e, t in ex]
                   for p, ex in phases.items()},
        "trace_id": trace_id, "turns": turns, "step": step, "verify_s": totals.get("verify", 0.0),
        "phase_counts": {p: len(ex) for p, ex in phases.items()},
    }


def meta_events(pid: int, rank: int, world: int) -> list[bytes]:
    head = b'{"pid":%d,"tid":0,"ph":"M","name":' % pid
    return [
        head + b'"process_name","args":{"name":"rank %d \xc2\xb7 actor \xc2\xb7 synth"}}\n' % rank,
        head + b'"process_labels","args":{"labels":"rank=%d,world_size=%d,role=actor,host=synth,'
               b'experiment=synth,trial=t0"}}\n' % (rank, world),
        head + b'"process_sort_index","args":{"sort_index":%d}}\n' % rank,
    ]


def x_event(pid: int, tid: int, start_s: float, dur_s: float, name: str, cat: str = "compute",
            args: dict[str, Any] | None = None) -> bytes:
    ts = math.floor(start_s * 1e6)
    dur = dur_s * 1e6 - (start_s * 1e6 - ts)  # rltrace: ts floored to the µs, dur exact from it
    return orjson.dumps({"pid": pid, "tid": tid, "ph": "X", "ts": ts, "dur": dur,
                         "name": name, "cat": cat, "args": args or {}}) + b"\n"


def write_run(logdir: Path, spec: SynthSpec) -> SynthTruth:
    """Write the run described by ``spec`` under ``logdir``; return the known answers."""
    truth = SynthTruth()
    (logdir / "session_tracer").mkdir(parents=True, exist_ok=True)
    (logdir / "perf_tracer").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    n = spec.sessions_per_step
    for rank in range(spec.ranks):
        pid = 1000 + rank
        sess_path = logdir / "session_tracer" / f"sessions-r{rank}.jsonl"
        trace_path = logdir / "perf_tracer" / f"traces-r{rank}.jsonl"
        samples = 0
        with open(sess_path, "wb") as sf, open(trace_path, "wb") as tf:
            tf.writelines(meta_events(pid, rank, spec.ranks))
            for step in range(spec.steps):
                start = float(spec.t0 + step * spec.step_period_s)
                gen = rng.lognormal(mean=math.log(0.5), sigma=0.6, size=(n, 4))
                if rank == spec.straggler_rank and step == spec.straggler_step:
                    gen *= spec.straggler_factor
                lines: list[bytes] = []
                spans: list[bytes] = []
                last_final = start
                for i in range(n):
                    submit = start + 0.001 * (i + 1)
                    turns = 1 + (i * 7 + step) % 3
                    t = submit + 0.003
                    phases: dict[str, list[tuple[float, float, int]]] = {"generate": []}
                    for turn in range(turns):
                        g = float(gen[i, turn])
                        phases["generate"].append((t, t + g, turn))
                        t += g
                        if spec.truth:  # as the report reads it back: end_ts - start_ts
                            s0, e0, _ = phases["generate"][-1]
                            truth.generate_by_turn.setdefault(turn, []).append(e0 - s0)
                        if turn < turns - 1:
                            phases.setdefault("toolcall", []).append((t, t + TOOL_S, turn))
                            t += TOOL_S
                    if i % 5 == 0:
                        phases["verify"] = [(t, t + VERIFY_S, turns - 1)]
                        t += VERIFY_S
                    slow = (rank == spec.slow_reward_rank and step == spec.slow_reward_step
                            and i % spec.slow_reward_every == 0)
                    r = REWARD_S * (spec.slow_reward_factor if slow else 1.0)
                    phases["reward"] = [(t, t + r, turns - 1)]
                    final = t + r + GAP_S
                    sid = step * n + i
                    if spec.fail_every and i % spec.fail_every == 7:
                        status, reason = "failed", "TimeoutError: inference server timed out"
                    elif spec.reject_every and i % spec.reject_every == 9:
                        status, reason = "rejected", "stale_weight"
                    else:
                        status, reason = "accepted", None
                    rec = session_record(task_id=sid // spec.samples_per_task, session_id=sid, rank=rank,
                                         step=step, status=status, reason=reason, submit=submit,
                                         phases=phases, final=final, trace_id=f"{rank:08x}{sid:024x}")
                    lines.append(orjson.dumps(rec) + b"\n")
                    if spec.session_spans:
                        spans.append(x_event(pid, 2 + i % 32, submit, final - submit, "rl.session", "misc",
                                             {"rl.session.id": sid}))
                        for p, ex in phases.items():
                            spans.extend(x_event(pid, 2 + i % 32, s, e - s, p) for s, e, _ in ex)
                    last_final = max(last_final, final)
                    if slow:
                        truth.slow_reward_sessions.append((rank, step, sid))
                    if spec.truth:
                        truth.completion.append(final - start)
                        truth.step.append(step)
                        truth.rank.append(rank)
                        truth.turns.append(turns)
                        truth.total.append(final - submit)
                        truth.status.append(status)
                sf.writelines(lines)
                rollout = last_final + 0.01 - start
                truth.rollout_s[(rank, step)] = _dur_as_read(start, rollout)
                samples += n
                tf.writelines(spans)
                tf.write(x_event(pid, 1, start, rollout, "train.rollout", args={"global_step": step}))
                tf.write(x_event(pid, 1, start + rollout, PPO_S, "train.ppo_update"))
                tf.write(x_event(pid, 1, start + rollout + PPO_S, SYNC_S, "train.weight_sync", "comm"))
                end = start + rollout + PPO_S + SYNC_S
                tf.write(x_event(pid, 1, start, end - start, "train.step", args={"rl.step": step}))
                tf.write(b'{"pid":%d,"tid":0,"ph":"C","ts":%d,"name":"samples","args":{"value":%d}}\n'
                         % (pid, math.floor(end * 1e6), samples))
        truth.samples_counter[rank] = float(samples)
        truth.wall_s[rank] = (spec.steps - 1) * spec.step_period_s + _last_step_len(truth, rank, spec)
        truth.bytes_written += sess_path.stat().st_size + trace_path.stat().st_size
    return truth


def _dur_as_read(start_s: float, dur_s: float) -> float:
    """A duration as the report reads it back from an X event (µs ts and dur)."""
    ts = math.floor(start_s * 1e6)
    return (dur_s * 1e6 - (start_s * 1e6 - ts)) / 1e6


def _last_step_len(truth: SynthTruth, rank: int, spec: SynthSpec) -> float:
    return truth.rollout_s[(rank, spec.steps - 1)] + PPO_S + SYNC_S
