"""AReaL ``perf_tracer`` compatibility namespace: ``from rltrace import perf_tracer``.

Every public name of AReaL's ``areal.utils.perf_tracer`` (1.0.x) is here, as a thin object over
rltrace's one pipeline per process (:mod:`rltrace.pipeline.loop`, :mod:`rltrace.sessions`,
:mod:`rltrace.spans`) -- not a second tracer:

* :func:`configure` returns a :class:`PerfTracer` (``save``, ``trace_scope``, ``instant``,
  ``session_tracer``, ``reset``...); calling it again without :func:`reset` raises
  ``RuntimeError`` as AReaL's does.  (:func:`rltrace.configure` keeps reconfiguring.)
* :func:`reset` flushes everything and shuts the pipeline down, so the next ``configure``
  starts afresh (AReaL drops unsaved events here; rltrace writes them).
* ``trace_scope``/``atrace_scope(..., enable_profiler=True, profiler_args=...)`` run
  ``torch.profiler`` around that one scope when its step (``args["global_step"]``, an
  enclosing scope's, or :func:`rltrace.step`) is in the config's ``profile_steps`` (AReaL's
  rule; a nested request while one runs is ignored).  The trace goes to
  ``{log_dir}/torch_profiler/[role-]step{n}-r{rank}-{scope}.json``, which ``rltrace convert``
  merges on the same epoch clock.
* ``trace_session_event("increment_counter", session_id=..., name=..., value=1)`` adds to the
  session record's ``counters``; ``SessionTraceEvent``, ``SessionTracer.record_event`` map
  onto rltrace's ``mark_*`` events.
* AReaL's data structures (``SessionRecord``, ``PhaseSpan``, ``PhaseSpec``, ``EventBinding``,
  ``FieldSpec``) exist with AReaL's fields, for reading the session files
  (:meth:`SessionRecord.from_dict`).

Names rltrace adds beyond AReaL (``trace_perf`` on generators, ``register_phase``, ``flush``,
``shutdown``...) are the rltrace functions themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rltrace import runtime as _runtime
from rltrace.config import SessionTracerConfig
from rltrace.config import TracerConfig as PerfTracerConfig
from rltrace.logdir.files import write_atomically
from rltrace.profiling import maybe_profiled, profile_path
from rltrace.readers.session_schema import SESSION_RECORD, Kind, RecordSchema, areal
from rltrace.recording.recorder import STATE, RecordBase
from rltrace.runtime import (
    RUNTIME,
    atrace_session_phase,
    flush,
    register_phase,
    register_session,
    register_task,
    save,
    session_context,
    shutdown,
    trace_session,
    trace_session_phase,
)
from rltrace.semconv import ATTR_POLICY_VERSION
from rltrace.sessions import get_session_id, get_task_id, set_session_id, set_task_id
from rltrace.spans import atrace_scope as _atrace_scope
from rltrace.spans import instant as _instant
from rltrace.spans import trace_perf
from rltrace.spans import trace_scope as _trace_scope

__all__ = [
    "GLOBAL_TRACER",
    "Category",
    "EventBinding",
    "FieldSpec",
    "PerfTraceCategory",
    "PerfTracer",
    "PerfTracerConfig",
    "PhaseSpan",
    "PhaseSpec",
    "SessionRecord",
    "SessionTraceEvent",
    "SessionTracer",
    "SessionTracerConfig",
    "atrace_scope",
    "atrace_session_phase",
    "configure",
    "flush",
    "get_session_id",
    "get_session_tracer",
    "get_task_id",
    "get_tracer",
    "instant",
    "is_configured",
    "register_phase",
    "register_session",
    "register_task",
    "reset",
    "save",
    "session_context",
    "set_session_id",
    "set_task_id",
    "shutdown",
    "trace_perf",
    "trace_scope",
    "trace_session",
    "trace_session_event",
    "trace_session_phase",
]


# ---- categories -------------------------------------------------------------------------------


class PerfTraceCategory(str, Enum):
    """AReaL's event categories (Chrome ``cat``, OTel ``rl.category``); any other string passes."""

    COMPUTE = "compute"
    COMM = "comm"
    IO = "io"
    SYNC = "sync"
    SCHEDULER = "scheduler"
    INSTR = "instr"
    MISC = "misc"

    def __str__(self) -> str:
        return self.value


Category = PerfTraceCategory

#: AReaL's spelled-out aliases (``"communication"`` is ``comm``...), matched case-insensitively
_ALIASES: Mapping[str, str] = MappingProxyType({
    "compute": "compute", "communication": "comm", "comm": "comm", "io": "io",
    "synchronization": "sync", "sync": "sync", "scheduling": "scheduler",
    "scheduler": "scheduler", "instrumentation": "instr", "instr": "instr", "misc": "misc",
})


def _category(category: PerfTraceCategory | str) -> PerfTraceCategory | str | None:
    if type(category) is str:
        found = _ALIASES.get(category)
        if found is None:
            found = _ALIASES.get(category.strip().lower())
        return found if found is not None else (category if category.strip() else None)
    return category


# ---- spans, with AReaL's per-scope torch.profiler ----------------------------------------------

def trace_scope(
    name: str, category: PerfTraceCategory | str | None = None, args: dict[str, object] | None = None,
    *, enable_profiler: bool = False, profiler_args: dict[str, object] | None = None,
    device_sync: bool | str | None = None, device_timing: str | None = None,
    annotate: bool | None = None,
) -> Any:
    """AReaL's ``trace_scope``: :func:`rltrace.trace_scope` plus ``enable_profiler``.

    ``enable_profiler=True`` runs ``torch.profiler.profile(**profiler_args)`` around this scope
    when its step (``args["global_step"]``, an enclosing scope's, or :func:`rltrace.step`) is
    in the config's ``profile_steps``, unless a profiler started this way is already running.
    AReaL's category aliases (``"communication"``, ``"instrumentation"``...) are accepted.
    """
    if category is not None:
        category = _category(category)
    scope = _trace_scope(name, category, args, device_sync=device_sync,
                         device_timing=device_timing, annotate=annotate)
    if enable_profiler:
        scope = maybe_profiled(scope, name, args, profiler_args)
    return _areal_version(scope, name, args) if args else scope


def atrace_scope(
    name: str, category: PerfTraceCategory | str | None = None, args: dict[str, object] | None = None,
    *, enable_profiler: bool = False, profiler_args: dict[str, object] | None = None,
    device_sync: bool | str | None = None, device_timing: str | None = None,
    annotate: bool | None = None,
) -> Any:
    """Async form of :func:`trace_scope` (``async with``)."""
    if category is not None:
        category = _category(category)
    scope = _atrace_scope(name, category, args, device_sync=device_sync,
                          device_timing=device_timing, annotate=annotate)
    if enable_profiler:
        scope = maybe_profiled(scope, name, args, profiler_args)
    return _areal_version(scope, name, args) if args else scope


#: AReaL's weight update scope: inside it AReaL's trainer (``rl_trainer.py``) sets every engine's
#: version to ``global_step + 1`` (``engine.set_version``), the version its rollouts then carry
AREAL_WEIGHT_UPDATE = "train.update_weights"


class _ScopeManager(Protocol):
    """A scope as a sync and async context manager (what :class:`_WeightUpdate` wraps)."""

    def __enter__(self) -> object: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None: ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None: ...


class _WeightUpdate:
    """AReaL's ``train.update_weights`` scope: when it ends without an error, the policy version
    becomes ``version`` (as AReaL's engines' do inside it), unless the process sets its own
    (:func:`rltrace.set_policy_version`)."""

    __slots__ = ("scope", "version")

    def __init__(self, scope: _ScopeManager, version: int) -> None:
        self.scope = scope
        self.version = version

    def __getattr__(self, name: str) -> Any:  # the scope's own API (set_attribute, ...)
        return getattr(self.scope, name)

    def __enter__(self) -> object:
        return self.scope.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        try:
            return self.scope.__exit__(exc_type, exc, tb)
        finally:
            self._updated(exc_type)

    async def __aenter__(self) -> object:
        return await self.scope.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        try:
            return await self.scope.__aexit__(exc_type, exc, tb)
        finally:
            self._updated(exc_type)

    def _updated(self, exc_type: type[BaseException] | None) -> None:
        if exc_type is None and not STATE.policy_version_set:
            STATE.policy_version = self.version


def _areal_version(scope: _ScopeManager, name: str, args: dict[str, object]) -> _ScopeManager:
    """AReaL's own notion of the policy version, where it is at hand: a scope of step
    ``args["global_step"]`` records the version in effect (``rl.policy.version``; the report
    takes a step's lowest as the version it trained with), and AReaL's weight update scope moves
    it to ``global_step + 1`` when it ends (:class:`_WeightUpdate`)."""
    step = args.get("global_step")
    if type(step) is not int or step < 0:
        return scope
    v = STATE.policy_version
    if v is not None and isinstance(scope, RecordBase):
        scope.set_attribute(ATTR_POLICY_VERSION, v)
    if name == AREAL_WEIGHT_UPDATE:
        return _WeightUpdate(scope, step + 1)
    return scope


def instant(name: str, category: PerfTraceCategory | str | None = None,
            args: dict[str, object] | None = None) -> None:
    """AReaL's ``instant``: a point in time (see :func:`rltrace.instant`); args are not modified."""
    if category is not None:
        category = _category(category)
    _instant(name, category, args)


# ---- session events ------------------------------------------------------------------------------


class SessionTraceEvent(str, Enum):
    """AReaL's session lifecycle events (``SessionTracer.record_event``)."""

    FINALIZED = "finalized"
    GENERATE_START = "generate_start"
    GENERATE_END = "generate_end"
    REWARD_START = "reward_start"
    REWARD_END = "reward_end"
    TOOLCALL_START = "toolcall_start"
    TOOLCALL_END = "toolcall_end"


def _event_method(event: SessionTraceEvent | str) -> str:
    value = event.value if isinstance(event, SessionTraceEvent) else str(event)
    return f"mark_{value}"


def increment_counter(name: str, value: int | float = 1, *, session_id: Hashable | None = None,
                      task_id: Hashable | None = None) -> int:
    """Add ``value`` to counter ``name`` of one open session (or of every open session of a task);
    the process's session registry's :meth:`~rltrace.sessions.registry.SessionRegistry.increment_counter`."""
    return RUNTIME.sessions.increment_counter(name, value, session_id=session_id, task_id=task_id)


def trace_session_event(method: str, session_id: Hashable | None = None,
                        task_id: Hashable | None = None, **payload: Any) -> Any:
    """AReaL's ``trace_session_event``: rltrace's (see :func:`rltrace.trace_session_event`),
    ``"increment_counter"`` with ``name=`` and ``value=`` (default 1) included."""
    return _runtime.trace_session_event(method, session_id=session_id, task_id=task_id, **payload)


# ---- AReaL's data structures ------------------------------------------------------------------


@dataclass
class PhaseSpan:
    """One execution of a phase in a session record (epoch seconds)."""

    start_ts: float
    end_ts: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        """``{"start_ts": ..., "end_ts": ...}`` as in the session file."""
        return {"start_ts": self.start_ts, "end_ts": self.end_ts}


@dataclass(frozen=True)
class PhaseSpec:
    """AReaL's description of a tracked phase and the events bounding it.

    rltrace's own phase registry is :func:`register_phase` (:class:`rltrace.PhaseSpec`); this
    class exists for code that reads ``SessionRecord.PHASE_CONFIGS``.
    """

    name: str
    start_event: SessionTraceEvent
    end_event: SessionTraceEvent
    allow_multiple: bool = False
    ready_on_complete: bool = False
    on_end: Callable[[SessionRecord, dict[str, object]], None] | None = None


@dataclass(frozen=True)
class EventBinding:
    """AReaL's binding of a :class:`SessionTraceEvent` to a record update (informational)."""

    timestamp_attr: str | None = None
    phase: str | None = None
    role: str | None = None
    allow_multiple: bool = False
    payload_handler: Callable[[SessionRecord, dict[str, object]], None] | None = None
    mark_ready: bool = False


@dataclass(frozen=True)
class FieldSpec:
    """AReaL's description of one serialised session-record field."""

    attr: str | None = None
    key: str | None = None
    compute: Callable[[SessionRecord], object] | None = None
    omit_if_none: bool = True

    def resolve(self, record: SessionRecord) -> object:
        """The field's value for ``record``."""
        if self.compute is not None:
            return self.compute(record)
        if self.attr is None:
            raise ValueError("FieldSpec requires either attr or compute")
        return getattr(record, self.attr)

    def key_name(self) -> str:
        """The JSON key."""
        if self.key is not None:
            return self.key
        if self.attr is None:
            raise ValueError("FieldSpec without attr must define key")
        return self.attr


def _total(record: SessionRecord) -> float | None:
    return None if record.finalized_ts is None else record.finalized_ts - record.submit_ts


def _phase_total(record: SessionRecord, phase: str) -> float | None:
    spans = [s.end_ts - s.start_ts for s in record.phases.get(phase, []) if s.end_ts is not None]
    return sum(spans) if spans else None


@dataclass
class SessionRecord:
    """One line of ``session_tracer/[role/]sessions-r{rank}.jsonl`` with AReaL's fields.

    rltrace writes these records itself (:class:`rltrace.SessionMetricsProcessor`); this class
    reads them back (:meth:`from_dict`) for code written against AReaL.  Fields rltrace adds
    (``trace_id``, ``turns``, ``phase_counts``, ``<phase>_s``...) are kept in ``extra``.
    """

    task_id: Hashable | None
    session_id: Hashable
    rank: int
    role: str | None
    submit_ts: float
    status: str = "pending"
    reason: str | None = None
    finalized_ts: float | None = None
    phases: dict[str, list[PhaseSpan]] = field(default_factory=dict)
    counters: dict[str, int | float] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict, repr=False)

    PHASE_CONFIGS: ClassVar[tuple[PhaseSpec, ...]] = ()
    FIELD_SPECS: ClassVar[tuple[FieldSpec, ...]] = ()

    @classmethod
    def default_phase_configs(cls) -> tuple[PhaseSpec, ...]:
        """generate, reward and toolcall, each allowed many times per session."""
        E = SessionTraceEvent
        return (PhaseSpec("generate", E.GENERATE_START, E.GENERATE_END, allow_multiple=True),
                PhaseSpec("reward", E.REWARD_START, E.REWARD_END, allow_multiple=True),
                PhaseSpec("toolcall", E.TOOLCALL_START, E.TOOLCALL_END, allow_multiple=True))

    @classmethod
    def default_field_specs(cls, schema: RecordSchema = SESSION_RECORD) -> tuple[FieldSpec, ...]:
        """AReaL's serialised fields, in AReaL's order: the ``areal`` fields of the session
        record's schema (:mod:`rltrace.readers.session_schema`) but ``phases`` and ``counters``, which
        :meth:`to_dict` writes itself."""
        specs = []
        for f in areal(schema):
            if f.kind is Kind.PHASES or f.kind is Kind.COUNTERS:
                continue
            if not f.derived:
                specs.append(FieldSpec(f.name))
            elif f.name == "total_s":
                specs.append(FieldSpec(compute=_total, key=f.name))
            else:  # ``<phase>_s``
                specs.append(FieldSpec(compute=functools.partial(_phase_total, phase=f.name[:-2]),
                                       key=f.name))
        return tuple(specs)

    def is_ready_to_flush(self) -> bool:
        """Whether the session is final (AReaL's rule)."""
        return self.status in ("rejected", "failed", "dropped") or (
            self.status == "accepted" and self.finalized_ts is not None)

    def increment_counter(self, name: str, value: int = 1) -> None:
        """Add to a counter of this (in-memory) record."""
        self.counters[name] = self.counters.get(name, 0) + value

    def to_dict(self) -> dict[str, object]:
        """AReaL's serialised form (``None`` fields omitted, ``phases``/``counters`` when set)."""
        data: dict[str, object] = {}
        for spec in self.FIELD_SPECS:
            value = spec.resolve(self)
            if not (spec.omit_if_none and value is None):
                data[spec.key_name()] = value
        if any(self.phases.values()):
            data["phases"] = {k: [s.to_dict() for s in v] for k, v in self.phases.items() if v}
        if any(self.counters.values()):
            data["counters"] = {k: v for k, v in self.counters.items() if v}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionRecord:
        """A record from one line of a session file (rltrace's or AReaL's)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"phases", "counters", "extra"}
        phases = {name: [PhaseSpan(float(s["start_ts"]), s.get("end_ts")) for s in spans]
                  for name, spans in (data.get("phases") or {}).items()}
        given: dict[str, Any] = {k: data.get(k) for k in known if k not in ("status",)}
        return cls(
            **given,
            status=data.get("status", "pending"), phases=phases,
            counters=dict(data.get("counters") or {}),
            extra={k: v for k, v in data.items() if k not in known | {"phases", "counters"}},
        )


SessionRecord.PHASE_CONFIGS = SessionRecord.default_phase_configs()
SessionRecord.FIELD_SPECS = SessionRecord.default_field_specs()


# ---- the tracer objects ---------------------------------------------------------------------------


class SessionTracer:
    """AReaL's per-session tracer, as a handle on rltrace's session tracing.

    Records go to the configured pipeline's ``session_tracer/[role/]sessions-r{rank}.jsonl``;
    ``output_path`` is accepted for AReaL's signature and reported as ``_output_path``.
    """

    def __init__(self, config: object = None, *, output_path: str | None = None, rank: int = 0,
                 role: str | None = None) -> None:
        self._config = config
        self._output_path = output_path
        self._rank = rank
        self._role = role
        self._flush_threshold = max(1, int(getattr(config, "flush_threshold", 1) or 1))

    def register_task(self, task_id: Hashable | None) -> None:
        """Register a task (one dataset item)."""
        register_task(task_id)

    def register_session(self, task_id: Hashable | None) -> Hashable:
        """Register a session under ``task_id``; returns the new session id."""
        return register_session(task_id)

    def get_session_ids(self, task_id: Hashable) -> list[Hashable]:
        """Ids of the task's sessions that are still open."""
        return [s.session_id for s in RUNTIME.sessions.open_sessions(task_id)]

    def record_event(self, session_id: Hashable, event: SessionTraceEvent | str, **payload: object) -> None:
        """Apply one lifecycle event (``FINALIZED`` takes ``status=`` and ``reason=``)."""
        trace_session_event(_event_method(event), session_id=session_id, **payload)

    def increment_counter(self, session_id: Hashable, name: str, value: int = 1) -> None:
        """Add ``value`` to counter ``name`` of one open session."""
        increment_counter(name, value, session_id=session_id)

    def flush(self, force: bool = False) -> None:
        """Write every finished session record now (open sessions are written when they end)."""
        flush()

    def reset(self) -> None:
        """Flush (AReaL also forgets the records; rltrace keeps no finished ones)."""
        flush()


class PerfTracer:
    """AReaL's ``PerfTracer``: configures rltrace's pipeline for this process and handles it.

    There is one pipeline per process: constructing a ``PerfTracer`` (re)configures it, and
    the most recent one is the active tracer (older instances' calls go to it as well).
    ``config`` is AReaL's ``PerfTracerConfig`` (or rltrace's, a dict, a DictConfig, a YAML
    path); ``rank`` defaults from the environment as in :func:`rltrace.configure`.
    """

    def __init__(self, config: object = None, *, rank: int | None = None, role: str | None = None,
                 **overrides: Any) -> None:
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
            raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
        cfg = _runtime.configure(config, rank=rank, role=role, **overrides)
        self._bind(config, cfg)

    @classmethod
    def _of_current_pipeline(cls) -> PerfTracer:
        obj = cls.__new__(cls)
        cfg = RUNTIME.config
        obj._bind(cfg, cfg)  # type: ignore[arg-type]
        return obj

    def _bind(self, config: object, cfg: PerfTracerConfig) -> None:
        p = RUNTIME.pipeline
        self._config = config
        self._cfg = cfg
        self._pipeline = p
        self._rank = p.rank if p is not None else (cfg.rank or 0)
        self._role = cfg.role
        self._pid = os.getpid()
        self._save_interval = cfg.save_interval
        self._profile_steps = frozenset(cfg.profile_steps or ())
        self._output_path = str(p.chrome_path) if p is not None and p.chrome_path else None
        self._session_tracer: SessionTracer | None = None
        if p is not None and p.session_processor is not None:
            self._session_tracer = SessionTracer(
                cfg.session_tracer, rank=self._rank, role=self._role,
                output_path=str(p.sessions_path) if p.sessions_path else None)

    def _active(self) -> bool:
        return self._pipeline is not None and RUNTIME.pipeline is self._pipeline

    @property
    def enabled(self) -> bool:
        """Whether spans are being recorded by this tracer's pipeline."""
        return self._active() and RUNTIME.state.enabled

    def set_enabled(self, flag: bool) -> None:
        """Pause (False) or resume (True) span recording; session tracing is unaffected."""
        if self._active():
            RUNTIME.state.enabled = bool(flag) and self._cfg.enabled

    @property
    def session_tracer(self) -> SessionTracer | None:
        """The session tracer, when ``session_tracer.enabled``."""
        return self._session_tracer

    def trace_scope(self, name: str, *, category: PerfTraceCategory | str | None = None,
                    enable_profiler: bool = False, profiler_args: dict[str, object] | None = None,
                    args: dict[str, object] | None = None) -> Any:
        """See the module-level :func:`trace_scope`."""
        return trace_scope(name, category, args, enable_profiler=enable_profiler,
                           profiler_args=profiler_args)

    def atrace_scope(self, name: str, *, category: PerfTraceCategory | str | None = None,
                     enable_profiler: bool = False, profiler_args: dict[str, object] | None = None,
                     args: dict[str, object] | None = None) -> Any:
        """See the module-level :func:`atrace_scope`."""
        return atrace_scope(name, category, args, enable_profiler=enable_profiler,
                            profiler_args=profiler_args)

    def instant(self, name: str, *, category: PerfTraceCategory | str | None = None,
                args: dict[str, object] | None = None) -> None:
        """See the module-level :func:`instant`."""
        instant(name, category, args)

    def save(self, *, step: int | None = None, force: bool = False) -> None:
        """Flush to disk when ``force``, without ``step``, or when ``(step + 1) % save_interval == 0``."""
        save(step, force)

    def reset(self) -> None:
        """Write everything recorded so far and shut this tracer's pipeline down."""
        active = RUNTIME.part(_ActiveTracer)
        with active.lock:
            if active.tracer is self:
                active.tracer = None
        if self._active():
            shutdown()

    def merge_profiler_trace(self, profiler_traces: dict[str, Any], base_time_ns: int, *,
                             args: dict[str, object] | None = None) -> Path | None:
        """Add a ``torch.profiler`` Chrome trace (a loaded dict) to this run's output.

        ``base_time_ns`` is the ``time.perf_counter_ns()`` at which profiling started (AReaL's
        convention).  The trace is written to ``{log_dir}/torch_profiler/`` with a
        ``baseTimeNanoseconds`` on the epoch clock, so ``rltrace convert`` merges it aligned.
        """
        events = profiler_traces.get("traceEvents") if isinstance(profiler_traces, dict) else None
        if not events:
            return None
        ts = [e["ts"] for e in events if isinstance(e, dict) and isinstance(e.get("ts"), (int, float))]
        if not ts:
            raise RuntimeError("Profiler trace events do not contain timestamps ('ts' field).")
        epoch_start = time.time_ns() - (time.perf_counter_ns() - base_time_ns)
        doc = dict(profiler_traces)
        doc["baseTimeNanoseconds"] = epoch_start - int(min(ts) * 1000)
        step = (args or {}).get("global_step", "x")
        path = profile_path("merged", step)
        # never through a link or another user's folder (the log dir's guard)
        write_atomically(path, json.dumps(doc, default=str).encode(),
                         guard=RUNTIME.guarded)
        return path


class _ActiveTracer:
    """The tracer this namespace configured (AReaL's ``GLOBAL_TRACER``), held by the runtime
    (``RUNTIME.part``) so that the module keeps no state of its own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tracer: PerfTracer | None = None

    def after_fork_in_child(self) -> None:
        """Another thread may have held the lock at fork time."""
        self.lock = threading.Lock()


def configure(config: object = None, *, rank: int | None = None, role: str | None = None,
              **overrides: Any) -> PerfTracer:
    """AReaL's ``configure``: set up the process's tracer once and return it.

    Raises ``RuntimeError`` when this namespace already configured a tracer that is still
    active: call :func:`reset` first (AReaL's rule; :func:`rltrace.configure` reconfigures
    instead).  A pipeline set up with :func:`rltrace.configure` is replaced.
    """
    active = RUNTIME.part(_ActiveTracer)
    with active.lock:
        if active.tracer is not None and active.tracer._active():
            raise RuntimeError("PerfTracer has already been configured. Call perf_tracer.reset() "
                               "before configuring again (or rltrace.configure() to reconfigure).")
        tracer = active.tracer = PerfTracer(config, rank=rank, role=role, **overrides)
        return tracer


def is_configured() -> bool:
    """True while a pipeline is configured (through this namespace or :func:`rltrace.configure`)."""
    return _runtime.is_configured()


def get_tracer() -> PerfTracer:
    """The configured tracer; ``RuntimeError`` when none is (call :func:`configure` first)."""
    tracer = RUNTIME.part(_ActiveTracer).tracer
    if tracer is not None and tracer._active():
        return tracer
    if _runtime.is_configured():
        return PerfTracer._of_current_pipeline()
    raise RuntimeError("PerfTracer is not configured. Call perf_tracer.configure(...) first.")


def get_session_tracer() -> SessionTracer | None:
    """The session tracer of the configured tracer, or None (not configured or sessions off)."""
    if not _runtime.is_configured():
        return None
    return get_tracer().session_tracer


def reset() -> None:
    """Write everything recorded so far and shut tracing down, so ``configure`` may run again."""
    active = RUNTIME.part(_ActiveTracer)
    with active.lock:
        active.tracer = None
    shutdown()


if TYPE_CHECKING:
    #: the tracer :func:`configure` set up (None before, or after :func:`reset`)
    GLOBAL_TRACER: PerfTracer | None


def __getattr__(name: str) -> object:
    """``GLOBAL_TRACER`` is the tracer :func:`configure` set up (None before, or after
    :func:`reset`), read from the runtime; ``profiler`` is ``torch.profiler``, imported on first
    use (AReaL's module exposes both)."""
    if name == "GLOBAL_TRACER":
        return RUNTIME.part(_ActiveTracer).tracer
    if name == "profiler":  # AReaL's module exposes ``torch.profiler`` as ``profiler``
        import torch.profiler

        return torch.profiler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
