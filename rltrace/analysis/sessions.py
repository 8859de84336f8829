"""Session records, aggregated as they are read.

Per session only a few numbers go into compact columns (``array.array``, ~50 bytes a session):
rank, step, status, task, finalized time, total and phase seconds, turns.  Everything else is
aggregated on the fly (generate time by turn, reasons, earliest submit per rank and step) or
kept for a bounded number of sessions (the slowest ones, the last ones to finish per rank and
step).
"""

from __future__ import annotations

import array
import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .load import OTHER, StepRange

MAX_REASONS = 500
MAX_STATUSES = 100  # status codes are int8
#: what a malformed record raises (it is then skipped and reported)
BAD_RECORD = (TypeError, ValueError, AttributeError, OverflowError, KeyError)



@dataclass
class SessionArrays:
    """The per-session columns, as numpy arrays (one element per session)."""

    rank: np.ndarray      # int32
    step: np.ndarray      # int32, -1 = no step
    status: np.ndarray    # int8 codes into ``status_names``
    task: np.ndarray      # int64 (task ids >= 0 as is; others interned as -1 - index)
    final: np.ndarray     # float64 epoch seconds
    total: np.ndarray     # float32 seconds
    turns: np.ndarray     # int16
    phases: dict[str, np.ndarray]  # float32 seconds per phase
    status_names: list[str]
    task_names: list[Any]

    @property
    def size(self) -> int:
        return int(self.rank.size)

    def task_label(self, code: int) -> Any:
        return code if code >= 0 else self.task_names[-1 - code]


class SessionReader:
    """Aggregates session records as they are read (see the module docstring)."""

    def __init__(self, steps: StepRange, top: int = 10, per_rank_step: int = 3) -> None:
        self.steps = steps
        self.top = top
        self.per_rank_step = per_rank_step
        self.n = 0
        self.filtered = 0
        self._rank = array.array("i")
        self._step = array.array("i")
        self._status = array.array("b")
        self._task = array.array("q")
        self._final = array.array("d")
        self._total = array.array("f")
        self._turns = array.array("h")
        self._phase_cols: dict[str, array.array] = {}
        self._phase_keys: list[tuple[str, str, array.array]] = []
        self.status_names: list[str] = []
        self._status_code: dict[str, int] = {}
        self.task_names: list[Any] = []
        self._task_code: dict[Any, int] = {}
        #: (status, reason) -> sessions
        self.reasons: dict[tuple[str, str], int] = {}
        #: (step, turn) -> [total generate seconds, executions]
        self.generate_by_turn: dict[tuple[int, int], list[float]] = {}
        #: (rank, step) -> earliest submit_ts
        self.first_submit: dict[tuple[int, int], float] = {}
        #: min-heap of (total_s, seq, brief): the ``top`` longest sessions
        self.slowest: list[tuple[float, int, dict[str, Any]]] = []
        #: (rank, step) -> min-heap of (finalized_ts, seq, brief): the last ones to finish
        self.latest: dict[tuple[int, int], list[tuple[float, int, dict[str, Any]]]] = {}

    def _new_phase(self, name: str) -> None:
        col = array.array("f", bytes(4 * self.n))
        self._phase_cols[name] = col
        self._phase_keys.append((name, name + "_s", col))

    def _brief(self, rec: dict[str, Any], rank: int, step: int, total: float) -> dict[str, Any]:
        phases = rec.get("phases") or {}
        gen = phases.get("generate") or ()
        return {
            "rank": rank, "step": None if step < 0 else step, "task_id": rec.get("task_id"),
            "session_id": rec.get("session_id"), "status": rec.get("status"),
            "reason": rec.get("reason"), "submit_ts": rec.get("submit_ts"),
            "finalized_ts": rec.get("finalized_ts"), "total_s": total, "turns": rec.get("turns"),
            "trace_id": rec.get("trace_id"),
            "phases_s": {p: float(rec.get(k) or 0.0) for p, k, _ in self._phase_keys
                         if rec.get(k)},
            "phase_counts": rec.get("phase_counts") or {p: len(v) for p, v in phases.items()},
            "generate_by_turn_s": [_dur(e) for e in gen[:32]],
        }

    def add(self, rec: dict[str, Any], default_rank: int) -> None:
        """Take one record.  Raises TypeError/ValueError on a malformed one, having kept nothing."""
        step = rec.get("step")
        if step is None:
            if not self.steps.everything:
                self.filtered += 1
                return
            s = -1
        else:
            s = int(step)
            if s not in self.steps:
                self.filtered += 1
                return
        # everything that can fail comes first, so a bad record leaves no partial row
        rank = rec.get("rank")
        r = default_rank if rank is None else int(rank)
        status = str(rec.get("status") or "pending")
        submit = rec.get("submit_ts")
        submit = None if submit is None else float(submit)
        final = rec.get("finalized_ts")
        final = (submit if submit is not None else math.nan) if final is None else float(final)
        total = rec.get("total_s")
        total = ((final - submit) if submit is not None else 0.0) if total is None else float(total)
        turns = min(int(rec.get("turns") or 0), 32767)
        phases = rec.get("phases") or {}
        present = rec.get("phase_counts")
        names = list(present if present is not None else phases)
        task = rec.get("task_id")
        if not (type(task) is int and 0 <= task < 1 << 63):
            hash(task)
        if not (-(1 << 31) < r < 1 << 31 and s < 1 << 31):
            raise ValueError(f"rank {r} or step {s} out of range")
        gen = phases.get("generate") or ()
        gen_turns = [((s, e.get("turn", i)), _dur(e)) for i, e in enumerate(gen)]
        for p in names:
            if p not in self._phase_cols:
                self._new_phase(p)
        values = []
        for p, key, _ in self._phase_keys:
            v = rec.get(key)
            values.append(float(v) if v is not None else sum(_dur(e) for e in phases.get(p, ())))
        # keep it
        code = self._status_code.get(status)
        if code is None and len(self.status_names) >= MAX_STATUSES:
            status = OTHER
            code = self._status_code.get(status)
        if code is None:
            code = self._status_code[status] = len(self.status_names)
            self.status_names.append(status)
        if status != "accepted":
            reason = rec.get("reason")
            if reason is not None:
                key = (status, str(reason))
                if key not in self.reasons and len(self.reasons) >= MAX_REASONS:
                    key = (status, OTHER)
                self.reasons[key] = self.reasons.get(key, 0) + 1
        if type(task) is int and 0 <= task < 1 << 63:
            t = task
        else:
            t = self._task_code.get(task, -1)
            if t == -1:
                t = self._task_code[task] = -1 - len(self.task_names)
                self.task_names.append(task)
        if submit is not None:
            fs = self.first_submit.get((r, s))
            if fs is None or submit < fs:
                self.first_submit[(r, s)] = submit
        for (_, _, col), v in zip(self._phase_keys, values, strict=True):
            col.append(v)
        gbt = self.generate_by_turn
        for k2, d in gen_turns:
            acc = gbt.get(k2)
            if acc is None:
                gbt[k2] = [d, 1]
            else:
                acc[0] += d
                acc[1] += 1
        self._rank.append(r)
        self._step.append(s)
        self._status.append(code)
        self._task.append(t)
        self._final.append(final)
        self._total.append(total)
        self._turns.append(turns)
        seq = self.n
        self.n += 1
        brief = None
        if len(self.slowest) < self.top or total > self.slowest[0][0]:
            brief = self._brief(rec, r, s, total)
            item = (total, seq, brief)
            if len(self.slowest) < self.top:
                heapq.heappush(self.slowest, item)
            else:
                heapq.heapreplace(self.slowest, item)
        h = self.latest.get((r, s))
        if h is None:
            self.latest[(r, s)] = [(final, seq, brief or self._brief(rec, r, s, total))]
        elif len(h) < self.per_rank_step or final > h[0][0]:
            item = (final, seq, brief or self._brief(rec, r, s, total))
            if len(h) < self.per_rank_step:
                heapq.heappush(h, item)
            else:
                heapq.heapreplace(h, item)

    def arrays(self) -> SessionArrays:
        return SessionArrays(
            rank=np.frombuffer(self._rank, dtype=np.int32),
            step=np.frombuffer(self._step, dtype=np.int32),
            status=np.frombuffer(self._status, dtype=np.int8),
            task=np.frombuffer(self._task, dtype=np.int64),
            final=np.frombuffer(self._final, dtype=np.float64),
            total=np.frombuffer(self._total, dtype=np.float32),
            turns=np.frombuffer(self._turns, dtype=np.int16),
            phases={p: np.frombuffer(c, dtype=np.float32) for p, c in self._phase_cols.items()},
            status_names=list(self.status_names), task_names=list(self.task_names),
        )

    def memory_bytes(self) -> int:
        cols = [self._rank, self._step, self._status, self._task, self._final, self._total,
                self._turns, *self._phase_cols.values()]
        return sum(c.itemsize * len(c) for c in cols)


def _dur(e: Any) -> float:
    try:
        return float(e["end_ts"]) - float(e["start_ts"])
    except (KeyError, TypeError, ValueError):
        return 0.0
