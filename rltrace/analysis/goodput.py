"""Goodput in the report: each rank's step split into productive, overhead, idle and wasted
time (the split itself is :mod:`rltrace.goodput`'s, shared with ``rltrace top``), and every
generated token.

Tokens are the ``output_tokens`` of the session records (``gen_ai.usage.output_tokens`` of their
phases): generated (all), accepted (trained on) and wasted, per rank and step, and per second
of the step's wall time.  Staleness is each trained sample's version lag: the policy version of
the train step that used it (``rl.policy.version`` of its ``rltrace.step`` scope) minus the
version that generated it (``policy_version`` of its record; ``rltrace.set_policy_version``), and
what staleness cost: the rejected sessions by reason, with their time and tokens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..goodput import BUCKETS, RankStepWork, split_rank_step
from ..readers import timeline
from ..sessions import THROWN_AWAY

__all__ = ["GoodputReader", "build", "staleness"]


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
        tokens = rec.get("output_tokens") or 0.0
        phase_s = w.add(((s, e) for _, kind, s, e, _ in d.raw if kind == timeline.KIND_PHASE),
                        status, tokens, rec.get("policy_version"), submit, final)
        if status in THROWN_AWAY:
            key = (status, str(rec.get("reason") or "–"))
            t = self.thrown.get(key)
            if t is None:
                t = self.thrown[key] = [0, 0.0, 0.0]
            t[0] += 1
            t[1] += phase_s
            t[2] += tokens


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
