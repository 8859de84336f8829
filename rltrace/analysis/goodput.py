"""Goodput in the report: each rank's step split into productive, overhead, idle and wasted
time (the split and the waste taxonomy are :mod:`rltrace.accounting.goodput`'s, shared with ``rltrace top``
and ``rltrace diff``), every generated token, the sections seen with their class, the groups
whose rewards had zero spread and the truncated completions.

Tokens are the ``output_tokens`` of the session records (``gen_ai.usage.output_tokens`` of their
phases): generated (all), accepted (trained on with a gradient) and wasted, per rank and step,
and per second of the step's wall time.  Staleness is each trained sample's version lag: the
policy version of the train step that used it (``rl.policy.version`` of its ``rltrace.step``
scope) minus the version that generated it (``policy_version`` of its record;
``rltrace.set_policy_version``), and what staleness cost: the wasted sessions by reason, with
their time and tokens.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from rltrace.accounting.goodput import (
    BUCKETS,
    RankStepWork,
    classify,
    section_times,
    split_rank_step,
)
from rltrace.analysis.goodput_reader import GoodputReader

if TYPE_CHECKING:
    from rltrace.analysis.run import Run

__all__ = ["build", "sections", "staleness"]


def _shares(sec: dict[str, float]) -> dict[str, float | None]:
    total = sum(sec.values())
    return {k: (v / total if total > 0 else None) for k, v in sec.items()}


def _add(into: dict[str, float], sec: dict[str, float]) -> None:
    for k, v in sec.items():
        into[k] = into.get(k, 0.0) + v


_TOKEN_KINDS = ("generated", "accepted", "wasted")


def _add_tokens(into: dict[str, float], work: RankStepWork) -> None:
    into["generated"] += work.tokens_generated
    into["accepted"] += work.tokens_accepted
    into["wasted"] += work.tokens_wasted


def _new_row(**head: object) -> dict[str, Any]:
    return {**head, "wall_s": 0.0, "seconds": dict.fromkeys(BUCKETS, 0.0),
            "tokens": dict.fromkeys(_TOKEN_KINDS, 0.0)}


class _TimeSplit:
    """Each (rank, step)'s wall time split into the goodput buckets, summed overall, by role, and
    as one row per step (its wall time: the longest rank's) and per rank (its steps' sum)."""

    def __init__(self) -> None:
        self.overall = dict.fromkeys(BUCKETS, 0.0)
        self.by_role: dict[str, dict[str, float]] = {}
        self.steps: dict[int, dict[str, Any]] = {}
        self.ranks: dict[int, dict[str, Any]] = {}

    def add(self, rank: int, step: int, role: str | None, wall: float, sec: dict[str, float],
            work: RankStepWork | None) -> None:
        _add(self.overall, sec)
        _add(self.by_role.setdefault(role or "–", dict.fromkeys(BUCKETS, 0.0)), sec)
        st = self.steps.setdefault(step, _new_row(step=step))
        st["wall_s"] = max(st["wall_s"], wall)
        rk = self.ranks.setdefault(rank, _new_row(rank=rank, role=role))
        rk["wall_s"] += wall
        for row in (st, rk):
            _add(row["seconds"], sec)
            if work is not None:
                _add_tokens(row["tokens"], work)

    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The step rows and the rank rows, in order, with their shares and token rates."""
        for row in (*self.steps.values(), *self.ranks.values()):
            row["share"] = _shares(row["seconds"])
            row["tokens_per_s"] = {k: (v / row["wall_s"] if row["wall_s"] > 0 else None)
                                   for k, v in row["tokens"].items()}
        return ([self.steps[s] for s in sorted(self.steps)],
                [self.ranks[r] for r in sorted(self.ranks)])


def _split_time(run: Run, reader: GoodputReader) -> _TimeSplit:
    infos = run.steps_info
    roles = {**run.traces.roles(), **run.reader.roles}
    split = _TimeSplit()
    for rank, step in sorted(set(infos) | set(reader.work)):
        work = reader.work.get((rank, step))
        wall, sec = split_rank_step(infos.get((rank, step)), work, run.options.rollout_scope)
        if wall > 0:
            split.add(rank, step, roles.get(rank), wall, sec, work)
    return split


def _tokens(reader: GoodputReader, step_wall: float) -> dict[str, Any]:
    """Every generated token of the run: accepted, wasted, and per second of step wall time."""
    tokens = dict.fromkeys(_TOKEN_KINDS, 0.0)
    for w in reader.work.values():
        _add_tokens(tokens, w)
    return {**tokens, "trained": tokens["accepted"],
            "wasted_share": tokens["wasted"] / tokens["generated"] if tokens["generated"] else None,
            "per_s": {k: (v / step_wall if step_wall > 0 else None) for k, v in tokens.items()}}


def _zero_advantage_and_truncated(reader: GoodputReader) -> dict[str, dict[str, Any]]:
    """The groups whose rewards had zero spread, and the truncated completions."""
    works = reader.work.values()
    sessions = sum(w.sessions for w in works)
    truncated = sum(w.truncated for w in works)
    return {
        "zero_advantage": {"groups": len(reader.zero_groups), "groups_total": len(reader.groups),
                           "sessions": sum(w.zero_adv for w in works),
                           "seconds": sum(w.zero_adv_s for w in works),
                           "tokens": sum(w.zero_adv_tokens for w in works)},
        "truncated": {"sessions": truncated, "of_sessions": sessions,
                      "share": truncated / sessions if sessions else None,
                      "tokens": sum(w.truncated_tokens for w in works)},
    }


def build(run: Run) -> dict[str, Any]:
    """The goodput section of the report of ``run`` (see the module docstring)."""
    reader: GoodputReader = run.reader.goodput
    split = _split_time(run, reader)
    by_step, by_rank = split.rows()
    return {
        "buckets": list(BUCKETS),
        "seconds": split.overall, "share": _shares(split.overall),
        "by_role": {role: {"seconds": sec, "share": _shares(sec)}
                    for role, sec in sorted(split.by_role.items())},
        "by_step": by_step,
        "by_rank": by_rank,
        "tokens": _tokens(reader, sum(s["wall_s"] for s in by_step)),
        "staleness": staleness(run, reader),
        "sections": sections(run),
        "section_outliers": section_outliers(run),
        **_zero_advantage_and_truncated(reader),
    }


#: a section's own time in a step is an outlier past this many times its median over the steps
OUTLIER_X_MEDIAN = 2.0


def section_outliers(run: Run) -> list[dict[str, Any]]:
    """The sections that took far longer than usual in one step, nested ones included (a TRL
    reward function inside the generation, a verl ``update_weights``): own time above its median
    over the (rank, step)s that ran it by ``k`` scaled MADs and by :data:`OUTLIER_X_MEDIAN` times,
    and at least 5% of that step's wall time; by excess over the median, largest first."""
    seen: dict[str, list[tuple[int, int, float]]] = {}
    walls: dict[tuple[int, int], float] = {}
    for (rank, step), info in run.steps_info.items():
        walls[(rank, step)] = info.dur_us / 1e6
        for name, (_, sec) in section_times(info, run.options.rollout_scope)[0].items():
            seen.setdefault(name, []).append((rank, step, sec))
    k = run.options.k
    out: list[dict[str, Any]] = []
    for name, rows in seen.items():
        if len(rows) < 3:
            continue
        secs = sorted(sec for _, _, sec in rows)
        med = statistics.median(secs)
        mad = statistics.median(abs(s - med) for s in secs) * 1.4826
        for rank, step, sec in rows:
            wall = walls.get((rank, step), 0.0)
            if (sec > med + k * mad and sec > OUTLIER_X_MEDIAN * med and wall > 0
                    and sec >= 0.05 * wall):
                out.append({"section": name, "class": classify(name, rollout_scope=run.options.rollout_scope),
                            "rank": rank, "step": step, "seconds": sec, "median_s": med,
                            "step_s": wall, "excess_s": sec - med})
    out.sort(key=lambda r: -r["excess_s"])
    return out


def sections(run: Run) -> list[dict[str, Any]]:
    """Each ``train.*`` section under the steps with its class in the waste taxonomy and its own
    time (less its nested sections') summed over ranks and steps, longest first."""
    total: dict[str, tuple[str, float]] = {}
    for info in run.steps_info.values():
        for name, (cls, sec) in section_times(info, run.options.rollout_scope)[0].items():
            t = total.get(name)
            total[name] = (cls, sec) if t is None else (t[0], t[1] + sec)
    return [{"section": name, "class": cls, "seconds": sec}
            for name, (cls, sec) in sorted(total.items(), key=lambda kv: -kv[1][1])]


def staleness(run: Run, reader: GoodputReader) -> dict[str, Any]:
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
