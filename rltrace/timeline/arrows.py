"""The arrows that cross files, planned before anything is written: the first of two passes
over the run's files (for the native trace and for the merged Chrome JSON alike).

Two kinds of arrow cross ranks, so no single file can draw them:

* **task -> session**, where a task is registered in one process and its sessions run in
  others (a Ray driver's task, run by rollout actors): the task's slice starts the arrows of
  the sessions that other files hold;
* **accepted session -> the train step that consumed it** (rollout workers and trainers are
  separate processes, and a synchronous loop's ``train.step`` opens before its rollouts).

The pass reads only the lines of task, session and step spans (found by their bytes before
any parsing) and keeps a few bytes per session: 32 while it reads, 8 per arrow after.

Which step consumed a session, until sessions carry the policy version that trained on them:
the first train step (an ``rltrace.step(n)`` scope) with ``n >=`` the session's step that was
still running when the session ended, on the session's own rank when that rank runs train
steps (a synchronous loop), else on the lowest rank that does (a separate trainer).  A rank
that only rolls out tags its sessions' step with a scope's ``global_step`` argument, not with
``rltrace.step``.  A session with no such step has no arrow.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..readers import Oversize, iter_lines
from ..semconv import ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK, SESSION_SPAN, TASK_SPAN

#: the lines the pass parses (rltrace's own layout writes these bytes)
_MARKS = (b'"rl.step"', b'"name":"rl.session"', b'"name":"rl.task"')
_INT64 = 1 << 62


def stable_id(*parts: Any) -> int:
    """A non-zero 64-bit id of ``parts`` (track uuids, flow ids): the same in every process and
    run, so ids computed in two passes, or for two files, meet."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def consume_flow(rank: Any, session: Any) -> int:
    """The flow id of a session's arrow to the train step that consumed it."""
    return stable_id("consume", rank, session)


def cross_task_flow(task: Any, rank: Any, session: Any) -> int:
    """The flow id of the arrow from a task to a session another file holds."""
    return stable_id("xtask", task, rank, session)


def step_of(ev: dict[str, Any]) -> int | None:
    """The step of an ``rltrace.step`` scope's complete event (None for anything else)."""
    args = ev.get("args")
    if ev.get("ph") != "X" or type(args) is not dict or ev.get("name") in (TASK_SPAN, SESSION_SPAN):
        return None
    step = args.get(ATTR_STEP)
    return step if type(step) is int and abs(step) < _INT64 and ATTR_SESSION not in args else None


def start_ns(ev: dict[str, Any]) -> int:
    """An event's start in ns (its ``ts`` is µs)."""
    ts = ev["ts"]
    return ts * 1000 if type(ts) is int else round(float(ts) * 1000)


def end_ns(ev: dict[str, Any]) -> int:
    """A complete event's end in ns."""
    return start_ns(ev) + round(float(ev.get("dur") or 0) * 1000)


@dataclass
class Consumed:
    """The accepted sessions one train step consumed: their flow ids and the last one's end."""

    flows: array = field(default_factory=lambda: array("Q"))
    last_end_ns: int = 0


class _Seen:
    """Sessions seen by the pass, in columns (a few dozen bytes each, whatever the run's
    length): the accepted ones (for their train step), and those with a task (for the task's
    arrows; integer task and session ids, as rltrace and AReaL draw them)."""

    def __init__(self) -> None:
        self.ranks: list[Any] = []
        self._rank_index: dict[Any, int] = {}
        self.rank = array("l")
        self.step = array("q")
        self.end = array("q")
        self.flow = array("Q")
        self.task = array("q")
        self.task_file = array("l")
        self.task_rank = array("l")
        self.task_sid = array("q")

    def rank_of(self, rank: Any) -> int:
        ri = self._rank_index.get(rank)
        if ri is None:
            ri = self._rank_index[rank] = len(self.ranks)
            self.ranks.append(rank)
        return ri


@dataclass
class Plan:
    """Train steps by rank, what each consumed, and the tasks whose sessions other files hold."""

    #: rank -> step -> the step's end (ns)
    steps: dict[Any, dict[int, int]] = field(default_factory=dict)
    consumed: dict[tuple[Any, int], Consumed] = field(default_factory=dict)
    #: task id -> the file holding its ``rl.task`` span
    task_files: dict[Any, int] = field(default_factory=dict)
    #: task id -> arrows to its sessions in other files
    cross: dict[Any, array] = field(default_factory=dict)
    _trainer: Any = None
    _sorted: dict[Any, tuple[list[int], list[int]]] = field(default_factory=dict)

    def consumer(self, rank: Any, step: int, end: int) -> tuple[Any, int] | None:
        """(rank, step) of the train step that consumed an accepted session of ``rank``
        submitted in ``step`` and ended at ``end`` (None: none did)."""
        who = rank if rank in self.steps else self._trainer
        if who is None:
            return None
        nums, ends = self._sorted[who]
        for i in range(bisect_left(nums, step), len(nums)):
            if ends[i] > end:
                return who, nums[i]
        return None

    def task_elsewhere(self, task: Any, fi: int) -> bool:
        """Whether ``task``'s span is in another file than ``fi`` (its arrows cross files)."""
        where = self.task_files.get(task)
        return where is not None and where != fi

    def _finish(self, seen: _Seen) -> None:
        if self.steps:
            self._trainer = min(self.steps, key=lambda r: (type(r) is not int, str(r)))
        for rank, by_step in self.steps.items():
            nums = sorted(by_step)
            self._sorted[rank] = (nums, [by_step[n] for n in nums])
        ranks = seen.ranks
        for ri, step, end, flow in zip(seen.rank, seen.step, seen.end, seen.flow, strict=True):
            key = self.consumer(ranks[ri], step, end)
            if key is None:
                continue
            c = self.consumed.get(key)
            if c is None:
                c = self.consumed[key] = Consumed()
            c.flows.append(flow)
            if end > c.last_end_ns:
                c.last_end_ns = end
        for task, fi, ri, sid in zip(seen.task, seen.task_file, seen.task_rank, seen.task_sid,
                                     strict=True):
            if self.task_elsewhere(task, fi):
                arrows = self.cross.get(task)
                if arrows is None:
                    arrows = self.cross[task] = array("Q")
                arrows.append(cross_task_flow(task, ranks[ri], sid))


def plan_arrows(jsonl_files: Iterable[tuple[int, Path]]) -> Plan:
    """Read the task, session and step lines of ``jsonl_files`` ((file index, path)): the plan."""
    plan = Plan()
    seen = _Seen()

    def see(ev: Any, fi: int) -> None:
        args = ev.get("args") if type(ev) is dict else None
        if type(args) is not dict or not isinstance(ev.get("ts"), (int, float)) or ev.get("ph") != "X":
            return
        rank = args.get("rank")
        step = step_of(ev)
        name = ev.get("name")
        if step is not None:
            ends = plan.steps.setdefault(rank, {})
            ends[step] = max(ends.get(step, 0), end_ns(ev))
        elif name == TASK_SPAN and ATTR_TASK in args:
            plan.task_files.setdefault(args[ATTR_TASK], fi)
        elif name == SESSION_SPAN and ATTR_SESSION in args:
            sid = args[ATTR_SESSION]
            task = args.get(ATTR_TASK)
            if type(task) is int and type(sid) is int and abs(task) < _INT64 and abs(sid) < _INT64:
                seen.task.append(task)
                seen.task_file.append(fi)
                seen.task_rank.append(seen.rank_of(rank))
                seen.task_sid.append(sid)
            s = args.get(ATTR_STEP)
            if args.get(ATTR_STATUS) == "accepted" and type(s) is int and abs(s) < _INT64:
                seen.rank.append(seen.rank_of(rank))
                seen.step.append(s)
                seen.end.append(end_ns(ev))
                seen.flow.append(consume_flow(rank, sid))

    for fi, path in jsonl_files:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError:
            continue  # the second pass reports it
        with src:
            for raw in iter_lines(src):
                if isinstance(raw, Oversize) or not any(m in raw for m in _MARKS):
                    continue
                try:
                    see(orjson.loads(raw), fi)
                except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                    continue
    plan._finish(seen)
    return plan
