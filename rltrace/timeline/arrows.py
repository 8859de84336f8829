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
import re
from array import array
from bisect import bisect_left
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

import orjson

from rltrace.readers import Oversize, iter_lines
from rltrace.readers.trace_event import times_ok
from rltrace.semconv import ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK, SESSION_SPAN, TASK_SPAN

#: the lines the pass parses (rltrace's own layout writes these bytes)
_MARKS = (b'"rl.step"', b'"name":"rl.session"', b'"name":"rl.task"')
_INT64 = 1 << 62


def stable_id(*parts: object) -> int:
    """A non-zero 64-bit id of ``parts`` (track uuids, flow ids): the same in every process and
    run, so ids computed in two passes, or for two files, meet."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def consume_flow(rank: Hashable, session: Hashable) -> int:
    """The flow id of a session's arrow to the train step that consumed it."""
    return stable_id("consume", rank, session)


def cross_task_flow(task: Hashable, rank: Hashable, session: Hashable) -> int:
    """The flow id of the arrow from a task to a session another file holds."""
    return stable_id("xtask", task, rank, session)


def step_of(ev: dict[str, object]) -> int | None:
    """The step of an ``rltrace.step`` scope's complete event (None for anything else)."""
    args = ev.get("args")
    if ev.get("ph") != "X" or type(args) is not dict:
        return None
    return step_in(ev.get("name"), args)


def step_in(name: object, args: Mapping[str, object]) -> int | None:
    """The step of a complete slice named ``name`` with ``args``: an ``rltrace.step`` scope's
    (None for a task, a session, a phase or anything without a step)."""
    if name in (TASK_SPAN, SESSION_SPAN):
        return None
    step = args.get(ATTR_STEP)
    return step if type(step) is int and abs(step) < _INT64 and ATTR_SESSION not in args else None


def _plain(value: object) -> bool:
    """Whether ``value`` can be a rank (a key of the plan): None, a bool, an integer, a finite
    float or a string; a list or object (a damaged line) cannot."""
    return value is None or type(value) in (int, str, bool) or (
        type(value) is float and value == value and abs(value) != float("inf"))


def number(value: object) -> float:
    """A checked event's ``ts`` or ``dur`` (a number, or its text) as a float."""
    if isinstance(value, (int, float, str)):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def start_ns(ev: dict[str, object]) -> int:
    """An event's start in ns (its ``ts`` is µs)."""
    ts = ev["ts"]
    return ts * 1000 if type(ts) is int else round(number(ts) * 1000)


def end_ns(ev: dict[str, object]) -> int:
    """A complete event's end in ns."""
    return start_ns(ev) + round(number(ev.get("dur") or 0) * 1000)


@dataclass
class Window:
    """The time range one output file holds (ns, ``lo <= t < hi``; None: unbounded), and the
    steps it covers.  A slice belongs to the file of its start."""

    lo: int | None = None
    hi: int | None = None
    first_step: int | None = None
    last_step: int | None = None

    def holds(self, ns: int) -> bool:
        return (self.lo is None or ns >= self.lo) and (self.hi is None or ns < self.hi)

    @property
    def whole(self) -> bool:
        """Whether the window is the whole run (one output file, unbounded both ways)."""
        return self.lo is None and self.hi is None


@dataclass
class Arrows:
    """Arrow ends kept for one slice: flow ids, and the start (ns) of each arrow's other end's
    slice (an arrow whose other end is in another file of a split trace is not drawn)."""

    flows: array[int] = field(default_factory=lambda: array("Q"))
    starts: array[int] = field(default_factory=lambda: array("q"))
    last_end_ns: int = 0

    def add(self, flow: int, start: int) -> None:
        self.flows.append(flow)
        self.starts.append(start)

    def within(self, window: Window) -> list[int]:
        if window.whole:
            return list(self.flows)
        return [f for f, s in zip(self.flows, self.starts, strict=True) if window.holds(s)]


class _Seen:
    """Sessions seen by the pass, in columns (a few dozen bytes each, whatever the run's
    length): the accepted ones (for their train step), and those with a task (for the task's
    arrows; integer task and session ids, as rltrace and AReaL draw them)."""

    def __init__(self) -> None:
        self.ranks: list[Hashable] = []
        self._rank_index: dict[Hashable, int] = {}
        self.rank = array("l")
        self.step = array("q")
        self.start = array("q")
        self.end = array("q")
        self.flow = array("Q")
        self.task = array("q")
        self.task_file = array("l")
        self.task_rank = array("l")
        self.task_sid = array("q")
        self.task_start = array("q")

    def rank_of(self, rank: Hashable) -> int:
        ri = self._rank_index.get(rank)
        if ri is None:
            ri = self._rank_index[rank] = len(self.ranks)
            self.ranks.append(rank)
        return ri


@dataclass
class Plan:
    """Train steps by rank, what each consumed, the tasks whose sessions other files hold, and
    how many lines the run has."""

    #: rank -> step -> the step's (start, end) in ns
    steps: dict[Hashable, dict[int, tuple[int, int]]] = field(default_factory=dict)
    consumed: dict[tuple[Hashable, int], Arrows] = field(default_factory=dict)
    #: task id -> (the file holding its ``rl.task`` span, the span's start)
    task_files: dict[Hashable, tuple[int, int]] = field(default_factory=dict)
    #: task id -> arrows to its sessions in other files
    cross: dict[Hashable, Arrows] = field(default_factory=dict)
    #: lines in the files read (the events a conversion will see, about)
    lines: int = 0
    _trainer: Hashable = None
    _sorted: dict[Hashable, tuple[list[int], list[int]]] = field(default_factory=dict)

    def consumer(self, rank: Hashable, step: int, end: int) -> tuple[Hashable, int] | None:
        """(rank, step) of the train step that consumed an accepted session of ``rank``
        submitted in ``step`` and ended at ``end`` (None: none did)."""
        if not _plain(rank):
            return None
        who = rank if rank in self.steps else self._trainer
        if who is None:
            return None
        nums, ends = self._sorted[who]
        for i in range(bisect_left(nums, step), len(nums)):
            if ends[i] > end:
                return who, nums[i]
        return None

    def step_start(self, key: tuple[Hashable, int]) -> int:
        """The start (ns) of train step ``key`` ((rank, step))."""
        return self.steps[key[0]][key[1]][0]

    def task_elsewhere(self, task: Hashable, fi: int) -> bool:
        """Whether ``task``'s span is in another file than ``fi`` (its arrows cross files)."""
        where = self.task_files.get(task)
        return where is not None and where[0] != fi

    def step_starts(self) -> list[tuple[int, int]]:
        """(start ns, step) of every step: its earliest start over the ranks, by start."""
        first: dict[int, int] = {}
        for by_step in self.steps.values():
            for n, (start, _) in by_step.items():
                first[n] = min(first.get(n, start), start)
        return sorted((t, n) for n, t in first.items())

    def _finish(self, seen: _Seen) -> None:
        if self.steps:
            self._trainer = min(self.steps, key=lambda r: (type(r) is not int, str(r)))
        for rank, by_step in self.steps.items():
            nums = sorted(by_step)
            self._sorted[rank] = (nums, [by_step[n][1] for n in nums])
        ranks = seen.ranks
        for ri, step, start, end, flow in zip(seen.rank, seen.step, seen.start, seen.end, seen.flow,
                                              strict=True):
            key = self.consumer(ranks[ri], step, end)
            if key is None:
                continue
            c = self.consumed.get(key)
            if c is None:
                c = self.consumed[key] = Arrows()
            c.add(flow, start)
            if end > c.last_end_ns:
                c.last_end_ns = end
        for task, fi, ri, sid, start in zip(seen.task, seen.task_file, seen.task_rank, seen.task_sid,
                                            seen.task_start, strict=True):
            if self.task_elsewhere(task, fi):
                arrows = self.cross.get(task)
                if arrows is None:
                    arrows = self.cross[task] = Arrows()
                arrows.add(cross_task_flow(task, ranks[ri], sid), start)


class FileArrows:
    """The plan's arrows as one output file draws them (the native trace and the merged JSON
    alike): only those whose two ends start in its window, and each train step's and task's
    arrows once, should a rank's file repeat."""

    def __init__(self, plan: Plan, window: Window | None = None) -> None:
        self.plan = plan
        #: the output file's time range (None: the whole run)
        self.window = window if window is not None else Window()
        self._used: set[Hashable] = set()

    def to_consumer(self, rank: Hashable, session: Hashable, step: object, end: int) -> int | None:
        """The flow id of an accepted session's arrow to the train step that consumed it (None:
        no step did, or not in this file)."""
        if type(step) is not int or abs(step) >= _INT64:
            return None
        key = self.plan.consumer(rank, step, end)
        if key is None or not self.window.holds(self.plan.step_start(key)):
            return None
        return consume_flow(rank, session)

    def from_other_file(self, task: Hashable, fi: int, rank: Hashable, session: Hashable) -> int | None:
        """The flow id of the arrow to a session of input file ``fi`` from its task's slice in
        another input file (None: the task's slice is in the same file, in none, or not in this
        output file)."""
        plan = self.plan
        if type(session) is not int or not plan.task_elsewhere(task, fi) \
                or not self.window.holds(plan.task_files[task][1]):
            return None
        return cross_task_flow(task, rank, session)

    def to_other_files(self, task: Hashable) -> list[int]:
        """The flow ids of the arrows from ``task``'s slice to its sessions in other files."""
        cross = self.plan.cross.get(task)
        if cross is None or ("task", task) in self._used:
            return []
        self._used.add(("task", task))
        return cross.within(self.window)

    def consumed(self, rank: Hashable, step: int) -> tuple[int, list[int]] | None:
        """(the last consumed sample's end in ns, the flow ids ending) of train step ``step`` of
        ``rank`` (None: it consumed none)."""
        key = (rank, step)
        c = self.plan.consumed.get(key)
        if c is None or key in self._used:
            return None
        self._used.add(key)
        return c.last_end_ns, c.within(self.window)


def plan_arrows(jsonl_files: Iterable[tuple[int, Path]]) -> Plan:
    """Read the task, session and step lines of ``jsonl_files`` ((file index, path)): the plan."""
    plan = Plan()
    seen = _Seen()

    def see(ev: object, fi: int) -> None:
        # only what the second pass keeps: an X event whose ts and dur are numbers in range
        # (checked before anything is appended, so the columns of ``seen`` stay in step)
        if type(ev) is not dict:
            return
        args = ev.get("args")
        if type(args) is not dict or ev.get("ph") != "X" or not times_ok(ev):
            return
        start, end = start_ns(ev), end_ns(ev)
        if not -_INT64 < start <= end < _INT64:
            return
        rank = args.get("rank")
        if not (_plain(rank) and _plain(args.get(ATTR_SESSION)) and _plain(args.get(ATTR_TASK))):
            return  # as the second pass drops them (:func:`rltrace.readers.trace_event.plain_ids`)
        step = step_of(ev)
        name = ev.get("name")
        if step is not None:
            ends = plan.steps.setdefault(rank, {})
            if step in ends:
                start, end = min(start, ends[step][0]), max(end, ends[step][1])
            ends[step] = (start, end)
        elif name == TASK_SPAN and ATTR_TASK in args:
            plan.task_files.setdefault(args[ATTR_TASK], (fi, start))
        elif name == SESSION_SPAN and ATTR_SESSION in args:
            sid = args[ATTR_SESSION]
            task = args.get(ATTR_TASK)
            if type(task) is int and type(sid) is int and abs(task) < _INT64 and abs(sid) < _INT64:
                seen.task.append(task)
                seen.task_file.append(fi)
                seen.task_rank.append(seen.rank_of(rank))
                seen.task_sid.append(sid)
                seen.task_start.append(start)
            s = args.get(ATTR_STEP)
            if args.get(ATTR_STATUS) == "accepted" and type(s) is int and abs(s) < _INT64:
                flow = consume_flow(rank, sid)
                seen.rank.append(seen.rank_of(rank))
                seen.step.append(s)
                seen.start.append(start)
                seen.end.append(end)
                seen.flow.append(flow)

    lines = 0
    for fi, path in jsonl_files:
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError:
            continue  # the second pass reports it
        with src:
            for raw in iter_lines(src):
                lines += 1
                if isinstance(raw, Oversize) or not any(m in raw for m in _MARKS):
                    continue
                try:
                    see(orjson.loads(raw), fi)
                except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                    continue
    plan.lines = lines
    plan._finish(seen)
    return plan


_TS = re.compile(rb'"ts":(-?\d+)')
#: the resolution of the line counts that place the cuts of a split trace
_BUCKET_NS = 10_000_000


def line_ts_ns(raw: bytes) -> int | None:
    """A line's ``ts`` in ns, read from its bytes without parsing it (None: it has none)."""
    m = _TS.search(raw)
    return int(m.group(1)) * 1000 if m is not None else None


class LineCounts:
    """How many lines of the run's files start before a time (counted per 10 ms bucket)."""

    def __init__(self, jsonl_files: list[tuple[int, Path]]) -> None:
        per_bucket: dict[int, int] = {}
        for _, path in jsonl_files:
            try:
                src = open(path, "rb")  # noqa: SIM115 - closed by the with below
            except OSError:
                continue
            with src:
                for raw in iter_lines(src):
                    ns = None if isinstance(raw, Oversize) else line_ts_ns(raw)
                    if ns is not None:
                        b = ns // _BUCKET_NS
                        per_bucket[b] = per_bucket.get(b, 0) + 1
        self.buckets = sorted(per_bucket)
        self.cumulative = list(accumulate(per_bucket[b] for b in self.buckets))
        self.total = self.cumulative[-1] if self.cumulative else 0

    def before(self, ns: int) -> int:
        i = bisect_left(self.buckets, ns // _BUCKET_NS)
        return self.cumulative[i - 1] if i else 0


def split_windows(plan: Plan, jsonl_files: list[tuple[int, Path]], max_events: int) -> list[Window]:
    """Time windows of at most about ``max_events`` lines each (counted per 10 ms), cut at step
    starts (at 10 ms boundaries when the run has no steps); one window when the run fits."""
    if plan.lines <= max_events:
        return [Window()]
    counts = LineCounts(jsonl_files)
    steps = plan.step_starts()
    cuts: list[tuple[int, int | None]] = (
        [(t, n) for t, n in steps] if steps else [(b * _BUCKET_NS, None) for b in counts.buckets])
    windows = _cut(cuts, counts, max_events)
    windows[-1].last_step = steps[-1][1] if steps else None
    return windows


def _before(step: int | None) -> int | None:
    return None if step is None else step - 1


def _cut(cuts: list[tuple[int, int | None]], counts: LineCounts, max_events: int) -> list[Window]:
    """Windows from ``cuts`` ((time, step) boundaries), each closed at the last boundary that
    kept it within ``max_events`` lines (or at the next, when one step alone is over it)."""
    windows: list[Window] = []
    lo: int | None = None
    lo_step = cuts[0][1] if cuts else None
    base = 0
    last_ok: tuple[int, int | None] | None = None
    for t, step in cuts[1:]:
        if counts.before(t) - base <= max_events:
            last_ok = (t, step)
            continue
        cut_t, cut_step = last_ok if last_ok is not None else (t, step)
        windows.append(Window(lo, cut_t, lo_step, _before(cut_step)))
        lo, lo_step, base, last_ok = cut_t, cut_step, counts.before(cut_t), None
        if cut_t == t:
            continue
        if counts.before(t) - base <= max_events:
            last_ok = (t, step)
        else:
            windows.append(Window(lo, t, lo_step, _before(step)))
            lo, lo_step, base = t, step, counts.before(t)
    if last_ok is not None and counts.total - base > max_events:  # the tail, too
        windows.append(Window(lo, last_ok[0], lo_step, _before(last_ok[1])))
        lo, lo_step = last_ok
    windows.append(Window(lo, None, lo_step, None))
    return windows
