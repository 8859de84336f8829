"""What Chrome JSON can show of the run's structure, added by ``rltrace convert`` to the merged
JSON (AReaL's format, read by AReaL's tools as before: only ``tid``s change and events are added).

* A named track (a Chrome "thread" of the rank's process) per task, ``task T · step S``, and
  per session, ``session N · task T``, holding the ``rl.task`` slice, the ``rl.session`` slice
  and the session's phases, rather than the anonymous ``MainThread [n]`` lanes the per-rank
  files draw sessions on.
* Flow events (``s`` / ``f`` with ``bp: e``): the task's slice to each of its sessions (across
  files too), and each accepted session (from its last phase) to the train step that consumed
  it (:mod:`.arrows`).

Phases of one session that overlap each other cannot nest on one Chrome track; they are rare,
and Perfetto then draws the later one beside the other (the native trace puts them on a child
track).
"""

from __future__ import annotations

from collections.abc import Hashable

import orjson

from rltrace.semconv import ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK, SESSION_SPAN, TASK_SPAN
from rltrace.timeline.arrows import FileArrows, Plan, Window, number, stable_id, start_ns, step_of

#: tids of the tracks added here start above any thread lane the Chrome exporter numbers
FIRST_TID = 1 << 20
#: how far inside its slice an arrow's end is placed (µs), so it binds to that slice
_INSIDE_US = 1.0
#: how long before the ``consumed`` instant the arrows' ends are (µs; epoch µs as doubles
#: keep quarter-µs steps)
_BEFORE_US = 0.5


def _flow(ph: str, pid: int, tid: int, ts_us: float, flow_id: int, name: str,
          enclosing: bool = True) -> bytes:
    """A flow event: ``s`` binds to the slice open at ``ts_us`` on its thread, ``f`` to the
    enclosing slice (``bp: e``) or, with ``enclosing=False``, to the next one to start."""
    ev: dict[str, object] = {"pid": pid, "tid": tid, "ph": ph, "ts": ts_us, "id": f"0x{flow_id:016x}",
                          "name": name, "cat": "rl.flow"}
    if ph == "f" and enclosing:
        ev["bp"] = "e"
    return orjson.dumps(ev)


def _inside(start_us: float, dur_us: float, from_end: bool = False) -> float:
    step = min(_INSIDE_US, dur_us / 2)
    return start_us + dur_us - step if from_end else start_us + step


class ChromeTracks:
    """One conversion's added tracks and arrows (state bounded by the tasks open at once)."""

    def __init__(self, plan: Plan, window: Window | None = None) -> None:
        #: the arrows this file draws (a split trace's: those with both ends in its window)
        self.arrows = FileArrows(plan, window)
        self._tids: dict[Hashable, int] = {}
        self._next_tid = FIRST_TID
        #: (file, pid, task) -> sessions of the task seen in the file: (tid, start µs, dur µs, sid)
        self._task_sessions: dict[tuple[int, Hashable, Hashable], list[tuple[int, float, float, object]]] = {}
        #: (file, pid, session) -> start µs of its earliest phase so far
        self._first_phase: dict[tuple[int, Hashable, Hashable], float] = {}
        self.flows = 0

    def _track(self, key: Hashable, pid: int, name: str, out: list[bytes]) -> int:
        tid = self._tids.get(key)
        if tid is None:
            tid = self._tids[key] = self._next_tid
            self._next_tid += 1
            out.append(orjson.dumps({"pid": pid, "tid": tid, "ph": "M", "name": "thread_name",
                                     "args": {"name": name}}))
            out.append(orjson.dumps({"pid": pid, "tid": tid, "ph": "M", "name": "thread_sort_index",
                                     "args": {"sort_index": tid}}))
        return tid

    def place(self, fi: int, pid: int, ev: dict[str, object], out: list[bytes]) -> int | None:
        """The tid ``ev`` (written with pid ``pid``) moves to (None: it stays), after adding to
        ``out`` the lines that go with it (track names, flow events)."""
        args = ev.get("args")
        if type(args) is not dict or ev.get("ph") not in ("X", "i", "I"):
            return None
        if ATTR_SESSION in args:
            return self._session_line(fi, pid, ev, args, out)
        if ev.get("name") == TASK_SPAN and ATTR_TASK in args and ev.get("ph") == "X":
            return self._task_line(fi, pid, ev, args, out)
        step = step_of(ev)
        if step is not None:
            self._consumed(pid, ev, args, step, out)
        return None

    def _session_line(self, fi: int, pid: int, ev: dict[str, object], args: dict[str, object],
                      out: list[bytes]) -> int:
        sid, task = args[ATTR_SESSION], args.get(ATTR_TASK)
        label = f"session {sid}" + (f" · task {task}" if task is not None else "")
        tid = self._track((fi, pid, "session", sid), pid, label, out)
        if ev.get("ph") != "X":
            return tid
        ts, dur = number(ev["ts"]), number(ev.get("dur") or 0)
        key = (fi, pid, sid)
        if ev.get("name") != SESSION_SPAN:  # a phase
            first = self._first_phase.get(key)
            if first is None or ts < first:
                self._first_phase[key] = ts
            return tid
        first = self._first_phase.pop(key, None)
        rank = args.get("rank")
        if task is not None:
            if type(sid) is int and self.arrows.plan.task_elsewhere(task, fi):  # the arrow's start: there
                fid = self.arrows.from_other_file(task, fi, rank, sid)
                if fid is not None:
                    out.append(_flow("f", pid, tid, _inside(ts, dur), fid, "task"))
            else:
                self._task_sessions.setdefault((fi, pid, task), []).append((tid, ts, dur, sid))
        if args.get(ATTR_STATUS) == "accepted":
            fid = self.arrows.to_consumer(rank, sid, args.get(ATTR_STEP), start_ns(ev) + round(dur * 1000))
            if fid is not None:
                # from the session's slice: Perfetto binds a flow's start to the innermost slice
                # open at its time on the track (a phase that has ended still counts until another
                # starts), so it goes between the session's start and its first phase's, when
                # they are apart (timestamps are whole µs: at least 1 µs); else it binds to the
                # first phase
                gap = first - ts if first is not None else dur
                at = ts + min(_INSIDE_US, gap / 2) if gap > 0 else _inside(ts, dur)
                out.append(_flow("s", pid, tid, at, fid, "consumed by"))
        return tid

    def _task_line(self, fi: int, pid: int, ev: dict[str, object], args: dict[str, object],
                   out: list[bytes]) -> int:
        task, step = args[ATTR_TASK], args.get(ATTR_STEP)
        tid = self._track((fi, pid, "task", task), pid,
                          f"task {task}" + (f" · step {step}" if step is not None else ""), out)
        ts, dur = number(ev["ts"]), number(ev.get("dur") or 0)
        at = _inside(ts, dur)
        for s_tid, s_ts, s_dur, sid in self._task_sessions.pop((fi, pid, task), ()):
            fid = stable_id("json-task", fi, pid, task, sid)
            out.append(_flow("s", pid, tid, at, fid, "task"))
            out.append(_flow("f", pid, s_tid, _inside(s_ts, s_dur), fid, "task"))
        for fid in self.arrows.to_other_files(task):  # its sessions in other files
            out.append(_flow("s", pid, tid, at, fid, "task"))
        return tid

    def _consumed(self, pid: int, ev: dict[str, object], args: dict[str, object], step: int,
                  out: list[bytes]) -> None:
        """An instant ``consumed N sample(s)`` inside train step ``step`` once its last sample
        ended, and the arrows' ends bound to it.  (Perfetto draws an arrow whose end binds to a
        slice that started before the arrow's start backwards: the instant starts after.)"""
        consumed = self.arrows.consumed(args.get("rank"), step)
        if consumed is None:
            return
        last_end, flows = consumed
        ts, dur = number(ev["ts"]), number(ev.get("dur") or 0)
        # the last sample's end rounded up to a whole µs (a float of epoch µs cannot hold its
        # ns: rounded down, the instant could start before the session's slice ends)
        at = min(max(float(-(-last_end // 1000)), _inside(ts, dur)), _inside(ts, dur, from_end=True))
        raw_tid = ev.get("tid")
        tid = raw_tid if isinstance(raw_tid, int) else 0
        n = len(flows)
        out.append(orjson.dumps({"pid": pid, "tid": tid, "ph": "i", "s": "t", "ts": at,
                                 "name": f"consumed {n} sample(s)", "cat": "rl.consume",
                                 "args": {"rl.consumed": n, ATTR_STEP: step}}))
        for fid in flows:  # just before the instant: bound to the next slice, the instant
            out.append(_flow("f", pid, tid, at - _BEFORE_US, fid, "consumed by", enclosing=False))
        self.flows += n
