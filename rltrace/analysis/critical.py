"""The cross-rank critical path of each step: the chain of (rank, scope or session phase) that
set the step's length, and how much shorter the step would have been without each link's
excess over its median ("what if").

A step's length is measured within each rank, on that rank's own step window (its
``train.step`` scope, else the span of its ``train.*`` scopes that carry the step): ranks that do
not wait on each other may start seconds apart (one launched later, a rollout rank running ahead
of a trainer in async RL), and one rank's start to another's end is no duration of anything.
The step's length is its longest rank's; that rank sets it.  Where ranks do wait on each other
(a synchronous step's all-reduce or barrier), the wait lies inside the waiting rank's own window,
so it still counts, on the rank that waited.  In async RL a rollout rank's step N (generating the
batch) and a trainer's step N (training on it) are different work over different windows: each
is measured on its own rank, the step's length is the longer of them, and ``rltrace diff`` shows
each role's step time beside it.

Walking the top-level ``train.*`` scopes of the rank that set the length, each scope is a link;
its rollout scope ends when the samples it waits for are done: on a rank that rolls out itself,
its session that finished its own work last; on a rank that only trains, the last session to
finish on any rank (the link crosses ranks). A session link names the segment that made that
session slow (its phase and turn, against the median of that phase's executions).

What if: a scope link at its median would have made the step shorter by its excess over the
median, but no shorter than the next longest rank's step (the step's slack); a session link
at its slow segment's median by that excess, but no earlier than the next session to finish
(another sample then holds the rollout), and within the step's slack.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rltrace.analysis.trace_aggregates import StepInfo

if TYPE_CHECKING:
    from rltrace.analysis.run import Run

#: links named over the run in the report
TOP_LINKS = 5


def analyze(run: Run) -> dict[str, Any]:
    """Per step its chain and what-ifs, and the links that cost most over the run, for ``run``
    (a :class:`~.run.Run`)."""
    by_step: dict[int, list[tuple[int, StepInfo]]] = {}
    for (rank, step), info in run.steps_info.items():
        by_step.setdefault(step, []).append((rank, info))
    medians = _scope_medians(run.steps_info.values())
    steps = [_step_path(run, step, lst, medians) for step, lst in sorted(by_step.items())]
    totals: dict[tuple[object, ...], dict[str, Any]] = {}
    for st in steps:
        for link in st["links"]:
            key = (link["rank"], link["what"]) if link["kind"] == "scope" else (
                link["rank"], link["step"], link["session_id"])
            t = totals.setdefault(key, {**{k: link[k] for k in ("rank", "what", "kind")}, "steps": 0,
                                        "what_if_s": 0.0, "session_id": link.get("session_id"),
                                        "step": link.get("step")})
            t["steps"] += 1
            t["what_if_s"] += link["what_if_s"]
    top = heapq.nlargest(TOP_LINKS, (t for t in totals.values() if t["what_if_s"] > 0),
                         key=lambda t: t["what_if_s"])
    return {"steps": steps, "top_links": top}


def _scope_medians(infos: Iterable[StepInfo]) -> dict[str, float]:
    durs: dict[str, list[float]] = {}
    for info in infos:
        for name, _, dur in info.scopes:
            durs.setdefault(name, []).append(dur / 1e6)
    return {name: statistics.median(v) for name, v in durs.items()}


def _last_sessions(run: Run, step: int, ranks: list[int] | None) -> list[tuple[float, dict[str, Any]]]:
    """(own end, brief) of the sessions that finished their work last in ``step`` (on ``ranks``,
    else on every rank), latest first."""
    out: list[tuple[float, dict[str, Any]]] = []
    for (rank, s), heap in run.reader.latest.items():
        if s == step and (ranks is None or rank in ranks):
            out.extend((own_end, brief) for own_end, _, brief in heap)
    out.sort(key=lambda t: -t[0])
    return out


def _step_path(run: Run, step: int, lst: list[tuple[int, StepInfo]],
               medians: dict[str, float]) -> dict[str, Any]:
    # within each rank: never one rank's start to another's end (see the module docstring)
    lengths = sorted((i.dur_us / 1e6, r) for r, i in lst)
    length, rank = lengths[-1]
    slack = length - lengths[-2][0] if len(lengths) > 1 else float("inf")
    info = dict(lst)[rank]
    start = info.start_us / 1e6
    links: list[dict[str, Any]] = []
    for name, s_us, d_us in sorted(info.scopes, key=lambda t: t[1]):
        dur = d_us / 1e6
        if run.traces.is_rollout(name):
            link = _rollout_link(run, step, rank, slack)
            if link is not None:
                links.append(link)
                continue
        med = medians.get(name, dur)
        excess = max(dur - med, 0.0)
        links.append({"kind": "scope", "rank": rank, "what": name, "step": step,
                      "start_s": s_us / 1e6 - start, "seconds": dur, "median_s": med, "excess_s": excess,
                      "what_if_s": min(excess, slack)})
    return {"step": step, "length_s": length, "ended_by_rank": rank,
            "slack_s": slack if slack != float("inf") else None, "links": links,
            "what_if_s": sum(x["what_if_s"] for x in links)}


def _rollout_link(run: Run, step: int, rank: int, slack: float) -> dict[str, Any] | None:
    """The session that ended ``rank``'s rollout in ``step`` (its own last, else any rank's)."""
    last = _last_sessions(run, step, [rank]) or _last_sessions(run, step, None)
    if not last:
        return None
    own_end, brief = last[0]
    nxt = last[1][0] if len(last) > 1 else None
    d = run.explain(brief)
    excess = max((d.get("slow_phase_s") or 0.0) - (d.get("slow_phase_median_s") or 0.0), 0.0)
    room = own_end - nxt if nxt is not None else excess
    turn = d.get("slow_turn")
    seg = d.get("slow_phase")
    phase = seg is not None and d.get("slow_kind") == "phase" and turn is not None
    what = f"{seg} turn {turn}" if phase else seg
    return {"kind": "session", "rank": brief["rank"], "step": step,
            "what": f"session {brief['session_id']}: {what}", "session_id": brief["session_id"],
            "task_id": brief.get("task_id"), "segment": seg, "turn": turn,
            "seconds": d.get("slow_phase_s"), "median_s": d.get("slow_phase_median_s"), "excess_s": excess,
            "what_if_s": min(excess, room, slack), "crosses_ranks": brief["rank"] != rank}
