"""The session registry: the open tasks and sessions of a process, and the API that records
their lifecycle (register, phases, AReaL's events, finalize, links to the consuming step)."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from opentelemetry.trace import SpanContext
from opentelemetry.trace.status import Status, StatusCode

from rltrace.recording import recorder
from rltrace.recording.arguments import check_mapping, check_optional_int, did_you_mean, type_error
from rltrace.recording.recorder import RecordBase, Scope, attach, current_scope, detach
from rltrace.recording.user_values import recorded, text
from rltrace.semconv import ATTR_SESSION_COUNTER_PREFIX, ATTR_VERSION_AT_FINALIZE
from rltrace.sessions.context import SESSION_CV, TASK_CV, caller_task, get_session_id, get_task_id
from rltrace.sessions.phases import PhaseRegistry, PhaseSpec
from rltrace.sessions.recent import recent, remember
from rltrace.sessions.records import (
    FINAL_SET,
    NO_PHASES,
    PhaseScope,
    RemoteTaskScope,
    SessionScope,
    SyncedPhaseScope,
    TaskScope,
    check_status,
)
from rltrace.sessions.shared_counts import FINALIZED, REGISTERED
from rltrace.steps import _STEP_CV, scope_arg_step

logger = logging.getLogger("rltrace")
F = TypeVar("F", bound=Callable[..., Any])

#: recently registered tasks, for links from the step that consumes them: two generations of
#: ``RECENT_CAP // 2`` entries (task id -> task span; session id -> its task's span, in the same
#: trace), so an insert is one dict store and old entries go a generation at a time
RECENT_CAP = 4_096
_RECENT_GEN = RECENT_CAP // 2


class SessionRegistry:
    """The open tasks and sessions of a process, and the API that records their lifecycle.

    The runtime owns the process's one (``rltrace.runtime.RUNTIME.sessions``; the module
    functions ``register_task``, ``trace_session_phase``, ... are its bound methods, and
    :func:`rltrace.configure` switches it on and off through :attr:`enabled`).  It outlives
    reconfiguration, so a task open across ``configure`` calls keeps its sessions.  Tests build
    their own (``SessionRegistry(phases=PhaseRegistry())``) instead of patching module state.
    """

    __slots__ = ("_off_warned", "_session_ids", "_task_ids", "enabled", "flight", "lock", "misuse",
                 "off_reason", "phases", "recent_sessions", "recent_tasks", "sessions", "tally",
                 "tasks")

    def __init__(self, phases: PhaseRegistry | None = None) -> None:
        #: whether session tracing records (set by ``configure``)
        self.enabled = False
        #: why it does not although tracing is configured (said once, at the first session
        #: call), or None: not configured at all (then nothing is said)
        self.off_reason: str | None = None
        self._off_warned = False
        #: the ring each finalized session is kept in until its record is on disk
        #: (:class:`rltrace.sessions.flight.FlightRecorder`, set by the pipeline), or None
        self.flight: Any = None
        #: the phases its sessions may run (default: the built-ins, in a registry of its own)
        self.phases = phases if phases is not None else PhaseRegistry()
        self.tasks: dict[Hashable, TaskScope] = {}
        self.sessions: dict[Hashable, SessionScope] = {}
        self.recent_tasks: list[dict[Hashable, TaskScope]] = [{}, {}]
        self.recent_sessions: list[dict[Hashable, TaskScope]] = [{}, {}]
        self.lock = threading.RLock()  # reentrant: the SIGTERM flush may interrupt a holder
        #: misuse that does not raise (unknown/finalized ids, phases outside a session): counted
        self.misuse: dict[str, int] = {}
        self._task_ids = itertools.count()
        self._session_ids = itertools.count()
        #: counts of sessions registered and finalized that outlive the process
        #: (:class:`rltrace.sessions.shared_counts.SessionTally` ``.view``: a Ray worker's), or None
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

    def session(self, session_id: Hashable | None) -> SessionScope | None:
        """The open session ``session_id``, or None."""
        return self.sessions.get(session_id)

    def open_sessions(self, task_id: Hashable | None) -> list[SessionScope]:
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

    def register_task(self, task_id: Hashable | None = None) -> Hashable:
        """Register a task (one dataset item) and return its id (a new int when not given)."""
        if task_id is None:
            task_id = next(self._task_ids)
        if self.enabled:
            with self.lock:
                if self.tasks.get(task_id) is None:
                    self._task_locked(task_id)
        elif self.off_reason is not None:
            self.said_off("register_task")
        return task_id

    def switched_off(self, reason: str | None) -> None:
        """Why session calls record nothing now (said once per configuration, at the first
        call), or None: nothing to say (tracing not configured, or session tracing on)."""
        self.off_reason = reason
        self._off_warned = False

    def said_off(self, api: str) -> None:
        """Say once that session calls record nothing while session tracing is off."""
        if not self._off_warned:
            self._off_warned = True
            logger.warning("rltrace: %s() was called but session tracing is off (%s): no session "
                           "is recorded. Turn it on with rltrace.configure(session_tracer="
                           "{'enabled': True}) or RLTRACE_SESSION_TRACER_ENABLED=true.",
                           api, self.off_reason)

    def _task_locked(self, task_id: Hashable | None) -> TaskScope:
        """The open task ``task_id``, registered now if needed (caller holds the lock): a
        :class:`RemoteTaskScope` when it is the caller's task in another process."""
        task = self.tasks.get(task_id)
        if task is None:
            caller = caller_task()
            if caller is not None and caller[0] == task_id:
                task = self.tasks[task_id] = RemoteTaskScope(task_id, caller[1])
            else:
                step = _STEP_CV.get()  # else AReaL style: the enclosing scope's args.global_step
                task = self.tasks[task_id] = TaskScope(
                    task_id, scope_arg_step() if step is None else step)
            remember(self.recent_tasks, task_id, task, _RECENT_GEN)
        return task

    def task_span_context(self, task_id: Hashable | None, spread: bool = False) -> SpanContext | None:
        """The ``SpanContext`` of task ``task_id``'s span in this process (open or recently
        finished), for propagation to the processes that run its sessions; None if unknown.
        ``spread``: mark the task as having gone to another process (its span is then sent
        by session-aware sampling even when the task is dropped here, so the sessions other
        processes keep have their parent)."""
        with self.lock:
            task = self.tasks.get(task_id) or recent(self.recent_tasks, task_id)
            if task is not None and spread:
                task.spread = True
        return None if task is None else task.get_span_context()

    def register_session(self, task_id: Hashable | None = None) -> Hashable:
        """Register a session (one sample) under ``task_id`` (default: the current task).

        Without any task a task is registered implicitly, so the session is never lost.
        """
        session_id = next(self._session_ids)
        if not self.enabled:
            if self.off_reason is not None:
                self.said_off("register_session")
            return session_id
        if task_id is None:
            task_id = TASK_CV.get()
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
            self.sessions[session_id] = SessionScope(session_id, task, step)
            remember(self.recent_sessions, session_id, task, _RECENT_GEN)
            tally = self.tally
            if tally is not None:
                tally[REGISTERED] += 1
        return session_id

    # ---- phases ----------------------------------------------------------------------------

    def no_session(self, sid: Hashable | None, api: str) -> None:
        """Count a phase API called without a live session."""
        if sid is None:
            self.count_misuse("no_session", f"{api} called outside any session (no session_id "
                                            "given and none in context); the phase is not "
                                            "recorded. Use @session_context() or set_session_id()")
        else:
            self.count_misuse("unknown_session", f"{api}: session {sid!r} is unknown or already "
                                                 "finalized; the phase is not recorded")

    def _session_for(self, session_id: Hashable | None, api: str) -> SessionScope | None:
        sid = session_id if session_id is not None else SESSION_CV.get()
        sess = self.sessions.get(sid) if sid is not None else None
        if sess is None:
            self.no_session(sid, api)
        return sess

    def trace_session_phase(
        self, phase: str, start_payload: dict[str, object] | None = None,
        end_payload: dict[str, object] | None = None, *, turn: int | None = None,
        session_id: Hashable | None = None, device_sync: bool | str | None = None,
    ) -> PhaseScope:
        """Time one execution of ``phase`` in the current session: ``with trace_session_phase(...)``.

        ``start_payload``/``end_payload`` become span attributes (``rl.start.*``/``rl.end.*``;
        ``model``, ``input_tokens``, ``output_tokens``, ``tool_name`` also map to OTel GenAI
        attributes on generate/toolcall).  ``turn`` overrides the automatic per-session turn
        counter (each ``generate`` starts a new turn).  Raises
        :class:`~rltrace.sessions.phases.UnknownPhaseError` for an unregistered phase.  ``device_sync``
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
        start = recorded(start_payload, recorder.STATE.kinds) if start_payload else None
        end = recorded(end_payload, recorder.STATE.kinds) if end_payload else None
        if device_sync:
            return SyncedPhaseScope(spec, start, end, turn, session_id, self, device_sync)
        return PhaseScope(spec, start, end, turn, session_id, self)

    def atrace_session_phase(
        self, phase: str, start_payload: dict[str, object] | None = None,
        end_payload: dict[str, object] | None = None, *, turn: int | None = None,
        session_id: Hashable | None = None, device_sync: bool | str | None = None,
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
                async def awrapper(*a: object, **k: object) -> object:
                    if not reg.enabled:
                        return await fn(*a, **k)
                    async with PhaseScope(phases.get(phase), None, None, None, None, reg):
                        return await fn(*a, **k)

                return awrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*a: object, **k: object) -> object:
                if not reg.enabled:
                    return fn(*a, **k)
                with PhaseScope(phases.get(phase), None, None, None, None, reg):
                    return fn(*a, **k)

            return wrapper  # type: ignore[return-value]

        return deco

    # ---- finalization ----------------------------------------------------------------------

    def _finalize(self, sess: SessionScope, status: str, given: object) -> None:
        # never raises: an unprintable reason must not lose the session
        reason = given if given is None or type(given) is str else \
            text(given, recorder.STATE.kinds)
        with self.lock:
            if self.sessions.pop(sess.session_id, None) is None:
                return
            task = sess.task_rec
            task_done = self._session_left(task, sess.session_id)
            tally = self.tally
            if tally is not None:
                tally[FINALIZED] += 1
        end = recorder.STATE.now_ns()
        ops = sess.open_phases
        while ops:  # close what is still open; a phase ending concurrently is closed once
            try:
                handle = ops[-1]
            except IndexError:
                break
            handle._close_if_open(ops, end, None, True)
        sess.open_phases = NO_PHASES  # the list goes: one object fewer per queued record
        sess.status = status
        sess.reason = reason
        version = recorder.STATE.policy_version
        if version is not None and version != sess.version:  # the policy moved on meanwhile
            sess.set_attribute(ATTR_VERSION_AT_FINALIZE, version)
        if status == "failed":
            sess.extras()["status"] = Status(StatusCode.ERROR, reason or "failed")
        flight = self.flight
        if flight is not None:  # before it is queued: the ring has it whatever comes next
            flight.add(task.task_id, sess.session_id, status, reason, sess.start_ns, end,
                       sess.step, sess.phase_log)
        sess.finish(end, keep=True)
        if task_done:
            task.finish(end, keep=True)

    def _session_left(self, task: TaskScope, session_id: Hashable | None) -> bool:
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

    def finalize_session(self, session_id: Hashable | None, status: str, reason: str | None = None) -> None:
        """Finalize one session (see ``trace_session_event("mark_finalized", ...)``)."""
        sess = self.sessions.get(session_id)
        if sess is None:
            self.count_misuse("unknown_session", f"mark_finalized: session {session_id!r} is "
                                                 "unknown or already finalized; ignored")
            return
        self._finalize(sess, status, reason)

    def finalize_task(self, task_id: Hashable | None, status: str, reason: str | None = None) -> None:
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
            task.finish(recorder.STATE.now_ns(), keep=True)

    def trace_session_event(
        self, method: str, session_id: Hashable | None = None, task_id: Hashable | None = None, **payload: Any
    ) -> Any:
        """Record a lifecycle event: ``mark_finalized``, ``mark_<phase>_start``/``_end``, or
        ``increment_counter`` (``name=``, ``value=``: :meth:`increment_counter`).

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
            return self._finalized_event(session_id, task_id, payload)
        if method.startswith("mark_") and (method.endswith("_start") or method.endswith("_end")):
            return self._phase_edge_event(method, session_id, task_id, payload)
        if method == "increment_counter":
            name = payload.pop("name", None)
            value = payload.pop("value", 1)
            if payload:
                raise TypeError(f"rltrace increment_counter: unexpected arguments {sorted(payload)}; "
                                "use name= and value=")
            self.increment_counter(name, value, session_id=session_id, task_id=task_id)
            return None
        methods = [f"mark_{p}_{edge}" for p in self.phases.names() for edge in ("start", "end")]
        raise ValueError(
            f"rltrace trace_session_event: unknown method {method!r}"
            f"{did_you_mean(method, ['mark_finalized', 'increment_counter', *methods])}; use "
            f"'mark_finalized', 'increment_counter', or 'mark_<phase>_start' or 'mark_<phase>_end' "
            f"with a phase registered by rltrace.register_phase"
        )

    def increment_counter(self, name: str, value: int | float = 1, *, session_id: Hashable | None = None,
                          task_id: Hashable | None = None) -> int:
        """Add ``value`` to counter ``name`` of one open session (or of every open session of a
        task; with neither id, the current session, else the current task).

        The counters are written in the session record's ``counters`` (AReaL's field) and as
        ``rl.session.counter.<name>`` attributes of the session span.  Returns how many sessions
        were counted; a finalized or unknown session is counted as misuse and ignored.
        """
        if type(name) is not str or not name:
            raise ValueError(f"rltrace increment_counter: name must be a non-empty str, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"rltrace increment_counter: value must be a number, got "
                            f"{type(value).__name__} {value!r}")
        if not self.enabled:
            return 0
        key = ATTR_SESSION_COUNTER_PREFIX + name
        with self.lock:
            targets = self._counter_targets(session_id, task_id)
            for sess in targets:
                attrs = sess.extras().setdefault("attrs", {})
                attrs[key] = attrs.get(key, 0) + value
        if not targets:
            self.count_misuse("unknown_session", f"increment_counter {name!r}: session "
                                                 f"{session_id!r} / task {task_id!r} is unknown or "
                                                 "already finalized; ignored")
        return len(targets)

    def _counter_targets(self, session_id: Hashable | None, task_id: Hashable | None) -> list[SessionScope]:
        """Open sessions addressed as AReaL does (the session, else all of a task; else context)."""
        if session_id is None and task_id is None:
            session_id = get_session_id()
            if session_id is None:
                task_id = get_task_id()
        if session_id is not None:
            sess = self.session(session_id)
            return [sess] if sess is not None else []
        if task_id is None:
            raise ValueError("rltrace increment_counter: no session_id or task_id given and none in "
                             "context; pass session_id= or task_id=")
        return self.open_sessions(task_id)

    def _finalized_event(self, session_id: Hashable | None, task_id: Hashable | None,
                         payload: dict[str, Any]) -> None:
        """``mark_finalized``: the session given (or in context), else every open session of the
        task given (or in context)."""
        status = payload.pop("status", None)
        if status not in FINAL_SET:
            check_status(status)
        reason = payload.pop("reason", None)
        if payload:
            raise TypeError(f"rltrace mark_finalized: unexpected arguments {sorted(payload)}; "
                            "use status= and reason=")
        if not self.enabled:
            return
        if session_id is None and task_id is None:
            session_id = SESSION_CV.get()
            if session_id is None:
                task_id = TASK_CV.get()
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

    def _phase_edge_event(self, method: str, session_id: Hashable | None, task_id: Hashable | None,
                          payload: dict[str, Any]) -> Any:
        """``mark_<phase>_start`` (a handle; a list of them for a task) or ``mark_<phase>_end``
        (that handle's execution, else the oldest open one of the phase)."""
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

    def _phase_event(self, sess: SessionScope, spec: PhaseSpec, start: bool,
                     payload: dict[str, Any]) -> Any:
        if start:
            turn = payload.pop("turn", None)
            held = recorded(payload, recorder.STATE.kinds) if payload else None
            started = PhaseScope(spec, held, None, turn, sess.session_id, self)
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
                async def awrapper(*a: object, **k: object) -> object:
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
                        SESSION_CV.reset(tok)

                return awrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*a: object, **k: object) -> object:
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
                    SESSION_CV.reset(tok)

            return wrapper  # type: ignore[return-value]

        return deco

    def _enter_session(self, sid: Hashable | None) -> tuple[Any, Any]:
        tok = SESSION_CV.set(sid)
        sess = self.sessions.get(sid)
        return tok, attach(sess) if sess is not None else None

    def _fail(self, sid: Hashable | None, exc: BaseException) -> None:
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
                    scope = self.sessions.get(key) or recent(self.recent_sessions, key)
                else:
                    scope = recent(self.recent_tasks, key)
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
        end = recorder.STATE.now_ns()
        for task in tasks:
            task.finish(end, keep=True)
        return len(open_)


