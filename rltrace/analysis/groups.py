"""1. Slow groups: which sample held its GRPO group, in which phase and turn?

A group is the sessions of one task on one rank in one step: AReaL finalizes them together, so
each sample's ``total_s`` runs to its slowest sibling's end.  A group's span runs from its
first submit to the latest own end (last phase's end) among its sessions; that session *held*
the group, and every sibling's time after its own end is group wait caused by it.

The slowest groups with at least two sessions (by span) are re-read from the session files
(a second pass that keeps only their records) and shown whole: every member's time
decomposition (:mod:`.columns`, adding up to 100%) and segments for the timeline plot, and
the holder's slowest segment (phase and turn, × its median, share of the holder's own time).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from rltrace.analysis import columns
from rltrace.analysis.descriptive import fnum
from rltrace.analysis.load import Progress, Skipped, file_rank
from rltrace.analysis.run import Run, describe
from rltrace.analysis.session_aggregates import BAD_RECORD, Parsed, iter_sessions, step_or_none
from rltrace.readers import MAX_TEXT

MAX_GROUPS = 5
MAX_MEMBERS = 64

GroupKey = tuple[int, int, int]  # rank, step (NO_STEP: none), task code


def select(run: Run, n: int = MAX_GROUPS) -> list[tuple[GroupKey, float]]:
    """The ``n`` groups with the longest span (first submit to last own end), 2+ sessions each."""
    s = run.sessions
    if s.size == 0:
        return []
    order = np.lexsort((s.task, s.step, s.rank))
    rk, st, tk = s.rank[order], s.step[order], s.task[order]
    change = np.ones(order.size, dtype=bool)
    change[1:] = (rk[1:] != rk[:-1]) | (st[1:] != st[:-1]) | (tk[1:] != tk[:-1])
    starts = np.flatnonzero(change)
    sizes = np.diff(np.append(starts, order.size))
    own_end = s.own_end[order]
    first = own_end - s.own[order].astype(np.float64)
    span = np.maximum.reduceat(own_end, starts) - np.minimum.reduceat(first, starts)
    span[sizes < 2] = -np.inf
    pick = [int(i) for i in np.argsort(-span, kind="stable")[:n] if np.isfinite(span[i])]
    return [((int(rk[starts[i]]), int(st[starts[i]]), int(tk[starts[i]])), float(span[i])) for i in pick]


def _needle(run: Run, keys: list[GroupKey]) -> re.Pattern[bytes] | None:
    """A raw-line prefilter: ``"task_id":<one of the wanted ids>`` (None: keep every line)."""
    alts = []
    for _, _, code in keys:
        label = run.sessions.task_label(code)
        if type(label) is str and len(label) > MAX_TEXT:
            return None  # capped as it was read: the file holds more
        try:
            alts.append(re.escape(orjson.dumps(label)))
        except TypeError:
            return None
    return re.compile(b'"task_id": ?(?:' + b"|".join(alts) + b")[,}]")


def collect(run: Run, keys: list[GroupKey]) -> dict[GroupKey, list[tuple[dict[str, Any], Parsed]]]:
    """Every record of the wanted groups, read again from the session files."""
    wanted = set(keys)
    out: dict[GroupKey, list[tuple[dict[str, Any], Parsed]]] = {k: [] for k in keys}
    needle = _needle(run, keys)
    want = (lambda raw: needle.search(raw) is not None) if needle is not None else None
    ranks = {k[0] for k in keys}
    reader = run.reader
    skipped, progress = Skipped(), Progress(0, False)
    for fi, path in enumerate(run.session_files):
        default_rank = file_rank(path, fi)
        for _, rec in iter_sessions(path, skipped, progress, want=want):
            try:
                p = reader.parse(rec, default_rank)
            except BAD_RECORD:
                continue
            if p is None or p.rank not in ranks:
                continue
            code = reader.task_code(p.task)
            key = (p.rank, p.step, code) if code is not None else None
            if key in wanted and len(out[key]) < MAX_MEMBERS:
                out[key].append((rec, p))
    progress.close()
    return out


def _member(run: Run, rec: dict[str, Any], p: Parsed, group_start: float, group_end: float) -> dict[str, Any]:
    d: columns.Decomposition = p.decomp
    segs = columns.split_segments(d, group_end)
    out = {"session_id": rec.get("session_id"), "status": p.status, "total_s": p.total, "own_s": d.own_s,
           "own_end_s": d.own_end - group_start, "trace_id": rec.get("trace_id"), "turns": rec.get("turns")}
    out.update(describe(segs, group_start, run.medians))
    return out


def analyze_group(run: Run, key: GroupKey, members: list[tuple[dict[str, Any], Parsed]]) -> dict[str, Any]:
    """One group: its members' decompositions, who held it, and the wait it caused."""
    rank, step, code = key
    start = min(p.decomp.start for _, p in members)
    end = max(p.decomp.own_end for _, p in members)
    rows = [_member(run, rec, p, start, end) for rec, p in members]
    rows.sort(key=lambda m: -m["own_end_s"])
    holder = rows[0]
    holder["held"] = True
    for m in rows[1:]:
        m["held"] = False
    whole = sum(sum(m["decomposition_s"].values()) for m in rows)
    wait = sum(m["group_wait_s"] for m in rows)
    return {
        "rank": rank, "step": step_or_none(step), "task_id": run.sessions.task_label(code),
        "sessions": len(rows), "start_ts": start, "span_s": end - start,
        "finalized_s": max(p.decomp.final for _, p in members) - start,
        "holder": {k: holder.get(k) for k in ("session_id", "own_s", "slow_phase", "slow_turn", "slow_kind",
                                              "slow_phase_s", "slow_phase_median_s", "slow_phase_x_median",
                                              "slow_share")},
        "group_wait_s": wait, "group_wait_share": fnum(wait / whole) if whole > 0 else None,
        "siblings_own_s": [m["own_s"] for m in rows[1:]],
        "members": rows,
    }


def analyze(run: Run) -> dict[str, Any]:
    """The slowest groups, each with every member's decomposition and its holder."""
    picked = select(run, MAX_GROUPS)
    found = collect(run, [k for k, _ in picked]) if picked else {}
    groups = [analyze_group(run, k, found[k]) for k, _ in picked if len(found.get(k, ())) >= 2]
    wait, _, _ = run.tail()
    total = sum(sum(d.values()) for d in run.buckets_by_step().values())
    return {"groups": groups, "total_group_wait_s": float(wait.sum()),
            "group_wait_share": fnum(float(wait.sum()) / total) if total > 0 else None}
