"""The check of one session record (a line of ``sessions-r*.jsonl``), used by every reader of them.

A record is refused when a time it is measured by (``submit_ts``, ``finalized_ts``,
``total_s``) is not a number of seconds.  Any other field read by the report that has the
wrong type or range is removed and noted (``step`` -2**63 is a record without a step, a
``task_id`` list is a record without a task id), as is each malformed phase execution; ids and
texts are capped at ``MAX_TEXT`` characters.  An execution whose ``start_ts`` or ``end_ts`` is
null (a phase that never ended) is kept as it is: readers already ignore it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rltrace.readers.fields import (
    MAX_SECONDS,
    MAX_TEXT,
    Bad,
    Check,
    Note,
    cap_text,
    integer,
    number,
    preview,
    scalar,
    text,
)
from rltrace.readers.session_schema import (
    COUNT_MAX,
    INT32_MAX,
    SESSION_RECORD,
    Kind,
    RecordField,
    RecordSchema,
    times,
)
from rltrace.readers.session_schema import STEP_MAX as STEP_MAX
from rltrace.readers.session_schema import STEP_MIN as STEP_MIN

RANK_MAX = TURN_MAX = INT32_MAX
TURNS_MAX = COUNT_MAX
#: phase names read per record (the rest are dropped and noted)
MAX_PHASES = 64


def _seconds(v: object) -> bool:
    """A number of seconds (NaN and infinities fail the range check)."""
    return (type(v) is float or type(v) is int) and -MAX_SECONDS <= v <= MAX_SECONDS


def check_session_record(rec: dict[str, Any], note: Note, checks: RecordChecks | None = None) -> str | None:
    """Check ``rec`` in place (see the module docstring): None when it can be used, else why not.
    ``note`` receives one ``"field: why"`` per field removed.  ``checks`` are those of the
    session record's schema unless given (:meth:`RecordChecks.of` another schema)."""
    c = checks if checks is not None else CHECKS
    fields, times = c.fields, c.times
    dropped = []
    for key, v in rec.items():
        if v is None:
            continue
        check = fields.get(key)
        if check is not None:
            try:
                new = check(v, note)
            except Bad as exc:
                dropped.append(key)
                note(f"{key}: {exc}")
                continue
            if new is not v:
                rec[key] = new
        elif (key in times or key[-2:] == "_s") and not _seconds(v):  # the times and <phase>_s
            if key in times:
                return f"{key}: expected a number of seconds, got {preview(v)}"
            dropped.append(key)
            note(f"{cap_text(key, 40)}: expected a number of seconds, got {preview(v)}")
    for key in dropped:
        del rec[key]
    return None


def _phases(v: object, note: Note) -> dict[str, list[Any]]:
    """``{phase: [execution, ...]}`` with malformed executions (and phases) dropped; ``v`` itself
    when nothing is."""
    if type(v) is not dict:
        raise Bad(f"expected an object, got {preview(v)}")
    if len(v) > MAX_PHASES:
        note(f"phases: {len(v) - MAX_PHASES} phase(s) past the {MAX_PHASES} read")
        v = dict(list(v.items())[:MAX_PHASES])
    kept: dict[str, list[Any]] | None = None
    for i, (name, execs) in enumerate(v.items()):
        ex = execs if _well_formed(execs) else _repaired(name, execs, note)
        if kept is None and (ex is not execs or len(name) > MAX_TEXT):
            kept = dict(list(v.items())[:i])  # the phases before were kept as they are
        if kept is not None and ex is not None:
            kept[name if len(name) <= MAX_TEXT else cap_text(name)] = ex
    return v if kept is None else kept


def _well_formed(execs: object) -> bool:
    """Every execution an object with numbers of seconds (or null) as ends and a valid turn."""
    if type(execs) is not list:
        return False
    lo, hi = -MAX_SECONDS, MAX_SECONDS
    for e in execs:
        if type(e) is not dict:
            return False
        s, t, turn = e.get("start_ts"), e.get("end_ts"), e.get("turn")
        if not ((s is None or ((type(s) is float or type(s) is int) and lo <= s <= hi))
                and (t is None or ((type(t) is float or type(t) is int) and lo <= t <= hi))
                and (turn is None or (type(turn) is int and 0 <= turn <= TURN_MAX))):
            return False
    return True


def _repaired(name: str, execs: object, note: Note) -> list[Any] | None:
    """The executions of a phase that has malformed ones, without them (None: not a list); a
    malformed ``turn`` is made null.  Each problem is noted."""
    where = f"phases.{cap_text(name, 40)}"
    if type(execs) is not list:
        note(f"{where}: expected a list, got {preview(execs)}")
        return None
    good = [e for e in execs if type(e) is dict and _times_ok(e.get("start_ts"), e.get("end_ts"))]
    for e in good:
        turn = e.get("turn")
        if turn is not None and not (type(turn) is int and 0 <= turn <= TURN_MAX):
            e["turn"] = None
            note(f"{where}.turn: expected an integer in [0, {TURN_MAX}], got {preview(turn)}")
    if len(good) < len(execs):
        note(f"{where}: {len(execs) - len(good)} malformed execution(s) dropped")
    return good


def _times_ok(start: object, end: object) -> bool:
    """Start and end of an execution: numbers of seconds, or null (a phase that never ended)."""
    return (start is None or _seconds(start)) and (end is None or _seconds(end))


def _phase_counts(v: object, note: Note) -> dict[str, int]:
    """``{phase: count}``; any malformed entry makes the whole field unusable."""
    if type(v) is not dict or len(v) > MAX_PHASES:
        raise Bad(f"expected an object of at most {MAX_PHASES} counts, got {preview(v)}")
    long_name = False
    for k, n in v.items():
        if type(n) is not int or n < 0:
            raise Bad(f"expected counts (integers >= 0), got {preview(n)}")
        long_name = long_name or len(k) > MAX_TEXT
    if not long_name:
        return v
    return {(k if len(k) <= MAX_TEXT else cap_text(k)): n for k, n in v.items()}


@dataclass(frozen=True)
class RecordChecks:
    """The checks of a session record, made from its schema (:mod:`rltrace.readers.session_schema`)."""

    #: the fields checked by a :data:`~.fields.Check` (the times and ``<phase>_s`` are checked
    #: inline, ``counters`` is read as it is)
    fields: Mapping[str, Check]
    #: the times a record is measured by: a record with a malformed one is refused
    times: tuple[str, ...]

    @classmethod
    def of(cls, schema: RecordSchema) -> RecordChecks:
        """The checks of the records ``schema`` describes."""
        fields = {f.name: check for f in schema if (check := _check_of(f)) is not None}
        return cls(MappingProxyType(fields), times(schema))


def _check_of(f: RecordField) -> Check | None:
    """The check of one field by its kind; None for those checked inline or read as they are."""
    kind = f.kind
    if kind is Kind.ID:
        return scalar
    if kind is Kind.TEXT:
        return text
    if kind is Kind.INT:
        return integer(int(f.lo), int(f.hi))
    if kind is Kind.NUMBER:
        return number(f.lo, f.hi)
    if kind is Kind.PHASES:
        return _phases
    if kind is Kind.PHASE_COUNTS:
        return _phase_counts
    return None  # SECONDS (inline), COUNTERS


#: the checks of :data:`rltrace.readers.session_schema.SESSION_RECORD`
CHECKS = RecordChecks.of(SESSION_RECORD)
FIELDS = CHECKS.fields
TIMES = CHECKS.times
