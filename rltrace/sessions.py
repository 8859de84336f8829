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
from collections import OrderedDict
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry.trace.status import Status, StatusCode

from rltrace.exporters.values import text

from . import recorder
from .phases import PhaseSpec, get_phase
from .recorder import Scope, attach, detach
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
from .steps import _STEP_CV

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
STATUSES = ("pending", *FINAL_STATUSES)


_GENAI_KEYS = {
    "model": "gen_ai.request.model",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "tool_name": "gen_ai.tool.name",
}

_TASK_CV: ContextVar[Any] = ContextVar("rltrace_task_id", default=None)
_SESSION_CV: ContextVar[Any] = ContextVar("rltrace_session_id", default=None)


class _Flags:
    __slots__ = ("enabled",)

    def __init__(self) -> None:
        self.enabled = False


FLAGS = _Flags()
_task_ids = itertools.count()
_session_ids = itertools.count()
_LOCK = threading.RLock()  # reentrant: the SIGTERM flush may interrupt a holder
#: misuse that does not raise (unknown/finalized ids, phases outside a session): counted
MISUSE: dict[str, int] = {}


def _misuse(kind: str, message: str) -> None:
    n = MISUSE.get(kind, 0)
    MISUSE[kind] = n + 1
    if n == 0:
        logger.warning("rltrace: %s (further occurrences are counted in rltrace.diagnostics())",
                       message)


class _Task:
    __slots__ = ("open", "scope", "task_id")

    def __init__(self, task_id: Any) -> None:
        self.task_id = task_id
        self.open: set[Any] = set()
        scope = self.scope = Scope(TASK_SPAN, "scheduler")
        attrs: dict[str, Any] = {ATTR_TASK: task_id}
        step = _STEP_CV.get()
        if step is not None:
            attrs[ATTR_STEP] = step
        scope.extra = {"attrs": attrs}
        scope.begin_detached(None, from_context=False)


class _Session:
    __slots__ = ("open_phases", "scope", "session_id", "task", "turn")

    def __init__(self, session_id: Any, task: _Task) -> None:
        self.session_id = session_id
        self.task = task
        self.turn = -1
        self.open_phases: list[PhaseScope] = []
        scope = self.scope = Scope(SESSION_SPAN, "scheduler")
        attrs: dict[str, Any] = {ATTR_TASK: task.task_id, ATTR_SESSION: session_id,
                                 ATTR_STATUS: "pending"}
        step = _STEP_CV.get()
        if step is None:
            step = task.scope.extra["attrs"].get(ATTR_STEP)  # type: ignore[index]
        if step is not None:
            attrs[ATTR_STEP] = step
        scope.extra = {"attrs": attrs}
        scope.begin_detached(task.scope, from_context=False)


_TASKS: dict[Any, _Task] = {}
_SESSIONS: dict[Any, _Session] = {}
#: recently registered task/session spans, for links from the step that consumes them
#: (task spans are kept; a session is linked through its task's span, in the same trace, so
#: only its task id is kept: few live objects for the garbage collector to walk)
_RECENT: OrderedDict[tuple[str, Any], Any] = OrderedDict()  # O(1) oldest-first eviction
RECENT_CAP = 4_096
_RECENT_SESSIONS: OrderedDict[Any, Any] = OrderedDict()  # session id -> task id
RECENT_SESSIONS_CAP = 4_096


def _remember(kind: str, key: Any, scope: Scope) -> None:
    _RECENT[(kind, key)] = scope
    if len(_RECENT) > RECENT_CAP:
        try:
            _RECENT.popitem(last=False)
        except KeyError:
            pass


def _remember_session(session_id: Any, task_id: Any) -> None:
    _RECENT_SESSIONS[session_id] = task_id
    if len(_RECENT_SESSIONS) > RECENT_SESSIONS_CAP:
        try:
            _RECENT_SESSIONS.popitem(last=False)
        except KeyError:
            pass


def offset_ids(pid: int) -> None:
    """Start this process's task/session ids at ``pid << 32``: children sharing a rank (forked
    dataloader workers, spawned helpers) never reuse their parent's ids."""
    global _task_ids, _session_ids
    _task_ids = itertools.count(pid << 32)
    _session_ids = itertools.count(pid << 32)


def open_counts() -> dict[str, int]:
    """Tasks and sessions currently open (finished ones leave no state)."""
    return {"open_tasks": len(_TASKS), "open_sessions": len(_SESSIONS)}


# ---- ids and context -----------------------------------------------------------------------


def register_task(task_id: Any = None) -> Any:
    """Register a task (one dataset item) and return its id (a new int when not given)."""
    if task_id is None:
        task_id = next(_task_ids)
    if FLAGS.enabled:
        with _LOCK:
            _task_locked(task_id)
    return task_id


def _task_locked(task_id: Any) -> _Task:
    """The open task ``task_id``, registered now if needed (caller holds ``_LOCK``)."""
    task = _TASKS.get(task_id)
    if task is None:
        task = _TASKS[task_id] = _Task(task_id)
        _remember("task", task_id, task.scope)
    return task


def set_task_id(task_id: Any) -> None:
    """Make ``task_id`` the current task for this context (asyncio tasks inherit it)."""
    _TASK_CV.set(task_id)


def get_task_id() -> Any:
    """The current task id in this context, or None."""
    return _TASK_CV.get()


def register_session(task_id: Any = None) -> Any:
    """Register a session (one sample) under ``task_id`` (default: the current task).

    Without any task a task is registered implicitly, so the session is never lost.
    """
    session_id = next(_session_ids)
    if not FLAGS.enabled:
        return session_id
    if task_id is None:
        task_id = _TASK_CV.get()
    with _LOCK:
        task = _task_locked(next(_task_ids) if task_id is None else task_id)
        task.open.add(session_id)
        _SESSIONS[session_id] = _Session(session_id, task)
        _remember_session(session_id, task.task_id)
    return session_id


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


class PhaseScope:
    """One execution of a phase in one session.

    Used as a context manager (sync and async) by ``trace_session_phase`` /
    ``atrace_session_phase`` / ``@trace_session``, and returned as a handle by
    ``mark_<phase>_start``.  Each execution is its own object, so overlapping executions of
    one phase pair correctly.
    """

    __slots__ = ("_sync_wait", "_token", "closed", "device_sync", "end_payload", "scope",
                 "session", "session_id", "spec", "start_payload", "turn")

    def __init__(self, spec: PhaseSpec, start_payload: dict[str, Any] | None,
                 end_payload: dict[str, Any] | None, turn: int | None, session_id: Any,
                 device_sync: Any = None) -> None:
        self.spec = spec
        self.start_payload = start_payload
        self.end_payload = end_payload
        self.turn = turn
        self.session_id = session_id
        self.scope: Scope | None = None
        self.closed = False
        self._token: Any = None
        self.device_sync = device_sync
        self._sync_wait = 0

    @property
    def phase(self) -> str:
        return self.spec.name

    def set_end_payload(self, **payload: Any) -> None:
        """Add key/values recorded when the phase ends (``rl.end.<key>``)."""
        if self.end_payload is None:
            self.end_payload = {}
        self.end_payload.update(payload)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the phase span (e.g. ``gen_ai.usage.output_tokens``)."""
        if self.scope is not None:
            self.scope.extra["attrs"][key] = value  # type: ignore[index]

    def _start(self, session: _Session, share_lane: bool) -> None:
        spec = self.spec
        turn = self.turn
        if turn is None:
            if spec.starts_turn:
                session.turn += 1
            turn = session.turn if session.turn > 0 else 0
        elif turn > session.turn:
            session.turn = turn
        sid = session.session_id
        attrs: dict[str, Any] = {ATTR_PHASE: spec.name, ATTR_TURN: turn, ATTR_SESSION: sid,
                                 ATTR_TASK: session.task.task_id}
        if spec.genai_operation is not None:
            attrs["gen_ai.operation.name"] = spec.genai_operation
            attrs["gen_ai.conversation.id"] = str(sid)
        if self.start_payload:
            _payload_attrs(attrs, "rl.start.", self.start_payload, spec)
        scope = self.scope = Scope(spec.name, spec.category)
        scope.extra = {"attrs": attrs}
        scope.begin_detached(session.scope, from_context=False, share_lane=share_lane)
        self.session = session
        session.open_phases.append(self)  # list.append is atomic; finalize copies under _LOCK

    def end(self, payload: dict[str, Any] | None = None, exc: BaseException | None = None,
            interrupted: bool = False, end_ns: int | None = None) -> None:
        """Close this execution (idempotent; a second call does nothing)."""
        end = end_ns if end_ns is not None else recorder.now_ns()
        with _LOCK:
            if self.closed or self.scope is None:
                return
            self.closed = True
            try:
                self.session.open_phases.remove(self)
            except ValueError:
                pass
        scope = self.scope
        attrs = scope.extra["attrs"]  # type: ignore[index]
        if payload:
            _payload_attrs(attrs, "rl.end.", payload, self.spec)
        if interrupted or exc is not None:
            attrs[ATTR_INTERRUPTED] = True
        scope.finish(end, exc)

    def __enter__(self) -> PhaseScope:
        if FLAGS.enabled:
            sid = self.session_id
            if sid is None:
                sid = _SESSION_CV.get()
            sess = _SESSIONS.get(sid) if sid is not None else None
            if sess is None:
                _no_session(sid, f"trace_session_phase({self.spec.name!r})")
            else:
                if self.device_sync:
                    from .device import device_sync

                    _, self._sync_wait = device_sync(self.device_sync)
                self._start(sess, True)
                self._token = attach(self.scope)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self.scope is not None:
            if self.device_sync:
                from .device import ATTR_SYNC, ATTR_SYNC_WAIT, device_sync

                kind, wait = device_sync(self.device_sync)
                attrs = self.scope.extra["attrs"]  # type: ignore[index]
                attrs[ATTR_SYNC] = kind
                attrs[ATTR_SYNC_WAIT] = (self._sync_wait + wait) / 1e9
            detach(self._token)
            self.end(self.end_payload, exc)
        return False

    async def __aenter__(self) -> PhaseScope:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return self.__exit__(exc_type, exc, tb)


#: ``mark_<phase>_start`` returns one of these
PhaseHandle = PhaseScope


def _no_session(sid: Any, api: str) -> None:
    if sid is None:
        _misuse("no_session", f"{api} called outside any session (no session_id given and none "
                              "in context); the phase is not recorded. Use @session_context() "
                              "or set_session_id()")
    else:
        _misuse("unknown_session", f"{api}: session {sid!r} is unknown or already finalized; "
                                   "the phase is not recorded")


def _session_for(session_id: Any, api: str) -> _Session | None:
    sid = session_id if session_id is not None else _SESSION_CV.get()
    sess = _SESSIONS.get(sid) if sid is not None else None
    if sess is None:
        _no_session(sid, api)
    return sess


def trace_session_phase(
    phase: str, start_payload: dict[str, Any] | None = None,
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
    return PhaseScope(get_phase(phase), dict(start_payload) if start_payload else None,
                      dict(end_payload) if end_payload else None, turn, session_id, device_sync)


def atrace_session_phase(
    phase: str, start_payload: dict[str, Any] | None = None,
    end_payload: dict[str, Any] | None = None, *, turn: int | None = None,
    session_id: Any = None, device_sync: bool | str | None = None,
) -> PhaseScope:
    """Async form of :func:`trace_session_phase` (``async with``)."""
    return trace_session_phase(phase, start_payload, end_payload, turn=turn,
                               session_id=session_id, device_sync=device_sync)


def trace_session(phase: str) -> Callable[[F], F]:
    """Decorator: every call of the (sync or async) function is one ``phase`` execution."""
    get_phase(phase)  # built-ins and phases registered before decoration fail fast

    def deco(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*a: Any, **k: Any) -> Any:
                if not FLAGS.enabled:
                    return await fn(*a, **k)
                async with PhaseScope(get_phase(phase), None, None, None, None):
                    return await fn(*a, **k)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if not FLAGS.enabled:
                return fn(*a, **k)
            with PhaseScope(get_phase(phase), None, None, None, None):
                return fn(*a, **k)

        return wrapper  # type: ignore[return-value]

    return deco


# ---- finalization ------------------------------------------------------------------------------


def _finalize(sess: _Session, status: str, reason: Any) -> None:
    if reason is not None and type(reason) is not str:
        reason = text(reason)  # never raises: an unprintable reason must not lose the session
    with _LOCK:
        if _SESSIONS.pop(sess.session_id, None) is None:
            return
        open_phases = list(sess.open_phases)
        task = sess.task
        task.open.discard(sess.session_id)
        task_done = not task.open and _TASKS.get(task.task_id) is task
        if task_done:
            del _TASKS[task.task_id]
    end = recorder.now_ns()
    for handle in open_phases:
        handle.end(None, None, interrupted=True, end_ns=end)
    scope = sess.scope
    attrs = scope.extra["attrs"]  # type: ignore[index]
    attrs[ATTR_STATUS] = status
    if reason is not None:
        attrs[ATTR_REASON] = str(reason)
    if status == "failed":
        scope.extras()["status"] = Status(StatusCode.ERROR, str(reason) if reason else "failed")
    scope.finish(end, keep=True)
    if task_done:
        task.scope.finish(end, keep=True)


def finalize_session(session_id: Any, status: str, reason: str | None = None) -> None:
    """Finalize one session (see ``trace_session_event("mark_finalized", ...)``)."""
    sess = _SESSIONS.get(session_id)
    if sess is None:
        _misuse("unknown_session", f"mark_finalized: session {session_id!r} is unknown or "
                                   "already finalized; ignored")
        return
    _finalize(sess, status, reason)


def finalize_task(task_id: Any, status: str, reason: str | None = None) -> None:
    """Finalize every open session of a task, then end the task span."""
    with _LOCK:
        task = _TASKS.get(task_id)
        sessions = [_SESSIONS[s] for s in task.open if s in _SESSIONS] if task else []
    if task is None:
        _misuse("unknown_task", f"mark_finalized: task {task_id!r} is unknown or already "
                                "finished; ignored")
        return
    for sess in sessions:
        _finalize(sess, status, reason)
    with _LOCK:
        done = _TASKS.get(task_id) is task
        if done:
            del _TASKS[task_id]
    if done:
        task.scope.finish(recorder.now_ns(), keep=True)


def _check_status(status: Any) -> str:
    if status not in FINAL_STATUSES:
        raise ValueError(
            f"rltrace mark_finalized: status must be one of {', '.join(FINAL_STATUSES)}, "
            f"got {status!r}"
        )
    return status


def trace_session_event(
    method: str, session_id: Any = None, task_id: Any = None, **payload: Any
) -> Any:
    """Record a lifecycle event: ``mark_finalized`` or ``mark_<phase>_start``/``_end``.

    ``session_id=`` targets one session, ``task_id=`` every open session of a task; with
    neither, the current session (else the current task) from context.  ``mark_finalized``
    takes ``status`` (accepted / rejected / failed / dropped) and an optional ``reason``.
    ``mark_<phase>_start`` returns a :class:`PhaseScope` handle (a list of them for a task); a
    ``mark_<phase>_end`` given ``handle=`` closes that execution, otherwise the oldest open
    execution of the phase.  Remaining keyword arguments are the phase payload (``turn=``
    sets the turn).  Unknown methods and phases raise ``ValueError`` naming the fix.
    """
    if method == "mark_finalized":
        status = _check_status(payload.pop("status", None))
        reason = payload.pop("reason", None)
        if payload:
            raise TypeError(f"rltrace mark_finalized: unexpected arguments {sorted(payload)}; "
                            "use status= and reason=")
        if not FLAGS.enabled:
            return None
        if session_id is None and task_id is None:
            session_id = _SESSION_CV.get()
            if session_id is None:
                task_id = _TASK_CV.get()
        if session_id is not None:
            finalize_session(session_id, status, reason)
        elif task_id is not None:
            finalize_task(task_id, status, reason)
        else:
            raise ValueError("rltrace mark_finalized: no session_id or task_id given and none "
                             "in context; pass session_id= or task_id=")
        return None
    if method.startswith("mark_") and (method.endswith("_start") or method.endswith("_end")):
        start = method.endswith("_start")
        spec = get_phase(method[5:-6] if start else method[5:-4])
        if not FLAGS.enabled:
            return None
        if session_id is None and task_id is not None:
            with _LOCK:
                task = _TASKS.get(task_id)
                targets = [_SESSIONS[s] for s in task.open if s in _SESSIONS] if task else []
            return [_phase_event(s, spec, start, dict(payload)) for s in targets]
        handle = payload.get("handle")
        if not start and isinstance(handle, PhaseScope):
            payload.pop("handle")
            handle.end(payload)  # exactly that execution; idempotent once it is closed
            return handle
        sess = _session_for(session_id, method)
        return None if sess is None else _phase_event(sess, spec, start, payload)
    raise ValueError(
        f"rltrace trace_session_event: unknown method {method!r}; use 'mark_finalized', "
        f"'mark_<phase>_start' or 'mark_<phase>_end' with a phase registered by "
        f"rltrace.register_phase"
    )


def _phase_event(sess: _Session, spec: PhaseSpec, start: bool, payload: dict[str, Any]) -> Any:
    if start:
        turn = payload.pop("turn", None)
        handle = PhaseScope(spec, payload or None, None, turn, sess.session_id)
        handle._start(sess, share_lane=False)
        return handle
    handle = payload.pop("handle", None)
    if handle is None:
        with _LOCK:
            handle = next((h for h in sess.open_phases if h.spec is spec), None)
    if handle is None:
        _misuse("phase_not_started", f"mark_{spec.name}_end: no open {spec.name!r} phase in "
                                     f"session {sess.session_id!r}; ignored")
        return None
    handle.end(payload)
    return handle


# ---- session_context -------------------------------------------------------------------------


def session_context() -> Callable[[F], F]:
    """Decorator: each call registers a session under the current task and runs in it.

    The session id (and its span, as the current OTel span) are in context for everything the
    function calls, including ``asyncio.gather`` children.  An exception escaping the function
    finalizes the session as ``failed`` with the exception as reason (open phases are closed
    and marked interrupted) and is re-raised unchanged; otherwise the session stays pending
    until ``mark_finalized``.
    """

    def deco(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*a: Any, **k: Any) -> Any:
                if not FLAGS.enabled:
                    return await fn(*a, **k)
                sid = register_session()
                tok, sess_tok = _enter_session(sid)
                try:
                    return await fn(*a, **k)
                except BaseException as exc:
                    _fail(sid, exc)
                    raise
                finally:
                    detach(sess_tok)
                    _SESSION_CV.reset(tok)

            return awrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            if not FLAGS.enabled:
                return fn(*a, **k)
            sid = register_session()
            tok, sess_tok = _enter_session(sid)
            try:
                return fn(*a, **k)
            except BaseException as exc:
                _fail(sid, exc)
                raise
            finally:
                detach(sess_tok)
                _SESSION_CV.reset(tok)

        return wrapper  # type: ignore[return-value]

    return deco


def _enter_session(sid: Any) -> tuple[Any, Any]:
    tok = _SESSION_CV.set(sid)
    sess = _SESSIONS.get(sid)
    return tok, attach(sess.scope) if sess is not None else None


def _fail(sid: Any, exc: BaseException) -> None:
    sess = _SESSIONS.get(sid)
    if sess is not None:
        _finalize(sess, "failed", f"{type(exc).__name__}: {exc}")


def link_consumed(task_ids: Any = (), session_ids: Any = (), span: Any = None) -> int:
    """Link the current scope (e.g. the train step) to the tasks/sessions it consumed.

    Each task is its own trace; the links let a trace UI jump from a train step to the rollouts
    that fed it (and back).  A finished session is linked through its task's span (same trace).
    Ids must be among the ~4k most recent tasks / ~4k most recent sessions; returns how many
    links were added.
    """
    from .recorder import current_scope

    target = span if span is not None else current_scope()
    if target is None or not isinstance(target, Scope):
        _misuse("link_outside_scope", "link_consumed called outside any rltrace scope; "
                                      "call it inside the step's trace_scope")
        return 0
    links = target.extras().setdefault("links", [])
    added = 0
    for kind, ids in (("task", task_ids), ("session", session_ids)):
        for key in ([ids] if isinstance(ids, (int, str)) else ids):
            if kind == "session":
                sess = _SESSIONS.get(key)
                scope = sess.scope if sess is not None else (
                    _RECENT.get(("task", _RECENT_SESSIONS[key])) if key in _RECENT_SESSIONS else None)
            else:
                scope = _RECENT.get((kind, key))
            if scope is None:
                _misuse("unknown_link", f"link_consumed: {kind} {key!r} is unknown or too old "
                                        "to link; ignored")
                continue
            links.append((scope, {"rl.link.type": "consumed", f"rl.{kind}.id": key}))
            added += 1
    return added


def close_all(status: str = "pending", reason: str = "open at shutdown") -> int:
    """Finalize every open session and task (shutdown); returns how many sessions were open."""
    with _LOCK:
        sessions = list(_SESSIONS.values())
    for sess in sessions:
        _finalize(sess, status, reason)
    with _LOCK:
        tasks = list(_TASKS.values())
        _TASKS.clear()
    end = recorder.now_ns()
    for task in tasks:
        task.scope.finish(end, keep=True)
    return len(sessions)


def _reset_after_fork() -> None:
    global _LOCK
    _LOCK = threading.RLock()
    offset_ids(os.getpid())
    _TASKS.clear()  # open tasks/sessions belong to the parent, which finalizes them
    _SESSIONS.clear()
    _RECENT.clear()
    _RECENT_SESSIONS.clear()


os.register_at_fork(after_in_child=_reset_after_fork)
