"""The session record's schema: one line of ``session_tracer/[role/]sessions-r{rank}.jsonl``.

This table is the one definition of the record's shape.  The writer
(:func:`rltrace.sessions.metrics_processor.build_record`) writes its fields in this order, the readers'
check (:func:`rltrace.readers.session_record.check_session_record`) is made from their kinds
and bounds, and AReaL's ``SessionRecord`` (:mod:`rltrace.perf_tracer`) takes its attributes and
serialised fields from the fields marked ``areal``.

A field whose value is a span attribute copied as it is (``attr``) needs nothing but its entry
here: the writer copies it when it is set (:func:`copied`).  Fields the writer
computes (times, phase totals, counts) are written by the writer's own code, in this order.
Besides these fields, a record holds ``<phase>_s`` for each custom phase it ran (seconds, checked
like every ``*_s`` field).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    """What a field holds (the readers' check of each kind is in
    :mod:`rltrace.readers.session_record`)."""

    #: a task or session id: a string, a number or a boolean
    ID = "id"
    TEXT = "text"
    #: an integer within the field's bounds
    INT = "int"
    #: a number within the field's bounds
    NUMBER = "number"
    #: epoch seconds or a duration in seconds
    SECONDS = "seconds"
    #: ``{phase: [{"start_ts", "end_ts", "turn"?, "interrupted"?}, ...]}``
    PHASES = "phases"
    #: ``{phase: executions}``
    PHASE_COUNTS = "phase_counts"
    #: ``{name: number}`` (AReaL's ``counters``)
    COUNTERS = "counters"


#: the steps a reader can hold (int32; -2**31 is the report's "no step")
STEP_MIN, STEP_MAX = -(1 << 31) + 1, (1 << 31) - 1
INT32_MAX = (1 << 31) - 1
COUNT_MAX = 1 << 63
TOKENS_MAX = 1e15


@dataclass(frozen=True)
class RecordField:
    """One field of the session record."""

    name: str
    kind: Kind
    #: absent or null in some records (a reader keeps a record without it)
    optional: bool = False
    #: one of AReaL's fields (``SessionRecord``'s attributes and serialised keys)
    areal: bool = False
    #: AReaL's: computed by ``SessionRecord.to_dict`` from other fields, not an attribute
    derived: bool = False
    #: the span attribute the writer copies as it is, when the writer does not compute it
    attr: str | None = None
    #: bounds of an ``INT`` or ``NUMBER``
    lo: float = 0
    hi: float = 0


#: an ordered table of fields; :data:`SESSION_RECORD` is the session record's
RecordSchema = tuple[RecordField, ...]


def names(schema: RecordSchema) -> tuple[str, ...]:
    """Every field's name, in the writer's order."""
    return tuple(f.name for f in schema)


def copied(schema: RecordSchema) -> tuple[tuple[str, str], ...]:
    """``(field, span attribute)`` of the fields the writer copies from span attributes."""
    return tuple((f.name, f.attr) for f in schema if f.attr is not None)


def areal(schema: RecordSchema) -> RecordSchema:
    """AReaL's fields, in AReaL's order."""
    return tuple(f for f in schema if f.areal)


def areal_attributes(schema: RecordSchema) -> tuple[str, ...]:
    """AReaL's ``SessionRecord`` attributes (its fields not computed from others)."""
    return tuple(f.name for f in schema if f.areal and not f.derived)


def times(schema: RecordSchema) -> tuple[str, ...]:
    """The times a record is measured by: a record with a malformed one is refused."""
    return tuple(f.name for f in schema if f.kind is Kind.SECONDS and not f.optional)


_F, _K = RecordField, Kind

#: the session record, in the writer's order: AReaL's fields, then rltrace's
SESSION_RECORD: RecordSchema = (
    _F("task_id", _K.ID, optional=True, areal=True),
    _F("session_id", _K.ID, areal=True),
    _F("rank", _K.INT, areal=True, lo=0, hi=INT32_MAX),
    _F("role", _K.TEXT, optional=True, areal=True),
    _F("status", _K.TEXT, areal=True),
    _F("reason", _K.TEXT, optional=True, areal=True),
    _F("submit_ts", _K.SECONDS, areal=True),
    _F("finalized_ts", _K.SECONDS, areal=True),
    _F("total_s", _K.SECONDS, areal=True, derived=True),
    _F("generate_s", _K.SECONDS, optional=True, areal=True, derived=True),
    _F("reward_s", _K.SECONDS, optional=True, areal=True, derived=True),
    _F("toolcall_s", _K.SECONDS, optional=True, areal=True, derived=True),
    _F("phases", _K.PHASES, areal=True),
    _F("counters", _K.COUNTERS, optional=True, areal=True),
    _F("trace_id", _K.TEXT),
    _F("turns", _K.INT, lo=0, hi=COUNT_MAX),
    _F("step", _K.INT, optional=True, lo=STEP_MIN, hi=STEP_MAX),
    _F("phase_counts", _K.PHASE_COUNTS),
    _F("input_tokens", _K.NUMBER, optional=True, lo=0, hi=TOKENS_MAX),
    _F("output_tokens", _K.NUMBER, optional=True, lo=0, hi=TOKENS_MAX),
    _F("policy_version", _K.INT, optional=True, lo=0, hi=COUNT_MAX),
    _F("policy_version_at_finalize", _K.INT, optional=True, lo=0, hi=COUNT_MAX),
)
