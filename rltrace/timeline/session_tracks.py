"""A session's subtree on the native timeline: its slice, its turns, its phases and the waits
between them, laid out from the events of its spans.

The waits (those of at least :data:`MIN_WAIT_SHARE` of the session) are the report's
decomposition (:func:`rltrace.readers.session_time.decompose`, one
implementation): queue wait (submit to the first phase), the gaps between phases, group wait
(its own end to its group's last sibling's end) and before finalize.  Times stay in integer
nanoseconds: the decomposition runs on offsets from the session's submit, which a double holds
exactly, so a wait ends exactly where the next phase begins.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from itertools import pairwise

from rltrace.readers import session_time
from rltrace.semconv import ATTR_REASON, ATTR_STATUS, ATTR_STEP, ATTR_TURN

#: a slice of the session's own track: (start, end, order, name, category, args); ``order``
#: puts the session before its turns, turns before phases and waits, instants last, at one start
Piece = tuple[int, int, int, str, str, "dict[str, object] | None"]
SESSION, TURN, PHASE, INSTANT = 0, 1, 2, 3
WAIT_CATEGORY = "rl.wait"
#: waits shorter than this share of their session are not drawn (the report counts them all):
#: microsecond gaps between phases are invisible on a timeline and would double its events
MIN_WAIT_SHARE = 0.005


@dataclass(slots=True)
class Phase:
    """One phase execution's complete event."""

    start: int
    end: int
    name: str
    category: str
    args: dict[str, object]
    turn: int | None = None

    @classmethod
    def of(cls, start: int, end: int, name: str, category: str, args: dict[str, object]) -> Phase:
        t = args.get(ATTR_TURN)
        return cls(start, end, name, category, args, t if type(t) is int else None)


@dataclass(slots=True)
class Session:
    """What arrived of one session: its phases, instants, and its own span when it ended."""

    sid: Hashable
    task: Hashable = None
    phases: list[Phase] = field(default_factory=list)
    instants: list[tuple[int, str, str, dict[str, object]]] = field(default_factory=list)
    #: (start, end, category, args) of its ``rl.session`` span
    own: tuple[int, int, str, dict[str, object]] | None = None
    #: the id of the arrow its task's slice has to it (None: its task's slice has none)
    from_task: int | None = None
    _decomp: tuple[session_time.Decomposition, int] | None = None

    @property
    def status(self) -> str:
        s = self.own[3].get(ATTR_STATUS) if self.own is not None else None
        return s if isinstance(s, str) else "pending"

    @property
    def step(self) -> object:
        return self.own[3].get(ATTR_STEP) if self.own is not None else None

    def window(self) -> tuple[int, int]:
        """Submit to finalize (its span), else its phases' extent."""
        if self.own is not None:
            return self.own[0], self.own[1]
        if not self.phases:
            return 0, 0
        return min(p.start for p in self.phases), max(p.end for p in self.phases)

    def decomposition(self) -> tuple[session_time.Decomposition, int]:
        """The decomposition on offsets from ``base`` (the window's start), and ``base``."""
        if self._decomp is None:
            base, final = self.window()
            phases: dict[str, list[dict[str, object]]] = {}
            for p in self.phases:
                item: dict[str, object] = {"start_ts": p.start - base, "end_ts": p.end - base}
                if p.turn is not None:
                    item["turn"] = p.turn
                phases.setdefault(p.name, []).append(item)
            self._decomp = (session_time.decompose(phases, 0.0, float(final - base)), base)
        return self._decomp

    def own_end(self) -> int:
        """Its last phase's end (the group's end is the latest of its sessions')."""
        d, base = self.decomposition()
        return base + int(d.own_end)


def lanes_of(phases: list[Phase]) -> list[list[Phase]]:
    """Phases split into lanes in which none overlaps another (most sessions: one lane)."""
    lanes: list[list[Phase]] = []
    for p in sorted(phases, key=lambda p: (p.start, -p.end)):
        for lane in lanes:
            if lane[-1].end <= p.start:
                lane.append(p)
                break
        else:
            lanes.append([p])
    return lanes


def turn_spans(phases: list[Phase]) -> list[tuple[int, int, int]]:
    """(turn, start, end) of each turn, when turns can be drawn as slices around their phases:
    disjoint, and no phase without a turn straddling one's edge (else none)."""
    spans: dict[int, list[int]] = {}
    for p in phases:
        t = p.turn
        if t is not None:
            s = spans.get(t)
            if s is None:
                spans[t] = [p.start, p.end]
            else:
                s[0], s[1] = min(s[0], p.start), max(s[1], p.end)
    out = sorted((lo, hi, t) for t, (lo, hi) in spans.items())
    for (_, e0, _), (s1, _, _) in pairwise(out):
        if s1 < e0:
            return []
    for p in phases:
        if p.turn is None:
            for lo, hi, _ in out:
                if p.start < hi and p.end > lo and not (lo <= p.start and p.end <= hi):
                    return []
    return [(t, lo, hi) for lo, hi, t in out]


def pieces(sess: Session, group_end: int, label: str) -> list[list[Piece]]:
    """The slices of ``sess``'s track (index 0) and of its overflow lanes (concurrent phases)."""
    start, final = sess.window()
    if sess.phases:  # a phase racing its finalize stays inside the session's slice
        start = min(start, min(p.start for p in sess.phases))
        final = max(final, max(p.end for p in sess.phases))
    args = sess.own[3] if sess.own is not None else {}
    own: list[Piece] = [(start, final, SESSION, label, "rl.session", args)]
    lanes = lanes_of(sess.phases)
    first = lanes[0] if lanes else []
    if len(lanes) <= 1:
        for turn, s, e in turn_spans(first):
            own.append((s, e, TURN, f"turn {turn}", "rl.turn", {ATTR_TURN: turn}))
    own.extend((p.start, p.end, PHASE, p.name, p.category, p.args) for p in first)
    d, base = sess.decomposition()
    min_wait = max(1, (final - start) * MIN_WAIT_SHARE)
    for seg in session_time.split_segments(d, float(group_end - base)):
        if seg.kind != session_time.KIND_PHASE and seg.end - seg.start >= min_wait:
            own.append((base + int(seg.start), base + int(seg.end), PHASE, seg.label, WAIT_CATEGORY, None))
    for ts, name, cat, ev_args in sess.instants:
        own.append((ts, ts, INSTANT, name, cat, ev_args))
    status = sess.status
    if status not in ("accepted", "pending"):
        reason = args.get(ATTR_REASON)
        own.append((final, final, INSTANT, f"{status}: {reason}" if reason else status, "rl.status",
                    {ATTR_STATUS: status, ATTR_REASON: reason}))
    out = [own]
    for lane in lanes[1:]:
        out.append([(p.start, p.end, PHASE, p.name, p.category, p.args) for p in lane])
    return out
