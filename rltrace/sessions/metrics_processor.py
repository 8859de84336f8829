"""``SessionMetricsProcessor``: derives per-session records and metrics from session spans.

It is a real OTel ``SpanProcessor``: add it to any SDK ``TracerProvider`` and every span with
``rl.session.id`` feeds it (phase spans carry ``rl.phase``; the ``rl.session`` span closes the
record).  Inside rltrace's pipeline it is fed the recorded scopes directly (``on_record``),
before ``ReadableSpan``s are built, so the derived figures also land on the session span as
``rl.session.<field>`` attributes; an rltrace session brings its phase executions with it (its
``phase_log``, which the flight recorder keeps too), so nothing is held for it meanwhile.

A record holds AReaL's fields in AReaL's order (``task_id, session_id, rank, role`` (when set),
``status, reason, submit_ts, finalized_ts, total_s, generate_s, reward_s, toolcall_s, phases,
counters`` (when any)) followed by
rltrace's (``trace_id``, ``turns``, ``<custom phase>_s``, ``phase_counts``).  Times are
epoch seconds.  Finished sessions leave no state behind.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from rltrace.readers.session_schema import SESSION_RECORD
from rltrace.readers.session_schema import copied as copied_fields
from rltrace.recording.recorder import RecordBase, Scope
from rltrace.seams import RecordProcessor
from rltrace.semconv import (
    ATTR_INTERRUPTED,
    ATTR_PHASE,
    ATTR_POLICY_VERSION,
    ATTR_REASON,
    ATTR_SESSION,
    ATTR_SESSION_COUNTER_PREFIX,
    ATTR_STATUS,
    ATTR_STEP,
    ATTR_TASK,
    ATTR_TURN,
    ATTR_VERSION_AT_FINALIZE,
    SESSION_SPAN,
)
from rltrace.sessions.phases import BUILTIN, PhaseRegistry
from rltrace.sessions.records import Execution, PhaseScope, SessionScope, SyncedPhaseScope, TaskScope

if TYPE_CHECKING:
    from rltrace.sessions.metric_aggregates import SessionAggregates

_BUILTIN_SET = frozenset(p.name for p in BUILTIN)
#: the record's fields copied from span attributes as they are (the schema's ``attr`` fields)
COPIED = copied_fields(SESSION_RECORD)
#: session-span attributes holding per-session counters (``rl.session.counter.<name>``)
COUNTER_PREFIX = ATTR_SESSION_COUNTER_PREFIX
_COUNTER_LEN = len(COUNTER_PREFIX)
_DONE_GEN = 4_096
_EXEC_TIMES = itemgetter(1, 2)  # an execution's (start, end)
#: token counts of a phase execution (``gen_ai.usage.*``; AReaL's ``input_tokens`` /
#: ``output_tokens`` payloads are recorded under these names)
IN_TOKENS, OUT_TOKENS = "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"


def _reraise(rec: object, exc: Exception) -> None:
    raise exc


def build_record(attrs: Mapping[str, object], start: int, end: int, trace_id: int,
                 phases: dict[str, list[Execution]], rank: int, role: str | None,
                 custom: tuple[str, ...], counters_possible: bool = True,
                 tokens: list[float] | None = None,
                 copied: tuple[tuple[str, str], ...] = COPIED) -> dict[str, Any]:
    """One session's record (AReaL's fields in AReaL's order, then rltrace's): its span's
    attributes and times, its phase executions (:data:`~rltrace.sessions.records.Execution`) by phase,
    and the ``[input, output]`` tokens its phases reported (``input_tokens`` /
    ``output_tokens``; absent when none did), and ``policy_version`` when it was set.
    Its fields are those of :data:`rltrace.readers.session_schema.SESSION_RECORD`; the schema's fields
    copied from a span attribute (``copied``, :func:`~rltrace.readers.session_schema.copied`)
    come last, each when its attribute is set."""
    status = attrs.get(ATTR_STATUS, "pending")
    totals: dict[str, float] = {}
    out_phases: dict[str, list[dict[str, object]]] = {}
    counts: dict[str, int] = {}
    turns = -1
    for p, execs in phases.items():
        if len(execs) > 1:  # by times only: a turn may be None beside an int
            execs.sort(key=_EXEC_TIMES)
        total = 0
        items = []
        for _, s, e, turn, interrupted in execs:
            total += e - s
            item: dict[str, object] = {"start_ts": s / 1e9, "end_ts": e / 1e9}
            if turn is not None:
                item["turn"] = turn
                if turn > turns:
                    turns = turn
            if interrupted:
                item["interrupted"] = True
            items.append(item)
        totals[p] = total / 1e9
        out_phases[p] = items
        counts[p] = len(execs)
    record: dict[str, Any] = {
        "task_id": attrs.get(ATTR_TASK),
        "session_id": attrs[ATTR_SESSION],
        "rank": rank,
        **({"role": role} if role is not None else {}),
        "status": status,
        "reason": attrs.get(ATTR_REASON),
        "submit_ts": start / 1e9,
        "finalized_ts": end / 1e9,
        "total_s": (end - start) / 1e9,
        "generate_s": totals.get("generate", 0.0),
        "reward_s": totals.get("reward", 0.0),
        "toolcall_s": totals.get("toolcall", 0.0),
        "phases": out_phases,
    }
    counters = {k[_COUNTER_LEN:]: v for k, v in attrs.items()
                if k.startswith(COUNTER_PREFIX)} if counters_possible else None
    if counters:  # AReaL's ``counters`` (``trace_session_event("increment_counter", ...)``)
        record["counters"] = counters
    record["trace_id"] = f"{trace_id:032x}"
    record["turns"] = turns + 1
    record["step"] = attrs.get(ATTR_STEP)
    for p in custom:
        record[p + "_s"] = totals.get(p, 0.0)
    for p, phase_s in totals.items():
        if p not in _BUILTIN_SET:
            record[p + "_s"] = phase_s
    record["phase_counts"] = counts
    if tokens is not None:
        record["input_tokens"], record["output_tokens"] = tokens
    version = attrs.get(ATTR_POLICY_VERSION)
    if version is not None:
        record["policy_version"] = version
        moved = attrs.get(ATTR_VERSION_AT_FINALIZE)
        if moved is not None:
            record["policy_version_at_finalize"] = moved
    for name, attr in copied:
        value = attrs.get(attr)
        if value is not None:
            record[name] = value
    return record


def group_phases(logged: Sequence[Execution],
                 held: dict[str, list[Execution]] | None = None) -> dict[str, list[Execution]]:
    """A session's logged executions by phase, as :func:`build_record` takes them (after
    those ``held`` for it by attribute, if any)."""
    out = {p: list(execs) for p, execs in held.items()} if held else {}
    for entry in logged:
        execs = out.get(entry[0])
        if execs is None:
            out[entry[0]] = [entry]
        else:
            execs.append(entry)
    return out


class SessionMetricsProcessor(SpanProcessor, RecordProcessor):
    """Builds one record per finished session; writes it and records OTel metrics."""

    def __init__(self, writer: Any = None, *, rank: int = 0, meter: Any = None,
                 max_open: int = 65_536, role: str | None = None,
                 aggregates: SessionAggregates | None = None,
                 phases: PhaseRegistry | None = None) -> None:
        self.writer = writer
        #: the registered phases: each custom one gets its ``<phase>_s`` field in every record
        #: (None: those the record's phases show)
        self.phases = phases
        self.rank = rank
        #: AReaL's ``role`` field, written after ``rank`` when set
        self.role = role
        self.max_open = max_open
        self.sessions = 0
        #: sessions whose phases were held but whose session span never came (e.g. dropped
        #: under overload); evicted oldest-first beyond ``max_open`` so memory stays bounded
        self.orphaned = 0
        #: rltrace phase executions that ended after their session's record was written (a
        #: phase racing its session's finalize on another thread): counted, not held.  Spans
        #: of other instrumentation are not checked (their session ids may repeat)
        self.late_phases = 0
        # recently finished session ids, two generations of _DONE_GEN: a phase racing its
        # session's finalize arrives within an export cycle or two, so a few thousand suffice
        self._done: list[set[Any]] = [set(), set()]
        self._acc: OrderedDict[Any, dict[str, list[Execution]]] = OrderedDict()
        #: session id -> [input, output] tokens its phases reported so far
        self._tokens: dict[Any, list[float]] = {}
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        #: phase name -> (its ``rl.session.<phase>_s`` attribute, its record field)
        self._phase_keys: dict[str, tuple[str, str]] = {}
        #: :class:`rltrace.sessions.metric_aggregates.SessionAggregates`: the metrics aggregated in place for
        #: the pipeline's readers (``meter`` records through the SDK one measurement at a time)
        self._aggregates = aggregates
        self._metrics = None
        if meter is not None and aggregates is None:
            self._metrics = (
                meter.create_histogram("rl.session.duration", unit="s",
                                       description="session time from register to finalize"),
                meter.create_histogram("rl.phase.duration", unit="s",
                                       description="duration of one phase execution"),
                meter.create_counter("rl.sessions", unit="{session}",
                                     description="finalized sessions by status"),
            )

    # -- SpanProcessor ----------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        rec = getattr(span, "rltrace_record", None)
        if rec is not None:
            self.on_record(rec)
            return
        attrs = span.attributes or {}
        if ATTR_SESSION in attrs:
            self._observe(span.name, attrs, span.start_time or 0, span.end_time or 0, span, None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self.writer is not None:
            self.writer.flush()
        return True

    def shutdown(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- rltrace records ---------------------------------------------------------------------
    def on_record(self, rec: Any) -> None:
        """One finished rltrace scope (see :meth:`on_records`); what it raises is raised."""
        self.on_records((rec,), _reraise)

    def on_records(self, records: Sequence[Any],
                   on_error: Callable[[Any, Exception], None]) -> None:
        """A cycle's finished rltrace scopes, before any ``ReadableSpan`` is built; a record
        that raises is handed to ``on_error`` and the rest go on.

        A session's record is made from the session itself: its phase executions are in its
        ``phase_log`` (each execution notes itself there as it ends, before its own record is
        queued), so the processor holds nothing per open session; an execution's record only
        brings its token counts.  Records of other kinds that carry ``rl.session.id`` (a
        scope of the user's) are reassembled by attribute, as the spans of other
        instrumentation are.
        """
        for rec in records:
            cls = rec.__class__
            if cls is Scope and rec.extra is None:
                continue  # a plain scope without attributes: the common case
            try:
                if cls is SessionScope:
                    attrs = rec.record_attrs()
                    self._session_ended(attrs, rec.start_ns, rec.end_ns, rec, attrs)
                elif cls is PhaseScope or cls is SyncedPhaseScope:
                    self._logged_phase(rec)
                elif cls is not TaskScope and (rec.extra is not None or rec.slot_attrs):
                    attrs = rec.record_attrs()
                    if attrs and ATTR_SESSION in attrs:
                        if rec.name == SESSION_SPAN:
                            self._session_ended(attrs, rec.start_ns, rec.end_ns, rec, attrs)
                        else:
                            self._phase_ended(attrs, rec.start_ns, rec.end_ns)
            except Exception as exc:
                on_error(rec, exc)

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's partial sessions are the parent's."""
        self._acc = OrderedDict()
        self._tokens = {}
        self._done = [set(), set()]

    def open_sessions(self) -> int:
        """Sessions with phases seen but no session span yet."""
        return len(self._acc)

    def _observe(self, name: str, attrs: Mapping[str, Any], start: int, end: int,
                 span: Any, writable: dict[str, Any] | None) -> None:
        if name == SESSION_SPAN:
            self._session_ended(attrs, start, end, span, writable)
        else:
            self._phase_ended(attrs, start, end)

    def _session_ended(self, attrs: Mapping[str, Any], start: int, end: int, span: Any,
                       writable: dict[str, Any] | None) -> None:
        """A session's span ended: its record, from its logged phase executions (an rltrace
        session's) and those held for it by attribute, written and aggregated (and its figures
        added to ``writable``: an rltrace record's attributes)."""
        sid = attrs[ATTR_SESSION]
        phases = self._acc.pop(sid, None) if self._acc else None
        if phases is None:
            phases = {}  # none held by attribute (the common case): logged ones only
        if writable is not None and span.__class__ is SessionScope:
            # what ended before now; an execution ending from now on is a late one
            logged = span.phase_log = tuple(span.phase_log)
            if logged:
                phases = group_phases(logged, phases)
        tokens = self._tokens.pop(sid, None) if self._tokens else None
        # the trace id: an rltrace session's is its task's (no ids of its own are drawn for
        # it); an rltrace record keeps user-set attributes (counters among them) in ``extra``
        parent = span.parent if writable is not None else None
        ids = parent if isinstance(parent, RecordBase) else span
        record = build_record(attrs, start, end, ids.get_span_context()[0], phases, self.rank,
                              self.role, () if self.phases is None else self.phases.custom_names(),
                              writable is None or span.extra is not None, tokens)
        if self._aggregates is not None:
            self._aggregates.record(record["status"], record["total_s"], phases)
        elif self._metrics is not None:
            self._record_metrics(record, phases)
        if writable is not None:
            writable["rl.session.total_s"] = record["total_s"]
            writable["rl.session.turns"] = record["turns"]
            keys = self._phase_keys
            for p in record["phase_counts"]:
                k = keys.get(p)
                if k is None:
                    k = keys[p] = (f"rl.session.{p}_s", f"{p}_s")
                writable[k[0]] = record[k[1]]
            # an rltrace record: its session ids are never reused
            done = self._done[0]
            done.add(sid)
            if len(done) >= _DONE_GEN:
                self._done = [set(), done]
        self.sessions += 1
        if self.writer is not None:
            self.writer.add(record)
        for listener in self.listeners:
            listener(record)

    def _logged_phase(self, rec: PhaseScope) -> None:
        """An rltrace phase execution's record: in its session's log already; counted late if
        its session's record was built without it, else its token counts are taken."""
        log = rec.parent.phase_log
        if type(log) is tuple:  # its session's record is built
            entry = rec.logged
            if entry is not None:
                for e in log:
                    if e is entry:
                        return  # in that record: it ended in time
            # late: noted after the record was built (or on the list the record was built
            # from, as it was being built), or never noted; matched by identity, so another
            # execution of the same phase with the same times does not stand in for it
            self.late_phases += 1
            return
        if rec.start_payload or rec.end_payload or rec.extra is not None:
            attrs = rec.record_attrs()
            tin, tout = attrs.get(IN_TOKENS), attrs.get(OUT_TOKENS)
            if tin is not None or tout is not None:
                self._count_tokens(rec.session_id, tin, tout)

    def _phase_ended(self, attrs: Mapping[str, Any], start: int, end: int) -> None:
        """A phase execution's span ended: held until its session's span ends."""
        phase = attrs.get(ATTR_PHASE)
        if phase is None:
            return
        sid = attrs[ATTR_SESSION]
        acc = self._acc
        phases = acc.get(sid)
        if phases is None:
            if sid in self._done[0] or sid in self._done[1]:
                self.late_phases += 1
                return
            phases = acc[sid] = {}
            if len(acc) > self.max_open:
                self._evict_oldest()
        execs = phases.get(phase)
        if execs is None:
            execs = phases[phase] = []
        execs.append((phase, start, end, attrs.get(ATTR_TURN),
                      bool(attrs.get(ATTR_INTERRUPTED, False))))
        tin, tout = attrs.get(IN_TOKENS), attrs.get(OUT_TOKENS)
        if tin is not None or tout is not None:
            self._count_tokens(sid, tin, tout)

    def _count_tokens(self, sid: Any, tin: Any, tout: Any) -> None:
        """Add a phase's token counts to its session's (values that are not numbers are not)."""
        tok = self._tokens.get(sid)
        if tok is None:
            tok = self._tokens[sid] = [0, 0]
        for i, v in enumerate((tin, tout)):
            if type(v) in (int, float) and v == v and abs(v) < 1e15:
                tok[i] += v

    def _evict_oldest(self) -> None:
        """More sessions held than ``max_open``: the oldest goes, counted as orphaned."""
        sid, _ = self._acc.popitem(last=False)
        self._tokens.pop(sid, None)
        self.orphaned += 1

    def _record_metrics(self, record: dict[str, Any],
                        phases: dict[str, list[Execution]]) -> None:
        """The session's figures through the SDK's instruments, one measurement at a time."""
        h_session, h_phase, c_sessions = self._metrics  # type: ignore[misc]
        status = record["status"]
        labels = {ATTR_STATUS: status}
        h_session.record(record["total_s"], labels)
        c_sessions.add(1, labels)
        for p, execs in phases.items():
            for _, s, e, _, _ in execs:
                h_phase.record((e - s) / 1e9, {ATTR_PHASE: p, ATTR_STATUS: status})


