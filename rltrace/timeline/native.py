"""The native trace of a run: processes, tracks, slices, flows and counters from the checked
events of the per-rank Chrome files (and ``torch.profiler`` traces), in one pass per file.

Track tree (every track named; the UI orders children by their first slice):

* a process per rank, named as the Chrome file names it (``[role] Rank R, Process P · host``);
* under it, a track per task (the GRPO group) ``task T · step S`` holding the ``rl.task``
  slice, and under each task a track per session ``session N · status`` whose slice holds its
  turns, phases and the waits between them (:mod:`.sessions`); a rejected, failed or dropped
  session ends in a marked instant with its reason; phases of one session that overlap go to a
  child track of the session's;
* the rank's threads (``rltrace.step`` and the other scopes: train step, weight sync, ...), as
  in the Chrome file; ``torch.profiler`` traces' threads under the rank's process;
* counter tracks: sessions in flight, queue depth (submitted, no phase begun), accepted /
  rejected / failed so far in each step, generated tokens per second, the policy version (of
  the sessions as they are submitted and the train steps as they start: it moves when the
  weights do).

Flows: the task's slice to each of its sessions; each accepted session to the train step that
consumed it (:mod:`.arrows`), ending on an instant ``consumed N sample(s)`` inside that step.
Every slice carries the event's args, among them the OTel ``trace_id``/``span_id`` rltrace
writes when spans go out over OTLP, so a slice can be looked up in Jaeger or Tempo.

Memory: sessions wait for their task's span (their group's end splits group wait from before
finalize) and scopes for their parent (:mod:`.lanes`); both are bounded by what runs at once.
Counters keep a few bytes per session until their file ends.
"""

from __future__ import annotations

import re
from array import array
from collections import defaultdict
from collections.abc import Hashable, Iterable
from functools import partial
from itertools import accumulate
from typing import Protocol

from rltrace.semconv import (
    ATTR_POLICY_VERSION,
    ATTR_SESSION,
    ATTR_STATUS,
    ATTR_STEP,
    ATTR_TASK,
    SESSION_SPAN,
    TASK_SPAN,
)
from rltrace.timeline import session_tracks as sess_mod
from rltrace.timeline.arrows import FileArrows, Plan, Window, stable_id, start_ns, step_in
from rltrace.timeline.lanes import Lane, Node, preorder
from rltrace.timeline.packets import INSTANT, SLICE_BEGIN, SLICE_END, PacketWriter

#: the largest step or version magnitude drawn (as the arrows' plan bounds ids)
_BOUND = 1 << 62
#: a process's place among its siblings is an int32 (a rank beyond it does not order processes)
_INT32 = 1 << 31
#: sessions held for their task's span before the oldest group is written without it
MAX_HELD_SESSIONS = 100_000
_LABEL_RANK = re.compile(r"(?:^|,)rank=(-?\d+)")
_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
_STATUS_COUNTERS = ("accepted", "rejected", "failed")
#: args not repeated on every slice: the rank's process names them (sessions and tasks keep
#: ``rank``, for queries)
_PER_PROCESS = frozenset({"rank", "role"})
_ROLE = frozenset({"role"})


class Result(Protocol):
    """Where the builder reports what it skipped (``rltrace convert``'s result)."""

    def skip_line(self, msg: str) -> None: ...


def task_flow(fi: int, pid: Hashable, task: Hashable, session: Hashable) -> int:
    """The flow id of the arrow from a task to one of its sessions."""
    return stable_id("task", fi, pid, task, session)


class _Counts:
    """A process's counter samples, kept compactly until its file ends."""

    def __init__(self) -> None:
        self.flight_ts = array("q")
        self.flight_d = array("b")
        self.queue_ts = array("q")
        self.queue_d = array("b")
        #: (finalize ts, step, status index) of finalized sessions
        self.final_ts = array("q")
        self.final_step = array("q")
        self.final_status = array("b")
        self.tokens: defaultdict[int, float] = defaultdict(float)
        #: (start, policy version) of the slices that carry one: sessions (the version that
        #: generated them) and train steps (the version they trained with)
        self.version_ts = array("q")
        self.version = array("q")
        #: sessions counted, and whether the trace's cap stopped the counting
        self.sessions = 0
        self.capped = False


class Proc:
    """One process of one input file: its track, rank, threads and counters."""

    def __init__(self, uuid: int, pid: int, rank: Hashable) -> None:
        self.uuid = uuid
        self.pid = pid
        self.rank = rank
        self.label: str | None = None
        self.written = False
        self.threads: dict[Hashable, tuple[int, Lane]] = {}
        self.thread_names: dict[Hashable, str] = {}
        self.tracks: dict[Hashable, int] = {}
        self.counts = _Counts()


class _Group:
    """A task's sessions, held until its ``rl.task`` span (or the file's end)."""

    __slots__ = ("done", "end", "sessions", "uuid")

    def __init__(self, uuid: int) -> None:
        self.uuid = uuid
        self.sessions: dict[Hashable, sess_mod.Session] = {}
        self.done = False
        self.end = 0


class NativeTrace:
    """One merged native trace being written: shared by the files it is built from."""

    def __init__(self, out: PacketWriter, plan: Plan, result: Result, window: Window | None = None,
                 counter_cap: int | None = None) -> None:
        self.out = out
        self.result = result
        #: sessions a process's counters hold at most (their samples wait for the file's end:
        #: a rank's trace written as the run goes bounds them; None: all)
        self.counter_cap = counter_cap
        #: whether a process reached ``counter_cap`` (its counters end there)
        self.counters_capped = False
        #: the arrows this file draws (a split trace's: those with both ends in its window)
        self.arrows = FileArrows(plan, window)
        self._next_pid = 1
        self._next_tid = 1_000
        #: rank -> its (first) process, for ``torch.profiler`` traces of that rank
        self.rank_procs: dict[Hashable, Proc] = {}
        self.sessions = 0
        self.flows = 0

    @property
    def processes(self) -> int:
        return self._next_pid - 1

    def new_pid(self) -> int:
        pid = self._next_pid
        self._next_pid += 1
        return pid

    def new_tid(self) -> int:
        tid = self._next_tid
        self._next_tid += 1
        return tid

    def file(self, fi: int, events: Iterable[dict[str, object]], rank_hint: Hashable = None,
             onto_rank: Hashable = None) -> None:
        """Add one file's checked events.  ``onto_rank``: a ``torch.profiler`` trace of that rank,
        whose threads go under the rank's process."""
        fb = FileBuilder(self, fi, rank_hint, onto_rank)
        for ev in events:
            fb.event(ev)
        fb.close()


class FileBuilder:
    """One input file's events onto the native trace."""

    def __init__(self, trace: NativeTrace, fi: int, rank_hint: Hashable, onto_rank: Hashable) -> None:
        self.trace = trace
        self.out = trace.out
        self.fi = fi
        self.rank_hint = rank_hint
        self.onto = trace.rank_procs.get(onto_rank) if onto_rank is not None else None
        self.onto_rank = onto_rank
        self.procs: dict[Hashable, Proc] = {}
        self.groups: dict[tuple[Hashable, Hashable], _Group] = {}
        self.open: dict[tuple[Hashable, Hashable], sess_mod.Session] = {}
        self.held = 0

    # -- processes and tracks ------------------------------------------------------------------
    def proc(self, pid: Hashable) -> Proc:
        p = self.procs.get(pid)
        if p is None:
            if self.onto is not None:
                p = self.onto
            else:
                p = Proc(stable_id("proc", self.fi, pid), self.trace.new_pid(), self.rank_hint)
            self.procs[pid] = p
        return p

    def written(self, p: Proc) -> Proc:
        """``p`` with its descriptor written (the first time an event needs it)."""
        if not p.written:
            p.written = True
            if self.onto_rank is not None and p.label is None:
                p.label = f"[Rank {self.onto_rank}, torch.profiler]"
            rank = p.rank if type(p.rank) is int else None
            self.out.process_track(p.uuid, p.pid, p.label or (f"Rank {p.rank}" if p.rank is not None
                                                              else f"process {p.pid}"),
                                   rank if rank is not None and abs(rank) < _INT32 else None)
            if rank is not None:
                self.trace.rank_procs.setdefault(rank, p)
        return p

    def thread(self, p: Proc, pid: Hashable, tid: Hashable) -> tuple[int, Lane]:
        key = (pid, tid)
        known = p.threads.get(key)
        if known is None:
            uuid = stable_id("thread", self.fi, pid, tid)
            name = p.thread_names.get(key) or (f"torch.profiler · {tid}" if self.onto else f"thread {tid}")
            self.out.thread_track(uuid, p.pid, self.trace.new_tid(), name)
            known = p.threads[key] = (uuid, Lane(partial(self.write_tree, uuid)))
        return known

    def child_track(self, p: Proc, key: Hashable, name: str, parent: int | None = None,
                    counter: bool = False) -> int:
        uuid = p.tracks.get(key)
        if uuid is None:
            uuid = p.tracks[key] = stable_id("track", self.fi, p.pid, key)
            self.out.track(uuid, name, p.uuid if parent is None else parent, counter)
        return uuid

    # -- events ------------------------------------------------------------------------------------
    def event(self, ev: dict[str, object]) -> None:
        """One checked Chrome event, drawn by its phase letter."""
        ph = ev.get("ph")
        if ph == "M":
            self.meta(ev)
            return
        ts = ev.get("ts", 0)
        if isinstance(ts, (int, float)) and ts < 0:  # the trace's timestamps are unsigned
            self.trace.result.skip_line(f"event of phase {ph!r} at a negative ts (before 1970), "
                                        f"not drawn on the native timeline")
            return
        pid = ev.get("pid")
        p = self.written(self.proc(pid))
        args = ev.get("args")
        if type(args) is not dict:
            args = {}
        name = str(ev.get("name", ""))
        cat = str(ev.get("cat") or "")
        if ph == "X":
            self.complete(p, pid, ev, name, cat, args)
        elif "ts" not in ev:
            self.trace.result.skip_line(f"event of phase {ph!r} without a time, not drawn")
        elif ph in ("i", "I", "n"):
            self.instant(p, pid, ev, name, cat, args)
        elif ph == "C":
            self.counter_event(p, ev, name, args)
        elif ph in ("b", "e", "B", "E"):
            self.begin_end(p, pid, ev, name, cat, args)
        else:
            self.trace.result.skip_line(f"event of phase {ph!r} not drawn on the native timeline")

    def complete(self, p: Proc, pid: Hashable, ev: dict[str, object], name: str, cat: str,
                 args: dict[str, object]) -> None:
        """An ``X`` event: a session's phase or span, a task's span, or a scope on its thread."""
        start = start_ns(ev)
        dur = ev.get("dur") or 0  # a checked event's: a number
        self.span(p, pid, ev.get("tid"), start,
                  start + round(float(dur) * 1000 if isinstance(dur, (int, float)) else 0), name, cat, args)

    def span(self, p: Proc, pid: Hashable, tid: Hashable, start: int, end: int, name: str, cat: str,
             args: dict[str, object]) -> None:
        """A complete slice (ns): a session's phase or span, a task's span, or a scope on its
        thread (from a Chrome ``X`` event, or straight from a record)."""
        version = args.get(ATTR_POLICY_VERSION)
        if type(version) is int and 0 <= version < _BOUND and not p.counts.capped:
            p.counts.version_ts.append(start)
            p.counts.version.append(version)
        if ATTR_SESSION in args and self.onto is None:
            self.session_event(p, pid, name, cat, start, end, args)
        elif name == TASK_SPAN and ATTR_TASK in args and self.onto is None:
            self.task_ended(p, pid, args, start, end)
        else:
            self.scope(p, pid, tid, Node(start, end, name, cat, args), args)

    def instant(self, p: Proc, pid: Hashable, ev: dict[str, object], name: str, cat: str,
                args: dict[str, object]) -> None:
        """An instant: on its session's track, its async span's, or its thread's."""
        ts = start_ns(ev)
        ph = ev.get("ph")
        if ATTR_SESSION in args and ph != "n" and self.onto is None:
            self.session(pid, args).instants.append((ts, name, cat, args))
        elif ph == "n":
            self.out.event(ts, INSTANT, self.async_track(p, ev), name, cat)
        else:
            self.thread(p, pid, ev.get("tid"))[1].place(Node(ts, None, name, cat, args))

    def counter_event(self, p: Proc, ev: dict[str, object], name: str, args: dict[str, object]) -> None:
        """A ``C`` event: each numeric arg on a counter track of the process."""
        for key, value in args.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                label = name if key == "value" else f"{name}.{key}"
                self.out.counter(start_ns(ev), self.child_track(p, ("C", label), label, counter=True), value)

    def begin_end(self, p: Proc, pid: Hashable, ev: dict[str, object], name: str, cat: str,
                  args: dict[str, object]) -> None:
        """``b``/``e`` (another instrumentation's span: a track per id) and ``B``/``E`` (a thread's)."""
        ph = ev.get("ph")
        begin = ph in ("b", "B")
        track = self.async_track(p, ev) if ph in ("b", "e") else self.thread(p, pid, ev.get("tid"))[0]
        self.out.event(start_ns(ev), SLICE_BEGIN if begin else SLICE_END, track,
                       name if begin else None, cat if begin else None,
                       args if begin or ph == "E" else None, _PER_PROCESS)

    def meta(self, ev: dict[str, object]) -> None:
        pid, args = ev.get("pid"), ev.get("args")
        if not isinstance(args, dict):
            args = {}
        name = ev.get("name")
        if self.onto is not None and name == "process_name":
            return  # its threads go under the rank's process
        p = self.proc(pid)
        if name == "process_name" and not p.written:
            p.label = str(args.get("name", ""))
        elif name == "process_labels":
            m = _LABEL_RANK.search(str(args.get("labels", "")))
            if m and not p.written:
                p.rank = int(m.group(1))
        elif name == "process_sort_index" and p.rank is None and type(args.get("sort_index")) is int:
            p.rank = args["sort_index"]
        elif name == "thread_name":
            label = str(args.get("name", "")) or f"thread {ev.get('tid')}"
            p.thread_names[(pid, ev.get("tid"))] = f"torch.profiler · {label}" if self.onto else label

    def async_track(self, p: Proc, ev: dict[str, object]) -> int:
        key = ("async", ev.get("cat"), ev.get("id"), ev.get("id2"))
        return self.child_track(p, key, str(ev.get("name", "span")))

    # -- scopes (threads) -----------------------------------------------------------------------
    def scope(self, p: Proc, pid: Hashable, tid: Hashable, node: Node, args: dict[str, object]) -> None:
        lane = self.thread(p, pid, tid)[1]
        lane.add(node)
        step = step_in(node.name, args)
        if step is None:
            return
        consumed = self.trace.arrows.consumed(args.get("rank"), step)
        if consumed is None or node.end is None:
            return
        last_end, flows = consumed
        at = min(max(last_end, node.start), node.end)
        n = len(flows)
        lane.place(Node(at, None, f"consumed {n} sample(s)", "rl.consume",
                        {"rl.consumed": n, ATTR_STEP: step}, flows_end=flows))

    def write_tree(self, track: int, root: Node) -> None:
        out = self.out

        def visit(n: Node, begin: bool) -> None:
            if n.end is None:
                if begin:
                    out.event(n.start, INSTANT, track, n.name, n.category, n.args, _PER_PROCESS,
                              ends=n.flows_end or ())
                    if n.flows_end is not None:
                        self.trace.flows += len(n.flows_end)
            elif begin:
                out.event(n.start, SLICE_BEGIN, track, n.name, n.category, n.args, _PER_PROCESS)
            else:
                out.end(n.end, track)

        preorder(root, visit)

    # -- sessions --------------------------------------------------------------------------------
    def session(self, pid: Hashable, args: dict[str, object]) -> sess_mod.Session:
        sid = args[ATTR_SESSION]
        key = (pid, sid)
        s = self.open.get(key)
        if s is None:
            s = self.open[key] = sess_mod.Session(sid)
        task = args.get(ATTR_TASK)
        if task is not None and s.task is None:
            s.task = task
        return s

    def session_event(self, p: Proc, pid: Hashable, name: str, cat: str, start: int, end: int,
                      args: dict[str, object]) -> None:
        s = self.session(pid, args)
        if name != SESSION_SPAN:
            s.phases.append(sess_mod.Phase.of(start, end, name, cat, args))
            return
        s.own = (start, end, cat, args)
        c = p.counts
        cap = self.trace.counter_cap
        if cap is not None and c.sessions >= cap:
            c.capped = self.trace.counters_capped = True
        c.sessions += 1
        if not c.capped:
            self._count_final(c, start, end, args)
        if s.task is None:
            self.write_session(p, pid, s, None)
            return
        g = self.group(p, pid, s.task)
        g.sessions[s.sid] = s
        self.held += 1
        if g.done:  # its task's span came first: written now, against the group's end
            self.write_session(p, pid, s, g)
        elif self.held > MAX_HELD_SESSIONS:
            self.flush_oldest()

    def group(self, p: Proc, pid: Hashable, task: Hashable) -> _Group:
        key = (pid, task)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(stable_id("task-track", self.fi, pid, task))
        return g

    def task_ended(self, p: Proc, pid: Hashable, args: dict[str, object], start: int, end: int) -> None:
        task = args[ATTR_TASK]
        g = self.group(p, pid, task)
        step = args.get(ATTR_STEP)
        self.out.track(g.uuid, f"task {task}" + (f" · step {step}" if step is not None else ""), p.uuid)
        ready = [s for s in g.sessions.values() if s.own is not None]
        flows: list[int] = []
        for s in ready:
            s.from_task = task_flow(self.fi, pid, task, s.sid)
            flows.append(s.from_task)
        flows.extend(self.trace.arrows.to_other_files(task))  # its sessions in other files
        self.out.event(start, SLICE_BEGIN, g.uuid, f"task {task}", "rl.task", args, _ROLE,
                       flows=flows, once=True)
        self.out.end(end, g.uuid)
        g.done = True
        self.write_group(p, pid, g)

    def write_group(self, p: Proc, pid: Hashable, g: _Group) -> None:
        ready = [s for s in g.sessions.values() if s.own is not None]
        if ready:
            g.end = max(g.end, max(s.own_end() for s in ready))
        for s in ready:
            self.write_session(p, pid, s, g)

    def flush_oldest(self) -> None:
        """Too many sessions held: the oldest group is written without its task's span."""
        for key, g in self.groups.items():
            if not g.done and g.sessions:
                self.write_group(self.procs[key[0]], key[0], g)
                if not g.sessions:
                    del self.groups[key]
                return

    def write_session(self, p: Proc, pid: Hashable, s: sess_mod.Session, g: _Group | None) -> None:
        """One session's track (under its task's), its slices, its arrows and its counts."""
        self._let_go(pid, s, g)
        self.trace.sessions += 1
        uuid = stable_id("session", self.fi, pid, s.sid)
        label = f"session {s.sid} · {s.status}"
        self.out.track(uuid, label, self._session_parent(p, s, g))
        group_end = g.end if g is not None and g.end else s.own_end()
        self._count(p, s)
        flows_in, flows_out = self._session_flows(pid, s)
        for i, lane in enumerate(sess_mod.pieces(s, group_end, label)):
            track = uuid if i == 0 else stable_id("session-lane", self.fi, pid, s.sid, i)
            if i:
                self.out.track(track, f"{label} · concurrent {i}", uuid)
            self.write_pieces(track, lane, flows_in if i == 0 else (), flows_out if i == 0 else ())

    def _let_go(self, pid: Hashable, s: sess_mod.Session, g: _Group | None) -> None:
        """The session is written: it is no longer held, nor (when its group is done) its group."""
        self.open.pop((pid, s.sid), None)
        if g is not None:
            if g.sessions.pop(s.sid, None) is not None:
                self.held -= 1
            if not g.sessions and g.done:
                self.groups.pop((pid, s.task), None)

    def _session_parent(self, p: Proc, s: sess_mod.Session, g: _Group | None) -> int:
        """Its task's track; a track of its own for a task whose span is elsewhere or never came."""
        if g is None:
            return p.uuid
        if g.done:
            return g.uuid
        step = f" · step {s.step}" if s.step is not None else ""
        return self.child_track(p, ("task", s.task), f"task {s.task}{step}")

    @staticmethod
    def _count_final(c: _Counts, start: int, end: int, args: dict[str, object]) -> None:
        """A session's span into its process's counters: in flight, and its status in its step."""
        c.flight_ts.extend((start, end))
        c.flight_d.extend((1, -1))
        status = args.get(ATTR_STATUS)
        step = args.get(ATTR_STEP)
        if status in _STATUS_COUNTERS and type(step) is int and abs(step) < _BOUND:
            c.final_ts.append(end)
            c.final_step.append(step)
            c.final_status.append(_STATUS_COUNTERS.index(status))

    def _count(self, p: Proc, s: sess_mod.Session) -> None:
        """The session into its process's counters: queue depth and generated tokens."""
        c = p.counts
        if c.capped:
            return
        start, final = s.window()
        d, base = s.decomposition()
        first = base + int(d.raw[0][3]) if d.raw and d.raw[0][1] == "queue" else start
        if s.own is not None:
            c.queue_ts.extend((start, first if s.phases else final))
            c.queue_d.extend((1, -1))
        for ph in s.phases:
            tokens = ph.args.get(_OUTPUT_TOKENS)
            if isinstance(tokens, (int, float)) and not isinstance(tokens, bool):
                c.tokens[ph.end // 1_000_000_000] += tokens

    def _session_flows(self, pid: Hashable, s: sess_mod.Session) -> tuple[list[int], list[int]]:
        """The arrows ending on the session's slice (from its task) and leaving it (to the train
        step that consumed it), both ends in this file's time range."""
        arrows = self.trace.arrows
        flows_in: list[int] = []
        flows_out: list[int] = []
        if s.from_task is not None:
            flows_in.append(s.from_task)
        if s.own is None:
            return flows_in, flows_out
        rank = s.own[3].get("rank")
        if s.from_task is None:
            fid = arrows.from_other_file(s.task, self.fi, rank, s.sid)
            if fid is not None:
                flows_in.append(fid)
        if s.status == "accepted":
            fid = arrows.to_consumer(rank, s.sid, s.step, s.own[1])
            if fid is not None:
                flows_out.append(fid)
        return flows_in, flows_out

    def write_pieces(self, track: int, pieces: list[sess_mod.Piece], flows_in: Iterable[int],
                     flows_out: Iterable[int]) -> None:
        out = self.out
        pieces.sort(key=lambda x: (x[0], x[2], -x[1]))
        open_ends: list[int] = []
        first = True
        for start, end, order, name, cat, args in pieces:
            while open_ends and open_ends[-1] <= start and not (order == sess_mod.INSTANT
                                                                 and open_ends[-1] == start):
                out.end(open_ends.pop(), track)
            if order == sess_mod.INSTANT:
                out.event(start, INSTANT, track, name, cat, args, _PER_PROCESS)
                continue
            if first:  # the session's slice
                first = False
                out.event(start, SLICE_BEGIN, track, name, cat, args, _ROLE, flows=flows_out,
                          ends=flows_in, once=order == sess_mod.SESSION)
            else:
                out.event(start, SLICE_BEGIN, track, name, cat, args, _PER_PROCESS)
            open_ends.append(end)
        while open_ends:
            out.end(open_ends.pop(), track)

    # -- the file's end ----------------------------------------------------------------------------
    def close(self) -> None:
        for (pid, _task), g in list(self.groups.items()):
            self.write_group(self.procs[pid], pid, g)
        for (pid, _sid), s in list(self.open.items()):  # phases whose session never ended
            self.write_session(self.procs[pid], pid, s, None)
        for p in {id(p): p for p in self.procs.values()}.values():
            for _uuid, lane in p.threads.values():
                lane.close()
            if self.onto is None:
                self.write_counters(p)
        self.out.flush()

    def write_counters(self, p: Proc) -> None:
        c = p.counts
        for name, ts, deltas in (("sessions in flight", c.flight_ts, c.flight_d),
                                 ("queue depth (submitted, no phase yet)", c.queue_ts, c.queue_d)):
            if not ts:
                continue
            track = self.child_track(p, ("counter", name), name, counter=True)
            changes = sorted(zip(ts, deltas, strict=True))  # at one time: an end before a start
            self.out.counters(track, zip([t for t, _ in changes], accumulate(d for _, d in changes),
                                         strict=True))
        if c.final_ts:
            per: dict[tuple[int, int], int] = defaultdict(int)
            tracks = [self.child_track(p, ("counter", s), f"{s} in step", counter=True)
                      for s in _STATUS_COUNTERS]
            for i in sorted(range(len(c.final_ts)), key=c.final_ts.__getitem__):
                key = (c.final_step[i], c.final_status[i])
                per[key] += 1
                self.out.counter(c.final_ts[i], tracks[c.final_status[i]], per[key])
        if c.version_ts:
            track = self.child_track(p, ("counter", "version"), "policy version", counter=True)
            last = None
            for i in sorted(range(len(c.version_ts)), key=lambda i: (c.version_ts[i], c.version[i])):
                if c.version[i] != last:
                    last = c.version[i]
                    self.out.counter(c.version_ts[i], track, last)
        if c.tokens:
            track = self.child_track(p, ("counter", "tokens"), "generated tokens/s", counter=True)
            last = None
            for sec in sorted(c.tokens):
                if last is not None and sec > last + 1:
                    self.out.counter((last + 1) * 1_000_000_000, track, 0)
                self.out.counter(sec * 1_000_000_000, track, c.tokens[sec])
                last = sec
            if last is not None:
                self.out.counter((last + 1) * 1_000_000_000, track, 0)
        p.counts = _Counts()
