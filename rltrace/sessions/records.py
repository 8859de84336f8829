"""The span records of the session lifecycle: a task (``rl.task``), a session (``rl.session``)
and a phase execution (named by its phase), each an rltrace :class:`~rltrace.recording.recorder.Scope`
whose fields stay in slots until export."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Protocol

from opentelemetry.trace import SpanContext

from rltrace.device import ATTR_SYNC, ATTR_SYNC_WAIT, device_sync
from rltrace.recording import recorder
from rltrace.recording.recorder import Scope
from rltrace.recording.user_values import recorded
from rltrace.semconv import (
    ATTR_INTERRUPTED,
    ATTR_PHASE,
    ATTR_POLICY_VERSION,
    ATTR_REASON,
    ATTR_SESSION,
    ATTR_STATUS,
    ATTR_STEP,
    ATTR_TASK,
    ATTR_TURN,
    EVALUATION_EVENT,
    SESSION_SPAN,
    TASK_SPAN,
    evaluation_result,
)
from rltrace.sessions.context import SESSION_CV
from rltrace.sessions.phases import PhaseSpec
from rltrace.steps import _STEP_CV, scope_arg_step

FINAL_STATUSES = ("accepted", "rejected", "failed", "dropped")
FINAL_SET = frozenset(FINAL_STATUSES)
#: the final statuses of samples that are not trained on: their work is thrown away
THROWN_AWAY = FINAL_SET - {"accepted"}
STATUSES = ("pending", *FINAL_STATUSES)


_GENAI_KEYS: Mapping[str, str] = MappingProxyType({
    "model": "gen_ai.request.model",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "tool_name": "gen_ai.tool.name",
})

_GENAI_OPERATION = "gen_ai.operation.name"


_SCHEDULER = "scheduler"  # the category of task and session spans

#: one phase execution, as its session logs it: ``(phase, start_ns, end_ns, turn, interrupted)``
Execution = tuple[str, int, int, Any, bool]


class PhaseHost(Protocol):
    """What a phase execution needs of the registry that holds its session
    (:class:`rltrace.sessions.registry.SessionRegistry`)."""

    enabled: bool
    sessions: dict[Hashable, SessionScope]

    def count_misuse(self, kind: str, message: str) -> None: ...

    def no_session(self, sid: Hashable | None, api: str) -> None: ...


class TaskScope(Scope):
    """A task's span record (``rl.task``); its fields stay in slots until export."""

    slot_attrs = True
    kept = True
    __slots__ = ("_attrs", "open", "spread", "step", "task_id")

    def __init__(self, task_id: Hashable, step: int | None) -> None:
        """A started task; ``step`` is its caller's (see ``SessionRegistry._task_locked``)."""
        self.name = TASK_SPAN
        self.category = _SCHEDULER
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._attrs: dict[str, Any] | None = None
        self._sc = None  # its ids are always drawn (its sessions' records carry its trace id):
        # set, the slot is read without the AttributeError an unset one raises and clears
        self.task_id = task_id
        self.open: set[Hashable] | None = set()  # ids of its open sessions; None once it ended
        #: its context went to another process (``rltrace.ray``), whose sessions join it there
        self.spread = False
        self.step = step
        self._start_under(None, False)

    def record_attrs(self) -> dict[str, Any]:
        """The task's attributes, built from its slots once it is exported."""
        if self._attrs is not None:
            return self._attrs
        attrs: dict[str, Any] = {ATTR_TASK: self.task_id}
        if self.step is not None:
            attrs[ATTR_STEP] = self.step
        return _with_user_attrs(self, attrs)

    def own_step(self) -> int | None:
        return self.step


class RemoteTaskScope(TaskScope):
    """A task registered in another process (the driver), standing in for it here.

    Sessions registered under it are children of that process's ``rl.task`` span, in its trace.
    It records nothing itself (the task's span is the other process's): it leaves this
    process's registry when its last session here is finalized, or by ``finalize_task``.
    ``parts`` counts the sessions registered under it here, and ``decision`` is what
    session-aware sampling decided for them (see :class:`rltrace.pipeline.sampling.TaskTailSampler`).
    """

    __slots__ = ("decision", "parts")

    def __init__(self, task_id: Hashable, context: SpanContext) -> None:
        self.name = TASK_SPAN
        self.category = "scheduler"
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._attrs = None
        self.task_id = task_id
        self.open = set()
        step = _STEP_CV.get()
        self.step = scope_arg_step() if step is None else step
        self._sc = context
        self.parts = 0
        self.decision: bool | None = None
        self.spread = False
        self.parent = None
        self.thread = 0
        self.task = None
        self.lane = 0
        self.lanes = None
        self.start_ns = 0

    def finish(self, end_ns: int, exc: BaseException | None = None, keep: bool = False,
               hold: bool = False) -> None:
        self.end_ns = end_ns or 1  # nothing queued: the task's span is the other process's



class SessionScope(Scope):
    """A session's span record (``rl.session``) and its live state while it is open."""

    slot_attrs = True
    kept = True
    __slots__ = ("_attrs", "open_phases", "phase_log", "reason", "session_id", "status", "step",
                 "task_rec", "turn", "version")
    status: str
    reason: str | None

    def __init__(self, session_id: Hashable, task: TaskScope, step: int | None) -> None:
        """A started session of ``task``; ``step`` is its caller's (see
        ``SessionRegistry.register_session``)."""
        self.name = SESSION_SPAN
        self.category = _SCHEDULER
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._sc = None  # set: drawing ids reads it without raising
        self._attrs: dict[str, Any] | None = None
        self.session_id = session_id
        self.task_rec = task
        self.turn = -1
        self.open_phases: list[PhaseScope] = []
        #: its ended phase executions ``(phase, start, end, turn, interrupted)``, as they end:
        #: what its record (:mod:`rltrace.sessions.metrics_processor`) and the flight recorder
        #: (:mod:`rltrace.sessions.flight`) are made from.  A list while executions may join it; the
        #: session processor turns it into a tuple when it builds the record, and an execution
        #: that ends after that is a late one (counted there, not added)
        self.phase_log: list[Execution] | tuple[Execution, ...] = []
        # ``status`` and ``reason`` are set when it is finalized (the only way it ends)
        self.step = step
        #: the policy version that generates it (``rltrace.set_policy_version``), or None
        self.version = recorder.STATE.policy_version
        self._start_under(task, False)

    def record_attrs(self) -> dict[str, Any]:
        """The session's attributes, built from its slots once it is exported."""
        if self._attrs is not None:
            return self._attrs
        attrs = _with_user_attrs(self, {ATTR_TASK: self.task_rec.task_id,
                                        ATTR_SESSION: self.session_id})
        # finalize's figures win over user-set ones; ``status`` is unset only if the span was
        # ended through the OTel API instead of being finalized
        attrs[ATTR_STATUS] = getattr(self, "status", "pending")
        reason = getattr(self, "reason", None)
        if reason is not None:
            attrs[ATTR_REASON] = reason
        if self.step is not None:
            attrs.setdefault(ATTR_STEP, self.step)
        if self.version is not None:
            attrs.setdefault(ATTR_POLICY_VERSION, self.version)
        return attrs


    def own_step(self) -> int | None:
        return self.step


def _with_user_attrs(rec: TaskScope | SessionScope | PhaseScope, attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` plus what was set through ``set_attribute`` (which wins).

    Kept once the record is finished: processors add to it (the session figures) and every
    later reader (Chrome, ReadableSpan) sees the same dict.
    """
    extra = rec.extra
    if extra is not None:
        user = extra.get("attrs")
        if user:
            attrs.update(user)
    if rec.end_ns:
        rec._attrs = attrs
    return attrs


# ---- phases ---------------------------------------------------------------------------------


def _payload_attrs(attrs: dict[str, Any], prefix: str, payload: dict[str, object], spec: PhaseSpec) -> None:
    for k, v in payload.items():
        attrs[prefix + str(k)] = v
        genai = _GENAI_KEYS.get(k)
        if genai is not None and spec.genai_operation is not None:
            attrs[genai] = v


class PhaseScope(Scope):
    """One execution of a phase in one session, and its span record.

    Used as a context manager (sync and async) by ``trace_session_phase`` /
    ``atrace_session_phase`` / ``@trace_session``, and returned as a handle by
    ``mark_<phase>_start``.  Each execution is its own object, so overlapping executions of
    one phase pair correctly.  While open it is the current OTel span (``with`` form), so
    spans other instrumentation starts inside it (an HTTP call to the inference server)
    become its children.
    """

    slot_attrs = True
    kept = True
    #: device-synced phases are :class:`SyncedPhaseScope`s (two slots more)
    device_sync: bool | str | None = None
    __slots__ = ("_attrs", "end_payload", "logged", "reg", "session_id", "spec", "start_payload",
                 "turn")

    def __init__(self, spec: PhaseSpec, start_payload: dict[str, object] | None,
                 end_payload: dict[str, object] | None, turn: int | None, session_id: Hashable | None,
                 reg: PhaseHost) -> None:
        self.name = spec.name
        self.category = spec.category
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._sc = None  # set: drawing ids reads it without raising
        self._attrs: dict[str, Any] | None = None
        self.parent = None  # its session, once started
        self.spec = spec
        self.start_payload = start_payload
        self.end_payload = end_payload
        self.turn = turn
        self.session_id = session_id
        self.reg = reg  # the registry that holds its session
        #: its entry in its session's ``phase_log``, once it ended in time to be noted there
        self.logged: Execution | None = None

    @property
    def phase(self) -> str:
        """The phase name."""
        return self.spec.name

    @property
    def closed(self) -> bool:
        """Whether this execution has ended."""
        return self.end_ns != 0

    def set_end_payload(self, **payload: object) -> None:
        """Add key/values recorded when the phase ends (``rl.end.<key>``)."""
        if self.end_payload is None:
            self.end_payload = {}
        self.end_payload.update(recorded(payload, recorder.STATE.kinds))

    def record_attrs(self) -> dict[str, Any]:
        """The execution's attributes, built from its slots once it is exported."""
        attrs = self._attrs
        if attrs is not None:
            return attrs
        spec = self.spec
        sess = self.parent
        sid = self.session_id
        # its session (a plain type check first: ``isinstance`` goes through Span's ABCMeta)
        task_id = sess.task_rec.task_id if type(sess) is SessionScope or \
            isinstance(sess, SessionScope) else None
        attrs = {ATTR_PHASE: spec.name, ATTR_TURN: self.turn, ATTR_SESSION: sid, ATTR_TASK: task_id}
        if spec.genai_operation is not None:
            attrs[_GENAI_OPERATION] = spec.genai_operation
        if self.start_payload:
            _payload_attrs(attrs, "rl.start.", self.start_payload, spec)
        if self.end_payload:
            _payload_attrs(attrs, "rl.end.", self.end_payload, spec)
        return _with_user_attrs(self, attrs)


    def _start(self, session: SessionScope, share_lane: bool) -> None:
        turn = self.turn
        if turn is None:
            if self.spec.starts_turn:
                session.turn += 1
            turn = session.turn
            self.turn = turn if turn > 0 else 0
        elif turn > session.turn:
            session.turn = turn
        self.session_id = session.session_id
        self._start_under(session, share_lane)
        ops = session.open_phases
        try:
            ops.append(self)  # atomic; whoever removes it from the list closes it
        except AttributeError:  # finalized meanwhile (a race): recorded, and interrupted
            self.set_attribute(ATTR_INTERRUPTED, True)
            end = recorder.STATE.now_ns()
            self._log_in(session, end, True)
            self.finish(end)
            return
        if self.reg.sessions.get(session.session_id) is not session:  # finalized meanwhile
            self._close_if_open(ops, recorder.STATE.now_ns(), None, True)

    def end(self, end_time: int | None = None, *, payload: Mapping[str, object] | None = None,
            exc: BaseException | None = None, interrupted: bool = False) -> None:
        """Close this execution (idempotent): OTel's ``Span.end(end_time=None)``, plus
        ``payload`` added as ``rl.end.*`` attributes (``mark_<phase>_end(handle=h, ...)``)."""
        end = end_time if end_time is not None else recorder.STATE.now_ns()
        sess = self.parent
        if sess is None or self.end_ns:
            return  # never started (no session), or already closed
        if payload is not None:
            if self.end_payload is None:
                self.end_payload = {}
            self.end_payload.update(recorded(payload, recorder.STATE.kinds))  # never its code
        self._close_if_open(sess.open_phases, end, exc, interrupted)

    def _close_if_open(self, ops: list[PhaseScope], end: int, exc: BaseException | None,
                       interrupted: bool) -> None:
        try:
            ops.remove(self)  # atomic: exactly one closer wins (user, finalize, other thread)
        except (ValueError, AttributeError):  # closed already (or its session finalized)
            return
        if interrupted or exc is not None:
            self.set_attribute(ATTR_INTERRUPTED, True)
        self._log_in(self.parent, end, interrupted or exc is not None)
        self.finish(end, exc)

    def _log_in(self, sess: SessionScope, end: int, interrupted: bool) -> None:
        """Note this ended execution on its session (before its record is queued: the session
        processor, meeting the record, knows its session's log has it)."""
        log = sess.phase_log
        if type(log) is list:  # else the session's record is built: this one is late
            entry = self.logged = (self.spec.name, self.start_ns, end, self.turn, interrupted)
            log.append(entry)
            if (self.end_payload or self.start_payload) and not sess.end_ns:
                # a scored execution (``reward=``/``score=``): an evaluation of its session
                ev = evaluation_result(self.spec.name, self.turn, self.start_payload, self.end_payload)
                if ev is not None:
                    ev[ATTR_SESSION] = sess.session_id
                    sess.add_event(EVALUATION_EVENT, ev, end)

    def __enter__(self) -> PhaseScope:
        if self.parent is not None:  # started before: a handle used in ``with``, or reused
            self._token = None
            if self.end_ns:
                self.reg.count_misuse(
                    "phase_reused", f"trace_session_phase({self.spec.name!r}) object entered again "
                                    "after it ended; it records one execution: call "
                                    "trace_session_phase(...) for each")
            return self
        reg = self.reg
        if reg.enabled:
            sid = self.session_id
            if sid is None:
                sid = SESSION_CV.get()
            sess = reg.sessions.get(sid)
            if sess is None:
                reg.no_session(sid, f"trace_session_phase({self.spec.name!r})")
            else:
                if self.device_sync:
                    _, self._sync_wait = device_sync(self.device_sync)
                self._start(sess, True)
                self._token = recorder.attach(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        sess = self.parent
        if sess is not None:
            end = recorder.STATE.now_ns()
            if self.device_sync:
                kind, wait = device_sync(self.device_sync)
                self.set_attribute(ATTR_SYNC, kind)
                self.set_attribute(ATTR_SYNC_WAIT, (self._sync_wait + wait) / 1e9)
                end = recorder.STATE.now_ns()
            token = self._token
            self._token = None  # a kept token would keep a context alive with the record
            recorder.detach(token)  # nothing to undo if exited in another context or never attached
            try:
                sess.open_phases.remove(self)  # as in _close_if_open: one closer wins
            except (ValueError, AttributeError):
                return
            if exc is not None:
                self.set_attribute(ATTR_INTERRUPTED, True)
            self._log_in(sess, end, exc is not None)
            self.finish(end, exc)

    async def __aenter__(self) -> PhaseScope:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class SyncedPhaseScope(PhaseScope):
    """A phase execution that waits for the GPU/TPU at both ends (``device_sync=``)."""

    __slots__ = ("_sync_wait", "device_sync")

    def __init__(self, spec: PhaseSpec, start_payload: dict[str, object] | None,
                 end_payload: dict[str, object] | None, turn: int | None, session_id: Hashable | None,
                 reg: PhaseHost, device_sync: bool | str | None) -> None:
        super().__init__(spec, start_payload, end_payload, turn, session_id, reg)
        self.device_sync = device_sync
        self._sync_wait = 0


#: ``mark_<phase>_start`` returns one of these
PhaseHandle = PhaseScope


def check_status(status: object) -> str:
    if status not in FINAL_STATUSES:
        raise ValueError(
            f"rltrace mark_finalized: status must be one of {', '.join(FINAL_STATUSES)}, "
            f"got {status!r}"
        )
    return str(status)


#: a finalized session's ``open_phases``: appending fails, so a phase racing its session's
#: finalize on another thread is closed at once (see ``PhaseScope._start``)
NO_PHASES: Any = ()


