"""Task/session lifecycle (AReaL's session tracer) as OpenTelemetry parent/child spans.

* a task (one dataset item) is a root span ``rl.task`` (one trace per task), attribute
  ``rl.task.id``;
* each session (one sample) is its child span ``rl.session`` with ``rl.session.id``,
  ``rl.task.id``, ``rl.session.status``, ``rl.session.reason``;
* each phase execution (generate, reward, toolcall, or a registered custom phase) is a child
  span of its session named by the phase, with ``rl.phase``, ``rl.turn``, start/end payloads
  (``rl.start.<key>``, ``rl.end.<key>``) and OTel GenAI attributes on generate/toolcall.

Every open phase is held by its own handle, so overlapping executions of one phase in one
session pair correctly; finalizing a session closes whatever is still open (marked
``rl.phase.interrupted``) so no phase ever lacks an end.  Finalized sessions and finished
tasks leave no state behind.  The figures (``total_s``, ``<phase>_s``, turns) are derived from
these spans by :class:`rltrace.session_metrics.SessionMetricsProcessor`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext
from opentelemetry.trace.status import Status, StatusCode

from rltrace.exporters.values import text

from . import recorder
from .checks import check_mapping, check_optional_int, did_you_mean, type_error
from .otel_compat import SPAN_KEY as _SPAN_KEY
from .phases import PHASES, PhaseRegistry, PhaseSpec
from .recorder import (
    RecordBase,
    Scope,
    _ctx_get,
    _ctx_reset,
    _ctx_set,
    _dict_set,
    attach,
    detach,
)
from .semconv import (
    ATTR_INTERRUPTED,
    ATTR_PHASE,
    ATTR_REASON,
    ATTR_SESSION,
    ATTR_STATUS,
    ATTR_STEP,
    ATTR_TASK,
    ATTR_TURN,
    SESSION_SPAN,
    TASK_SPAN,
)
from .steps import _STEP_CV, CALLER_STEP_KEY, scope_arg_step
from .tally import FINALIZED, REGISTERED

__all__ = [
    "FINAL_STATUSES",
    "atrace_session_phase",
    "get_session_id",
    "get_task_id",
    "register_session",
    "register_task",
    "session_context",
    "set_session_id",
    "set_task_id",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
]

logger = logging.getLogger("rltrace")
F = TypeVar("F", bound=Callable[..., Any])

FINAL_STATUSES = ("accepted", "rejected", "failed", "dropped")
_FINAL_SET = frozenset(FINAL_STATUSES)
STATUSES = ("pending", *FINAL_STATUSES)


_GENAI_KEYS = {
    "model": "gen_ai.request.model",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "tool_name": "gen_ai.tool.name",
}

_GENAI_OPERATION = "gen_ai.operation.name"
_GENAI_CONVERSATION = "gen_ai.conversation.id"

_TASK_CV: ContextVar[Any] = ContextVar("rltrace_task_id", default=None)
_SESSION_CV: ContextVar[Any] = ContextVar("rltrace_session_id", default=None)
#: OTel context key: the caller's task in another process, ``(task_id, SpanContext)`` of its
#: ``rl.task`` span (propagation puts it there: ``rltrace.ray`` across ``.remote()`` calls)
CALLER_TASK_KEY = otel_context.create_key("rltrace-caller-task")


_SCHEDULER = "scheduler"  # the category of task and session spans


class TaskScope(Scope):
    """A task's span record (``rl.task``); its fields stay in slots until export."""

    slot_attrs = True
    kept = True
    __slots__ = ("_attrs", "open", "spread", "step", "task_id")

    def __init__(self, task_id: Any, step: Any) -> None:
        """A started task; ``step`` is its caller's (see ``SessionRegistry._task_locked``).
        ``_scope_accel.new_task`` makes the same record, compiled."""
        self.name = TASK_SPAN
        self.category = _SCHEDULER
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._attrs: dict[str, Any] | None = None
        self.task_id = task_id
        self.open: set[Any] | None = set()  # ids of its open sessions; None once it ended
        #: its context went to another process (``rltrace.ray``), whose sessions join it there
        self.spread = False
        self.step = step
        self._start_under(None, False)

    def _attrs_py(self) -> dict[str, Any]:
        """``record_attrs`` (``_scope_accel.ScopeCore.task_attrs`` mirrors it, compiled)."""
        if self._attrs is not None:
            return self._attrs
        attrs: dict[str, Any] = {ATTR_TASK: self.task_id}
        if self.step is not None:
            attrs[ATTR_STEP] = self.step
        return _with_user_attrs(self, attrs)

    record_attrs = _attrs_py

    def own_step(self) -> Any:
        return self.step


class RemoteTaskScope(TaskScope):
    """A task registered in another process (the driver), standing in for it here.

    Sessions registered under it are children of that process's ``rl.task`` span, in its trace.
    It records nothing itself (the task's span is the other process's): it leaves this
    process's registry when its last session here is finalized, or by ``finalize_task``.
    ``parts`` counts the sessions registered under it here, and ``decision`` is what
    session-aware sampling decided for them (see :class:`rltrace.sampling.TaskTailSampler`).
    """

    __slots__ = ("decision", "parts")

    def __init__(self, task_id: Any, context: SpanContext) -> None:
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
        self.owns_lane = False
        self.start_ns = 0

    def finish(self, end_ns: int, exc: BaseException | None = None, keep: bool = False,
               hold: bool = False) -> None:
        self.end_ns = end_ns or 1  # nothing queued: the task's span is the other process's


def caller_task() -> tuple[Any, SpanContext] | None:
    """The caller's task in another process, from the OTel context (see ``CALLER_TASK_KEY``)."""
    found = _ctx_get().get(CALLER_TASK_KEY)  # otel_context.get_value, without its layers
    return found if type(found) is tuple else None


class SessionScope(Scope):
    """A session's span record (``rl.session``) and its live state while it is open."""

    slot_attrs = True
    kept = True
    __slots__ = ("_attrs", "open_phases", "reason", "session_id", "status", "step", "task_rec",
                 "turn")
    status: str
    reason: str | None

    def __init__(self, session_id: Any, task: TaskScope, step: Any) -> None:
        """A started session of ``task``; ``step`` is its caller's (see
        ``SessionRegistry.register_session``).  ``_scope_accel.new_session`` makes the same
        record, compiled."""
        self.name = SESSION_SPAN
        self.category = _SCHEDULER
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._attrs: dict[str, Any] | None = None
        self.session_id = session_id
        self.task_rec = task
        self.turn = -1
        self.open_phases: list[PhaseScope] = []
        # ``status`` and ``reason`` are set when it is finalized (the only way it ends)
        self.step = step
        self._start_under(task, False)

    def _attrs_py(self) -> dict[str, Any]:
        """``record_attrs`` (``_scope_accel.ScopeCore.session_attrs`` mirrors it, compiled)."""
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
        return attrs

    record_attrs = _attrs_py

    def own_step(self) -> Any:
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


# ---- ids and context -----------------------------------------------------------------------


def set_task_id(task_id: Any) -> None:
    """Make ``task_id`` the current task for this context (asyncio tasks inherit it)."""
    _TASK_CV.set(task_id)


def get_task_id() -> Any:
    """The current task id in this context (else the caller's task in another process, when
    propagated: a Ray actor method called under the driver's task), or None."""
    task_id = _TASK_CV.get()
    if task_id is None:
        caller = caller_task()
        if caller is not None:
            return caller[0]
    return task_id


def set_session_id(session_id: Any) -> None:
    """Make ``session_id`` the current session for this context."""
    _SESSION_CV.set(session_id)


def get_session_id() -> Any:
    """The current session id in this context, or None."""
    return _SESSION_CV.get()


# ---- phases ---------------------------------------------------------------------------------


def _payload_attrs(attrs: dict[str, Any], prefix: str, payload: dict[str, Any], spec: PhaseSpec) -> None:
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
    device_sync: Any = None
    __slots__ = ("_attrs", "end_payload", "reg", "session_id", "spec", "start_payload", "turn")

    def __init__(self, spec: PhaseSpec, start_payload: dict[str, Any] | None,
                 end_payload: dict[str, Any] | None, turn: int | None, session_id: Any,
                 reg: SessionRegistry) -> None:
        """``_scope_accel.new_phase`` makes the same record, compiled."""
        self.name = spec.name
        self.category = spec.category
        self.args = None
        self.end_ns = 0
        self.extra = None
        self._attrs: dict[str, Any] | None = None
        self.parent = None  # its session, once started
        self.spec = spec
        self.start_payload = start_payload
        self.end_payload = end_payload
        self.turn = turn
        self.session_id = session_id
        self.reg = reg  # the registry that holds its session

    @property
    def phase(self) -> str:
        """The phase name."""
        return self.spec.name

    @property
    def closed(self) -> bool:
        """Whether this execution has ended."""
        return self.end_ns != 0

    def set_end_payload(self, **payload: Any) -> None:
        """Add key/values recorded when the phase ends (``rl.end.<key>``)."""
        if self.end_payload is None:
            self.end_payload = {}
        self.end_payload.update(payload)

    def _attrs_py(self) -> dict[str, Any]:
        """``record_attrs`` (``_scope_accel.ScopeCore.phase_attrs`` mirrors it, compiled)."""
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
            attrs[_GENAI_CONVERSATION] = str(sid)
        if self.start_payload:
            _payload_attrs(attrs, "rl.start.", self.start_payload, spec)
        if self.end_payload:
            _payload_attrs(attrs, "rl.end.", self.end_payload, spec)
        return _with_user_attrs(self, attrs)

    record_attrs = _attrs_py

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
            self.finish(recorder.now_ns())
            return
        if self.reg.sessions.get(session.session_id) is not session:  # finalized meanwhile
            self._close_if_open(ops, recorder.now_ns(), None, True)

    def end(self, end_time: int | None = None, *, payload: Mapping[str, Any] | None = None,
            exc: BaseException | None = None, interrupted: bool = False) -> None:
        """Close this execution (idempotent): OTel's ``Span.end(end_time=None)``, plus
        ``payload`` added as ``rl.end.*`` attributes (``mark_<phase>_end(handle=h, ...)``)."""
        end = end_time if end_time is not None else recorder.now_ns()
        sess = self.parent
        if sess is None or self.end_ns:
            return  # never started (no session), or already closed
        if payload:
            self.set_end_payload(**{str(k): v for k, v in payload.items()})
        self._close_if_open(sess.open_phases, end, exc, interrupted)

    def _close_if_open(self, ops: list[PhaseScope], end: int, exc: BaseException | None,
                       interrupted: bool) -> None:
        try:
            ops.remove(self)  # atomic: exactly one closer wins (user, finalize, other thread)
        except (ValueError, AttributeError):  # closed already (or its session finalized)
            return
        if interrupted or exc is not None:
            self.set_attribute(ATTR_INTERRUPTED, True)
        self.finish(end, exc)

    def _enter(self) -> PhaseScope:
        """``__enter__`` (``_scope_accel.ScopeCore.phase_enter`` mirrors it, compiled)."""
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
                sid = _SESSION_CV.get()
            sess = reg.sessions.get(sid)
            if sess is None:
                reg.no_session(sid, f"trace_session_phase({self.spec.name!r})")
            else:
                if self.device_sync:
                    from .device import device_sync

                    _, self._sync_wait = device_sync(self.device_sync)
                self._start(sess, True)
                ctx = Context(_ctx_get())
                _dict_set(ctx, _SPAN_KEY, self)
                self._token = _ctx_set(ctx)
        return self

    def _exit(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """``__exit__`` (``_scope_accel.ScopeCore.phase_exit`` mirrors it, compiled)."""
        sess = self.parent
        if sess is not None:
            end = recorder.now_ns()
            if self.device_sync:
                from .device import ATTR_SYNC, ATTR_SYNC_WAIT, device_sync

                kind, wait = device_sync(self.device_sync)
                self.set_attribute(ATTR_SYNC, kind)
                self.set_attribute(ATTR_SYNC_WAIT, (self._sync_wait + wait) / 1e9)
                end = recorder.now_ns()
            token = self._token
            self._token = None  # a kept token would keep a context alive with the record
            try:
                _ctx_reset(token)
            except (ValueError, RuntimeError, TypeError):
                pass  # exited in another context (or never attached): nothing to undo here
            try:
                sess.open_phases.remove(self)  # as in _close_if_open: one closer wins
            except (ValueError, AttributeError):
                return
            if exc is not None:
                self.set_attribute(ATTR_INTERRUPTED, True)
            self.finish(end, exc)

    __enter__ = _enter
    __exit__ = _exit

    async def __aenter__(self) -> PhaseScope:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)


class SyncedPhaseScope(PhaseScope):
    """A phase execution that waits for the GPU/TPU at both ends (``device_sync=``)."""

    __slots__ = ("_sync_wait", "device_sync")
    __enter__ = PhaseScope._enter  # the device waits are the Python methods' (never compiled)
    __exit__ = PhaseScope._exit

    def __init__(self, spec: PhaseSpec, start_payload: dict[str, Any] | None,
                 end_payload: dict[str, Any] | None, turn: int | None, session_id: Any,
                 reg: SessionRegistry, device_sync: Any) -> None:
        super().__init__(spec, start_payload, end_payload, turn, session_id, reg)
        self.device_sync = device_sync
        self._sync_wait = 0


#: ``mark_<phase>_start`` returns one of these
PhaseHandle = PhaseScope


def _check_status(status: Any) -> str:
    if status not in FINAL_STATUSES:
        raise ValueError(
            f"rltrace mark_finalized: status must be one of {', '.join(FINAL_STATUSES)}, "
            f"got {status!r}"
        )
    return str(status)


#: a finalized session's ``open_phases``: appending fails, so a phase racing its session's
#: finalize on another thread is closed at once (see ``PhaseScope._start``)
_NO_PHASES: Any = ()


# ---- the registry ------------------------------------------------------------------------------

#: recently registered tasks, for links from the step that consumes them: two generations of
#: ``RECENT_CAP // 2`` entries (task id -> task span; session id -> its task's span, in the same
#: trace), so an insert is one dict store and old entries go a generation at a time
RECENT_CAP = 4_096
_RECENT_GEN = RECENT_CAP // 2


_V = TypeVar("_V")


def _remember(gens: list[dict[Any, _V]], key: Any, value: _V) -> None:
    """Keep ``key -> value`` among the recent ones (the caller holds the lock that guards
    ``gens``; rltrace.ray_links keeps recent Ray calls the same way)."""
    recent = gens[0]
    recent[key] = value
    if len(recent) >= _RECENT_GEN:  # the older generation goes
        gens[1] = recent
        gens[0] = {}


def _recent(gens: list[dict[Any, _V]], key: Any) -> _V | None:
    found = gens[0].get(key)
    return found if found is not None else gens[1].get(key)


class SessionRegistry:
    """The open tasks and sessions of a process, and the API that records their lifecycle.

    One instance serves the process (:data:`REGISTRY`; the module functions
    ``register_task``, ``trace_session_phase``, ... are its bound methods, and
    :func:`rltrace.configure` switches it on and off through :attr:`enabled`).  It outlives
    reconfiguration, so a task open across ``configure`` calls keeps its sessions.  Tests build
    their own (``SessionRegistry(phases=PhaseRegistry())``) instead of patching module state.
    """

    __slots__ = ("_session_ids", "_task_ids", "enabled", "lock", "misuse", "phases",
                 "recent_sessions", "recent_tasks", "sessions", "tally", "tasks")

    def __init__(self, phases: PhaseRegistry | None = None) -> None:
        #: whether session tracing records (set by ``configure``)
        self.enabled = False
        #: the phases its sessions may run (default: the process's :data:`rltrace.phases.PHASES`)
        self.phases = phases if phases is not None else PHASES
        self.tasks: dict[Any, TaskScope] = {}
        self.sessions: dict[Any, SessionScope] = {}
        self.recent_tasks: list[dict[Any, TaskScope]] = [{}, {}]
        self.recent_sessions: list[dict[Any, TaskScope]] = [{}, {}]
        self.lock = threading.RLock()  # reentrant: the SIGTERM flush may interrupt a holder
        #: misuse that does not raise (unknown/finalized ids, phases outside a session): counted
        self.misuse: dict[str, int] = {}
        self._task_ids = itertools.count()
        self._session_ids = itertools.count()
        #: counts of sessions registered and finalized that outlive the process
        #: (:class:`rltrace.tally.SessionTally` ``.view``: a Ray worker's), or None
        self.tally: Any = None

    # ---- bookkeeping -----------------------------------------------------------------------

    def count_misuse(self, kind: str, message: str) -> None:
        """Count one misuse of ``kind``; the first of each kind is logged with ``message``."""
        n = self.misuse.get(kind, 0)
        self.misuse[kind] = n + 1
        if n == 0:
            logger.warning("rltrace: %s (further occurrences are counted in rltrace.diagnostics())",
                           message)

    def offset_ids(self, pid: int) -> None:
        """Start new task/session ids at ``pid << 32``: children sharing a rank (forked
        dataloader workers, spawned helpers, Ray workers) never reuse their parent's ids."""
        self._task_ids = itertools.count(pid << 32)
        self._session_ids = itertools.count(pid << 32)

    def open_counts(self) -> dict[str, int]:
        """Tasks and sessions currently open (finished ones leave no state)."""
        return {"open_tasks": len(self.tasks), "open_sessions": len(self.sessions)}

    def session(self, session_id: Any) -> SessionScope | None:
        """The open session ``session_id``, or None."""
        return self.sessions.get(session_id)

    def open_sessions(self, task_id: Any) -> list[SessionScope]:
        """The open sessions of task ``task_id`` (empty when the task is unknown or ended)."""
        with self.lock:
            task = self.tasks.get(task_id)
            reg = self.sessions
            return [reg[s] for s in task.open or () if s in reg] if task is not None else []

    def after_fork(self) -> None:
        """In a forked child: a fresh lock and ids of its own; the open tasks and sessions
        belong to the parent, which finalizes them."""
        self.lock = threading.RLock()
        self.offset_ids(os.getpid())
        self.tally = None  # the parent's counts stay the parent's
        self.tasks.clear()
        self.sessions.clear()
        for gens in (self.recent_tasks, self.recent_sessions):
            gens[:] = [{}, {}]

    # ---- tasks and sessions ----------------------------------------------------------------

    def register_task(self, task_id: Any = None) -> Any:
        """Register a task (one dataset item) and return its id (a new int when not given)."""
        if task_id is None:
            task_id = next(self._task_ids)
        if self.enabled:
            with self.lock:
                if self.tasks.get(task_id) is None:
                    self._task_locked(task_id)
        return task_id

    def _task_locked(self, task_id: Any) -> TaskScope:
        """The open task ``task_id``, registered now if needed (caller holds the lock): a
        :class:`RemoteTaskScope` when it is the caller's task in another process."""
        task = self.tasks.get(task_id)
        if task is None:
            caller = caller_task()
            if caller is not None and caller[0] == task_id:
                task = self.tasks[task_id] = RemoteTaskScope(task_id, caller[1])
            else:
                step = _STEP_CV.get()  # else AReaL style: the enclosing scope's args.global_step
                task = self.tasks[task_id] = _RECORDS.task(
                    task_id, scope_arg_step() if step is None else step)
            _remember(self.recent_tasks, task_id, task)
        return task

    def task_span_context(self, task_id: Any, spread: bool = False) -> SpanContext | None:
        """The ``SpanContext`` of task ``task_id``'s span in this process (open or recently
        finished), for propagation to the processes that run its sessions; None if unknown.
        ``spread``: mark the task as having gone to another process (its span is then sent
        by session-aware sampling even when the task is dropped here, so the sessions other
        processes keep have their parent)."""
        with self.lock:
            task = self.tasks.get(task_id) or _recent(self.recent_tasks, task_id)
            if task is not None and spread:
                task.spread = True
        return None if task is None else task.get_span_context()

    def register_session(self, task_id: Any = None) -> Any:
        """Register a session (one sample) under ``task_id`` (default: the current task).

        Without any task a task is registered implicitly, so the session is never lost.
        """
        session_id = next(self._session_ids)
        if not self.enabled:
            return session_id
        if task_id is None:
            task_id = _TASK_CV.get()
            if task_id is None:
                caller = caller_task()
                if caller is not None:
                    task_id = caller[0]
        with self.lock:
            task = self.tasks.get(task_id) if task_id is not None else None
            if task is None:
                task = self._task_locked(next(self._task_ids) if task_id is None else task_id)
            task.open.add(session_id)  # type: ignore[union-attr]  # open while registered
            if task.__class__ is RemoteTaskScope:
                task.parts += 1
            step = _STEP_CV.get()
            if step is None:  # the task's, else AReaL style: the enclosing scope's global_step
                step = task.step if task.step is not None else scope_arg_step()
            self.sessions[session_id] = _RECORDS.session(session_id, task, step)
            _remember(self.recent_sessions, session_id, task)
            tally = self.tally
            if tally is not None:
                tally[REGISTERED] += 1
        return session_id

    # ---- phases ----------------------------------------------------------------------------

    def no_session(self, sid: Any, api: str) -> None:
        """Count a phase API called without a live session."""
        if sid is None:
            self.count_misuse("no_session", f"{api} called outside any session (no session_id "
                                            "given and none in context); the phase is not "
                                            "recorded. Use @session_context() or set_session_id()")
        else:
            self.count_misuse("unknown_session", f"{api}: session {sid!r} is unknown or already "
                                                 "finalized; the phase is not recorded")

    def _session_for(self, session_id: Any, api: str) -> SessionScope | None:
        sid = session_id if session_id is not None else _SESSION_CV.get()
        sess = self.sessions.get(sid) if sid is not None else None
        if sess is None:
            self.no_session(sid, api)
        return sess

    def trace_session_phase(
        self, phase: str, start_payload: dict[str, Any] | None = None,
        end_payload: dict[str, Any] | None = None, *, turn: int | None = None,
        session_id: Any = None, device_sync: bool | str | None = None,
    ) -> PhaseScope:
        """Time one execution of ``phase`` in the current session: ``with trace_session_phase(...)``.

        ``start_payload``/``end_payload`` become span attributes (``rl.start.*``/``rl.end.*``;
        ``model``, ``input_tokens``, ``output_tokens``, ``tool_name`` also map to OTel GenAI
        attributes on generate/toolcall).  ``turn`` overrides the automatic per-session turn
        counter (each ``generate`` starts a new turn).  Raises
        :class:`~rltrace.phases.UnknownPhaseError` for an unregistered phase.  ``device_sync``
        waits for the GPU/TPU at both ends (see :mod:`rltrace.device`).
        """
        spec = self.phases.specs.get(phase) if type(phase) is str else None
        if spec is None:  # raises, naming the fix
            spec = self.phases.get(phase)
        if (start_payload is not None and type(start_payload) is not dict) or \
                (end_payload is not None and type(end_payload) is not dict) or \
                (turn is not None and type(turn) is not int):
            check_mapping("trace_session_phase", "start_payload", start_payload)
            check_mapping("trace_session_phase", "end_payload", end_payload)
            check_optional_int("trace_session_phase", "turn", turn)
        start = dict(start_payload) if start_payload else None
        end = dict(end_payload) if end_payload else None
        if device_sync:
            return SyncedPhaseScope(spec, start, end, turn, session_id, self, device_sync)
        return _RECORDS.phase(spec, start, end, turn, session_id, self)

    def atrace_session_phase(
        self, phase: str, start_payload: dict[str, Any] | None = None,
        end_payload: dict[str, Any] | None = None, *, turn: int | None = None,
        session_id: Any = None, device_sync: bool | str | None = None,
    ) -> PhaseScope:
        """Async form of :func:`trace_session_phase` (``async with``)."""
        return self.trace_session_phase(phase, start_payload, end_payload, turn=turn,
                                        session_id=session_id, device_sync=device_sync)

    def trace_session(self, phase: str) -> Callable[[F], F]:
        """Decorator: every call of the (sync or async) function is one ``phase`` execution."""
        phases = self.phases
        phases.get(phase)  # built-ins and phases registered before decoration fail fast; a
        # function here (``@trace_session`` without the phase) gets a TypeError naming the fix
        reg = self

        def deco(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def awrapper(*a: Any, **k: Any) -> Any:
                    if not reg.enabled:
                        return await fn(*a, **k)
                    async with PhaseScope(phases.get(phase), None, None, None, None, reg):
                        return await fn(*a, **k)

                return awrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*a: Any, **k: Any) -> Any:
                if not reg.enabled:
                    return fn(*a, **k)
                with PhaseScope(phases.get(phase), None, None, None, None, reg):
                    return fn(*a, **k)

            return wrapper  # type: ignore[return-value]

        return deco

    # ---- finalization ----------------------------------------------------------------------

    def _finalize(self, sess: SessionScope, status: str, reason: Any) -> None:
        if reason is not None and type(reason) is not str:
            reason = text(reason)  # never raises: an unprintable reason must not lose the session
        with self.lock:
            if self.sessions.pop(sess.session_id, None) is None:
                return
            task = sess.task_rec
            task_done = self._session_left(task, sess.session_id)
            tally = self.tally
            if tally is not None:
                tally[FINALIZED] += 1
        end = recorder.now_ns()
        ops = sess.open_phases
        while ops:  # close what is still open; a phase ending concurrently is closed once
            try:
                handle = ops[-1]
            except IndexError:
                break
            handle._close_if_open(ops, end, None, True)
        sess.open_phases = _NO_PHASES  # the list goes: one object fewer per queued record
        sess.status = status
        sess.reason = reason
        if status == "failed":
            sess.extras()["status"] = Status(StatusCode.ERROR, reason or "failed")
        sess.finish(end, keep=True)
        if task_done:
            task.finish(end, keep=True)

    def _session_left(self, task: TaskScope, session_id: Any) -> bool:
        """Drop a finalized session from its task; True when that ended the task (holds the
        lock)."""
        open_ = task.open
        if open_ is None:
            return False
        open_.discard(session_id)
        return not open_ and self._drop_task(task)

    def _drop_task(self, task: TaskScope) -> bool:
        """Unregister an ended task; False when it was no longer registered (holds the lock)."""
        if self.tasks.get(task.task_id) is not task:
            return False
        del self.tasks[task.task_id]
        task.open = None
        return True

    def finalize_session(self, session_id: Any, status: str, reason: str | None = None) -> None:
        """Finalize one session (see ``trace_session_event("mark_finalized", ...)``)."""
        sess = self.sessions.get(session_id)
        if sess is None:
            self.count_misuse("unknown_session", f"mark_finalized: session {session_id!r} is "
                                                 "unknown or already finalized; ignored")
            return
        self._finalize(sess, status, reason)

    def finalize_task(self, task_id: Any, status: str, reason: str | None = None) -> None:
        """Finalize every open session of a task, then end the task span."""
        with self.lock:
            task = self.tasks.get(task_id)
            open_ = self.open_sessions(task_id)
        if task is None:
            self.count_misuse("unknown_task", f"mark_finalized: task {task_id!r} is unknown or "
                                              "already finished; ignored")
            return
        for sess in open_:
            self._finalize(sess, status, reason)
        with self.lock:
            done = self._drop_task(task)
        if done:
            task.finish(recorder.now_ns(), keep=True)

    def trace_session_event(
        self, method: str, session_id: Any = None, task_id: Any = None, **payload: Any
    ) -> Any:
        """Record a lifecycle event: ``mark_finalized`` or ``mark_<phase>_start``/``_end``.

        ``session_id=`` targets one session, ``task_id=`` every open session of a task; with
        neither, the current session (else the current task) from context.  ``mark_finalized``
        takes ``status`` (accepted / rejected / failed / dropped) and an optional ``reason``.
        ``mark_<phase>_start`` returns a :class:`PhaseScope` handle (a list of them for a task);
        a ``mark_<phase>_end`` given ``handle=`` closes that execution, otherwise the oldest
        open execution of the phase.  Remaining keyword arguments are the phase payload
        (``turn=`` sets the turn).  Unknown methods and phases raise ``ValueError`` naming the
        fix.
        """
        if type(method) is not str:
            type_error("trace_session_event", "method", "a str", method,
                       "use 'mark_finalized', 'mark_<phase>_start' or 'mark_<phase>_end'")
        if method == "mark_finalized":
            status = payload.pop("status", None)
            if status not in _FINAL_SET:
                _check_status(status)
            reason = payload.pop("reason", None)
            if payload:
                raise TypeError(f"rltrace mark_finalized: unexpected arguments {sorted(payload)}; "
                                "use status= and reason=")
            if not self.enabled:
                return None
            if session_id is None and task_id is None:
                session_id = _SESSION_CV.get()
                if session_id is None:
                    task_id = _TASK_CV.get()
            if session_id is not None:
                sess = self.sessions.get(session_id)
                if sess is not None:
                    self._finalize(sess, status, reason)
                else:
                    self.finalize_session(session_id, status, reason)  # counts the misuse
            elif task_id is not None:
                self.finalize_task(task_id, status, reason)
            else:
                raise ValueError("rltrace mark_finalized: no session_id or task_id given and none "
                                 "in context; pass session_id= or task_id=")
            return None
        if method.startswith("mark_") and (method.endswith("_start") or method.endswith("_end")):
            start = method.endswith("_start")
            spec = self.phases.get(method[5:-6] if start else method[5:-4])
            if not self.enabled:
                return None
            if session_id is None and task_id is not None:
                return [self._phase_event(s, spec, start, dict(payload))
                        for s in self.open_sessions(task_id)]
            handle = payload.get("handle")
            if not start and isinstance(handle, PhaseScope):
                payload.pop("handle")
                handle.end(payload=payload)  # exactly that execution; idempotent once closed
                return handle
            sess = self._session_for(session_id, method)
            return None if sess is None else self._phase_event(sess, spec, start, payload)
        methods = [f"mark_{p}_{edge}" for p in self.phases.names() for edge in ("start", "end")]
        raise ValueError(
            f"rltrace trace_session_event: unknown method {method!r}"
            f"{did_you_mean(method, ['mark_finalized', *methods])}; use 'mark_finalized', "
            f"'mark_<phase>_start' or 'mark_<phase>_end' with a phase registered by "
            f"rltrace.register_phase"
        )

    def _phase_event(self, sess: SessionScope, spec: PhaseSpec, start: bool,
                     payload: dict[str, Any]) -> Any:
        if start:
            turn = payload.pop("turn", None)
            started = PhaseScope(spec, payload or None, None, turn, sess.session_id, self)
            started._start(sess, share_lane=False)
            return started
        handle: PhaseScope | None = payload.pop("handle", None)
        if handle is None:
            handle = next((h for h in list(sess.open_phases) if h.spec is spec), None)
        if handle is None:
            self.count_misuse("phase_not_started", f"mark_{spec.name}_end: no open {spec.name!r} "
                                                   f"phase in session {sess.session_id!r}; ignored")
            return None
        handle.end(payload=payload)
        return handle

    # ---- session_context -------------------------------------------------------------------

    def session_context(self) -> Callable[[F], F]:
        """Decorator: each call registers a session under the current task and runs in it.

        The session id (and its span, as the current OTel span) are in context for everything
        the function calls, including ``asyncio.gather`` children.  An exception escaping the
        function finalizes the session as ``failed`` with the exception as reason (open phases
        are closed and marked interrupted) and is re-raised unchanged; otherwise the session
        stays pending until ``mark_finalized``.
        """
        reg = self

        def deco(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def awrapper(*a: Any, **k: Any) -> Any:
                    if not reg.enabled:
                        return await fn(*a, **k)
                    sid = reg.register_session()
                    tok, sess_tok = reg._enter_session(sid)
                    try:
                        return await fn(*a, **k)
                    except BaseException as exc:
                        reg._fail(sid, exc)
                        raise
                    finally:
                        detach(sess_tok)
                        _SESSION_CV.reset(tok)

                return awrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*a: Any, **k: Any) -> Any:
                if not reg.enabled:
                    return fn(*a, **k)
                sid = reg.register_session()
                tok, sess_tok = reg._enter_session(sid)
                try:
                    return fn(*a, **k)
                except BaseException as exc:
                    reg._fail(sid, exc)
                    raise
                finally:
                    detach(sess_tok)
                    _SESSION_CV.reset(tok)

            return wrapper  # type: ignore[return-value]

        return deco

    def _enter_session(self, sid: Any) -> tuple[Any, Any]:
        tok = _SESSION_CV.set(sid)
        sess = self.sessions.get(sid)
        return tok, attach(sess) if sess is not None else None

    def _fail(self, sid: Any, exc: BaseException) -> None:
        sess = self.sessions.get(sid)
        if sess is not None:
            self._finalize(sess, "failed", f"{type(exc).__name__}: {exc}")

    def link_consumed(self, task_ids: Any = (), session_ids: Any = (), span: Any = None) -> int:
        """Link the current scope (e.g. the train step) to the tasks/sessions it consumed.

        Each task is its own trace; the links let a trace UI jump from a train step to the
        rollouts that fed it (and back).  A finished session is linked through its task's span
        (same trace).  Ids must be among the 2,048 to 4,096 most recent tasks / sessions
        (``RECENT_CAP``); returns how many links were added.
        """
        from .recorder import current_scope

        target = span if span is not None else current_scope()
        if target is None or not isinstance(target, RecordBase):
            self.count_misuse("link_outside_scope", "link_consumed called outside any rltrace "
                                                    "scope; call it inside the step's trace_scope")
            return 0
        links = target.extras().setdefault("links", [])
        added = 0
        for kind, ids in (("task", task_ids), ("session", session_ids)):
            for key in ([ids] if isinstance(ids, (int, str)) else ids):
                scope: Scope | None
                if kind == "session":
                    scope = self.sessions.get(key) or _recent(self.recent_sessions, key)
                else:
                    scope = _recent(self.recent_tasks, key)
                if scope is None:
                    self.count_misuse("unknown_link", f"link_consumed: {kind} {key!r} is unknown "
                                                      "or too old to link; ignored")
                    continue
                links.append((scope, {"rl.link.type": "consumed", f"rl.{kind}.id": key}))
                added += 1
        return added

    def close_all(self, status: str = "pending", reason: str = "open at shutdown") -> int:
        """Finalize every open session and task (shutdown); returns how many sessions were
        open."""
        with self.lock:
            open_ = list(self.sessions.values())
        for sess in open_:
            self._finalize(sess, status, reason)
        with self.lock:
            tasks = list(self.tasks.values())
            self.tasks.clear()
            for task in tasks:
                task.open = None
        end = recorder.now_ns()
        for task in tasks:
            task.finish(end, keep=True)
        return len(open_)


class _RecordMakers:
    """How the registry makes its records: the classes, or ``rltrace._scope_accel``'s compiled
    constructors (the same fields without an ``__init__`` frame)."""

    __slots__ = ("phase", "session", "task")

    def __init__(self) -> None:
        self.task: Callable[[Any, Any], TaskScope] = TaskScope
        self.session: Callable[[Any, TaskScope, Any], SessionScope] = SessionScope
        self.phase: Callable[..., PhaseScope] = PhaseScope


_RECORDS = _RecordMakers()


def _compile_session_api(accel: Any) -> None:
    """Hand the session API's common path to ``accel`` (``rltrace._scope_accel``; None: the
    Python code runs): the records' constructors and ``record_attrs``, a phase's
    ``__enter__``/``__exit__``; the module functions below take its ``RegistryCall``s."""
    if accel is None:
        return
    accel.configure_phases(
        phase_type=PhaseScope, session_type=SessionScope, registry_type=SessionRegistry,
        task_type=TaskScope, session_cv=_SESSION_CV, enter=PhaseScope._enter,
        exit=PhaseScope._exit, attrs=PhaseScope._attrs_py, interrupted=ATTR_INTERRUPTED,
        keys=(ATTR_PHASE, ATTR_TURN, ATTR_SESSION, ATTR_TASK, _GENAI_OPERATION,
              _GENAI_CONVERSATION, ATTR_STATUS, ATTR_REASON, ATTR_STEP, "pending"),
        task_span=TASK_SPAN, session_span=SESSION_SPAN, scheduler=_SCHEDULER,
        task_attrs=TaskScope._attrs_py, session_attrs=SessionScope._attrs_py)
    _RECORDS.task, _RECORDS.session, _RECORDS.phase = accel.new_task, accel.new_session, \
        accel.new_phase
    accel.configure_events(_FINAL_SET, _NO_PHASES, FINALIZED)
    accel.configure_registry(_STEP_CV, _TASK_CV, CALLER_TASK_KEY, CALLER_STEP_KEY, scope_arg_step,
                             RemoteTaskScope, REGISTERED, _RECENT_GEN)
    PhaseScope.__enter__ = accel.ScopeCore.phase_enter
    PhaseScope.__exit__ = accel.ScopeCore.phase_exit
    PhaseScope.record_attrs = accel.ScopeCore.phase_attrs
    TaskScope.record_attrs = accel.ScopeCore.task_attrs
    SessionScope.record_attrs = accel.ScopeCore.session_attrs


_compile_session_api(recorder.SCOPE_ACCEL)

#: the process's session registry (``configure`` switches it on); the module functions below
#: are its bound methods
REGISTRY = SessionRegistry()
register_task = REGISTRY.register_task
register_session = REGISTRY.register_session
task_span_context = REGISTRY.task_span_context
trace_session_phase = REGISTRY.trace_session_phase
atrace_session_phase = REGISTRY.atrace_session_phase
trace_session = REGISTRY.trace_session
trace_session_event = REGISTRY.trace_session_event


def _compiled(method: Any, kind: str) -> Any:
    """``method`` of :data:`REGISTRY` with its common call compiled (``_scope_accel``'s
    ``RegistryCall``); every other call, and the name, docstring and signature, are the
    method's."""
    return functools.update_wrapper(recorder.SCOPE_ACCEL.RegistryCall(method, REGISTRY, kind),
                                    method)


if recorder.SCOPE_ACCEL is not None and not TYPE_CHECKING:
    # ``mark_finalized`` of a known session with session_id=, status= and a str reason or none;
    # a registered phase with dict or no payloads and no device sync; a task that is not the
    # caller's in another process
    trace_session_event = _compiled(REGISTRY.trace_session_event, "event")
    trace_session_phase = _compiled(REGISTRY.trace_session_phase, "phase")
    register_task = _compiled(REGISTRY.register_task, "task")
    register_session = _compiled(REGISTRY.register_session, "session")
finalize_session = REGISTRY.finalize_session
finalize_task = REGISTRY.finalize_task
session_context = REGISTRY.session_context
link_consumed = REGISTRY.link_consumed
close_all = REGISTRY.close_all
open_counts = REGISTRY.open_counts
offset_ids = REGISTRY.offset_ids

os.register_at_fork(after_in_child=REGISTRY.after_fork)
