"""The hot path: scope records, timeline lanes and the bounded buffer of finished spans.

Entering a scope takes an epoch timestamp, draws ids, picks a timeline lane and puts the scope
into the OpenTelemetry context (so spans started by any other OTel instrumentation inside it
become its children, and an enclosing foreign span becomes its parent).  Exiting takes the end
timestamp and appends the scope to a bounded deque.  Everything else (attribute conversion,
``ReadableSpan`` construction, span processors, encoding, file I/O) happens later, off the
caller's path, in :mod:`rltrace.pipeline.loop`'s background exporter.

What the hot path reads and changes (the queue, the clock, the id source and its lock, the lanes,
the reader of the OTel context) is one :class:`RecorderState`, which the runtime owns and re-arms
after a fork.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from contextvars import Token
from heapq import heappop, heappush
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    Span,
    SpanContext,
    TraceFlags,
)
from opentelemetry.trace.status import Status, StatusCode

from rltrace.recording.otel_context import SPAN_KEY as _SPAN_KEY
from rltrace.recording.otel_context import ContextAccess, effective_context, new_span_context
from rltrace.recording.otel_context import frame_get as _frame_get
from rltrace.recording.otel_context import frame_reset as _frame_reset
from rltrace.recording.otel_context import frame_set as _frame_set
from rltrace.recording.user_values import ValueKinds, category_name, recorded, recorded_value, text
from rltrace.semconv import ATTR_STEP

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

    from rltrace.config import DeviceDefaults

logger = logging.getLogger("rltrace")

# ---- clock and ids (rltrace.testing swaps these for deterministic ones) --------------------

#: epoch nanoseconds; one clock for every rank and host, so merged timelines line up
DEFAULT_CLOCK = time.time_ns


def id_source_of(generator: IdGenerator) -> Callable[[int], int]:
    """A ``getrandbits``-like id source drawing from an OTel ``IdGenerator`` (128 bits: a trace
    id, 64: a span id), so rltrace's records and other instrumentation's spans share it."""
    trace_id, span_id = generator.generate_trace_id, generator.generate_span_id

    def bits(n: int) -> int:
        return int(trace_id() if n == 128 else span_id())

    return bits


_get_ident = threading.get_ident
_get_running_loop = asyncio._get_running_loop
_current_task = asyncio.current_task
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)


# ---- shared recorder state ------------------------------------------------------------------


class SpanApiStats:
    """Counters of OTel ``Span`` API use that rltrace refused (and the event bound it applies)."""

    __slots__ = ("dropped_events", "max_events", "writes_after_end")

    def __init__(self) -> None:
        self.writes_after_end = 0
        self.dropped_events = 0
        #: ``add_event`` calls kept per span (``SpanLimits().max_events``: 128, or
        #: ``OTEL_SPAN_EVENT_COUNT_LIMIT``); rltrace's own ``instant()``s are not counted
        self.max_events = 128

    def snapshot(self) -> dict[str, int]:
        return {"writes_after_end": self.writes_after_end, "dropped_events": self.dropped_events,
                "max_events": self.max_events}




class ThreadNames:
    """The names of the threads that recorded, by ident, as of the latest refresh: looked up at
    export time (the hot path records only the ident) and refreshed every export cycle, so a new
    thread that reuses a finished thread's ident is seen under its own name.  The runtime's
    state holds the process's one (``STATE.thread_names``)."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        #: thread ident -> name; the Chrome encoder's loop looks names up in it directly
        self.names: dict[int, str] = {}

    def refresh(self) -> None:
        """Note the names of the live threads (the exporter calls this once per cycle)."""
        names = self.names
        for t in threading.enumerate():
            if t.ident is not None:
                names[t.ident] = t.name

    def name(self, ident: int) -> str:
        """The name of the thread with this ident as of the latest refresh (or now, if unseen)."""
        name = self.names.get(ident)
        if name is None:
            self.refresh()
            name = self.names.get(ident)
        return name or f"thread-{ident}"


class RecorderState:
    """Mutable state shared by the hot path and the exporter thread."""

    __slots__ = ("buffer", "cap", "context", "ctx_get", "device", "dropped", "enabled",
                 "free_lanes", "held_events", "help", "help_at", "id_lock", "kinds", "mark",
                 "next_lane", "now_ns", "on_start", "overflow", "pid", "policy_version",
                 "policy_version_set", "rand_bits", "rng", "sampling", "span_api", "stepped",
                 "thread_names", "wake", "wake_at", "warned")

    def __init__(self) -> None:
        self.enabled = False
        #: epoch nanoseconds (``configure(clock=...)``, :func:`rltrace.testing.deterministic`)
        self.now_ns: Callable[[], int] = DEFAULT_CLOCK
        #: a generator of its own: a user's ``random.seed()`` must not make ids collide
        self.rng = random.Random()
        #: the ``getrandbits``-like id source (``configure(id_generator=...)``, testing)
        self.rand_bits: Callable[[int], int] = self.rng.getrandbits
        #: reentrant: a SIGTERM drain may interrupt a holder
        self.id_lock = threading.RLock()
        #: how the current OTel context is read, and OTel's runtime context wrapped
        self.context = ContextAccess()
        #: the hot path's reader of the current OTel context (``context.get``, bound once)
        self.ctx_get: Callable[[], Context] = self.context.get
        #: thread ident -> the heap of its free lanes (a record's ``lanes`` holds its thread's)
        self.free_lanes: dict[int, list[int]] = {}
        #: thread ident -> the lane a thread opens next when none of its lanes is free
        self.next_lane: dict[int, int] = {}
        #: the sites whose internal error was logged (once each)
        self.warned: set[str] = set()
        #: the names of the threads that recorded, for the exporters
        self.thread_names = ThreadNames()
        #: each type's kind, as every value recorded is classified (kept across configure and
        #: fork: a type's kind does not change)
        self.kinds = ValueKinds()
        self.buffer: deque[Any] = deque()
        self.cap = 262_144
        self.wake_at = 8_192
        self.wake: Callable[[], None] = _noop
        #: past this many queued records the recording thread runs an export cycle itself,
        #: after the running one if any, every ``HELP_EVERY`` records
        #: (:meth:`rltrace.pipeline.loop.Pipeline.help`)
        self.help_at = 1 << 62
        self.help: Callable[[], None] = _noop
        #: the queue length from which a push does more than append: ``min(wake_at, help_at)``
        self.mark = 8_192
        #: called with a kept record (task, session, phase) that meets a queue at twice its
        #: cap: the pipeline makes room by exporting on the caller's thread (backpressure)
        self.overflow: Callable[[Any], None] | None = None
        self.dropped = 0
        self.pid = os.getpid()
        #: the configured head sampler (:class:`rltrace.pipeline.sampling.HeadSampling`), or None for
        #: the default: roots sampled, a foreign parent's flag followed
        self.sampling: Any = None
        #: the user's span processors, whose ``on_start`` each rltrace span calls (None: none)
        self.on_start: tuple[SpanProcessor, ...] | None = None
        #: the configured pipeline's config-wide device options
        #: (:class:`rltrace.config.DeviceDefaults`), or None when it has none
        self.device: DeviceDefaults | None = None
        #: spans held for their CUDA events (:class:`rltrace.device.HeldEvents`), set by the
        #: runtime that owns this state
        self.held_events: Any = None
        #: what the OTel ``Span`` API of rltrace's records refused, and its event bound
        self.span_api = SpanApiStats()
        #: the policy (weights) version this process generates and trains with
        #: (``rltrace.set_policy_version``); kept across ``configure()``: it is the training's
        self.policy_version: int | None = None
        #: whether the version came from ``rltrace.set_policy_version`` (then AReaL's own notion
        #: of it, :func:`rltrace.perf_tracer.trace_scope`'s, is not applied over it)
        self.policy_version_set = False
        #: whether an ``rltrace.step`` scope was recorded in this process (then the pipeline
        #: follows step scopes for the live goodput split; until then no record pays for it)
        self.stepped = False

    def default_ids(self) -> None:
        """Draw ids from this state's own random generator again."""
        self.rand_bits = self.rng.getrandbits

    def follow_context(self, install: bool) -> str | None:
        """Follow OTel's runtime context (again, if other code replaced it) and, with
        ``install`` (``configure``) or once installed, keep it wrapped so that OTel sees
        rltrace's records; returns the replacing runtime context's type name, if any."""
        context = self.context
        replaced = None
        if install or context.installed:
            replaced = context.wrap()
        else:
            context.refollow()
        self.ctx_get = context.get
        return replaced

    def release_context(self) -> None:
        """Put OTel's own runtime context back (``shutdown``): rltrace still reads it."""
        self.context.unwrap()
        self.ctx_get = self.context.get

    def after_fork_in_child(self) -> None:
        """In a forked child: fresh ids (a generator of its own, never the parent's sequence), a
        fresh id lock (another thread may have held it at the fork), no lanes, and an empty
        queue (the parent exports what it recorded; never twice)."""
        self.rng.seed()
        self.id_lock = threading.RLock()
        self.free_lanes.clear()
        self.next_lane.clear()
        self.pid = os.getpid()
        self.buffer = deque()


def _noop() -> None:
    return None


def _call_on_start(span: Any, parent_context: Context) -> None:
    """``on_start(span, parent_context)`` of each of the user's span processors (as the SDK
    calls it: after the start time is set, on the starting thread); a failing processor is
    logged and skipped, never raised into the training loop."""
    for proc in STATE.on_start or ():
        try:
            proc.on_start(span, parent_context=parent_context)
        except Exception as exc:
            internal_error(f"{type(proc).__name__}.on_start", exc)


STATE = RecorderState()


#: how often (in queued records) a recording thread past ``help_at`` offers to help
HELP_EVERY = 512


def _past_wake(state: RecorderState, n: int) -> None:
    """A record was queued at position ``n`` >= ``mark``: wake the exporter at ``wake_at``, and
    from ``help_at`` on offer a cycle on this thread every ``HELP_EVERY`` records."""
    if n == state.wake_at:
        state.wake()
    if n >= state.help_at and not n % HELP_EVERY:
        state.help()


def push(item: Any, keep: bool = False) -> None:
    """Queue a finished span for export; count it as dropped when the buffer is full.

    ``keep`` (task, session and phase records: what the session records are made of) queues
    it past the cap, up to twice the cap; beyond that the caller exports a batch itself before
    queueing it (``STATE.overflow``), so a burst of any size keeps every session record while
    memory stays bounded: plain spans are dropped (and counted) first, then the caller waits.
    """
    state = STATE
    buf = state.buffer
    n = len(buf)
    if n < state.mark:  # the common case: below the marks that wake or help the exporter
        buf.append(item)
    elif n < state.cap or (keep and n < 2 * state.cap):
        buf.append(item)
        _past_wake(state, n)
    elif keep and state.overflow is not None:
        state.overflow(item)
    else:
        state.dropped += 1


def internal_error(where: str, exc: BaseException) -> None:
    """Log an rltrace-internal failure once per site; never re-raise into user code."""
    warned = STATE.warned
    if where not in warned:
        warned.add(where)
        logger.warning("rltrace internal error in %s (tracing continues): %r", where, exc,
                       exc_info=exc)


def now_ns() -> int:
    """Epoch nanoseconds from the recorder's clock (the one its records are stamped with)."""
    return STATE.now_ns()


def set_clock(clock: Callable[[], int]) -> None:
    """Replace the epoch-nanosecond clock (``configure(clock=...)``, ``testing.deterministic``)."""
    STATE.now_ns = clock


def set_id_source(bits: Callable[[int], int]) -> None:
    """Replace the ``getrandbits``-like id source (``testing.deterministic``)."""
    STATE.rand_bits = bits


def follow_runtime_context() -> str | None:
    """Follow a replacement of OTel's runtime context while rltrace keeps it wrapped (every
    export cycle calls it: code that replaced it since configure is followed from then on)."""
    return STATE.follow_context(install=False)


def context_value(key: str) -> object:
    """A value of the current OTel context (a frame adds only its record, as the span)."""
    return STATE.ctx_get().get(key)


# ---- lanes: per-thread track numbers so concurrent scopes never overlap on one track -------


def _take_lane(rec: ScopeCore, thread: int, state: RecorderState) -> None:
    """Give ``rec`` a lane of its own on ``thread``: the lowest free one, else a new one."""
    free = state.free_lanes.get(thread)
    if free is None:
        free = state.free_lanes[thread] = []
    if free:
        rec.lane = heappop(free)
    else:
        lane = rec.lane = state.next_lane.get(thread, 0)
        state.next_lane[thread] = lane + 1
    rec.lanes = free


# ---- the scope record ----------------------------------------------------------------------


_S = TypeVar("_S", bound="ScopeCore")


class ScopeCore:
    """A scope record's fields and hot methods; :class:`Scope` adds OTel's ``Span`` API."""

    __slots__ = (
        "_sc",
        "_token",
        "args",
        "category",
        "end_ns",
        "extra",
        "lane",
        "lanes",
        "name",
        "parent",
        "start_ns",
        "task",
        "thread",
    )
    _sc: SpanContext | None
    _token: Any
    args: dict[str, Any] | None
    category: Any
    end_ns: int
    extra: dict[str, Any] | None
    lane: int
    #: the free-lane heap of its thread that its lane goes back to (None: its parent's lane)
    lanes: list[int] | None
    name: str
    parent: Any
    start_ns: int
    task: Any
    thread: int
    if TYPE_CHECKING:  # Scope's, which both cores call
        kept: bool

        def _set_error(self, exc: BaseException) -> None: ...

        def _restore_parent(self, token: Token[Any]) -> None: ...

    def __init__(
        self, name: str, category: Any = None, args: dict[str, Any] | None = None
    ) -> None:
        self.name = name
        self.category = category
        self.args = args
        self.end_ns = 0
        self.extra = None
        # set: reading an unset slot with a default raises and clears an AttributeError (its
        # message formatted), which drawing the ids would pay twice; ``_token`` stays unset
        self._sc = None

    # -- lifecycle (the hot path: lane acquisition kept inline on purpose) ---------------
    def __enter__(self: _S) -> _S:
        try:
            state = STATE
            frame = _frame_get()
            ctx = state.ctx_get()
            parent = frame[0] if frame is not None and frame[1] is ctx else ctx.get(_SPAN_KEY)
            thread = _get_ident()
            loop = _get_running_loop()
            task = None if loop is None else _current_task(loop)
            if parent is None:
                self.parent = None
                free = state.free_lanes.get(thread)
                if free:  # inlined _take_lane: the common case
                    self.lane = heappop(free)
                    self.lanes = free
                else:
                    _take_lane(self, thread, state)
            elif isinstance(parent, RecordBase):
                self.parent = parent
                if parent.thread == thread and parent.task is task:
                    self.lane = parent.lane
                    self.lanes = None
                else:
                    _take_lane(self, thread, state)
            else:
                valid = isinstance(parent, Span) and parent.get_span_context().is_valid
                self.parent = parent if valid else None
                _take_lane(self, thread, state)
            self.thread = thread
            self.task = task
            # current as a frame over the OTel context: no OTel Context is built for it
            self._token = _frame_set([self, ctx, None])
            self.start_ns = state.now_ns()
            if state.on_start is not None:
                _call_on_start(self, effective_context(frame, ctx))
        except Exception as exc:  # pragma: no cover - defensive
            internal_error("trace_scope enter", exc)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        state = STATE
        end = state.now_ns()
        try:
            token = self._token  # unset only if __enter__ failed: the except below logs it
            if token is not None:
                self._token = None
                try:
                    _frame_reset(token)
                except (ValueError, RuntimeError):
                    # exited in another context (e.g. an async generator closed elsewhere)
                    self._restore_parent(token)
                if self.end_ns == 0:
                    self.end_ns = end
                    if exc is not None:
                        self._set_error(exc)
                    lanes = self.lanes
                    if lanes is not None:
                        heappush(lanes, self.lane)
                    buf = state.buffer
                    if len(buf) < state.mark:  # inlined push: the common case
                        buf.append(self)
                    else:
                        push(self)
        except Exception as err:  # pragma: no cover - defensive
            internal_error("trace_scope exit", err)

    def _start_under(self, parent: Any, share_lane: bool) -> None:
        """:meth:`begin_detached` under a known rltrace ``parent`` (or none): the session path."""
        self.parent = parent
        thread = self.thread = _get_ident()
        loop = _get_running_loop()
        task = self.task = None if loop is None else _current_task(loop)
        state = STATE
        if share_lane and parent is not None and parent.thread == thread and parent.task is task:
            self.lane = parent.lane
            self.lanes = None
        else:
            _take_lane(self, thread, state)
        self.start_ns = state.now_ns()
        if state.on_start is not None:
            _call_on_start(self, effective_context(_frame_get(), state.ctx_get()))

    def finish(self, end_ns: int, exc: BaseException | None = None, keep: bool = False,
               hold: bool = False) -> None:
        """Close a record started with :meth:`begin_detached` and queue it for export.

        ``hold``: close it but let the caller queue it later (device timing resolves first).
        """
        if self.end_ns:
            return
        self.end_ns = end_ns
        if exc is not None:
            self._set_error(exc)
        lanes = self.lanes
        if lanes is not None:
            heappush(lanes, self.lane)
        if not hold:
            push(self, keep or self.kept)

    # -- the record's ids (``get_span_context`` of opentelemetry.trace.Span) ---------------
    def get_span_context(self) -> SpanContext:
        """The record's ``SpanContext``: its ids are drawn the first time anything asks (a
        child, another instrumentation, the exporter), under its parent's trace."""
        sc: SpanContext | None = getattr(self, "_sc", None)
        if sc is not None:
            return sc
        parent = self.parent if hasattr(self, "parent") else None
        # sampled or not is decided once per trace, by its root (rltrace.pipeline.sampling); spans under
        # an rltrace parent inherit its flags, spans under a foreign span follow the sampler
        state = STATE
        sampling = state.sampling
        if parent is None:
            trace_id = 0
            flags = _SAMPLED
        elif isinstance(parent, RecordBase):  # its SpanContext's fields 0 and 3, no properties
            psc = parent.get_span_context()
            trace_id = psc[0]
            flags = psc[3]
        else:
            psc = parent.get_span_context()
            trace_id = psc.trace_id
            flags = psc.trace_flags if psc.trace_flags.sampled else _UNSAMPLED
        with state.id_lock:  # ids are drawn once, whichever thread asks first
            sc = getattr(self, "_sc", None)
            if sc is None:
                bits = state.rand_bits
                trace_id = trace_id or bits(128) or 1
                if sampling is not None and not isinstance(parent, RecordBase):
                    flags = sampling.flags(self, trace_id, parent)
                sc = self._sc = new_span_context(trace_id, bits(64) or 1, flags)
        return sc


class Scope(ScopeCore, Span):
    """A traced region: the context manager returned by ``trace_scope`` and the span record.

    It is a real :class:`opentelemetry.trace.Span` while open (other instrumentation can read
    its ``SpanContext``, set attributes, add events) and becomes an SDK ``ReadableSpan`` when
    the exporter thread picks it up.  Ids are drawn lazily, the first time anything asks for
    the ``SpanContext`` (a child, another instrumentation, or the exporter thread), so the hot
    path draws none.  Rarely used fields live in ``extra`` (None until needed): ``events``
    (name, ts, args, category) tuples, ``error`` (type, message, stack), ``attrs``,
    ``status`` and ``instant``.
    """

    __slots__ = ()  # the fields are ScopeCore's
    #: the record keeps attributes in slots of its own (sessions, tasks, phases) and builds
    #: them in :meth:`record_attrs`; a plain scope's are all in ``extra``
    slot_attrs = False
    #: never dropped under overload (tasks, sessions, phases: the session records' input)
    kept = False

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)

    def begin_detached(self, parent: Any = None, *, from_context: bool = True,
                       share_lane: bool = False) -> None:
        """Start without entering the context (generators, sessions, phases).

        The parent is the current span (``from_context``) or ``parent``.  The record gets a
        lane of its own unless ``share_lane`` and the parent is an rltrace scope opened in
        this same thread and asyncio task (then it nests inside the parent's lane).
        """
        if from_context:
            parent = current_span()
        if parent is not None and not isinstance(parent, RecordBase):
            if not parent.get_span_context().is_valid:
                parent = None
            share_lane = False
        self._start_under(parent, share_lane)

    def _restore_parent(self, token: Token[Any]) -> None:
        """Exited in another context than it was entered in: where it is still the current
        record, the frame it was made current over becomes current again."""
        frame = _frame_get()
        if frame is not None and frame[0] is self:
            old = token.old_value
            _frame_set(None if old is Token.MISSING else old)

    def _set_error(self, exc: BaseException) -> None:
        etype = type(exc)
        name = etype.__qualname__
        if etype.__module__ not in ("builtins", "__main__"):
            name = f"{etype.__module__}.{name}"
        try:
            stack = "".join(traceback.format_exception(etype, exc, exc.__traceback__))
        except Exception:
            stack = ""
        try:
            message = str(exc)
        except Exception:  # a raising __str__ must not replace the exception leaving the scope
            message = f"<unprintable {name}>"
        self.extras()["error"] = (name, message, stack)

    def record_attrs(self) -> dict[str, Any] | None:
        """The record's own attributes (set by rltrace or through ``set_attribute``), if any.

        Session, task and phase records keep their fields in slots on the hot path and build
        this dict here, on the exporter thread, once they are finished.
        """
        extra = self.extra
        return extra.get("attrs") if extra is not None else None

    def own_step(self) -> Any:
        """The ``rl.step`` this record itself carries (not inherited), or None."""
        extra = self.extra
        if extra is not None:
            attrs = extra.get("attrs")
            if attrs is not None:
                return attrs.get(ATTR_STEP)
        return None

    def extras(self) -> dict[str, Any]:
        """The record's rarely used fields, created on first use."""
        extra = self.extra
        if extra is None:
            extra = self.extra = {}
        return extra

    # -- opentelemetry.trace.Span ---------------------------------------------------------
    def is_recording(self) -> bool:
        return self.end_ns == 0

    # Writes through the OTel ``Span`` API after the span ended are ignored, as the SDK does
    # (one warning, then counted in ``diagnostics()["span_api"]``): the record may already be
    # on its way to the exporters.

    def set_attribute(self, key: str, value: object) -> None:
        if self.end_ns:
            _after_end(self, "set_attribute")
            return
        if type(key) is not str:
            key = text(key, STATE.kinds)  # OTel keys are strings; the key's own code never runs
        self.extras().setdefault("attrs", {})[key] = recorded_value(value, STATE.kinds)

    def set_attributes(self, attributes: Mapping[str, object] | None) -> None:
        if attributes is None:
            return
        for k, v in recorded(attributes, STATE.kinds).items():  # any mapping, never its code
            self.set_attribute(k, v)

    def add_event(self, name: str, attributes: Mapping[str, object] | None = None,
                  timestamp: int | None = None) -> None:
        if self.end_ns:
            _after_end(self, "add_event")
            return
        extra = self.extra
        events = extra.get("events") if extra is not None else None
        span_api = STATE.span_api
        if events is not None and len(events) >= span_api.max_events:
            span_api.dropped_events += 1  # bounded memory: the span limits' event count
            return
        self._event(name if type(name) is str else text(name, STATE.kinds),
                    timestamp if timestamp is not None else STATE.now_ns(),
                    recorded(attributes, STATE.kinds) if attributes is not None else None, None)

    def _event(self, name: str, ts: int, attrs: Mapping[str, object] | None,
               category: object) -> None:
        self.extras().setdefault("events", []).append((name, ts, attrs, category))

    def update_name(self, name: str) -> None:
        if self.end_ns:
            _after_end(self, "update_name")
            return
        self.name = name if type(name) is str else text(name, STATE.kinds)  # never its __str__

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_ns:
            _after_end(self, "set_status")
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        self.extras()["status"] = status

    def record_exception(
        self, exception: BaseException, attributes: Mapping[str, object] | None = None,
        timestamp: int | None = None, escaped: bool = False,
    ) -> None:
        if self.end_ns:
            _after_end(self, "record_exception")
            return
        self._set_error(exception)

    def end(self, end_time: int | None = None) -> None:
        if self.end_ns == 0 and hasattr(self, "start_ns"):
            self.finish(end_time if end_time is not None else STATE.now_ns())

    def __repr__(self) -> str:
        return f"<rltrace scope {self.name!r}>"




#: the class every rltrace record derives from.  ``Scope`` adds OTel's ``Span``, an ABC, so
#: ``isinstance(x, Scope)`` runs ``ABCMeta.__instancecheck__``; ``isinstance(x, RecordBase)`` is
#: a plain type check with the same answer (nothing derives from the core but ``Scope``)
if TYPE_CHECKING:
    RecordBase = Scope
else:
    RecordBase = ScopeCore


def _after_end(span: Scope, method: str) -> None:
    span_api = STATE.span_api
    span_api.writes_after_end += 1
    if span_api.writes_after_end == 1:
        logger.warning("rltrace: %s on span %r after it ended is ignored (as the OTel SDK does); "
                       "further ones are counted in rltrace.diagnostics()['span_api']",
                       method, span.name)


class NoopScope(NonRecordingSpan):
    """What the API returns while tracing is disabled: a do-nothing (async) context manager."""

    __slots__ = ()

    def __enter__(self) -> NoopScope:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> NoopScope:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class TracedScope(Protocol):
    """What :func:`trace_scope` returns: a sync and async context manager yielding the span (an
    OTel :class:`~opentelemetry.trace.Span`: rltrace's record, or a no-op one while disabled)."""

    def __enter__(self) -> Span: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None, /) -> None: ...

    async def __aenter__(self) -> Span: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None, /) -> None: ...


NOOP = NoopScope(INVALID_SPAN_CONTEXT)


def attach(span: Any) -> Any:
    """Make ``span`` (an rltrace record) the current span, as a frame over the OTel context
    (what ``opentelemetry.context.get_current()`` then answers has it as its span); returns
    the token for :func:`detach`."""
    return _frame_set([span, STATE.ctx_get(), None])


def detach(token: Any) -> None:
    """Undo :func:`attach` (tolerates a token from another context: nothing to undo there)."""
    if token is None:
        return
    try:
        _frame_reset(token)
    except (ValueError, RuntimeError):
        pass


def current_scope() -> Scope | None:
    """The innermost open rltrace scope in this context, if any."""
    span = current_span()
    return span if isinstance(span, RecordBase) else None


def current_span() -> Any:
    """The current span (rltrace's or another instrumentation's): the frame's record while
    the OTel context is the one it was made current over, else the OTel context's span."""
    frame = _frame_get()
    ctx = STATE.ctx_get()
    if frame is not None and frame[1] is ctx:
        return frame[0]
    return ctx.get(_SPAN_KEY)


def record_instant(name: str, category: object, args: dict[str, object] | None) -> None:
    """Attach an instant to the current span, or queue it as a zero-length span if none."""
    ts = STATE.now_ns()
    span = current_span()
    if isinstance(span, RecordBase) and span.end_ns == 0:
        span._event(name, ts, args, category)
        return
    if span is not None and span.is_recording():
        attrs = dict(args) if args else {}
        if category is not None:
            attrs["rl.category"] = category_name(category)
        span.add_event(name, attrs, ts)
        return
    rec = Scope(name, category, args)
    rec.extra = {"instant": True}
    rec.begin_detached()
    rec.start_ns = ts
    rec.finish(ts)
