"""Session records, aggregated as they are read.

Per session only a few numbers go into compact columns (``array.array``, ~60 bytes a session):
rank, step, status, task, finalized time, own end (its last phase's end), own and total
seconds, phase seconds, turns.  Everything else is aggregated on the fly (the time
decomposition of :mod:`.timeline` per step, phase time by turn, reasons, earliest submit per
rank and step) or kept for a bounded number of sessions (the slowest by their own time, the
last ones to finish their own work per rank and step).

A record without a step (AReaL's guide marks steps only in ``trace_scope`` args) takes the step
of the trace's step window on its rank that contains its submit time (else the next one to
start, which is the rollout that collects it, else the last one before it).  A rank with no
step windows of its own (a Ray actor, a rollout server) uses every rank's windows the same
way, except that a record submitted after they all ended keeps no step: no step of the run
collected it (the last step's window, borrowed from another process, says nothing of it).

Records are checked by :func:`rltrace.readers.check_session_record` as they are read
(:func:`iter_sessions`), so the readers here see only well-typed fields: a malformed record is
skipped and a malformed field ignored, both counted.  Steps are any int32 but ``NO_STEP``
(-2**31), which marks a record without a step in the step column.
"""

from __future__ import annotations

import array
import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rltrace.analysis import columns
from rltrace.analysis.descriptive import BoundedQuantiles
from rltrace.analysis.goodput_reader import GoodputReader
from rltrace.analysis.load import OTHER, Progress, Skipped, StepRange, iter_records
from rltrace.readers import check_session_record

MAX_REASONS = 500
MAX_STATUSES = 100  # status codes are int8
MAX_BUCKETS = 200  # decomposition buckets (phases, gaps between them): the rest go to OTHER
MAX_SEGMENTS = 64  # segments kept per briefed session
MAX_PHASE_COLUMNS = 256  # phases with a seconds column (records are checked to hold at most 64 each)
#: what a record could still raise past its check (a defect: it is then skipped and reported)
BAD_RECORD = (TypeError, ValueError, AttributeError, OverflowError, KeyError)
#: the step column's "no step"
NO_STEP = -(1 << 31)


def step_or_none(step: int) -> int | None:
    """A step column value as the report shows it: None for ``NO_STEP``."""
    return None if step == NO_STEP else step


def rank_step_keys(rank: np.ndarray, step: np.ndarray) -> np.ndarray:
    """One int64 per session for its (rank, step), ordered by rank, then no step, then step."""
    return (rank.astype(np.int64) << 32) | (step.astype(np.int64) - NO_STEP)


def rank_step_of(key: int) -> tuple[int, int]:
    """The (rank, step column value) of a :func:`rank_step_keys` key."""
    return key >> 32, (key & 0xFFFFFFFF) + NO_STEP


def iter_sessions(path: Path, skipped: Skipped, progress: Progress,
                  want: Callable[[bytes], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, checked record) of a session file; malformed ones skipped into ``skipped``."""
    return iter_records(path, skipped, progress, check_session_record, "session record", want)



@dataclass
class SessionArrays:
    """The per-session columns, as numpy arrays (one element per session)."""

    rank: np.ndarray      # int32
    step: np.ndarray      # int32, NO_STEP = no step
    status: np.ndarray    # int8 codes into ``status_names``
    task: np.ndarray      # int64 (task ids >= 0 as is; others interned as -1 - index)
    final: np.ndarray     # float64 epoch seconds
    own_end: np.ndarray   # float64 epoch seconds: the end of its last phase
    own: np.ndarray       # float32 seconds: submit (or first phase) to own end
    total: np.ndarray     # float32 seconds
    turns: np.ndarray     # int16
    phases: dict[str, np.ndarray]  # float32 seconds per phase
    status_names: list[str]
    task_names: list[object]

    @property
    def size(self) -> int:
        return int(self.rank.size)

    def task_label(self, code: int) -> object:
        return code if code >= 0 else self.task_names[-1 - code]


class StepResolver:
    """The step of a record that has none, from the trace's step windows (see the module doc)."""

    def __init__(self, windows: dict[int, list[tuple[float, float, int]]]) -> None:
        merged = sorted(w for lst in windows.values() for w in lst)
        self._by_rank = {r: ([w[0] for w in lst], lst) for r, lst in windows.items() if lst}
        self._any = ([w[0] for w in merged], merged)

    def __call__(self, rank: int, ts: float | None) -> int | None:
        own = self._by_rank.get(rank)
        starts, lst = own or self._any
        if ts is None or not lst or not math.isfinite(ts):
            return None
        us = ts * 1e6
        i = bisect_right(starts, us) - 1
        if i >= 0 and us <= lst[i][1]:
            return lst[i][2]
        if i + 1 < len(lst):
            return lst[i + 1][2]
        return lst[i][2] if own else None  # after the others' last window: no step


@dataclass
class Parsed:
    """What :meth:`SessionReader.add` reads from one record before keeping anything."""

    rank: int
    step: int
    status: str
    submit: float | None
    final: float
    total: float
    turns: int
    task: object
    decomp: columns.Decomposition
    #: the step came from the trace's step windows (the record had none)
    resolved: bool = False


class SessionReader:
    """Aggregates session records as they are read (see the module docstring)."""

    def __init__(self, steps: StepRange, top: int = 10, per_rank_step: int = 3,
                 resolver: StepResolver | None = None) -> None:
        self.steps = steps
        self.top = top
        self.per_rank_step = per_rank_step
        self.resolver = resolver
        self.n = 0
        self.filtered = 0
        #: records whose step came from the trace's step windows
        self.resolved = 0
        #: rank -> role (the first named in its records: a Ray actor's, ``configure(role=)``)
        self.roles: dict[int, str] = {}
        self._rank = array.array("i")
        self._step = array.array("i")
        self._status = array.array("b")
        self._task = array.array("q")
        self._final = array.array("d")
        self._own_end = array.array("d")
        self._own = array.array("f")
        self._total = array.array("f")
        self._turns = array.array("h")
        self._phase_cols: dict[str, array.array[float]] = {}
        self._phase_keys: list[tuple[str, str, array.array[float]]] = []
        self.status_names: list[str] = []
        self._status_code: dict[str, int] = {}
        self.task_names: list[object] = []
        self._task_code: dict[object, int] = {}
        #: (status, reason) -> sessions
        self.reasons: dict[tuple[str, str], int] = {}
        #: (step, turn) -> [total generate seconds, executions]
        self.generate_by_turn: dict[tuple[int, int], list[float]] = {}
        #: (phase, turn) -> [total seconds, executions] of every phase execution
        self.phase_by_turn: dict[tuple[str, int], list[float]] = {}
        #: phase (and queue wait) -> per-execution seconds, for "× median"
        self.exec_q: dict[str, BoundedQuantiles] = {}
        #: step -> bucket -> seconds: the decomposition's record-only part (queue, phases, gaps)
        self.buckets: dict[int, dict[str, float]] = {}
        #: bucket -> per-session seconds (sessions that had any)
        self.bucket_q: dict[str, BoundedQuantiles] = {}
        #: (rank, step) -> earliest submit_ts
        self.first_submit: dict[tuple[int, int], float] = {}
        #: min-heap of (own_s, seq, brief): the ``top`` sessions that took longest themselves
        self.slowest: list[tuple[float, int, dict[str, Any]]] = []
        #: (rank, step) -> min-heap of (own end, seq, brief): the last ones to finish their work
        self.latest: dict[tuple[int, int], list[tuple[float, int, dict[str, Any]]]] = {}
        #: what goodput needs of each record (:mod:`.goodput`)
        self.goodput = GoodputReader()

    def _new_phase(self, name: str) -> None:
        if len(self._phase_cols) >= MAX_PHASE_COLUMNS:
            return
        col = array.array("f", bytes(4 * self.n))
        self._phase_cols[name] = col
        self._phase_keys.append((name, name + "_s", col))

    def _brief(self, rec: dict[str, Any], p: Parsed, seq: int) -> dict[str, Any]:
        phases = rec.get("phases") or {}
        gen = phases.get("generate") or ()
        d = p.decomp
        return {
            "rank": p.rank, "role": self.roles.get(p.rank), "step": step_or_none(p.step),
            "task_id": rec.get("task_id"),
            "session_id": rec.get("session_id"), "status": rec.get("status"),
            "reason": rec.get("reason"), "submit_ts": rec.get("submit_ts"),
            "finalized_ts": rec.get("finalized_ts"), "total_s": p.total, "own_s": d.own_s,
            "own_end_ts": d.own_end, "turns": rec.get("turns"), "trace_id": rec.get("trace_id"),
            "phases_s": {ph: float(rec.get(k) or 0.0) for ph, k, _ in self._phase_keys
                         if rec.get(k)},
            "phase_counts": rec.get("phase_counts") or {ph: len(v) for ph, v in phases.items()},
            "generate_by_turn_s": [_dur(e) for e in gen[:32]],
            "_index": seq, "_decomp": d,
        }

    def parse(self, rec: dict[str, Any], default_rank: int) -> Parsed | None:
        """Read one checked record (:func:`iter_sessions`); None: outside the selected steps."""
        rank = rec.get("rank")
        r = default_rank if rank is None else rank
        submit = rec.get("submit_ts")
        submit = None if submit is None else float(submit)
        found = self._step_value(rec.get("step"), r, submit)
        if found is None:
            return None
        s, resolved = found
        status = rec.get("status") or "pending"
        final = rec.get("finalized_ts")
        final = (submit if submit is not None else math.nan) if final is None else float(final)
        total = rec.get("total_s")
        total = ((final - submit) if submit is not None else 0.0) if total is None else float(total)
        turns = min(rec.get("turns") or 0, 32767)
        decomp = columns.decompose(rec.get("phases") or {}, submit, final)
        return Parsed(r, s, status, submit, final, total, turns, rec.get("task_id"), decomp, resolved)

    def _step_value(self, step: int | None, rank: int, submit: float | None) -> tuple[int, bool] | None:
        """The step column's value of a record (``NO_STEP``: none) and whether it came from the
        trace's step windows; None when it is outside the selected steps."""
        resolved = False
        if step is None and self.resolver is not None:
            step = self.resolver(rank, submit)
            resolved = step is not None
        if step is None:
            return (NO_STEP, False) if self.steps.everything else None
        return (step, resolved) if step in self.steps else None

    def add(self, rec: dict[str, Any], default_rank: int) -> None:
        """Take one checked record (:func:`iter_sessions`)."""
        p = self.parse(rec, default_rank)
        if p is None:
            self.filtered += 1
            return
        # what could fail comes first, so a record that still fails leaves no partial row
        s = p.step
        phases = rec.get("phases") or {}
        present = rec.get("phase_counts")
        names = list(present if present is not None else phases)
        gen = phases.get("generate") or ()
        gen_turns = [((s, e.get("turn", i)), _dur(e)) for i, e in enumerate(gen)]
        for ph in names:
            if ph not in self._phase_cols:
                self._new_phase(ph)  # past MAX_PHASE_COLUMNS: none (its time is in the buckets)
        values = []
        for ph, key, _ in self._phase_keys:
            v = rec.get(key)
            values.append(float(v) if v is not None else sum(_dur(e) for e in phases.get(ph, ())))
        # keep it
        self.resolved += p.resolved
        if p.rank not in self.roles:
            role = rec.get("role")
            if type(role) is str and role:
                self.roles[p.rank] = role
        self._keep_status(p.status, rec.get("reason"))
        t = self._task_id(p.task)
        if p.submit is not None:
            fs = self.first_submit.get((p.rank, s))
            if fs is None or p.submit < fs:
                self.first_submit[(p.rank, s)] = p.submit
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
        self._keep_decomposition(s, p.decomp)
        self.goodput.add(rec, p.rank, s, p.status, p.decomp, p.submit, p.final)
        self._rank.append(p.rank)
        self._step.append(s)
        self._task.append(t)
        self._final.append(p.final)
        self._own_end.append(p.decomp.own_end)
        self._own.append(p.decomp.own_s)
        self._total.append(p.total)
        self._turns.append(p.turns)
        seq = self.n
        self.n += 1
        self._keep_briefs(rec, p, seq)

    def _keep_status(self, status: str, reason: object) -> None:
        code = self._status_code.get(status)
        if code is None and len(self.status_names) >= MAX_STATUSES:
            status = OTHER
            code = self._status_code.get(status)
        if code is None:
            code = self._status_code[status] = len(self.status_names)
            self.status_names.append(status)
        if status != "accepted" and reason is not None:
            key = (status, str(reason))
            if key not in self.reasons and len(self.reasons) >= MAX_REASONS:
                key = (status, OTHER)
            self.reasons[key] = self.reasons.get(key, 0) + 1
        self._status.append(code)

    def task_code(self, task: object) -> int | None:
        """The task column's code of ``task`` (None: never seen)."""
        if type(task) is int and 0 <= task < 1 << 63:
            return task
        return self._task_code.get(task)

    def _task_id(self, task: object) -> int:
        if type(task) is int and 0 <= task < 1 << 63:
            return task
        t = self._task_code.get(task, -1)
        if t == -1:
            t = self._task_code[task] = -1 - len(self.task_names)
            self.task_names.append(task)
        return t

    def _keep_decomposition(self, step: int, d: columns.Decomposition) -> None:
        """Per step bucket sums, per-session bucket quantiles, per-execution and per-turn times."""
        mine: dict[str, float] = {}
        execs, by_turn = self.exec_q, self.phase_by_turn
        phase, queue, tail = columns.KIND_PHASE, columns.KIND_QUEUE, columns.KIND_TAIL
        for label, kind, start, end, turn in d.raw:
            if kind == tail:
                continue
            dur = end - start
            mine[label] = mine.get(label, 0.0) + dur
            if kind in (phase, queue):
                q = execs.get(label)
                if q is None:
                    q = execs[label] = BoundedQuantiles()
                buf = q.buffer
                buf.append(dur)
                if len(buf) >= q.exact_limit:
                    q.maybe_flush()
                if kind == phase and turn is not None:
                    k = (label, turn if turn < columns.MAX_TURN else columns.MAX_TURN)
                    acc = by_turn.get(k)
                    if acc is None:
                        by_turn[k] = [dur, 1]
                    else:
                        acc[0] += dur
                        acc[1] += 1
        if columns.QUEUE not in mine and d.raw and d.raw[0][1] != columns.KIND_NONE:
            self._exec(columns.QUEUE, None, 0.0, False)  # no queue wait: the median counts it as 0
        step_acc = self.buckets.get(step)
        if step_acc is None:
            step_acc = self.buckets[step] = {}
        bucket_q = self.bucket_q
        for label, v in mine.items():
            q = bucket_q.get(label)
            if q is None:
                if len(bucket_q) >= MAX_BUCKETS:
                    label = OTHER
                q = bucket_q.get(label) or bucket_q.setdefault(label, BoundedQuantiles())
            step_acc[label] = step_acc.get(label, 0.0) + v
            buf = q.buffer
            buf.append(v)
            if len(buf) >= q.exact_limit:
                q.maybe_flush()

    def _exec(self, label: str, turn: int | None, dur: float, by_turn: bool) -> None:
        """One execution's seconds: for the label's median, and by turn index."""
        q = self.exec_q.get(label)
        if q is None:
            q = self.exec_q[label] = BoundedQuantiles()
        q.add(dur)
        if by_turn and turn is not None:
            k = (label, min(turn, columns.MAX_TURN))
            acc = self.phase_by_turn.get(k)
            if acc is None:
                self.phase_by_turn[k] = [dur, 1]
            else:
                acc[0] += dur
                acc[1] += 1

    def _keep_briefs(self, rec: dict[str, Any], p: Parsed, seq: int) -> None:
        own, own_end = p.decomp.own_s, p.decomp.own_end
        brief = None
        if len(self.slowest) < self.top or own > self.slowest[0][0]:
            brief = self._brief(rec, p, seq)
            item = (own, seq, brief)
            if len(self.slowest) < self.top:
                heapq.heappush(self.slowest, item)
            else:
                heapq.heapreplace(self.slowest, item)
        key = (p.rank, p.step)
        h = self.latest.get(key)
        if h is None:
            self.latest[key] = [(own_end, seq, brief or self._brief(rec, p, seq))]
        elif len(h) < self.per_rank_step or own_end > h[0][0]:
            item = (own_end, seq, brief or self._brief(rec, p, seq))
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
            own_end=np.frombuffer(self._own_end, dtype=np.float64),
            own=np.frombuffer(self._own, dtype=np.float32),
            total=np.frombuffer(self._total, dtype=np.float32),
            turns=np.frombuffer(self._turns, dtype=np.int16),
            phases={p: np.frombuffer(c, dtype=np.float32) for p, c in self._phase_cols.items()},
            status_names=list(self.status_names), task_names=list(self.task_names),
        )

    def memory_bytes(self) -> int:
        cols: list[array.array[Any]] = [
            self._rank, self._step, self._status, self._task, self._final, self._own_end, self._own,
            self._total, self._turns, *self._phase_cols.values()]
        return sum(c.itemsize * len(c) for c in cols)


def _dur(e: Any) -> float:
    try:
        return float(e["end_ts"]) - float(e["start_ts"])
    except (KeyError, TypeError, ValueError):
        return 0.0
