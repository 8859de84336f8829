"""Chrome-trace events, aggregated as they are read.

Events are reduced to per-scope-name statistics (:class:`~.stats.BoundedQuantiles`), user
counters, each process's first and last timestamp, and the few ``train.*`` scopes that describe
steps (``train.step`` and the scopes directly under it).

Events are checked by :func:`rltrace.readers.check_trace_event` as they are read
(:func:`iter_events`; names capped at ``MAX_TEXT`` characters): a malformed event is skipped
and a malformed field ignored, both counted.  Step arguments are steps only when they are
integers a step column can hold.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from rltrace.accounting.goodput import classify
from rltrace.analysis.descriptive import BoundedQuantiles
from rltrace.analysis.load import OTHER, Progress, Skipped, StepRange, file_rank, iter_records
from rltrace.readers import MAX_TEXT, cap_text, check_trace_event
from rltrace.readers.session_record import STEP_MAX, STEP_MIN
from rltrace.semconv import ATTR_POLICY_VERSION

MAX_SCOPE_NAMES = 1000
#: a process of a trace file: (file index, its pid as the file has it)
Proc = tuple[int, object]
#: a ``train.*`` or step scope: (file index, pid, tid, ts µs, dur µs, name, step argument or None)
TrainScope = tuple[int, object, object, float, float, str, int | None]
#: what an event could still raise past its check (a defect: it is then skipped and reported)
BAD_EVENT = (TypeError, ValueError, AttributeError, OverflowError, KeyError)


def iter_events(path: Path, skipped: Skipped, progress: Progress,
                want: Callable[[bytes], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, checked event) of a trace file; malformed ones skipped into ``skipped``."""
    return iter_records(path, skipped, progress, check_trace_event, "trace event", want)


@dataclass
class StepInfo:
    """One step on one rank, from the trace: the step scope, its rollout and train-side scopes."""

    rank: int
    step: int
    start_us: float
    dur_us: float
    rollout_start_us: float | None = None
    rollout_end_us: float | None = None
    rollout_scopes: int = 0
    rollout_dur_us: float = 0.0
    #: train-side scopes directly under the step (not nested in another train.* scope): µs
    breakdown: dict[str, float] = field(default_factory=dict)
    #: the same scopes one by one: (name, start µs, duration µs)
    scopes: list[tuple[str, float, float]] = field(default_factory=list)
    #: every train.* scope under the step, nested ones too, parents first: (name, start µs,
    #: duration µs, index of its nearest train.* ancestor here or -1) (the waste taxonomy's input)
    tree: list[tuple[str, float, float, int]] = field(default_factory=list)

    @property
    def rollout_us(self) -> float | None:
        if self.rollout_start_us is None or self.rollout_end_us is None:
            return None
        if self.rollout_scopes == 1:  # exact (end - start loses ~0.25 µs at epoch-µs magnitudes)
            return self.rollout_dur_us
        return self.rollout_end_us - self.rollout_start_us


@dataclass
class CounterInfo:
    """A user counter on one process: the running total before the window and at its end."""

    base: float = 0.0
    base_ts: float = -math.inf
    last: float = 0.0
    last_ts: float = -math.inf


class TraceReader:
    """Aggregates Chrome-trace events as they are read (see the module docstring)."""

    def __init__(self, steps: StepRange, *, step_scope: str = "train.step",
                 rollout_scope: str = "train.rollout", train_prefix: str = "train.") -> None:
        self.steps = steps
        self.step_scope = step_scope
        self.rollout_scope = rollout_scope
        self.train_prefix = train_prefix
        self._rollout: dict[str, bool] = {}
        self.events = 0
        self.scopes: dict[str, BoundedQuantiles] = {}
        #: (file index, pid) -> [first ts, last end] in µs
        self.extent: dict[Proc, list[float]] = {}
        self.pid_rank: dict[Proc, int] = {}
        #: (file index, pid) -> the role its process labels name
        self.pid_role: dict[Proc, str] = {}
        #: (file index, pid, step) -> the policy version its step scope trained with
        self._versions: dict[tuple[int, object, int], int] = {}
        self._scoped_versions: set[tuple[int, object, int]] = set()
        self.file_ranks: list[int] = []
        self.counters: dict[tuple[int, object, str], CounterInfo] = {}
        #: tool name -> durations (µs) of the tool-call phase spans
        self.tools: dict[str, BoundedQuantiles] = {}
        #: (file index, pid, tid, ts, dur, name, step arg) of train.* scopes
        self._train: list[TrainScope] = []
        #: with a step range: (file index, pid) -> (lo, hi) µs window of the selected steps
        self.windows: dict[Proc, tuple[float, float]] | None = None
        #: with a step range: the step-defining scopes of every step, seen by the prescan
        self._prescan: list[TrainScope] | None = None

    # -- reading --------------------------------------------------------------------------

    def prescan_windows(self, fi: int, path: Path, skipped: Skipped, progress: Progress) -> None:
        """With a step range: collect the step-defining scopes (and process ranks) of one file.

        Call :meth:`finish_prescan` after the last file, before :meth:`read`.  What cannot be read
        is reported by :meth:`read` (``skipped`` is not added to here).
        """
        if self._prescan is None:
            self._prescan = []
        needles = (orjson.dumps(self.step_scope), orjson.dumps(self.train_prefix)[:-1], b"process_labels")
        want = lambda raw: any(n in raw for n in needles)  # noqa: E731
        for _, ev in iter_events(path, Skipped(), progress, want=want):
            if ev.get("ph") == "M":
                self._meta(fi, ev)
                continue
            name = ev.get("name")
            if ev.get("ph") != "X" or not isinstance(name, str):
                continue
            if name != self.step_scope and not name.startswith(self.train_prefix):
                continue
            try:
                ts = float(ev["ts"])
                end = ts + float(ev.get("dur") or 0.0)
            except BAD_EVENT:
                continue  # reported by the main pass
            self._prescan.append((fi, ev.get("pid"), None, ts, end - ts, name, _step_arg(ev.get("args"))))

    def finish_prescan(self) -> None:
        """The selected steps' time window per process, from the scopes :meth:`prescan_windows` saw."""
        self.windows = {}
        for key, lst in step_windows(self._prescan or [], self.step_scope, lambda _: math.inf).items():
            for s, e, n in lst:
                if n in self.steps:
                    w = self.windows.get(key)
                    self.windows[key] = (s, e) if w is None else (min(w[0], s), max(w[1], e))

    def read(self, fi: int, path: Path, skipped: Skipped, progress: Progress) -> None:
        """Aggregate one trace file's events (``fi``: its index); malformed ones are skipped and reported."""
        rank_of_file = file_rank(path, fi)
        while len(self.file_ranks) <= fi:
            self.file_ranks.append(rank_of_file)
        for lineno, ev in iter_events(path, skipped, progress):
            try:
                ph = ev.get("ph")
                if ph == "X":
                    self.events += 1
                    self._complete(fi, ev)
                elif ph == "C":
                    self.events += 1
                    self._counter(fi, ev)
                elif ph == "M":
                    self._meta(fi, ev)
                else:
                    self.events += 1
            except BAD_EVENT as exc:
                skipped.add(f"{path}:{lineno}: malformed trace event ({exc!r}), skipped")

    def _complete(self, fi: int, ev: dict[str, Any]) -> None:
        """A complete (``X``) event of file ``fi`` inside its process's window: its duration into its
        scope's statistics, its process's extent, and the train.* scope or tool call records."""
        ts = ev.get("ts")
        if ts is None:
            return
        ts = float(ts)
        dur = float(ev.get("dur") or 0.0)
        key = (fi, ev.get("pid"))
        windows = self.windows
        if windows is not None:
            w = windows.get(key)
            if w is None or ts < w[0] or ts > w[1]:
                return
        name = ev.get("name")
        if type(name) is not str:
            name = str(name)
        q = self.scopes.get(name)
        if q is None:
            q = self._new_scope(name)
        buf = q.buffer
        buf.append(dur)
        if len(buf) >= q.exact_limit:
            q.maybe_flush()
        end = ts + dur
        e = self.extent.get(key)
        if e is None:
            self.extent[key] = [ts, end]
        else:
            if ts < e[0]:
                e[0] = ts
            if end > e[1]:
                e[1] = end
        if name.startswith(self.train_prefix) or name == self.step_scope:
            step = _step_arg(ev.get("args"))
            self._train.append((fi, ev.get("pid"), ev.get("tid"), ts, dur, name, step))
            if step is not None:
                self._version(fi, ev, step, name == self.step_scope)
        elif name.startswith(TOOL_PHASES) or "gen_ai.tool.name" in (ev.get("args") or ()):
            self._tool(ev, dur)

    def _version(self, fi: int, ev: dict[str, Any], step: int, step_scope: bool) -> None:
        """The policy version a step trained with (``rl.policy.version``), if recorded: its step
        scope's, else the lowest of its ``train.*`` scopes' (AReaL's trainer, whose version moves
        on at the end of the step: :func:`rltrace.perf_tracer.trace_scope`)."""
        v = ev["args"].get(ATTR_POLICY_VERSION) if isinstance(ev.get("args"), dict) else None
        if type(v) is not int or not 0 <= v <= STEP_MAX:
            return
        key = (fi, ev.get("pid"), step)
        if step_scope:
            self._versions[key] = v
            self._scoped_versions.add(key)
        elif key not in self._scoped_versions:
            self._versions[key] = min(v, self._versions.get(key, v))

    def step_versions(self) -> dict[tuple[int, int], int]:
        """(rank, step) -> the policy version that step trained with (where it was recorded)."""
        return {(self.rank_of(fi, pid), step): v for (fi, pid, step), v in self._versions.items()}

    def roles(self) -> dict[int, str]:
        """rank -> the role its processes' labels name."""
        return {self.rank_of(fi, pid): role for (fi, pid), role in self.pid_role.items()}

    def _new_scope(self, name: str) -> BoundedQuantiles:
        """The statistics of a scope name not seen yet (past ``MAX_SCOPE_NAMES`` names: ``OTHER``'s)."""
        scopes = self.scopes
        if len(scopes) < MAX_SCOPE_NAMES:
            q = scopes[name] = BoundedQuantiles()
            return q
        return scopes.get(OTHER) or scopes.setdefault(OTHER, BoundedQuantiles())

    def _meta(self, fi: int, ev: dict[str, Any]) -> None:
        if ev.get("name") == "process_labels":
            labels = _labels(ev["args"]["labels"])
            rank = labels.get("rank", "")
            if rank.isdecimal() and len(rank) < 10:  # a rank label as rltrace writes it (int32)
                self.pid_rank[(fi, ev.get("pid"))] = int(rank)
            role = labels.get("role")
            if role and role != "None":
                self.pid_role[(fi, ev.get("pid"))] = cap_text(role, MAX_TEXT)

    def _tool(self, ev: dict[str, Any], dur: float) -> None:
        """A tool call's duration, by tool name (``gen_ai.tool.name``, else the phase name)."""
        args = ev.get("args")
        tool = args.get("gen_ai.tool.name") if isinstance(args, dict) else None
        name = cap_text(str(tool if tool is not None else ev.get("name")), MAX_TEXT)
        q = self.tools.get(name)
        if q is None:
            if len(self.tools) >= MAX_SCOPE_NAMES:
                return
            q = self.tools[name] = BoundedQuantiles()
        q.add(dur)

    def _counter(self, fi: int, ev: dict[str, Any]) -> None:
        ts, name = ev.get("ts"), ev.get("name")
        args = ev.get("args") or {}
        value = args.get("value")
        if ts is None or name is None or not isinstance(value, (int, float)):
            return
        ts = float(ts)
        key = (fi, ev.get("pid"))
        if self.windows is not None:
            w = self.windows.get(key)
            if w is None:
                return
            lo, hi = w
        else:
            lo, hi = -math.inf, math.inf
        c = self.counters.get((fi, key[1], str(name)))
        if c is None:
            c = self.counters[(fi, key[1], str(name))] = CounterInfo()
        if ts < lo:
            if ts >= c.base_ts:
                c.base, c.base_ts = float(value), ts
        elif ts <= hi and ts >= c.last_ts:
            c.last, c.last_ts = float(value), ts
            e = self.extent.get(key)
            if e is None:
                self.extent[key] = [ts, ts]
            else:
                e[0], e[1] = min(e[0], ts), max(e[1], ts)

    # -- results ---------------------------------------------------------------------------

    def rank_of(self, fi: int, pid: object) -> int:
        r = self.pid_rank.get((fi, pid))
        if r is not None:
            return r
        return self.file_ranks[fi] if fi < len(self.file_ranks) else fi

    def rank_walls(self) -> dict[int, float]:
        """Seconds from the first to the last event of each rank (over its processes)."""
        spans: dict[int, list[float]] = {}
        for (fi, pid), (lo, hi) in self.extent.items():
            r = self.rank_of(fi, pid)
            s = spans.get(r)
            spans[r] = [lo, hi] if s is None else [min(s[0], lo), max(s[1], hi)]
        return {r: (hi - lo) / 1e6 for r, (lo, hi) in sorted(spans.items())}

    def is_rollout(self, name: str) -> bool:
        """Whether a step's top-level scope ``name`` is its rollout: the ``--rollout-scope``, or a
        section the waste taxonomy classes as a rollout (verl's ``gen``, TRL's generation)."""
        known = self._rollout.get(name)
        if known is None:
            known = self._rollout[name] = classify(name, rollout_scope=self.rollout_scope,
                                                   train_prefix=self.train_prefix) == "rollout"
        return known

    def step_infos(self) -> dict[tuple[int, int], StepInfo]:
        """(rank, step) -> :class:`StepInfo` for every selected step scope in the traces."""
        by_proc = step_windows(self._train, self.step_scope, self._last_end)
        infos = self._selected_steps(by_proc)
        starts = {proc: [s for s, _, _ in lst] for proc, lst in by_proc.items()}
        lanes: dict[int, list[int]] = {}  # id of a StepInfo -> tree indices of the open ancestors
        for fi, pid, ts, dur, name, depth in self._train_scopes_with_depth():
            info = self._enclosing_step(infos, by_proc, starts, fi, pid, ts, dur)
            if info is None:
                continue
            if depth == 0 and self.is_rollout(name):
                _add_rollout(info, ts, dur)
            if depth == 0:
                info.breakdown[name] = info.breakdown.get(name, 0.0) + dur
                info.scopes.append((name, ts, dur))
            # lane order: a scope's parent is the last one seen one level up (of its step); one
            # whose ancestor is not in the step is left out of the tree, with its descendants
            chain = lanes.setdefault(id(info), [])
            del chain[depth:]
            parent = -1 if depth == 0 else chain[depth - 1] if depth <= len(chain) else -2
            chain.extend([-2] * (depth - len(chain)))
            chain.append(len(info.tree) if parent != -2 else -2)
            if parent != -2:
                info.tree.append((name, ts, dur, parent))
        return infos

    def _last_end(self, proc: Proc) -> float:
        """The end (µs) of process ``proc``'s last event read (-inf when none was)."""
        e = self.extent.get(proc)
        return e[1] if e is not None else -math.inf

    def _selected_steps(self, by_proc: dict[Proc, list[tuple[float, float, int]]]
                        ) -> dict[tuple[int, int], StepInfo]:
        """A :class:`StepInfo` per rank and selected step: the hull of that step's windows over the
        rank's processes."""
        infos: dict[tuple[int, int], StepInfo] = {}
        for proc, lst in by_proc.items():
            for s, e, n in lst:
                if n not in self.steps:
                    continue
                r = self.rank_of(proc[0], proc[1])
                info = infos.get((r, n))
                if info is None:
                    infos[(r, n)] = StepInfo(rank=r, step=n, start_us=s, dur_us=e - s)
                else:
                    end = max(info.start_us + info.dur_us, e)
                    info.start_us = min(info.start_us, s)
                    info.dur_us = end - info.start_us
        return infos

    def _train_scopes_with_depth(self) -> Iterator[tuple[int, object, float, float, str, int]]:
        """The train.* scopes other than the step scope, by lane (file, pid, tid) and start, each as
        (file index, pid, ts, dur, name, depth): how many of them it is nested in on its lane."""
        others = [(fi, pid, tid, ts, dur, name) for fi, pid, tid, ts, dur, name, _ in self._train
                  if name != self.step_scope]
        others.sort(key=lambda t: (t[0], str(t[1]), str(t[2]), t[3], -t[4]))
        stack: list[float] = []
        lane = None
        for fi, pid, tid, ts, dur, name in others:
            if (fi, pid, tid) != lane:
                lane, stack = (fi, pid, tid), []
            end = ts + dur
            # timestamps are floored to the µs: a scope starting (or ending) within 1 µs of the
            # previous one's end is its sibling, not its child
            while stack and (stack[-1] <= ts + 1.0 or end > stack[-1] + 1.0):
                stack.pop()
            depth = len(stack)
            stack.append(end)
            yield fi, pid, ts, dur, name, depth

    def _enclosing_step(self, infos: dict[tuple[int, int], StepInfo],
                        by_proc: dict[Proc, list[tuple[float, float, int]]],
                        starts: dict[Proc, list[float]], fi: int, pid: object, ts: float,
                        dur: float) -> StepInfo | None:
        """The selected step whose window (of process ``(fi, pid)``) holds the scope at ``ts`` lasting
        ``dur`` (ending up to 1 µs past the window counts), or None."""
        found = by_proc.get((fi, pid))
        if not found:
            return None
        i = bisect_right(starts[(fi, pid)], ts) - 1
        if i < 0 or ts + dur > found[i][1] + 1.0:
            return None
        return infos.get((self.rank_of(fi, pid), found[i][2]))

    def rank_step_windows(self) -> dict[int, list[tuple[float, float, int]]]:
        """rank -> sorted (start, end, step) µs windows of every step (selected or not)."""
        events = self._prescan if self._prescan is not None else self._train
        out: dict[int, list[tuple[float, float, int]]] = {}
        for (fi, pid), lst in step_windows(events, self.step_scope).items():
            out.setdefault(self.rank_of(fi, pid), []).extend(lst)
        for lst in out.values():
            lst.sort()
        return out

    def counter_totals(self) -> dict[str, dict[int, float]]:
        """name -> rank -> counter increase over the window (last value minus the value before)."""
        out: dict[str, dict[int, float]] = {}
        for (fi, pid, name), c in self.counters.items():
            if c.last_ts == -math.inf:
                continue
            r = self.rank_of(fi, pid)
            d = out.setdefault(name, {})
            d[r] = d.get(r, 0.0) + (c.last - c.base)
        return out


def _add_rollout(info: StepInfo, ts: float, dur: float) -> None:
    """Widen the step's rollout to a rollout scope at ``ts`` lasting ``dur`` (and count it)."""
    info.rollout_scopes += 1
    info.rollout_dur_us = dur
    end = ts + dur
    lo, hi = info.rollout_start_us, info.rollout_end_us
    info.rollout_start_us = ts if lo is None else min(lo, ts)
    info.rollout_end_us = end if hi is None else max(hi, end)


def step_windows(events: list[TrainScope], step_scope: str,
                 last_end: Callable[[Proc], float] | None = None
                 ) -> dict[Proc, list[tuple[float, float, int]]]:
    """(file index, pid) -> sorted (start, end, step) windows of its steps.

    A process with step scopes (``train.step``): one window per step scope, numbered by its
    step argument, else in order.  A process without (AReaL's guide marks steps only as
    ``trace_scope("train.rollout", args={"global_step": n})``): per step number, the hull of
    the ``train.*`` scopes carrying it; with ``last_end`` (process -> µs), the step's *period*
    instead: from that hull's start to the next step's (the last step: to ``last_end``), so the
    code that runs between two such scopes (``train_batch(batch)`` after the rollout scope, in
    the README's quick start) is part of its step's time.
    """
    scoped: dict[Proc, list[tuple[float, float, int | None]]] = {}
    by_arg: dict[Proc, dict[int, list[float]]] = {}
    for fi, pid, _tid, ts, dur, name, stepval in events:
        if name == step_scope:
            scoped.setdefault((fi, pid), []).append((ts, ts + dur, stepval))
        elif stepval is not None:
            w = by_arg.setdefault((fi, pid), {}).get(stepval)
            if w is None:
                by_arg[(fi, pid)][stepval] = [ts, ts + dur]
            else:
                w[0], w[1] = min(w[0], ts), max(w[1], ts + dur)
    out: dict[Proc, list[tuple[float, float, int]]] = {}
    for proc, lst in scoped.items():
        lst.sort(key=lambda t: t[0])
        out[proc] = [(s, e, i if n is None else int(n)) for i, (s, e, n) in enumerate(lst)]
    for proc, d in by_arg.items():
        if proc not in out:
            hulls = sorted((s, e, n) for n, (s, e) in d.items())
            out[proc] = hulls if last_end is None else _periods(hulls, last_end(proc))
    return out


def _periods(hulls: list[tuple[float, float, int]], last: float) -> list[tuple[float, float, int]]:
    """Sorted step hulls widened to step periods: each ends at the next one's start (or its own
    end when later), the last at ``last`` (or its own end when later)."""
    ends = [s for s, _, _ in hulls[1:]] + [last]
    return [(s, max(e, nxt), n) for (s, e, n), nxt in zip(hulls, ends, strict=True)]


#: step arguments, most specific first (AReaL's guide: ``global_step``, and ``epoch_step``)
STEP_ARGS = ("rl.step", "global_step", "step", "epoch_step")
#: phase spans counted as tool calls (besides any span with a ``gen_ai.tool.name``)
TOOL_PHASES = ("toolcall",)


def _step_arg(args: object) -> int | None:
    if not isinstance(args, dict):
        return None
    for k in STEP_ARGS:
        v = args.get(k)
        if type(v) is float and v.is_integer():
            v = int(v)
        if type(v) is int and STEP_MIN <= v <= STEP_MAX:
            return v
    return None


def _labels(text: object) -> dict[str, str]:
    if not isinstance(text, str):
        return {}
    out = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out
