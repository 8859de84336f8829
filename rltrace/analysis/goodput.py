"""Goodput: where every second of each rank's steps went, and every generated token.

Each rank's step (its ``rltrace.step`` scope; on a rank that only rolls out, its sessions' first
submit to last finalize in that step) is split into four buckets that add up to its wall time:

* **productive**: train compute (the ``train.*`` scopes directly under the step that are not
  overhead or the rollout) and the generation, tool and reward time of samples that were
  accepted (trained on);
* **overhead**: weight sync, checkpoints, data loading, flushing (``train.*`` scopes named for
  them: :data:`OVERHEAD_WORDS`) and the step's time outside any ``train.*`` scope (untraced);
* **idle**: rollout time with no session phase running on the rank (a trainer waiting for
  rollouts, a rollout worker waiting for work or weights);
* **wasted**: the generation, tool and reward time of rejected, failed and dropped samples.

During the rollout the rank is busy while any of its sessions runs a phase (the union of their
phase executions); that busy time is shared between productive and wasted in proportion to the
phase time of accepted and of thrown-away sessions.

Tokens are the ``output_tokens`` of the session records (``gen_ai.usage.output_tokens`` of their
phases): generated (all), accepted (trained on) and wasted, per rank and step, and per second
of the step's wall time.  Staleness is each trained sample's version lag: the policy version of
the train step that used it (``rl.policy.version`` of its ``rltrace.step`` scope) minus the
version that generated it (``policy_version`` of its record; ``rltrace.set_policy_version``), and
what staleness cost: the rejected sessions by reason, with their time and tokens.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..readers import timeline
from ..sessions import THROWN_AWAY

BUCKETS = ("productive", "overhead", "idle", "wasted")
#: ``train.*`` scopes whose name holds one of these words are overhead, not train compute
OVERHEAD_WORDS = ("sync", "weight", "broadcast", "checkpoint", "ckpt", "save", "load", "data",
                  "offload", "flush")
_OVERHEAD = re.compile("|".join(OVERHEAD_WORDS), re.IGNORECASE)


@dataclass
class RankStepWork:
    """What the session records say one rank did in one step."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    accepted_s: float = 0.0
    wasted_s: float = 0.0
    first_submit: float = float("inf")
    last_final: float = float("-inf")
    tokens_generated: float = 0.0
    tokens_accepted: float = 0.0
    tokens_wasted: float = 0.0
    #: policy version that generated each accepted session -> sessions
    versions: Counter[int] = field(default_factory=Counter)
    accepted: int = 0
    unversioned: int = 0


class GoodputReader:
    """Takes each session record as the report reads it (kept per rank and step: phase
    intervals, 16 bytes per phase execution, and a few sums)."""

    def __init__(self) -> None:
        self.work: dict[tuple[int, int], RankStepWork] = {}
        #: (status, reason) of thrown-away sessions -> [sessions, phase seconds, tokens]
        self.thrown: dict[tuple[str, str], list[float]] = {}

    def add(self, rec: dict[str, Any], rank: int, step: int, status: str,
            d: timeline.Decomposition, submit: float | None, final: float) -> None:
        w = self.work.get((rank, step))
        if w is None:
            w = self.work[(rank, step)] = RankStepWork()
        phase_s = 0.0
        for _, kind, s, e, _ in d.raw:
            if kind == timeline.KIND_PHASE and e > s:
                w.starts.append(s)
                w.ends.append(e)
                phase_s += e - s
        if submit is not None and submit < w.first_submit:
            w.first_submit = submit
        if final > w.last_final:
            w.last_final = final
        tokens = rec.get("output_tokens") or 0.0
        w.tokens_generated += tokens
        if status == "accepted":
            w.accepted_s += phase_s
            w.tokens_accepted += tokens
            w.accepted += 1
            v = rec.get("policy_version")
            if type(v) is int:
                w.versions[v] += 1
            else:
                w.unversioned += 1
        elif status in THROWN_AWAY:
            w.wasted_s += phase_s
            w.tokens_wasted += tokens
            key = (status, str(rec.get("reason") or "–"))
            t = self.thrown.get(key)
            if t is None:
                t = self.thrown[key] = [0, 0.0, 0.0]
            t[0] += 1
            t[1] += phase_s
            t[2] += tokens


def union_s(starts: array[float], ends: array[float], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one of the intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts, ends, strict=True)):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def split_rank_step(info: Any, work: RankStepWork | None,
                    rollout_scope: str) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per bucket) of one rank's step."""
    b = dict.fromkeys(BUCKETS, 0.0)
    if info is not None:
        wall = info.dur_us / 1e6
        lo, hi = info.start_us / 1e6, (info.start_us + info.dur_us) / 1e6
        rollout_s, covered = 0.0, 0.0
        for name, us in info.breakdown.items():
            s = us / 1e6
            covered += s
            if name == rollout_scope:
                rollout_s += s
            else:
                b["overhead" if _OVERHEAD.search(name) else "productive"] += s
        if info.rollout_start_us is not None:
            lo, hi = info.rollout_start_us / 1e6, info.rollout_end_us / 1e6
        b["overhead"] += max(wall - covered, 0.0)  # untraced
    elif work is not None and work.last_final > work.first_submit:
        lo, hi = work.first_submit, work.last_final
        wall = rollout_s = hi - lo
    else:
        return 0.0, b
    busy = 0.0
    if work is not None and rollout_s > 0:
        busy = min(union_s(work.starts, work.ends, lo, hi), rollout_s)
        phase = work.accepted_s + work.wasted_s
        if phase > 0:
            b["productive"] += busy * work.accepted_s / phase
            b["wasted"] += busy * work.wasted_s / phase
    b["idle"] += max(rollout_s - busy, 0.0)
    return wall, b


def _shares(sec: dict[str, float]) -> dict[str, float | None]:
    total = sum(sec.values())
    return {k: (v / total if total > 0 else None) for k, v in sec.items()}


def _add(into: dict[str, float], sec: dict[str, float]) -> None:
    for k, v in sec.items():
        into[k] = into.get(k, 0.0) + v


def build(run: Any) -> dict[str, Any]:
    """The goodput section of the report of ``run`` (a :class:`~.run.Run`; see the module
    docstring)."""
    reader: GoodputReader = run.reader.goodput
    infos = run.steps_info
    roles = {**run.traces.roles(), **run.reader.roles}
    keys = sorted(set(infos) | set(reader.work))
    overall = dict.fromkeys(BUCKETS, 0.0)
    by_role: dict[str, dict[str, float]] = {}
    steps: dict[int, dict[str, Any]] = {}
    ranks: dict[int, dict[str, Any]] = {}
    for rank, step in keys:
        work = reader.work.get((rank, step))
        wall, sec = split_rank_step(infos.get((rank, step)), work, run.options.rollout_scope)
        if wall <= 0:
            continue
        role = roles.get(rank) or "–"
        _add(overall, sec)
        _add(by_role.setdefault(role, dict.fromkeys(BUCKETS, 0.0)), sec)
        st = steps.setdefault(step, {"step": step, "wall_s": 0.0, "seconds": dict.fromkeys(BUCKETS, 0.0),
                                     "tokens": dict.fromkeys(("generated", "accepted", "wasted"), 0.0)})
        st["wall_s"] = max(st["wall_s"], wall)
        _add(st["seconds"], sec)
        rk = ranks.setdefault(rank, {"rank": rank, "role": roles.get(rank), "wall_s": 0.0,
                                     "seconds": dict.fromkeys(BUCKETS, 0.0),
                                     "tokens": dict.fromkeys(("generated", "accepted", "wasted"), 0.0)})
        rk["wall_s"] += wall
        _add(rk["seconds"], sec)
        if work is not None:
            for row in (st, rk):
                row["tokens"]["generated"] += work.tokens_generated
                row["tokens"]["accepted"] += work.tokens_accepted
                row["tokens"]["wasted"] += work.tokens_wasted
    for row in (*steps.values(), *ranks.values()):
        row["share"] = _shares(row["seconds"])
        row["tokens_per_s"] = {k: (v / row["wall_s"] if row["wall_s"] > 0 else None)
                               for k, v in row["tokens"].items()}
    tokens = dict.fromkeys(("generated", "accepted", "wasted"), 0.0)
    for w in reader.work.values():
        tokens["generated"] += w.tokens_generated
        tokens["accepted"] += w.tokens_accepted
        tokens["wasted"] += w.tokens_wasted
    step_wall = sum(s["wall_s"] for s in steps.values())
    return {
        "buckets": list(BUCKETS),
        "seconds": overall, "share": _shares(overall),
        "by_role": {role: {"seconds": sec, "share": _shares(sec)} for role, sec in sorted(by_role.items())},
        "by_step": [steps[s] for s in sorted(steps)],
        "by_rank": [ranks[r] for r in sorted(ranks)],
        "tokens": {**tokens, "trained": tokens["accepted"],
                   "wasted_share": tokens["wasted"] / tokens["generated"] if tokens["generated"] else None,
                   "per_s": {k: (v / step_wall if step_wall > 0 else None) for k, v in tokens.items()}},
        "staleness": staleness(run, reader),
    }


def staleness(run: Any, reader: GoodputReader) -> dict[str, Any]:
    """The version lag of trained samples, and the sessions thrown away by reason."""
    versions = run.traces.step_versions()
    trainers: dict[int, list[int]] = {}
    for rank, step in versions:
        trainers.setdefault(step, []).append(rank)
    lag: Counter[int] = Counter()
    unknown = 0
    for (rank, step), w in reader.work.items():
        v_train = versions.get((rank, step))
        if v_train is None and step in trainers:
            v_train = versions[(min(trainers[step]), step)]
        unknown += w.unversioned
        for v, n in w.versions.items():
            if v_train is None:
                unknown += n
            else:
                lag[v_train - v] += n
    known = sum(lag.values())
    thrown = [{"status": st, "reason": why, "sessions": int(t[0]), "seconds": t[1], "tokens": t[2]}
              for (st, why), t in sorted(reader.thrown.items(), key=lambda kv: -kv[1][1])]
    return {"lag": {str(k): n for k, n in sorted(lag.items())}, "trained": known, "unknown": unknown,
            "mean_lag": (sum(k * n for k, n in lag.items()) / known) if known else None,
            "max_lag": max(lag) if lag else None, "thrown_away": thrown}
