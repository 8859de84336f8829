"""Where one session's time goes, computed once and used by every section of the report.

A session record runs from ``submit_ts`` to ``finalized_ts``.  In a GRPO group every sample
is finalized with its task (AReaL's definition, kept in the record), so ``total_s`` of a fast
sample includes the time it waited for its slowest sibling.  The report therefore splits each
session's time into buckets that add up to the whole, in this order on its timeline:

* ``queue wait``: submit to the first phase's start;
* each phase (``generate``, ``toolcall``, ``reward``, custom), each execution with its turn;
  where phases of one session overlap, the overlapping time counts once, for the phase that
  was already running;
* gaps between phases, named by what precedes and follows (``after generate, before
  toolcall``): the workflow's own code between two phases;
* after the session's own end (its last phase's end): ``group wait`` up to the end of the
  last sibling of its group (same rank, step and task), attributed to that sibling, then
  ``before finalize`` up to ``finalized_ts`` (user code between the group's last phase and the
  finalize call);
* a session with no phase at all is ``no phase recorded`` from submit to finalize.

:func:`decompose` does the part that needs only the record and :func:`split_segments` splits
one session's tail given its group's end; the report does the group split on columns
(:func:`rltrace.analysis.columns.split_tail`), the native Perfetto trace per session.
No numpy here: ``rltrace convert`` uses it without the analysis extra.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

QUEUE = "queue wait"
GROUP = "group wait"
FINALIZE = "before finalize"
NO_PHASE = "no phase recorded"
#: what a segment is: the kinds in timeline order
KIND_QUEUE, KIND_PHASE, KIND_GAP, KIND_TAIL, KIND_GROUP, KIND_FINALIZE, KIND_NONE = (
    "queue", "phase", "gap", "tail", "group", "finalize", "none")
MAX_TURN = 1000
_by_time = operator.itemgetter(0, 1)


def gap_name(before: str, after: str) -> str:
    """The bucket of the time between two phases: ``after generate, before toolcall``."""
    return f"after {before}, before {after}"


@dataclass(slots=True)
class Segment:
    """One stretch of a session's timeline (epoch seconds)."""

    label: str
    kind: str
    start: float
    end: float
    turn: int | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start


#: a segment as the hot path keeps it: (label, kind, start, end, turn)
Raw = tuple[str, str, float, float, "int | None"]


@dataclass(slots=True)
class Decomposition:
    """A session's timeline: segments from its window start to ``finalized_ts``."""

    start: float
    own_end: float
    final: float
    raw: list[Raw]

    @property
    def segments(self) -> list[Segment]:
        return [Segment(label, kind, s, e, turn) for label, kind, s, e, turn in self.raw]

    @property
    def own_s(self) -> float:
        """The session's own time: window start to its last phase's end."""
        return self.own_end - self.start

    @property
    def tail_s(self) -> float:
        """Time after its own end until it was finalized (group wait + before finalize)."""
        return max(self.final - self.own_end, 0.0)


def executions(phases: Any) -> list[tuple[float, float, str, int | None]]:
    """(start, end, phase, turn) of every well-formed phase execution, by start time."""
    out: list[tuple[float, float, str, int | None]] = []
    if type(phases) is not dict:
        return out
    append = out.append
    for name, execs in phases.items():
        if type(execs) is not list:
            continue
        name = str(name)
        for i, e in enumerate(execs):
            try:
                s, t = float(e["start_ts"]), float(e["end_ts"])
                turn = e.get("turn", i)
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
            if s <= t and t - s < math.inf:  # NaN and inf fail both
                append((s, t, name, turn if type(turn) is int else None))
    out.sort(key=_by_time)
    return out


def decompose(phases: Any, submit: float | None, final: float) -> Decomposition:
    """Split one record's time into segments (the tail is one ``tail`` segment, split later)."""
    ex = executions(phases)
    start = submit if submit is not None and math.isfinite(submit) else (ex[0][0] if ex else final)
    if not ex:
        end = max(final, start) if math.isfinite(final) else start
        return Decomposition(start, end, end, [(NO_PHASE, KIND_NONE, start, end, None)])
    start = min(start, ex[0][0])
    segs: list[Raw] = []
    append = segs.append
    cursor, prev = start, None
    for s, e, name, turn in ex:
        if s > cursor:
            if prev is None:
                append((QUEUE, KIND_QUEUE, cursor, s, None))
            else:
                append((gap_name(prev, name), KIND_GAP, cursor, s, None))
            cursor = s
        if e > cursor:
            append((name, KIND_PHASE, cursor, e, turn))
            cursor, prev = e, name
        elif prev is None:
            prev = name
    own_end = cursor
    fin = final if math.isfinite(final) else own_end
    if fin > own_end:
        append(("tail", KIND_TAIL, own_end, fin, None))
    return Decomposition(start, own_end, max(fin, own_end), segs)


def split_segments(d: Decomposition, group_end: float) -> list[Segment]:
    """The segments with the tail split at ``group_end`` into group wait and before finalize."""
    out = []
    for seg in d.segments:
        if seg.kind != KIND_TAIL:
            out.append(seg)
            continue
        cut = min(max(group_end, seg.start), seg.end)
        if cut > seg.start:
            out.append(Segment(GROUP, KIND_GROUP, seg.start, cut))
        if seg.end > cut:
            out.append(Segment(FINALIZE, KIND_FINALIZE, cut, seg.end))
    return out


