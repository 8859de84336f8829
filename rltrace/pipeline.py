"""The configured pipeline: provider, processors, exporters and the background exporter thread.

``configure()`` builds one :class:`Pipeline` per process.  Its thread wakes every
``flush_interval_s`` (or when the recorder's buffer fills past a threshold), turns recorded
scopes into ``ReadableSpan``s, passes them to every span processor, and lets the queued
exporters write their batch.  ``save``/``flush``/``shutdown`` run the same cycle on the
caller's thread so data is on disk when they return.  Reconfiguring flushes and closes the
old pipeline first; processors a user added are carried over.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rltrace.exporters.chrome import ACCELERATED as CHROME_ACCELERATED
from rltrace.exporters.sessions import SessionRecordWriter
from rltrace.exporters.values import refresh_thread_names

from . import device, otel_compat, recorder, sessions
from .checks import check_optional_int
from .config import ConfigError, TracerConfig, load_config, log_dir, redacted
from .live import LivePublisher, live_path
from .locks import FairRLock
from .materialize import SpanBuilder, bound
from .metrics_agg import make_aggregates
from .otlp import make_metric_exporter, make_span_exporter
from .otlp_encode import RecordEncoder
from .phases import PhaseRegistry
from .processors import BoundedBatchProcessor, QueuedExportProcessor
from .provider import DelegatingTracerProvider
from .ranks import detect_rank
from .recorder import SPAN_API, STATE, RecordBase, _noop, internal_error
from .sampling import HeadSampling, TaskTailSampler, head_sampler
from .session_metrics import SessionMetricsProcessor
from .summary import ScopeSummary, counters_snapshot
from .version import __version__

logger = logging.getLogger("rltrace")

TRACES_DIR = "perf_tracer"
SESSIONS_DIR = "session_tracer"


#: queued records at which the exporter thread is woken (at most a quarter of the queue's cap)
WAKE_AT = 8192
#: queued records past which a recording thread runs export cycles itself (:meth:`Pipeline.help`)
HELP_AT = 16384
#: records per export cycle of the exporter thread and of :meth:`Pipeline.help` (the lock is
#: free between cycles); an explicit flush takes everything
CYCLE_MAX = 2048
#: how long :meth:`Pipeline.help` waits for a running cycle before backing off
HELP_WAIT_S = 0.1
#: the export cycle's per-record loop compiled (``rltrace._scope_accel``), or None
_RUN_PROCESSORS = None if recorder.SCOPE_ACCEL is None else \
    recorder.SCOPE_ACCEL.run_record_processors


class Pipeline:
    """One configured tracing pipeline (see module docstring)."""

    def __init__(
        self, cfg: TracerConfig, rank: int, world_size: int, logdir: Path,
        user_processors: list[SpanProcessor], metric_readers: list[Any] | None = None,
        sampler: Any = None, *, clock: Callable[[], int] | None = None,
        id_generator: IdGenerator | None = None, registry: sessions.SessionRegistry | None = None,
        user_record_processors: list[Any] | None = None,
        on_unlock: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        #: the session registry whose open tasks and misuse ``diagnostics`` reports
        self.registry = registry if registry is not None else sessions.REGISTRY
        #: config-wide device options by category (None: none configured)
        self.device_defaults = device.DeviceDefaults.of(cfg.device)
        self.rank = rank
        self.world_size = world_size
        self.log_dir = logdir
        self.host = socket.gethostname()
        attrs: dict[str, Any] = {
            "rl.rank": rank, "rl.world_size": world_size,
            "rl.experiment": cfg.experiment_name, "rl.trial": cfg.trial_name,
            "host.name": self.host, "process.pid": os.getpid(),
        }
        if cfg.role:
            attrs["rl.role"] = cfg.role
        if cfg.service_name:
            attrs["service.name"] = cfg.service_name
        elif not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = "rltrace"
        self.resource = Resource.create(attrs)
        self.processor = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
        lim = cfg.span_limits
        limits = SpanLimits(  # unset keys: the OTEL_*_LIMIT variables, then the SDK's defaults
            max_span_attributes=lim.attribute_count,
            max_span_attribute_length=lim.attribute_value_length,
            max_events=lim.event_count, max_links=lim.link_count,
            max_event_attributes=lim.event_attribute_count,
            max_link_attributes=lim.link_attribute_count,
        )
        head = head_sampler(cfg.sampling, sampler)
        #: decides rltrace's trace roots (None: the default, roots sampled at no cost)
        self.head_sampling = HeadSampling(head) if head is not None else None
        #: injected by ``configure`` (None: the wall clock, random ids)
        self.clock = clock
        self.id_generator = id_generator
        self.provider = TracerProvider(  # other instrumentation's spans: the same sampler
            resource=self.resource, shutdown_on_exit=False, active_span_processor=self.processor,
            sampler=head, span_limits=limits, id_generator=id_generator,
        )
        self.builder = SpanBuilder(self.resource, InstrumentationScope("rltrace", __version__),
                                   limits)
        self.queued: list[QueuedExportProcessor] = []
        self.owned: list[SpanProcessor] = []
        self.user_processors = list(user_processors)
        self.chrome_path: Path | None = None
        self.sessions_path: Path | None = None
        self.record_processors: list[Any] = []
        self.session_processor: SessionMetricsProcessor | None = None
        self.metric_readers: list[Any] = []
        self.meter_provider = self._meter_provider(cfg, metric_readers or [])
        if cfg.session_tracer.enabled:
            self.sessions_path = logdir / SESSIONS_DIR / self._file_name("sessions", os.getpid())
            meter = aggregates = None
            if self.meter_provider is not None:
                # aggregated in place and handed to the readers as finished points; through the
                # SDK one measurement at a time only if a reader wants another aggregation
                aggregates = make_aggregates(self.metric_readers, self.resource,
                                             InstrumentationScope("rltrace", __version__))
                if aggregates is None:
                    meter = self.meter_provider.get_meter("rltrace", __version__)
            self.session_processor = SessionMetricsProcessor(
                SessionRecordWriter(self.sessions_path, cfg.session_tracer.flush_threshold),
                rank=rank, meter=meter, role=cfg.role, aggregates=aggregates,
            )
            self.record_processors.append(self.session_processor)
        #: the live state ``rltrace top`` reads (open sessions, current step), when enabled
        self.live: LivePublisher | None = None
        if self.session_processor is not None and cfg.live_interval_s > 0:
            self.live = LivePublisher(
                live_path(logdir, self._file_name("live", os.getpid())),
                interval_s=cfg.live_interval_s, session_processor=self.session_processor,
                rank=rank, world_size=world_size, role=cfg.role, host=self.host,
                experiment=cfg.experiment_name, trial=cfg.trial_name,
            )
        self.summary: ScopeSummary | None = None
        if cfg.print_summary:  # collected only when asked for (it costs the exporter thread)
            self.summary = ScopeSummary()
            self.record_processors.append(self.summary)
        self._counters_seen: dict[str, float] = {}
        self.user_record_processors = list(user_record_processors or ())
        #: called after each flush released the pipeline's lock (a deferred SIGTERM resumes)
        self._on_unlock = on_unlock
        self.record_processors.extend(self.user_record_processors)
        self.chrome: Any = None
        if cfg.enabled and cfg.exporters.chrome:
            from rltrace.exporters import ChromeTraceExporter

            self.chrome_path = logdir / TRACES_DIR / self._file_name("traces", os.getpid())
            self.chrome = ChromeTraceExporter(
                self.chrome_path, rank=rank, world_size=world_size, role=cfg.role,
                host=self.host, experiment=cfg.experiment_name, trial=cfg.trial_name,
            )
            self.add_queued(self.chrome)
        self.otlp: BoundedBatchProcessor | None = None
        self.tail_sampler: TaskTailSampler | None = None
        otlp = make_span_exporter(cfg.otlp)
        if otlp is not None:
            self.otlp = BoundedBatchProcessor(
                otlp, max_queue_size=cfg.otlp.max_queue_size,
                max_export_batch_size=cfg.otlp.max_export_batch_size,
                shutdown_timeout_s=cfg.otlp.timeout_s if cfg.otlp.timeout_s is not None else 5.0,
                encoder=RecordEncoder(self.builder),
            )
            if cfg.sampling.mode == "sessions":  # whole task traces, decided when the task ends
                self.tail_sampler = TaskTailSampler(self.otlp, cfg.sampling)
                self._own(self.tail_sampler)
            else:
                self._own(self.otlp)
        for p in self.user_processors:
            self.processor.add_span_processor(p)
        self._refresh_direct()
        self._lock = FairRLock()  # fair: a closing configure() never starves behind flushers
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        #: export cycles run on a recording thread because the queue was full of kept records
        self.backpressure = 0
        #: export cycles run on a recording thread that found the queue past ``help_at``
        self.helped = 0
        #: offers to help that found a cycle running past ``HELP_WAIT_S`` (then backed off)
        self.help_timeouts = 0
        self._help_after = 0
        self._dropped_reported = 0
        self._lost_reported = 0
        self._lost_warned_at = 0.0
        self.errors = 0

    def _file_name(self, kind: str, pid: int, per_process: bool | None = None) -> str:
        """``[{role}/]{kind}-r{rank}[-p{pid}].jsonl``: AReaL's per-role folder, so two processes of
        one rank with different roles never share a file."""
        if per_process is None:
            per_process = self.cfg.per_process_files
        name = f"{kind}-r{self.rank}-p{pid}.jsonl" if per_process else f"{kind}-r{self.rank}.jsonl"
        return f"{self.cfg.role}/{name}" if self.cfg.role else name

    def _meter_provider(self, cfg: TracerConfig, readers: list[Any]) -> Any:
        readers = list(readers)
        exporter = make_metric_exporter(cfg.otlp)
        if exporter is not None:
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            readers.append(PeriodicExportingMetricReader(exporter))
        if not readers:
            return None  # no consumer: skip recording metrics altogether
        from opentelemetry.sdk.metrics import MeterProvider

        self.metric_readers = readers
        return MeterProvider(metric_readers=readers, resource=self.resource,
                             shutdown_on_exit=False)

    # -- composition ----------------------------------------------------------------------
    def _own(self, processor: SpanProcessor) -> None:
        self.owned.append(processor)
        self.processor.add_span_processor(processor)

    def add_queued(self, exporter: Any) -> QueuedExportProcessor:
        proc = QueuedExportProcessor(exporter)
        self.queued.append(proc)
        self._own(proc)
        return proc

    def add_user_processor(self, processor: SpanProcessor) -> None:
        self.user_processors.append(processor)
        self.processor.add_span_processor(processor)
        self._refresh_direct()

    @property
    def on_start_hooks(self) -> tuple[SpanProcessor, ...] | None:
        """The span processors whose ``on_start`` rltrace spans call (the user's), or None."""
        return tuple(self.user_processors) or None

    def _refresh_direct(self) -> None:
        # When every consumer is one of rltrace's queued exporters, they take the records
        # themselves and no ReadableSpan needs to be built (the common offline case).
        self._direct = not self.user_processors and all(
            isinstance(p, QueuedExportProcessor) or getattr(p, "takes_records", False)
            for p in self.owned
        )
        #: in direct mode, everything that is handed the records themselves
        self._record_sinks: list[Any] = [
            p for p in self.owned
            if isinstance(p, QueuedExportProcessor) or getattr(p, "takes_records", False)
        ]

    # -- the exporter thread ------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rltrace-exporter", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def help(self) -> None:
        """The queue passed ``help_at`` on a recording thread: export a cycle of ``CYCLE_MAX``
        records here, after the exporter's running cycle if there is one.

        In a busy Python loop the exporter thread gets the GIL only between the loop's
        switch-interval slices, so a burst queues most of itself (71k of 80k records in
        ``bench_compare``'s 20k-session run); the records outlive the GC's young generations
        and each full collection walks all of them (a sixth of a session's cost there).
        Waiting for the lock gives the exporter the GIL to finish its cycle; then this thread
        runs one: the queue, and those collections, stay small, for the CPU the exporter
        thread would have spent on the same records, on the same GIL.  The wait is bounded
        (``HELP_WAIT_S``): a cycle that does not end in that time (a stalled disk) is left
        alone until the queue has grown by another ``HELP_AT`` records, so the training loop
        waits that long at most once per ``HELP_AT`` records (and fully only at twice the
        queue's cap, as before).
        """
        lock = self._lock
        if len(STATE.buffer) < self._help_after or lock.held_by_me():
            return
        if lock.acquire(timeout=HELP_WAIT_S):
            try:
                self.helped += 1
                self._help_after = 0
                self.flush(everything=False, batch=CYCLE_MAX)
            finally:
                lock.release()
        else:
            self.help_timeouts += 1
            self._help_after = len(STATE.buffer) + HELP_AT
        if self._on_unlock is not None:  # a SIGTERM deferred while this thread waited or held
            self._on_unlock()

    def overflow(self, record: Any) -> None:
        """A kept record met a queue at twice its cap: export a batch on this thread first.

        Backpressure instead of loss: the caller does the exporter's work, so session records
        are never dropped and the queue stays bounded (plain spans were dropped before this).
        """
        self.backpressure += 1
        self.flush(everything=False)
        STATE.buffer.append(record)

    def _run(self) -> None:
        interval = self.cfg.flush_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.flush(everything=False, batch=CYCLE_MAX)
            buf = STATE.buffer
            while len(buf) >= CYCLE_MAX and not self._stop.is_set():  # between batches the
                self.flush(everything=False, batch=CYCLE_MAX)  # lock is free: help() may run

    def flush(self, *, everything: bool = True, timeout: float | None = None,
              final: bool = False, batch: int | None = None) -> None:
        """Export everything recorded so far (on the calling thread); never raises.

        ``everything`` also writes session records held below ``flush_threshold`` (explicit
        flushes do; the background cycle leaves them to the threshold).  ``final`` (from
        :meth:`close`) marks the pipeline closed in the same critical section as its last
        cycle, so a flush that raced a reconfigure can never take records after that cycle:
        they belong to the next pipeline.
        """
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            if final:
                self._closed = True
            return
        try:
            try:
                if self._closed:
                    return  # a closed pipeline must not take records meant for its successor
                with otel_compat.instrumentation_suppressed():  # exporters never trace themselves
                    self._cycle(batch)
                    if everything:
                        for q in self.queued:  # lines a disk fault held back are retried now
                            q.force_flush()
                        for rp in self.record_processors:
                            flush = getattr(rp, "force_flush", None)
                            if flush is not None:
                                flush()
            except Exception as exc:  # pragma: no cover - defensive
                internal_error("exporter cycle", exc)
            finally:
                if final:
                    self._closed = True
        finally:
            self._lock.release()
        if self._on_unlock is not None:
            self._on_unlock()

    def _cycle(self, batch: int | None = None) -> None:
        refresh_thread_names()
        if device.pending_count():
            device.resolve_pending_events()
        buf = STATE.buffer
        popleft = buf.popleft
        record_procs = self.record_processors
        todo = len(buf) if batch is None else min(batch, len(buf))
        if self._direct:
            taken: list[Any] = []
            if _RUN_PROCESSORS is not None:  # the loop below, compiled
                _RUN_PROCESSORS(popleft, todo, record_procs, taken, self._sink_error)
            else:
                keep = taken.append
                for _ in range(todo):
                    try:
                        rec = popleft()
                    except IndexError:
                        break
                    try:
                        for rp in record_procs:
                            rp.on_record(rec)
                    except Exception as exc:  # counted; the record is not exported
                        self._sink_error(exc)
                        continue
                    keep(rec)
            for q in self._record_sinks:  # the whole cycle at once (queued exporters take it)
                take = getattr(q, "on_end_batch", None)
                if take is not None:
                    try:
                        take(taken, self._sink_error)  # a record that fails is counted there
                    except Exception as exc:  # the sink itself failed: the next one goes on
                        self._sink_error(exc)
                    continue
                for rec in taken:
                    try:
                        q.on_end(rec)
                    except Exception as exc:
                        self.errors += 1
                        internal_error("span export", exc)
            self._drain()
            return
        build = self.builder.build
        on_end = self.processor.on_end
        for _ in range(todo):
            try:
                rec = popleft()
            except IndexError:
                break
            try:
                for rp in record_procs:
                    rp.on_record(rec)
                on_end(build(rec) if isinstance(rec, RecordBase) else rec)
            except Exception as exc:
                self.errors += 1
                internal_error("span export", exc)
        self._drain()

    def _sink_error(self, exc: Exception) -> None:
        """A record a sink could not take (as ``on_end`` raising for it)."""
        self.errors += 1
        internal_error("span export", exc)

    def _drain(self) -> None:
        if self.tail_sampler is not None:
            self.tail_sampler.sweep()  # other processes' tasks whose part here ended
        for q in self.queued:
            q.drain()
        if self.chrome is not None:
            counts = counters_snapshot()
            changed = {k: v for k, v in counts.items() if self._counters_seen.get(k) != v}
            if changed:
                self.chrome.write_counters(changed, time.time_ns())
                self._counters_seen.update(changed)
        dropped = STATE.dropped
        if dropped > self._dropped_reported:
            logger.warning(
                "rltrace dropped %d spans because the export queue was full (max_queue_size=%d);"
                " raise max_queue_size or lower flush_interval_s",
                dropped - self._dropped_reported, STATE.cap,
            )
            self._dropped_reported = dropped
        self._report_otlp_loss(final=False)
        live = self.live
        if live is not None:
            live.maybe_publish()  # rate-limited: one clock read when not due

    def _report_otlp_loss(self, final: bool) -> None:
        otlp = self.otlp
        if otlp is None:
            return
        lost = otlp.dropped + otlp.failed
        now = time.monotonic()
        if lost > self._lost_reported and (final or now - self._lost_warned_at >= 30.0):
            logger.warning(
                "rltrace: %d spans not delivered to the OTLP endpoint so far (%d dropped: queue "
                "full, %d failed: export errors; %d delivered). Training is not slowed; check "
                "the collector.", lost, otlp.dropped, otlp.failed, otlp.exported,
            )
            self._lost_reported = lost
            self._lost_warned_at = now

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread, flush, and shut down rltrace's own processors (not the user's)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10 if timeout is None else timeout)
        if device.pending_count():
            try:  # spans held for their CUDA events: wait for the events, then export them
                device.resolve_pending_events(wait=True)
            except Exception as exc:
                internal_error("device events at shutdown", exc)
        self.flush(timeout=timeout, final=True)
        # Network exporters get one shared deadline: metrics shut down beside the spans.
        timeout = self.cfg.otlp.timeout_s if self.cfg.otlp.timeout_s is not None else 5.0
        meters = None
        if self.meter_provider is not None:
            mp = self.meter_provider
            meters = threading.Thread(target=self._shutdown_meters, args=(mp, timeout),
                                      name="rltrace-metrics-shutdown", daemon=True)
            meters.start()
        for p in [*self.owned, *(r for r in self.record_processors
                                 if r not in self.user_record_processors)]:
            try:
                p.shutdown()
            except Exception as exc:
                internal_error("processor shutdown", exc)
        if meters is not None:
            meters.join(timeout + 1.0)
        self._report_otlp_loss(final=True)
        if self.live is not None:
            self.live.close()
        if self.summary is not None:
            print(self.summary.render(), flush=True)

    @staticmethod
    def _shutdown_meters(mp: Any, timeout: float) -> None:
        try:
            mp.shutdown(timeout_millis=timeout * 1000)
        except Exception as exc:
            internal_error("meter provider shutdown", exc)

    def after_fork_in_child(self) -> bool:
        """Re-arm in a forked child; returns False when ``fork_mode`` disables tracing there."""
        self._lock = FairRLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        for q in self.queued:
            q.reset_after_fork()
        if self.cfg.fork_mode == "disable":
            return False
        pid = os.getpid()
        if self.chrome is not None:
            self.chrome_path = self.log_dir / TRACES_DIR / self._file_name("traces", pid, True)
            self.chrome.reset_after_fork(self.chrome_path)
        sp = self.session_processor
        if sp is not None and sp.writer is not None:
            self.sessions_path = self.log_dir / SESSIONS_DIR / self._file_name("sessions", pid, True)
            sp.writer.reset_after_fork(self.sessions_path)
            sp.reset_after_fork()
            if self.live is not None:
                self.live.reset_after_fork(live_path(self.log_dir, self._file_name("live", pid, True)))
        if self.otlp is not None:
            self.otlp.reset_after_fork()
        self.start()
        return True

    def diagnostics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "queued": len(STATE.buffer), "dropped": STATE.dropped, "errors": self.errors,
            "log_dir": str(self.log_dir), "backpressure_cycles": self.backpressure,
            "helped_cycles": self.helped, "help_timeouts": self.help_timeouts,
        }
        for q in self.queued:
            out[type(q.exporter).__name__] = q.stats()
        if self.otlp is not None:
            out["otlp"] = self.otlp.stats()
        sampling: dict[str, Any] = {"mode": self.cfg.sampling.mode or "parent"}
        if self.head_sampling is not None:
            sampling.update(self.head_sampling.stats())
        if self.tail_sampler is not None:
            sampling.update(self.tail_sampler.stats())
        out["sampling"] = sampling
        out["device_events"] = {**device.STATS, "pending": device.pending_count()}
        sp = self.session_processor
        if sp is not None:
            out["sessions"] = {"finalized": sp.sessions, "written": sp.writer.written,
                               "failed": sp.writer.failed, "orphaned": sp.orphaned,
                               "late_phases": sp.late_phases,
                               **self.registry.open_counts()}
        out["misuse"] = dict(self.registry.misuse)
        out["span_api"] = SPAN_API.snapshot()
        # the compiled hot paths in use (both off: not built, or RLTRACE_PURE_PYTHON=1)
        out["accelerated"] = {"scope": recorder.ACCELERATED, "chrome": CHROME_ACCELERATED}
        return out


# ---- the process's tracing ---------------------------------------------------------------------

PARENT_CONFIG_ENV = "RLTRACE_PARENT_CONFIG"
#: path of a private (0600) file holding the secrets children need (OTLP headers given in the
#: config); the environment never carries them, and the file goes when the parent exits
PARENT_SECRETS_ENV = "RLTRACE_PARENT_SECRETS"
_FINAL_SWITCH_INTERVAL = 1e6  # seconds: no other thread is scheduled until this one blocks


class Tracing:
    """A process's tracing: the :class:`Pipeline` each ``configure`` builds, what is kept across
    reconfiguration (the user's span and record processors), and the registries it switches
    on and off (sessions, phases).

    The process has one, :data:`TRACING`; ``rltrace.configure``, ``flush``, ``shutdown``, ...
    are its bound methods, as Logfire binds its module functions to a default instance.  It
    drives the recorder's hot-path switches (``recorder.STATE``), the process's exit, fork and
    SIGTERM hooks, so a second instance is for inspection and tests that do not record.
    """

    def __init__(self, registry: sessions.SessionRegistry | None = None,
                 phases: PhaseRegistry | None = None) -> None:
        #: the session registry ``configure`` switches on (default: :data:`sessions.REGISTRY`)
        self.sessions = registry if registry is not None else sessions.REGISTRY
        #: the phase registry its sessions use (default: :data:`rltrace.phases.PHASES`)
        self.phases = phases if phases is not None else self.sessions.phases
        self.lock = FairRLock()
        self.pipeline: Pipeline | None = None
        self.config: TracerConfig | None = None
        self.user_processors: list[SpanProcessor] = []
        self.user_record_processors: list[Any] = []
        self._global_set = False
        self._atexit = False
        self._secrets_files: list[Path] = []  # this process's file, if any
        self._mp_hooked = False
        self._sigterm_installed = False
        #: a termination signal that arrived while the main thread held one of rltrace's locks;
        #: it is raised again as soon as that lock is released (see ``_resume_pending_signal``)
        self._pending_signal: list[int] = []

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
        metric_readers: list[Any] | None = None,
        sampler: Any = None,
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
        sent over OTel, once per trace (see :mod:`rltrace.sampling`; the local files always get
        everything).  ``clock`` (epoch nanoseconds, ``time.time_ns`` by default) and
        ``id_generator`` (an OTel ``IdGenerator``; random by default) are this pipeline's:
        every rltrace record takes its times and ids from them, spans other instrumentation
        starts through its tracer provider their ids (``rltrace.testing.IncrementingClock``
        and ``SequentialIdGenerator`` make runs reproducible); a later ``configure`` without
        them, or :func:`shutdown`, goes back to the defaults.  Raises
        :class:`~rltrace.config.ConfigError` for bad input; the previous pipeline is left
        intact in that case.
        """
        try:
            return self._configure(config, rank=rank, role=role, metric_readers=metric_readers,
                                   sampler=sampler, clock=clock, id_generator=id_generator,
                                   **overrides)
        finally:
            if self._pending_signal:
                self._resume_pending_signal()

    def _configure(self, config: Any, *, rank: int | None, role: str | None,
                   metric_readers: list[Any] | None, sampler: Any = None,
                   clock: Callable[[], int] | None = None,
                   id_generator: IdGenerator | None = None, **overrides: Any) -> TracerConfig:
        reg = self.sessions
        with self.lock:
            _check_injected(clock, id_generator)
            cfg = load_config(config, rank=rank, role=role, **overrides)
            rk, world = detect_rank(cfg.rank, cfg.world_size)
            new: Pipeline | None = None
            if cfg.enabled or cfg.session_tracer.enabled:
                logdir = log_dir(cfg)
                _ensure_writable(logdir, cfg)
                new = Pipeline(cfg, rk, world, logdir, self.user_processors, metric_readers,
                               sampler, clock=clock, id_generator=id_generator, registry=reg,
                               user_record_processors=self.user_record_processors,
                               on_unlock=self._resume_pending_signal)
                if rk == 0 and not cfg.per_process_files:
                    _write_config(logdir, cfg, world)
            old = self.pipeline
            if old is not None:
                STATE.enabled = False
                old.close()
            self.pipeline, self.config = new, cfg
            _use_injected(new, old)
            STATE.sampling = new.head_sampling if new is not None else None
            STATE.on_start = new.on_start_hooks if new is not None else None
            if new is None:
                STATE.enabled = False
                STATE.device = None
                reg.enabled = False
                STATE.wake = _noop
                STATE.help = _noop
                STATE.overflow = None
                return cfg
            STATE.cap = cfg.max_queue_size
            STATE.dropped = 0  # counts are per pipeline; the old one reported its own at close
            reg.misuse.clear()
            STATE.wake_at = max(1, min(WAKE_AT, cfg.max_queue_size // 4))
            STATE.help_at = max(STATE.wake_at + 1, HELP_AT)
            STATE.wake = new.wake
            STATE.help = new.help
            STATE.overflow = new.overflow
            SPAN_API.max_events = bound(new.builder.limits.max_events)
            new.start()
            STATE.device = new.device_defaults
            STATE.enabled = cfg.enabled
            reg.enabled = cfg.session_tracer.enabled
            if (cfg.set_global_provider and not self._global_set
                    and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)):
                trace.set_tracer_provider(DelegatingTracerProvider(self._current_provider))
                self._global_set = True
            if not self._atexit:
                atexit.register(self._at_exit)
                self._atexit = True
            if cfg.handle_sigterm:
                self._install_sigterm_handler()
            self._hook_multiprocessing()
            self._publish_child_config(cfg, rk, world)
            return cfg

    # ---- children ----------------------------------------------------------------------------

    def _publish_child_config(self, cfg: TracerConfig, rank: int, world_size: int) -> None:
        """Put the config children inherit into the environment, with its secrets in a 0600 file.

        OTLP headers from the standard ``OTEL_EXPORTER_OTLP_HEADERS`` are the user's own
        environment and reach children as usual; headers given to ``configure`` are written to
        a private file (owner-only, in an owner-only directory) whose path is all the
        environment holds.  The file is replaced on reconfigure and removed at exit.
        """
        data = _child_config(cfg, rank, world_size)
        headers = data.get("otlp", {}).pop("headers", None)
        self._remove_secrets_file()
        if headers:
            import tempfile

            folder = Path(tempfile.mkdtemp(prefix="rltrace-secrets-"))  # mode 0700
            path = folder / "otlp-headers.json"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"otlp": {"headers": headers}}, fh)
            self._secrets_files.append(path)
            os.environ[PARENT_SECRETS_ENV] = str(path)
        os.environ[PARENT_CONFIG_ENV] = json.dumps(data)

    def _remove_secrets_file(self) -> None:
        os.environ.pop(PARENT_SECRETS_ENV, None)
        while self._secrets_files:
            path = self._secrets_files.pop()
            for p in (path, path.parent):
                try:
                    p.unlink() if p.is_file() else p.rmdir()
                except OSError:
                    pass

    def configure_child(self, **overrides: Any) -> TracerConfig:
        """Configure a *spawned* child process (multiprocessing ``spawn``, a subprocess) like its
        parent.

        The parent's effective config (same log dir, rank, exporters) is passed through the
        environment by :func:`configure`; the child writes its own ``-p{pid}`` files.  Keyword
        overrides apply on top.  Raises :class:`~rltrace.config.ConfigError` when no parent
        configured rltrace.
        """
        raw = os.environ.get(PARENT_CONFIG_ENV)
        if not raw:
            raise ConfigError(
                "rltrace.configure_child: no parent configuration in the environment "
                f"({PARENT_CONFIG_ENV}); call rltrace.configure() in the parent before starting "
                "the child, or call rltrace.configure(...) in the child instead"
            )
        self.sessions.offset_ids(os.getpid())
        data = json.loads(raw)
        secret_headers = _read_parent_secrets().get("otlp", {}).get("headers")
        if secret_headers:
            data.setdefault("otlp", {})["headers"] = secret_headers
        return self.configure(data, **overrides)

    def _hook_multiprocessing(self) -> None:
        """Flush in multiprocessing children before they leave through ``os._exit``.

        ``Process._bootstrap`` clears the finalizers a child inherits and then runs the
        after-fork hooks, so the exit flush is registered from such a hook.
        """
        if self._mp_hooked:
            return
        from multiprocessing import util

        def in_child(tracing: Tracing) -> None:
            if tracing.pipeline is not None:
                util.Finalize(None, tracing.shutdown, exitpriority=100)

        util.register_after_fork(self, in_child)
        self._mp_hooked = True

    # ---- SIGTERM -----------------------------------------------------------------------------

    def _main_holds_lock(self) -> bool:
        p = self.pipeline
        return self.lock.held_by_me() or (p is not None and p._lock.held_by_me())

    def _resume_pending_signal(self) -> None:
        """Re-raise a deferred termination signal once the main thread left rltrace's locks."""
        if not self._pending_signal or threading.current_thread() is not threading.main_thread() \
                or self._main_holds_lock():
            return
        signum = self._pending_signal.pop()
        signal.raise_signal(signum)  # handled at the next bytecode, now at a safe point

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
        if final and p.otlp is not None:
            p.flush()
            timeout = p.cfg.otlp.timeout_s if p.cfg.otlp.timeout_s is not None else 5.0
            p.otlp.force_flush(int(timeout * 1000))
        interval = sys.getswitchinterval()
        closed = not (final and self.sessions.enabled)
        with p._lock:  # fair: the exporter thread finishes the cycle it is in, then waits
            for _ in range(1000):  # bounded: other threads may keep recording while we write
                p.flush()
                if final:
                    sys.setswitchinterval(_FINAL_SWITCH_INTERVAL)
                if not STATE.buffer:
                    if closed:
                        return  # final: the GIL stays with this thread until the process ends
                    # sessions still open now are written as pending (open phases closed);
                    # done last, so a session finalized while the records above were written
                    # keeps its own status
                    self.sessions.close_all()
                    closed = True
                    continue
                sys.setswitchinterval(interval)

    def _install_sigterm_handler(self) -> None:
        """Flush on SIGTERM, then let the previous disposition act (default: terminate).

        The handler runs on the main thread, so the user's main-thread code (an asyncio loop, a
        training loop) is paused while every finished record is written; with the default
        disposition the process is then terminated by the same signal with no other thread
        running in between (see :meth:`_drain`), so nothing finished before the end is lost.
        If the signal interrupts rltrace itself holding a lock on the main thread (an explicit
        flush, configure), it is deferred until that lock is released.
        """
        if self._sigterm_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._main_holds_lock():
                if not self._pending_signal:
                    self._pending_signal.append(signum)
                return
            final = not callable(previous) and previous != signal.SIG_IGN
            try:
                self._drain(final)
            except Exception as exc:  # pragma: no cover - defensive
                internal_error("SIGTERM flush", exc)
            if callable(previous):
                previous(signum, frame)  # e.g. a launcher's handler; tracing stays on until exit
            elif final:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)  # the default action, with the records on disk

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
            self._sigterm_installed = True
        except (ValueError, OSError):
            pass

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
                p.otlp.force_flush(int(wait_s * 1000))

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
        reg = self.sessions
        try:
            p = self.pipeline
            if p is not None and reg.enabled:
                reg.close_all()  # open sessions are written as pending, open phases closed
            STATE.enabled = False
            reg.enabled = False
            STATE.wake = STATE.help = _noop
            if p is not None:
                p.close(timeout)  # (its last records still draw ids under its sampler)
                _use_injected(None, p)
            STATE.overflow = None
            STATE.sampling = STATE.on_start = STATE.device = None
            self.pipeline = None
        finally:
            self.lock.release()
        if self._pending_signal:
            self._resume_pending_signal()

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
                STATE.on_start = p.on_start_hooks

    def remove_span_processor(self, processor: SpanProcessor) -> None:
        """Stop delivering spans to ``processor`` (counterpart of :meth:`add_span_processor`)."""
        with self.lock:
            if processor in self.user_processors:
                self.user_processors.remove(processor)
            p = self.pipeline
            if p is not None and processor in p.user_processors:
                p.user_processors.remove(processor)
                otel_compat.remove_span_processor(p.processor, processor)
                p._refresh_direct()
                STATE.on_start = p.on_start_hooks

    def add_record_processor(self, processor: Any) -> None:
        """Add a *record processor*: ``on_record(record)`` for every finished rltrace scope.

        Record processors run on the exporter thread before any ``ReadableSpan`` is built, so
        they cost the least (rltrace's own session metrics and stats bridge are record
        processors).  A record has ``name``, ``category``, ``args``, ``start_ns``, ``end_ns``,
        ``thread``, ``lane`` and ``extra``; ``record_attrs()`` gives its attributes (the
        ``rl.*`` attributes of tasks, sessions and phases, and any set through
        ``set_attribute``) and :func:`rltrace.steps.step_of` its training step.  Kept across
        reconfiguration; an optional ``force_flush()`` runs on every explicit flush.
        """
        with self.lock:
            self.user_record_processors.append(processor)
            p = self.pipeline
            if p is not None:
                with p._lock:
                    p.user_record_processors.append(processor)
                    p.record_processors.append(processor)

    def remove_record_processor(self, processor: Any) -> None:
        """Stop calling ``processor`` (counterpart of :meth:`add_record_processor`)."""
        with self.lock:
            if processor in self.user_record_processors:
                self.user_record_processors.remove(processor)
            p = self.pipeline
            if p is not None and processor in p.user_record_processors:
                with p._lock:
                    p.user_record_processors.remove(processor)
                    p.record_processors.remove(processor)

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
        return p.diagnostics() if p is not None else {"queued": len(STATE.buffer),
                                                      "dropped": STATE.dropped}

    # ---- exit and fork -----------------------------------------------------------------------

    def _at_exit(self) -> None:
        cfg = self.config
        if cfg is not None and cfg.flush_at_exit:
            self.shutdown()
        self._remove_secrets_file()  # empty in a forked child: the parent's file stays the parent's

    def _before_fork(self) -> None:
        p = self.pipeline
        if p is not None:
            p._lock.acquire()

    def _after_fork_parent(self) -> None:
        p = self.pipeline
        if p is not None:
            p._lock.release()

    def _after_fork_child(self) -> None:
        self.lock = FairRLock()  # another thread may have held it at fork time
        self._secrets_files.clear()  # the parent's file: the parent removes it
        self._pending_signal.clear()
        STATE.buffer = deque()  # the parent exports what it recorded; never twice
        p = self.pipeline
        if p is None:
            return
        if p.after_fork_in_child():
            STATE.wake = p.wake
            STATE.help = p.help
            STATE.overflow = p.overflow
        else:
            STATE.enabled = False
            self.sessions.enabled = False
            STATE.wake = STATE.help = _noop
            STATE.overflow = None
            self.pipeline = None


def _check_injected(clock: Any, id_generator: Any) -> None:
    if clock is not None and not callable(clock):
        raise ConfigError(f"rltrace.configure: clock must be a callable returning epoch nanoseconds "
                          f"(like time.time_ns), got {type(clock).__name__} {clock!r}")
    if id_generator is not None and not all(
            callable(getattr(id_generator, m, None)) for m in ("generate_trace_id", "generate_span_id")):
        raise ConfigError("rltrace.configure: id_generator must be an OpenTelemetry IdGenerator "
                          "(generate_trace_id() and generate_span_id(), e.g. "
                          "opentelemetry.sdk.trace.id_generator.RandomIdGenerator()), got "
                          f"{type(id_generator).__name__}")


def _use_injected(new: Pipeline | None, old: Pipeline | None) -> None:
    """Point the recorder at ``new``'s clock and ids; back to the defaults when the pipeline that
    injected them goes (a clock set by ``testing.deterministic`` is left alone otherwise)."""
    clock = new.clock if new is not None else None
    if clock is not None:
        recorder.set_clock(clock)
    elif old is not None and old.clock is not None:
        recorder.set_clock(recorder.DEFAULT_CLOCK)
    gen = new.id_generator if new is not None else None
    if gen is not None:
        recorder.set_id_source(recorder.id_source_of(gen))
    elif old is not None and old.id_generator is not None:
        recorder.set_id_source(recorder.DEFAULT_ID_SOURCE)


def _child_config(cfg: TracerConfig, rank: int, world_size: int) -> dict[str, Any]:
    from .config import _dataclass_to_dict

    data = _dataclass_to_dict(cfg)
    data.update(rank=rank, world_size=world_size, per_process_files=True)
    return data


def _read_parent_secrets() -> dict[str, Any]:
    path = os.environ.get(PARENT_SECRETS_ENV)
    if not path:
        return {}
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except (OSError, ValueError) as exc:
        logger.warning("rltrace.configure_child: cannot read the parent's OTLP headers from %s (%s); "
                       "the child exports without them (did the parent exit already?)", path,
                       getattr(exc, "strerror", None) or exc)
        return {}


def _ensure_writable(logdir: Path, cfg: TracerConfig) -> None:
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        probe = logdir / f".rltrace-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"rltrace config key 'fileroot': cannot write the log dir {str(logdir)!r} "
            f"(fileroot={cfg.fileroot!r}): {exc.strerror or exc}. Set fileroot (or "
            f"RLTRACE_FILEROOT) to a writable directory."
        ) from None


def _write_config(logdir: Path, cfg: TracerConfig, world_size: int) -> None:
    import yaml

    data = redacted(cfg)
    data["world_size"] = world_size
    data["rank"] = None
    text = (f"# effective rltrace {__version__} configuration (secrets redacted)\n"
            + yaml.safe_dump(data, sort_keys=False))
    try:
        (logdir / "config.yaml").write_text(text)
    except OSError as exc:
        logger.warning("rltrace: cannot write %s: %s", logdir / "config.yaml", exc)


#: the process's tracing; the module functions below are its bound methods
TRACING = Tracing()
configure = TRACING.configure
configure_child = TRACING.configure_child
is_configured = TRACING.is_configured
get_config = TRACING.get_config
get_pipeline = TRACING.get_pipeline
flush = TRACING.flush
save = TRACING.save
shutdown = TRACING.shutdown
add_span_processor = TRACING.add_span_processor
remove_span_processor = TRACING.remove_span_processor
add_record_processor = TRACING.add_record_processor
remove_record_processor = TRACING.remove_record_processor
summary = TRACING.summary
tracer_provider = TRACING.tracer_provider
diagnostics = TRACING.diagnostics

os.register_at_fork(before=TRACING._before_fork, after_in_parent=TRACING._after_fork_parent,
                    after_in_child=TRACING._after_fork_child)
