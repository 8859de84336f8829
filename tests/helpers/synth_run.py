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
    completion: list[float] = field(default_factory=list)  # own end (last phase) - rollout start
    step: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    own: list[float] = field(default_factory=list)  # submit to own end (last phase's end)
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
                    own_end = t + r
                    final = own_end + GAP_S
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
                        truth.completion.append(own_end - start)
                        truth.step.append(step)
                        truth.rank.append(rank)
                        truth.turns.append(turns)
                        truth.total.append(final - submit)
                        truth.own.append(own_end - submit)
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


# ---- GRPO groups with planted causes --------------------------------------------------------------
#
# ``write_grpo_run`` writes a run where every task is a GRPO group of ``samples`` sessions finalized
# together (AReaL's definition: ``finalized_ts`` is the group's, so ``total_s`` of every sample runs
# to its slowest sibling's end), with deterministic durations and three planted causes: one
# sample's generate in one turn is slow, one sample waits in a queue before its first phase, one
# tool call is slow.  ``areal_style=True`` marks steps exactly as AReaL's guide does: no
# ``rltrace.step`` (records carry ``"step": null``, no ``train.step`` scope), only
# ``trace_scope("train.rollout", args={"global_step": n, "epoch_step": n})`` and
# ``train.ppo_update`` with ``{"global_step": n}``.

Where = tuple[int, int, int, int]  # rank, step, task index in the step, sample index in the task


@dataclass
class GrpoSpec:
    ranks: int = 2
    steps: int = 4
    tasks: int = 4  # per rank and step
    samples: int = 4  # per task: one GRPO group
    turns: int = 2
    gen_s: float = 0.5
    tool_s: float = 0.1
    reward_s: float = 0.05
    gap_s: float = 0.001  # workflow code between two phases
    finalize_s: float = 0.002  # after the group's last phase, before mark_finalized
    slow_generate: tuple[Where, int] | None = ((1, 2, 1, 2), 1)  # (where, turn)
    slow_generate_s: float = 6.0
    queued: Where | None = (0, 1, 3, 0)
    queue_s: float = 3.0
    slow_tool: tuple[Where, int] | None = ((0, 3, 2, 1), 0)  # (where, turn)
    slow_tool_s: float = 4.0
    tools: tuple[str, ...] = ("python", "search")  # the tool of turn t: tools[t % len(tools)]
    areal_style: bool = False
    step_period_s: int = 100
    t0: int = 1_800_000_000


def grpo_ids(spec: GrpoSpec, where: Where) -> tuple[int, int]:
    """(task id, session id) of a sample: both count up per rank."""
    _, step, task, sample = where
    tid = step * spec.tasks + task
    return tid, tid * spec.samples + sample


def _grpo_phases(spec: GrpoSpec, where: Where, submit: float) -> dict[str, list[tuple[float, float, int]]]:
    t = submit + (spec.queue_s if spec.queued == where else 0.0)
    phases: dict[str, list[tuple[float, float, int]]] = {"generate": []}
    for turn in range(spec.turns):
        g = spec.slow_generate_s if spec.slow_generate == (where, turn) else spec.gen_s
        phases["generate"].append((t, t + g, turn))
        t += g + spec.gap_s
        if turn < spec.turns - 1:
            d = spec.slow_tool_s if spec.slow_tool == (where, turn) else spec.tool_s
            phases.setdefault("toolcall", []).append((t, t + d, turn))
            t += d + spec.gap_s
    phases["reward"] = [(t, t + spec.reward_s, spec.turns - 1)]
    return phases


def _grpo_spans(pid: int, tid: int, sid: int, task: int, spec: GrpoSpec,
                phases: dict[str, list[tuple[float, float, int]]]) -> list[bytes]:
    out = []
    for p, ex in phases.items():
        for s, e, turn in ex:
            args: dict[str, Any] = {"rl.phase": p, "rl.turn": turn, "rl.session.id": sid, "rl.task.id": task}
            if p == "toolcall":
                args["gen_ai.tool.name"] = spec.tools[turn % len(spec.tools)]
            out.append(x_event(pid, tid, s, e - s, p, "io" if p == "toolcall" else "compute", args))
    return out


def _grpo_step_scopes(pid: int, spec: GrpoSpec, step: int, start: float, rollout: float) -> list[bytes]:
    out = []
    if spec.areal_style:
        out.append(x_event(pid, 1, start, rollout, "train.rollout",
                           args={"global_step": step, "epoch_step": step}))
        out.append(x_event(pid, 1, start + rollout, PPO_S, "train.ppo_update", args={"global_step": step}))
        out.append(x_event(pid, 1, start + rollout + PPO_S, SYNC_S, "train.weight_sync", "comm"))
    else:
        out.append(x_event(pid, 1, start, rollout, "train.rollout", args={"global_step": step}))
        out.append(x_event(pid, 1, start + rollout, PPO_S, "train.ppo_update"))
        out.append(x_event(pid, 1, start + rollout + PPO_S, SYNC_S, "train.weight_sync", "comm"))
        out.append(x_event(pid, 1, start, rollout + PPO_S + SYNC_S, "train.step", args={"rl.step": step}))
    return out


def write_grpo_run(logdir: Path, spec: GrpoSpec) -> list[dict[str, Any]]:
    """Write the run; return every session record written (with ``own_end`` added, not on disk)."""
    (logdir / "session_tracer").mkdir(parents=True, exist_ok=True)
    (logdir / "perf_tracer").mkdir(parents=True, exist_ok=True)
    written: list[dict[str, Any]] = []
    for rank in range(spec.ranks):
        pid = 2000 + rank
        lines, events = [], meta_events(pid, rank, spec.ranks)
        for step in range(spec.steps):
            start = float(spec.t0 + step * spec.step_period_s)
            last = start
            for task in range(spec.tasks):
                group = []
                for sample in range(spec.samples):
                    where = (rank, step, task, sample)
                    tid, sid = grpo_ids(spec, where)
                    submit = start + 0.01 * (task + 1)
                    phases = _grpo_phases(spec, where, submit)
                    own_end = max(e for ex in phases.values() for _, e, _ in ex)
                    group.append((tid, sid, submit, phases, own_end))
                    events += _grpo_spans(pid, 2 + task * spec.samples + sample, sid, tid, spec, phases)
                final = max(g[4] for g in group) + spec.finalize_s
                last = max(last, final)
                for tid, sid, submit, phases, own_end in group:
                    rec = session_record(task_id=tid, session_id=sid, rank=rank,
                                         step=None if spec.areal_style else step, status="accepted",
                                         reason=None, submit=submit, phases=phases, final=final,
                                         trace_id=f"{rank:08x}{sid:024x}")
                    lines.append(orjson.dumps(rec) + b"\n")
                    written.append({**rec, "own_end": own_end, "true_step": step})
            events += _grpo_step_scopes(pid, spec, step, start, last + 0.01 - start)
        (logdir / "session_tracer" / f"sessions-r{rank}.jsonl").write_bytes(b"".join(lines))
        (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").write_bytes(b"".join(events))
    return written


# ---- trace-only runs: rollout times given per rank and step ----------------------------------------


def write_rollout_run(logdir: Path, rollout_s: Any, *, extra_scopes: tuple[str, ...] = (),
                      step_period_s: int = 100, t0: int = 1_800_000_000) -> None:
    """Write ``perf_tracer/traces-r{rank}.jsonl`` only (no session records): per rank and step a
    ``train.step`` scope holding ``train.rollout`` lasting ``rollout_s[rank, step]`` seconds, then
    ``train.ppo_update`` (PPO_S) and ``train.weight_sync`` (SYNC_S); each name of
    ``extra_scopes`` runs once per step after them (0.5 s, not a ``train.*`` scope).  Where
    ``rollout_s`` is NaN the step has no ``train.rollout`` scope (no rollout time there)."""
    m = np.asarray(rollout_s, dtype=float)
    (logdir / "perf_tracer").mkdir(parents=True, exist_ok=True)
    for rank in range(m.shape[0]):
        pid = 3000 + rank
        events = meta_events(pid, rank, m.shape[0])
        for step in range(m.shape[1]):
            start, rollout = float(t0 + step * step_period_s), float(m[rank, step])
            if math.isfinite(rollout):
                events.append(x_event(pid, 1, start, rollout, "train.rollout", args={"global_step": step}))
            else:
                rollout = 1.0
            events.append(x_event(pid, 1, start + rollout, PPO_S, "train.ppo_update"))
            events.append(x_event(pid, 1, start + rollout + PPO_S, SYNC_S, "train.weight_sync", "comm"))
            end = start + rollout + PPO_S + SYNC_S
            events.append(x_event(pid, 1, start, end - start, "train.step", args={"rl.step": step}))
            events += [x_event(pid, 2, end + 0.5 * i, 0.5, name) for i, name in enumerate(extra_scopes)]
        (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").write_bytes(b"".join(events))
