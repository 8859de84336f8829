"""The runtime: the one object that owns a process's tracing state and its lifecycle.

``configure()`` builds a :class:`~rltrace.pipeline.loop.Pipeline` (the export loop), switches the
recorder and the session registry on and wraps OpenTelemetry's runtime context so that OTel code
sees rltrace's records as current spans; ``shutdown()`` (also at interpreter exit and on SIGTERM)
flushes, switches them off and gives OpenTelemetry its own runtime context back; a fork re-arms
everything in the child through one ordered hook, registered at the first ``configure()``.
Importing rltrace changes nothing outside it.
The module functions at the bottom (``configure``, ``flush``, ``register_session``,
``register_phase``, ...) are bound to the process's runtime, :data:`RUNTIME`.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

from rltrace.accounting.counters import Counters
from rltrace.config import ConfigError, TracerConfig, load_config
from rltrace.device import HeldEvents
from rltrace.logdir import layout as logdir_room
from rltrace.logdir.files import GuardedDirs
from rltrace.pipeline.fair_lock import FairRLock
from rltrace.pipeline.loop import Pipeline
from rltrace.pipeline.readable_spans import bound
from rltrace.process.children import ChildConfig, parent_config
from rltrace.process.ranks import detect_rank
from rltrace.process.signals import TerminationHandler
from rltrace.process.tracer_provider import DelegatingTracerProvider
from rltrace.recording import otel_context, recorder
from rltrace.recording.arguments import check_optional_int
from rltrace.recording.recorder import _noop, internal_error
from rltrace.seams import RecordProcessor, Sinks, SupportsOnRecord, as_record_processor
from rltrace.sessions import SessionRegistry, flight
from rltrace.sessions.phases import PhaseRegistry

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace.sampling import Sampler

logger = logging.getLogger("rltrace")

_PartT = TypeVar("_PartT")

_FINAL_SWITCH_INTERVAL = 1e6  # seconds: no other thread is scheduled until this one blocks


class Runtime:
    """The owner of a process's tracing state.

    It owns the recorder's switchboard (:class:`~rltrace.recording.recorder.RecorderState`: the queue,
    its bounds, the hot path's on/off), the phase registry, the session registry, the
    :class:`~rltrace.pipeline.loop.Pipeline` each ``configure`` builds, what is kept across
    reconfiguration (the user's span and record processors), and the process's lifecycle: exit,
    SIGTERM (:class:`~rltrace.process.signals.TerminationHandler`), fork (one ordered hook) and what
    spawned children inherit (:class:`~rltrace.process.children.ChildConfig`).

    The process has one, :data:`RUNTIME`, made over the recorder's :data:`~rltrace.recording.recorder.STATE`
    (the one state the hot path reads); ``rltrace.configure``, ``flush``, ``register_session``,
    ``register_phase``, ... are bound methods of it and of its registries, as Logfire binds its
    module functions to a default instance.  A second instance (``Runtime()``) has a state of
    its own that no ``trace_scope`` writes to: it is for inspection and tests that do not record.
    """

    def __init__(self, *, state: recorder.RecorderState | None = None,
                 sessions: SessionRegistry | None = None,
                 phases: PhaseRegistry | None = None) -> None:
        #: the hot path's switches and queue (the default runtime's is ``recorder.STATE``)
        self.state = state if state is not None else recorder.RecorderState()
        if self.state.held_events is None:
            self.state.held_events = HeldEvents()
        #: the phases sessions may run
        self.phases = phases if phases is not None else \
            sessions.phases if sessions is not None else PhaseRegistry()
        #: the session registry ``configure`` switches on
        self.sessions = sessions if sessions is not None else SessionRegistry(self.phases)
        self.lock = FairRLock()
        self.pipeline: Pipeline | None = None
        #: the log dirs whose folders every open of their files re-checks (each ``configure``
        #: declares its own; kept across reconfiguration and fork, as the files stay there)
        self.guarded = GuardedDirs()
        #: what the pipeline writes its local files with, given by the composer (``rltrace``'s
        #: public face hands it :func:`rltrace.exporters.defaults.default_sinks`)
        self.sinks: Sinks | None = None
        self.config: TracerConfig | None = None
        self.user_processors: list[SpanProcessor] = []
        self.user_record_processors: list[RecordProcessor | SupportsOnRecord] = []
        #: the user's counters (``rltrace.counter``), kept across reconfiguration
        self.counters = Counters()
        self.children = ChildConfig()
        self.termination = TerminationHandler(self._drain, self._main_holds_lock)
        self._global_set = False
        self._atexit = False
        self._mp_hooked = False
        self._parts: dict[type[Any], Any] = {}
        #: guards the making of parts (never the flush/close lock, which configure and shutdown
        #: hold for seconds) and the registration of the fork hook
        self._parts_lock = threading.Lock()
        self._fork_lock = threading.Lock()
        #: unknown RLTRACE_* variables already warned about (once per name and process)
        self.env_warned: set[str] = set()
        #: whether this process registered the runtime's fork hook (at the first ``configure``;
        #: ``os.register_at_fork`` cannot be undone, and a forked child inherits it)
        self._fork_hooked = False

    def part(self, kind: type[_PartT]) -> _PartT:
        """The runtime's one instance of ``kind``, made (``kind()``) on first use.

        This is how a room above the runtime (statistics, the AReaL namespace, Ray, the framework
        integrations) keeps process state without a module-level object: its state is a small
        class of its own, and the runtime holds the one instance.  A part with an
        ``after_fork_in_child()`` method has it called in a forked child, after the runtime's own.
        """
        try:
            return self._parts[kind]  # type: ignore[no-any-return]
        except KeyError:
            pass
        self._arm_fork_hook()  # a part holds locks: a child forked from now on gets fresh ones
        with self._parts_lock:
            return self._parts.setdefault(kind, kind())  # type: ignore[no-any-return]

    def _sinks(self) -> Sinks:
        if self.sinks is None:
            raise ConfigError("rltrace: this Runtime has no sinks to write its files with; give it "
                              "some first: runtime.sinks = rltrace.exporters.defaults.default_sinks()")
        return self.sinks

    def _current_provider(self) -> TracerProvider | None:
        p = self.pipeline
        return p.provider if p is not None else None

    # ---- configure ---------------------------------------------------------------------------

    def configure(
        self,
        config: TracerConfig | Mapping[str, Any] | str | os.PathLike[str] | Any | None = None,
        *,
        rank: int | None = None,
        role: str | None = None,
        metric_readers: list[MetricReader] | None = None,
        sampler: Sampler | None = None,
        clock: Callable[[], int] | None = None,
        id_generator: IdGenerator | None = None,
        **overrides: Any,
    ) -> TracerConfig:
        """Configure tracing for this process (call once per rank; calling again reconfigures).

        ``config`` is a :class:`~rltrace.config.TracerConfig`, a dict, any dataclass with the
        same keys (AReaL's ``PerfTracerConfig``), or a YAML path; ``RLTRACE_*`` environment
        variables and keyword ``overrides`` (nested keys as ``session_tracer__enabled=True``)
        win over it.  Rank and world size default from ``RANK``/``WORLD_SIZE``,
        torch.distributed or JAX.  Rank 0 writes the effective config to
        ``{log_dir}/config.yaml``.  ``metric_readers`` (OTel ``MetricReader`` objects) receive
        the session metrics.  ``sampler`` (an OTel SDK ``Sampler``) decides which traces are
        sent over OTel, once per trace (see :mod:`rltrace.pipeline.sampling`; the local files always get
        everything).  ``clock`` (epoch nanoseconds, ``time.time_ns`` by default) and
        ``id_generator`` (an OTel ``IdGenerator``; random by default) are this pipeline's:
        every rltrace record takes its times and ids from them, spans other instrumentation
        starts through its tracer provider their ids (``rltrace.testing.IncrementingClock``
        and ``SequentialIdGenerator`` make runs reproducible); a later ``configure`` without
        them, or :func:`shutdown`, goes back to the defaults.  Raises
        :class:`~rltrace.config.ConfigError` for bad input; the previous pipeline is left
        intact in that case.
        """
        self._arm_fork_hook()
        try:
            return self._configure(config, rank=rank, role=role, metric_readers=metric_readers,
                                   sampler=sampler, clock=clock, id_generator=id_generator,
                                   **overrides)
        finally:
            if self.termination.pending:
                self.termination.resume_pending()

    def _configure(self, config: Any, *, rank: int | None, role: str | None,
                   metric_readers: list[MetricReader] | None, sampler: Sampler | None = None,
                   clock: Callable[[], int] | None = None,
                   id_generator: IdGenerator | None = None, **overrides: Any) -> TracerConfig:
        reg, state = self.sessions, self.state
        with self.lock:
            _check_injected(clock, id_generator)
            state.follow_context(install=False)
            cfg = load_config(config, rank=rank, role=role, warned=self.env_warned, **overrides)
            rk, world = detect_rank(cfg.rank, cfg.world_size)
            new: Pipeline | None = None
            if cfg.enabled or cfg.session_tracer.enabled:
                logdir = logdir_room.prepare(cfg, self.guarded)
                ring = self.pipeline.flight if self.pipeline is not None else None
                _recover_killed_runs(logdir, () if ring is None else (ring.ring_id,))
                new = Pipeline(cfg, rk, world, logdir, self.user_processors, metric_readers,
                               sampler, clock=clock, id_generator=id_generator, registry=reg,
                               state=state, counters=self.counters,
                               user_record_processors=self.user_record_processors,
                               on_unlock=self.termination.resume_pending, sinks=self._sinks(),
                               guard=self.guarded)
                if rk == 0 and not cfg.per_process_files:
                    logdir_room.write_config(logdir, cfg, world, self.guarded)
            old = self.pipeline
            if old is not None:
                state.enabled = False
                old.close()
            self.pipeline, self.config = new, cfg
            _use_injected(state, new, old)
            state.sampling = new.head_sampling if new is not None else None
            state.on_start = new.on_start_hooks if new is not None else None
            reg.switched_off(None if cfg.session_tracer.enabled or new is None else
                             "session_tracer.enabled is false in the config")
            if new is None:
                state.release_context()
                state.enabled = False
                state.device = None
                reg.enabled = False
                state.wake = _noop
                state.help = _noop
                state.overflow = None
                return cfg
            state.cap = cfg.max_queue_size
            state.dropped = 0  # counts are per pipeline; the old one reported its own at close
            state.held_events.reset_counts()
            reg.misuse.clear()
            tuning = cfg.export_tuning
            state.wake_at = max(1, min(tuning.wake_at, cfg.max_queue_size // 4))
            state.help_at = tuning.help_at
            state.mark = min(state.wake_at, tuning.help_at)
            state.wake = new.wake
            state.help = new.help
            state.overflow = new.overflow
            state.span_api.max_events = bound(new.builder.limits.max_events)
            state.follow_context(install=True)  # OTel code sees rltrace's records from now on
            new.start()
            state.device = new.device_defaults
            state.enabled = cfg.enabled
            reg.enabled = cfg.session_tracer.enabled
            if (cfg.set_global_provider and not self._global_set
                    and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)):
                trace.set_tracer_provider(DelegatingTracerProvider(self._current_provider))
                self._global_set = True
            if not self._atexit:
                atexit.register(self._at_exit)
                self._atexit = True
            if cfg.handle_sigterm:
                self.termination.install()
            self._hook_multiprocessing()
            self.children.publish(cfg, rk, world)
            return cfg

    # ---- children ----------------------------------------------------------------------------

    def configure_child(self, **overrides: Any) -> TracerConfig:
        """Configure a *spawned* child process (multiprocessing ``spawn``, a subprocess) like its
        parent.

        The parent's effective config (same log dir, rank, exporters) is passed through the
        environment by :func:`configure`; the child writes its own ``-p{pid}`` files.  Keyword
        overrides apply on top.  Raises :class:`~rltrace.config.ConfigError` when no parent
        configured rltrace.
        """
        data = parent_config()
        self.sessions.offset_ids(os.getpid())
        return self.configure(data, **overrides)

    def _hook_multiprocessing(self) -> None:
        """Flush in multiprocessing children before they leave through ``os._exit``.

        ``Process._bootstrap`` clears the finalizers a child inherits and then runs the
        after-fork hooks, so the exit flush is registered from such a hook.
        """
        if self._mp_hooked:
            return
        from multiprocessing import util

        def in_child(runtime: Runtime) -> None:
            if runtime.pipeline is not None:
                util.Finalize(None, runtime.shutdown, exitpriority=100)

        util.register_after_fork(self, in_child)
        self._mp_hooked = True

    # ---- SIGTERM -----------------------------------------------------------------------------

    def _main_holds_lock(self) -> bool:
        p = self.pipeline
        return self.lock.held_by_me() or (p is not None and p._lock.held_by_me())

    def _drain(self, final: bool) -> None:
        """Write every finished record to disk, on the calling (main) thread.

        ``final``: the process ends right after this returns.  Open sessions are written as
        pending, OTLP gets its bounded chance, and the last check that nothing is left runs
        with the GIL held until the caller's ``os.kill``: a record another thread finishes
        after that check cannot exist, because no other thread runs again.
        """
        p = self.pipeline
        if p is None:
            return
        state = self.state
        if final and p.otlp is not None:
            p.flush()
            timeout = p.cfg.otlp.timeout_s if p.cfg.otlp.timeout_s is not None else 5.0
            p.wait_otlp(timeout)  # bounded: the SDK's retries may outlast its timeout
        interval = sys.getswitchinterval()
        closed = not (final and self.sessions.enabled)
        with p._lock:  # fair: the exporter thread finishes the cycle it is in, then waits
            for _ in range(1000):  # bounded: other threads may keep recording while we write
                p.flush()
                if final:
                    sys.setswitchinterval(_FINAL_SWITCH_INTERVAL)
                if not state.buffer:
                    if closed:
                        if final and p.flight is not None:  # every record on disk: no ring left
                            p._close_flight(remove=True)  # (its syscalls let threads run: again)
                            continue
                        return  # final: the GIL stays with this thread until the process ends
                    # sessions still open now are written as pending (open phases closed);
                    # done last, so a session finalized while the records above were written
                    # keeps its own status
                    self.sessions.close_all()
                    closed = True
                    continue
                sys.setswitchinterval(interval)

    # ---- the public functions ----------------------------------------------------------------

    def is_configured(self) -> bool:
        """True while a pipeline is configured (span or session tracing enabled)."""
        return self.pipeline is not None

    def get_config(self) -> TracerConfig | None:
        """The effective config of the last ``configure`` call (None before it)."""
        return self.config

    def get_pipeline(self) -> Pipeline | None:
        """The active pipeline, if any (advanced use: log dir, provider, diagnostics)."""
        return self.pipeline

    def flush(self, wait_s: float = 0.0) -> None:
        """Export everything recorded so far, now, on this thread: the trace files and session
        records are written, and spans are handed to the OTLP sender (which sends them on its
        own thread).  ``wait_s`` > 0 also waits, at most that long, until the OTLP sender has
        sent what it holds (a dead collector costs that wait, never more)."""
        p = self.pipeline
        if p is not None:
            p.flush()
            if wait_s > 0 and p.otlp is not None:
                p.wait_otlp(wait_s)

    def save(self, step: int | None = None, force: bool = False) -> None:
        """AReaL's ``save``: flush when ``force``, when ``step`` is None, or on the last step of
        every ``save_interval`` (``(step + 1) % save_interval == 0``: steps 2, 5, 8, ... for 3)."""
        check_optional_int("save", "step", step)
        p = self.pipeline
        if p is None:
            return
        if force or step is None or (step + 1) % p.cfg.save_interval == 0:
            p.flush()

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush all buffered data and close the pipeline; tracing is off until ``configure``.

        ``timeout`` bounds the wait for locks held elsewhere (used from the SIGTERM handler,
        which may interrupt rltrace's own code on the main thread).
        """
        if not self.lock.acquire(timeout=-1 if timeout is None else timeout):
            return
        reg, state = self.sessions, self.state
        try:
            p = self.pipeline
            if p is not None and reg.enabled:
                reg.close_all()  # open sessions are written as pending, open phases closed
            state.enabled = False
            reg.enabled = False
            reg.switched_off(None)
            state.wake = state.help = _noop
            if p is not None:
                p.close(timeout)  # (its last records still draw ids under its sampler)
                _use_injected(state, None, p)
            state.release_context()  # OpenTelemetry's own runtime context again
            state.overflow = None
            state.sampling = state.on_start = state.device = None
            self.pipeline = None
        finally:
            self.lock.release()
        if self.termination.pending:
            self.termination.resume_pending()

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Add an OTel ``SpanProcessor`` that receives every span (kept across reconfiguration).

        ``on_start(span, parent_context)`` is called as each rltrace span starts, on the
        starting thread (the span is rltrace's live span: ``set_attribute``,
        ``get_span_context``, ``name``); ``on_end`` gets the finished span as a
        ``ReadableSpan`` from rltrace's exporter thread shortly after it ends.  Spans from other
        instrumentation follow the SDK's usual calls.  With no processor added, rltrace spans
        pay one attribute read for this.
        """
        with self.lock:
            self.user_processors.append(processor)
            p = self.pipeline
            if p is not None:
                p.add_user_processor(processor)
                self.state.on_start = p.on_start_hooks

    def remove_span_processor(self, processor: SpanProcessor) -> None:
        """Stop delivering spans to ``processor`` (counterpart of :meth:`add_span_processor`)."""
        with self.lock:
            if processor in self.user_processors:
                self.user_processors.remove(processor)
            p = self.pipeline
            if p is not None and processor in p.user_processors:
                p.user_processors.remove(processor)
                otel_context.remove_span_processor(p.processor, processor)
                p._refresh_direct()
                self.state.on_start = p.on_start_hooks

    def add_record_processor(self, processor: RecordProcessor | SupportsOnRecord) -> None:
        """Add a *record processor*: ``on_record(record)`` for every finished rltrace scope.

        Record processors run on the exporter thread before any ``ReadableSpan`` is built, so
        they cost the least (rltrace's own session metrics and stats bridge are record
        processors).  A record has ``name``, ``category``, ``args``, ``start_ns``, ``end_ns``,
        ``thread``, ``lane`` and ``extra``; ``record_attrs()`` gives its attributes (the
        ``rl.*`` attributes of tasks, sessions and phases, and any set through
        ``set_attribute``) and :func:`rltrace.steps.step_of` its training step.  A processor
        with ``on_records(records, on_error)`` is given each export cycle's records at once
        instead (in order; ``on_error(record, exc)`` for one it fails on, which is counted and
        not exported, as when ``on_record`` raises).  Kept across reconfiguration; an optional
        ``force_flush()`` runs on every explicit flush.  Subclass
        :class:`rltrace.RecordProcessor` (:mod:`rltrace.seams`) for every hook's default.
        """
        with self.lock:
            self.user_record_processors.append(processor)
            p = self.pipeline
            if p is not None:
                p.add_record_processor(processor)

    def remove_record_processor(self, processor: RecordProcessor | SupportsOnRecord) -> None:
        """Stop calling ``processor`` (counterpart of :meth:`add_record_processor`)."""
        with self.lock:
            if processor in self.user_record_processors:
                self.user_record_processors.remove(processor)
            p = self.pipeline
            if p is not None:
                p.remove_record_processor(processor)

    def summary(self) -> str:
        """The run summary so far: per-scope count/total/mean/p50/p99/share of wall, counters."""
        p = self.pipeline
        if p is None:
            return "rltrace is not configured"
        if p.summary is None:
            return "the run summary is not collected: configure rltrace with print_summary=True"
        p.flush()
        return p.summary.render()

    def tracer_provider(self) -> TracerProvider | None:
        """The SDK ``TracerProvider`` of the current pipeline (None when not configured)."""
        return self._current_provider()

    def diagnostics(self) -> dict[str, Any]:
        """Counters of the current pipeline: queued, dropped, exported and failed spans."""
        p = self.pipeline
        return p.diagnostics() if p is not None else {"queued": len(self.state.buffer),
                                                      "dropped": self.state.dropped}

    # ---- exit and fork -----------------------------------------------------------------------

    def _at_exit(self) -> None:
        cfg = self.config
        if cfg is not None and cfg.flush_at_exit:
            self.shutdown()
        self.children.remove_secrets()  # none in a forked child: the parent's file is the parent's

    def _arm_fork_hook(self) -> None:
        """Register the runtime's fork hook, once per process, at the first ``configure`` or the
        first part made (importing rltrace registers nothing).  A process forked before that,
        from a parent that had done neither, has no hook run for it: it re-arms here, as the hook
        would have."""
        if self._fork_hooked:
            return
        if self.state.pid != os.getpid():
            self._after_fork_child()  # (replaces the locks: before they are taken)
        with self._fork_lock:
            if not self._fork_hooked:
                _register_fork_hooks(self)
                self._fork_hooked = True

    def _before_fork(self) -> None:
        p = self.pipeline
        if p is not None:
            p._lock.acquire()

    def _after_fork_parent(self) -> None:
        p = self.pipeline
        if p is not None:
            p._lock.release()

    def _after_fork_child(self) -> None:
        """The child side of the process's one fork hook, in order: the recorder (ids, lanes, an
        empty queue, no spans held for CUDA events), the counters, the registries, this
        runtime's own locks and lifecycle, then the pipeline (re-armed on files of the child's
        own, or switched off by ``fork_mode``) and the user's record processors."""
        state = self.state
        state.after_fork_in_child()
        state.held_events.after_fork_in_child()
        self.counters.after_fork()
        self.phases.after_fork()
        self.sessions.after_fork()
        self.lock = FairRLock()  # another thread may have held it at fork time
        self.children.after_fork_in_child()
        self.termination.after_fork_in_child()
        self._parts_lock = threading.Lock()
        self._fork_lock = threading.Lock()
        for part in list(self._parts.values()):
            reset_part = getattr(part, "after_fork_in_child", None)
            if reset_part is not None:
                try:
                    reset_part()
                except Exception as exc:
                    internal_error(f"{type(part).__name__}.after_fork_in_child", exc)
        for proc in self.user_record_processors:
            try:
                as_record_processor(proc).reset_after_fork()  # a hook it lacks does nothing
            except Exception as exc:
                internal_error(f"{type(proc).__name__}.reset_after_fork", exc)
        p = self.pipeline
        if p is None:
            return
        if p.after_fork_in_child():
            state.wake = p.wake
            state.help = p.help
            state.overflow = p.overflow
        else:
            state.enabled = False
            self.sessions.enabled = False
            state.wake = state.help = _noop
            state.overflow = None
            self.pipeline = None


def _recover_killed_runs(logdir: Path, own: tuple[tuple[int, int], ...]) -> None:
    """Sessions a killed process of this log dir had finalized but not written (its flight
    recorder's ring): appended to its records file, marked recovered, with one warning.
    ``own``: the ring this process has open (never recovered by it)."""
    try:
        back = flight.recover(logdir, own=own)
    except Exception as exc:  # never in the way of configure (recover reports what it finds)
        internal_error("flight recorder recovery", exc)
        return
    for records, n in back.restored:
        logger.warning("rltrace: restored %d session(s) that a killed process had finalized but "
                       "not written, into %s (marked \"recovered\": true)", n, records)
    for line in back.problem_lines(5):
        logger.warning("rltrace: flight recorder ring %s", line)


def _check_injected(clock: object, id_generator: object) -> None:
    if clock is not None and not callable(clock):
        raise ConfigError(f"rltrace.configure: clock must be a callable returning epoch nanoseconds "
                          f"(like time.time_ns), got {type(clock).__name__} {clock!r}")
    if id_generator is not None and not all(
            callable(getattr(id_generator, m, None)) for m in ("generate_trace_id", "generate_span_id")):
        raise ConfigError("rltrace.configure: id_generator must be an OpenTelemetry IdGenerator "
                          "(generate_trace_id() and generate_span_id(), e.g. "
                          "opentelemetry.sdk.trace.id_generator.RandomIdGenerator()), got "
                          f"{type(id_generator).__name__}")


def _use_injected(state: recorder.RecorderState, new: Pipeline | None,
                  old: Pipeline | None) -> None:
    """Point the recorder at ``new``'s clock and ids; back to the defaults when the pipeline that
    injected them goes (a clock set by ``testing.deterministic`` is left alone otherwise)."""
    clock = new.clock if new is not None else None
    if clock is not None:
        state.now_ns = clock
    elif old is not None and old.clock is not None:
        state.now_ns = recorder.DEFAULT_CLOCK
    gen = new.id_generator if new is not None else None
    if gen is not None:
        state.rand_bits = recorder.id_source_of(gen)
    elif old is not None and old.id_generator is not None:
        state.default_ids()


def _register_fork_hooks(runtime: Runtime) -> None:
    """The runtime's one fork hook, held through a weak reference (as the OTel SDK's batch
    processor registers its own): a runtime that is gone costs a dead reference, nothing more."""
    ref = weakref.WeakMethod

    def call(method: Callable[[], Callable[[], None] | None]) -> Callable[[], None]:
        def hook() -> None:
            bound = method()
            if bound is not None:
                bound()
        return hook

    os.register_at_fork(before=call(ref(runtime._before_fork)),
                        after_in_parent=call(ref(runtime._after_fork_parent)),
                        after_in_child=call(ref(runtime._after_fork_child)))


#: the process's runtime, over the recorder's state (the one the hot path reads)
RUNTIME = Runtime(state=recorder.STATE)

# the module functions: bound methods of the process's runtime and of its registries
configure = RUNTIME.configure
configure_child = RUNTIME.configure_child
is_configured = RUNTIME.is_configured
get_config = RUNTIME.get_config
get_pipeline = RUNTIME.get_pipeline
flush = RUNTIME.flush
save = RUNTIME.save
shutdown = RUNTIME.shutdown
add_span_processor = RUNTIME.add_span_processor
remove_span_processor = RUNTIME.remove_span_processor
add_record_processor = RUNTIME.add_record_processor
remove_record_processor = RUNTIME.remove_record_processor
summary = RUNTIME.summary
tracer_provider = RUNTIME.tracer_provider
diagnostics = RUNTIME.diagnostics

register_phase = RUNTIME.phases.register
register_task = RUNTIME.sessions.register_task
register_session = RUNTIME.sessions.register_session
task_span_context = RUNTIME.sessions.task_span_context
trace_session_phase = RUNTIME.sessions.trace_session_phase
atrace_session_phase = RUNTIME.sessions.atrace_session_phase
trace_session = RUNTIME.sessions.trace_session
trace_session_event = RUNTIME.sessions.trace_session_event
finalize_session = RUNTIME.sessions.finalize_session
finalize_task = RUNTIME.sessions.finalize_task
session_context = RUNTIME.sessions.session_context
link_consumed = RUNTIME.sessions.link_consumed
counter = RUNTIME.counters.get
