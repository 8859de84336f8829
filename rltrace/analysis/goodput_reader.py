"""The goodput side of reading session records: each record as the report reads it, kept per
rank and step (phase intervals and a few sums) for :mod:`rltrace.analysis.goodput`."""

from __future__ import annotations

from typing import Any

from rltrace.accounting.goodput import ZERO_ADVANTAGE, RankStepWork, session_fate, truncated_of
from rltrace.readers import session_time

__all__ = ["GoodputReader"]


class GoodputReader:
    """Takes each session record as the report reads it (kept per rank and step: phase
    intervals, 16 bytes per phase execution, and a few sums)."""

    #: groups (tasks) remembered for the zero-advantage count; beyond it only sessions count
    GROUPS_CAP = 1_000_000

    def __init__(self) -> None:
        self.work: dict[tuple[int, int], RankStepWork] = {}
        #: (status, reason) of wasted sessions -> [sessions, phase seconds, tokens]
        self.thrown: dict[tuple[str, str], list[float]] = {}
        #: the groups (tasks) seen, and those with a zero-advantage session
        self.groups: set[int | str] = set()
        self.zero_groups: set[int | str] = set()

    def add(self, rec: dict[str, Any], rank: int, step: int, status: str,
            d: session_time.Decomposition, submit: float | None, final: float) -> None:
        w = self.work.get((rank, step))
        if w is None:
            w = self.work[(rank, step)] = RankStepWork()
        tokens = rec.get("output_tokens") or 0.0
        reason = rec.get("reason")
        phase_s = w.add(((s, e) for _, kind, s, e, _ in d.raw if kind == session_time.KIND_PHASE),
                        status, tokens, rec.get("policy_version"), submit, final, reason,
                        truncated_of(rec))
        task = rec.get("task_id")
        if task is not None and type(task) in (int, str) and len(self.groups) < self.GROUPS_CAP:
            self.groups.add(task)
            if reason == ZERO_ADVANTAGE:
                self.zero_groups.add(task)
        if session_fate(status, reason) == "wasted":
            key = (status, str(reason or "–"))
            t = self.thrown.get(key)
            if t is None:
                t = self.thrown[key] = [0, 0.0, 0.0]
            t[0] += 1
            t[1] += phase_s
            t[2] += tokens
