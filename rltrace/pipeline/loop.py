"""The export loop: provider, processors, exporters and the background exporter thread.

The runtime (:mod:`rltrace.runtime`) builds one :class:`Pipeline` per ``configure()``.  Its thread wakes every
``flush_interval_s`` (or when the recorder's buffer fills past a threshold), turns recorded
scopes into ``ReadableSpan``s, passes them to every span processor, and lets the queued
exporters write their batch.  ``save``/``flush``/``shutdown`` run the same cycle on the
caller's thread so data is on disk when they return.  Reconfiguring flushes and closes the
old pipeline first; processors a user added are carried over.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rltrace import device
from rltrace.accounting.counters import Counters, ScopeSummary
from rltrace.accounting.goodput import StepScopeCollector
from rltrace.config import TracerConfig, redact_endpoint
from rltrace.logdir.files import GuardedDirs
from rltrace.pipeline.fair_lock import FairRLock
from rltrace.pipeline.live_state import LivePublisher, live_path
from rltrace.pipeline.otlp_encode import RecordEncoder
from rltrace.pipeline.otlp_exporter import (
    SdkLogFold,
    make_metric_exporter,
    make_span_exporter,
    otlp_endpoint,
    unfold_sdk_logs,
)
from rltrace.pipeline.processors import BoundedBatchProcessor, QueuedExportProcessor, RecordSinkProcessor
from rltrace.pipeline.readable_spans import SpanBuilder
from rltrace.pipeline.sampling import HeadSampling, TaskTailSampler, head_sampler
from rltrace.recording import otel_context
from rltrace.recording.recorder import RecordBase, RecorderState, follow_runtime_context, internal_error
from rltrace.seams import (
    ChromeSink,
    Record,
    RecordExporter,
    RecordProcessor,
    RecordSink,
    Sinks,
    SupportsOnRecord,
    as_record_processor,
)
from rltrace.sessions import SessionRegistry
from rltrace.sessions.flight import FlightRecorder, ring_name
from rltrace.sessions.metric_aggregates import make_aggregates
from rltrace.sessions.metrics_processor import SessionMetricsProcessor
from rltrace.version import __version__

logger = logging.getLogger("rltrace")

TRACES_DIR = "perf_tracer"
SESSIONS_DIR = "session_tracer"


class Pipeline:
    """One configured tracing pipeline (see module docstring)."""

    def __init__(
        self, cfg: TracerConfig, rank: int, world_size: int, logdir: Path,
        user_processors: list[SpanProcessor], metric_readers: list[Any] | None = None,
        sampler: Any = None, *, clock: Callable[[], int] | None = None,
        id_generator: IdGenerator | None = None, registry: SessionRegistry, state: RecorderState,
        counters: Counters | None = None,
        user_record_processors: Sequence[RecordProcessor | SupportsOnRecord] | None = None,
        on_unlock: Callable[[], None] | None = None, sinks: Sinks, guard: GuardedDirs | None = None,
    ) -> None:
        self.cfg = cfg
        #: the log dirs whose folders every open of this pipeline's files re-checks (the runtime's)
        self.guard = guard
        #: what the Chrome file and the session records are written with
        self.sinks = sinks
        #: how recording threads and the exporter thread share the export work
        self.tuning = cfg.export_tuning
        #: whether this interpreter's threads share one GIL (False on a free-threaded build that
        #: runs without it), unless ``tuning.shared_gil`` says
        self._interpreter_gil: bool = getattr(sys, "_is_gil_enabled", lambda: True)()
        #: the session registry whose open tasks and misuse ``diagnostics`` reports
        self.registry = registry
        #: the recorder state whose queue this pipeline drains
        self.state = state
        #: the user's counters, written to the Chrome trace as counter tracks
        self.counters = counters if counters is not None else Counters()
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
        self.owned: list[RecordSinkProcessor] = []
        self.user_processors = list(user_processors)
        self.chrome_path: Path | None = None
        self.sessions_path: Path | None = None
        #: every record processor, rltrace's then the user's, in the order they are fed
        self.record_processors: list[RecordProcessor] = []
        self.session_processor: SessionMetricsProcessor | None = None
        self.metric_readers: list[Any] = []
        self.meter_provider = self._meter_provider(cfg, metric_readers or [])
        #: the ring every finalized session is kept in until its record is on disk
        self.flight: FlightRecorder | None = None
        #: the live state ``rltrace top`` reads (open sessions, current step), when enabled
        self.live: LivePublisher | None = None
        #: the live state's step scope collector, until the process records a step scope
        self._step_scopes: RecordProcessor | None = None
        if cfg.session_tracer.enabled:
            self._session_side(cfg, registry)
        self.summary: ScopeSummary | None = None
        if cfg.print_summary:  # collected only when asked for (it costs the exporter thread)
            self.summary = ScopeSummary(counters=self.counters)
            self.record_processors.append(self.summary)
        self._counters_seen: dict[str, float] = {}
        self.user_record_processors = [as_record_processor(p) for p in user_record_processors or ()]
        #: called after each flush released the pipeline's lock (a deferred SIGTERM resumes)
        self._on_unlock = on_unlock
        self.record_processors.extend(self.user_record_processors)
        self.chrome: ChromeSink | None = None
        #: the rank's native trace written as the run goes (``exporters.native``)
        self.native: Any = None
        if cfg.enabled and cfg.exporters.chrome:
            self.chrome_path = logdir / TRACES_DIR / self._file_name("traces", os.getpid())
            self.chrome = sinks.chrome(
                self.chrome_path, rank=rank, world_size=world_size, role=cfg.role,
                host=self.host, experiment=cfg.experiment_name, trial=cfg.trial_name, guard=guard,
            )
            self.add_queued(self.chrome)
            if cfg.exporters.native:
                self._native_side(cfg.exporters.native_counter_cap)
        self.otlp: BoundedBatchProcessor | None = None
        #: the thread sending for the last ``wait_otlp`` (one at a time), and its lock
        self._otlp_flusher: threading.Thread | None = None
        self._otlp_flush_lock = threading.Lock()
        self.tail_sampler: TaskTailSampler | None = None
        #: the SDK exporters' own log lines, folded into this pipeline's warning about OTLP loss
        self.sdk_logs = SdkLogFold()
        self._otlp_side(cfg)
        if self.chrome is not None:  # slices name their OTel ids when the spans go out over OTLP
            self.chrome.encoder.with_ids = self.otlp is not None
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
        #: offers to help that found a cycle running past ``help_wait_s`` (then backed off)
        self.help_timeouts = 0
        self._help_after = 0
        #: when the last export cycle ended (monotonic): the queue is what came since
        self._cycled_at = time.monotonic()
        #: a recording thread runs the cycle (:meth:`help`): the live publish is left to the
        #: exporter thread
        self._helping = False
        self._dropped_reported = 0
        self._lost_reported = 0
        self._lost_warned_at = 0.0
        self.errors = 0
        if self.session_processor is not None and cfg.session_tracer.flight_recorder:
            self._new_flight(os.getpid())  # last: a configure that fails above leaves no ring

    def _native_side(self, counter_cap: int) -> None:
        """The rank's native Perfetto trace, drawn from the records the Chrome exporter writes."""
        from rltrace.logdir.files import open_fresh
        from rltrace.timeline.stream import SUFFIX, RankTraceWriter

        assert self.chrome_path is not None and self.chrome is not None
        self.native = RankTraceWriter(self.chrome_path.with_suffix(SUFFIX),
                                      functools.partial(open_fresh, guard=self.guard),
                                      counter_cap=counter_cap)
        self.chrome.tap = self.native.lines

    def _session_side(self, cfg: TracerConfig, registry: SessionRegistry) -> None:
        """Session records (and their metrics), the flight recorder, the live state."""
        self.sessions_path = self.log_dir / SESSIONS_DIR / self._file_name("sessions", os.getpid())
        meter = aggregates = None
        if self.meter_provider is not None:
            # aggregated in place and handed to the readers as finished points; through the
            # SDK one measurement at a time only if a reader wants another aggregation
            aggregates = make_aggregates(self.metric_readers, self.resource,
                                         InstrumentationScope("rltrace", __version__))
            if aggregates is None:
                meter = self.meter_provider.get_meter("rltrace", __version__)
        self.session_processor = SessionMetricsProcessor(
            self.sinks.session_records(self.sessions_path, cfg.session_tracer.flush_threshold,
                                       self.guard),
            rank=self.rank, meter=meter, role=cfg.role, aggregates=aggregates,
            phases=registry.phases,
        )
        self.record_processors.append(self.session_processor)
        if cfg.live_interval_s > 0:
            step_scopes = StepScopeCollector()  # the scope side of top's goodput split
            # fed records once the process records steps
            self._step_scopes = as_record_processor(step_scopes)
            self.live = LivePublisher(
                live_path(self.log_dir, self._file_name("live", os.getpid())),
                interval_s=cfg.live_interval_s, session_processor=self.session_processor,
                rank=self.rank, world_size=self.world_size, role=cfg.role, host=self.host,
                experiment=cfg.experiment_name, trial=cfg.trial_name, registry=registry,
                step_scopes=step_scopes, guard=self.guard,
            )

    def _otlp_side(self, cfg: TracerConfig) -> None:
        """The OTLP sender (behind session-aware sampling when that is the mode), if configured."""
        otlp = make_span_exporter(cfg.otlp, self.sdk_logs)
        if otlp is None:
            return
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

    def wait_otlp(self, wait_s: float) -> bool:
        """Have the OTLP sender send what it holds, returning after at most ``wait_s`` (True when
        all of it was sent).  The send runs on a helper thread: the SDK exporter retries a
        refused connection with backoff up to its own timeout (about 7 s by default), which no
        caller's bound reaches into, so the caller stops waiting at ``wait_s`` and the helper
        finishes (or the processor's shutdown ends) that export."""
        otlp = self.otlp
        if otlp is None:
            return True
        deadline = time.monotonic() + max(0.0, wait_s)
        with self._otlp_flush_lock:
            helper = self._otlp_flusher
            if helper is not None and helper.is_alive():
                # one helper at a time: a loop that flushes each step against a dead collector
                # waits on the send in progress instead of starting another behind it
                helper.join(max(0.0, deadline - time.monotonic()))
                if helper.is_alive():
                    return False
            done: list[bool] = []
            left = max(0.0, deadline - time.monotonic())

            def send() -> None:
                try:
                    done.append(otlp.force_flush(max(1, int(left * 1000))))
                except Exception as exc:  # never reaches the caller
                    internal_error("OTLP flush", exc)

            helper = self._otlp_flusher = threading.Thread(target=send, name="rltrace-otlp-flush",
                                                           daemon=True)
            helper.start()
            helper.join(left)
            return bool(done and done[0])

    def _new_flight(self, pid: int) -> None:
        """A ring for this process's session records, given to the registry."""
        assert self.sessions_path is not None
        path = self.sessions_path.with_name(ring_name(self.rank, pid))
        try:
            self.flight = FlightRecorder(path, self.sessions_path, role=bool(self.cfg.role),
                                         guard=self.guard)
        except OSError as exc:  # tracing goes on without it
            internal_error(f"flight recorder {path}", exc)
            self.flight = None
        self.registry.flight = self.flight

    def _close_flight(self, remove: bool) -> None:
        """Stop keeping sessions; ``remove`` the ring when every record it backs up is on disk
        (kept after a disk fault lost lines: ``rltrace recover`` restores them)."""
        flight = self.flight
        if flight is None:
            return
        self.flight = None
        if self.registry.flight is flight:
            self.registry.flight = None
        sp = self.session_processor
        whole = sp is not None and sp.writer.failed == 0 and sp.writer.lost == 0
        flight.close(remove=remove and whole)

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
    def _own(self, processor: RecordSinkProcessor) -> None:
        self.owned.append(processor)
        self.processor.add_span_processor(processor)

    def add_queued(self, exporter: RecordExporter) -> QueuedExportProcessor:
        proc = QueuedExportProcessor(exporter)
        self.queued.append(proc)
        self._own(proc)
        return proc

    def add_record_processor(self, processor: RecordProcessor | SupportsOnRecord) -> None:
        """Feed ``processor`` too, from the next cycle on (a user's: kept across reconfiguration
        by the runtime, never shut down here)."""
        proc = as_record_processor(processor)
        with self._lock:
            self.user_record_processors.append(proc)
            self.record_processors.append(proc)

    def remove_record_processor(self, processor: RecordProcessor | SupportsOnRecord) -> None:
        """Stop feeding a processor given to :meth:`add_record_processor` (if it was)."""
        with self._lock:
            if processor in self.user_record_processors:
                self.user_record_processors.remove(as_record_processor(processor))
                self.record_processors.remove(as_record_processor(processor))

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
        self._direct = not self.user_processors and all(p.takes_records for p in self.owned)
        #: in direct mode, everything that is handed the records themselves
        self._record_sinks: list[RecordSink] = [p for p in self.owned if p.takes_records]

    # -- the exporter thread ------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rltrace-exporter", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def help(self) -> None:
        """The queue passed ``help_at`` on a recording thread: export a cycle of ``cycle_max``
        records here (the knobs are :class:`rltrace.config.ExportTuning`), after the exporter's
        running cycle if there is one, when the records came at ``help_rate`` or faster, or
        ``help_backlog`` of them are queued.

        With the GIL, a recording thread that records that fast holds the GIL most of the
        time: the exporter thread would take it for its cycle all the same (the loop waits as
        long), and the records it is handed were made on another core and survived the GC's
        young collections by then.  Exported here, a few hundred at a time, they are still in
        this core's cache and die young.  Records that trickle in are left to the exporter
        thread (woken at ``wake_at``, or its timed cycle), which can then run while the
        recording thread waits on something else; so is everything when threads run in
        parallel (a free-threaded build), or when span or record processors of the user's are
        in the cycle (their code, which may block, stays off the training loop).  The live
        state's publish (a snapshot of every open session) stays the exporter thread's too,
        where the loop interleaves with it: a helping cycle that finds it due wakes that
        thread for it.

        Waiting for the lock gives a running cycle the GIL to finish.  The wait is bounded
        (``help_wait_s``): a cycle that does not end in that time (a stalled disk) is left
        alone until the queue has grown by another ``help_backlog`` records, so the training
        loop waits that long at most once per ``help_backlog`` records (and fully only at
        twice the queue's cap).
        """
        lock, tuning = self._lock, self.tuning
        n = len(self.state.buffer)
        if n < self._help_after or lock.held_by_me():
            return
        gil = self._interpreter_gil if tuning.shared_gil is None else tuning.shared_gil
        if n < tuning.help_backlog and (
                not gil or not self._direct or self.user_record_processors
                or (time.monotonic() - self._cycled_at) * tuning.help_rate > n):
            return  # records trickling in, threads that run in parallel, or processors of the
        # user's in the cycle (their code stays off the recording thread): the exporter's
        # wake at ``wake_at`` or its timed cycle takes them
        if lock.acquire(timeout=tuning.help_wait_s):
            try:
                self.helped += 1
                self._help_after = 0
                self._helping = True
                self.flush(everything=False, batch=tuning.cycle_max)
            finally:
                self._helping = False
                lock.release()
        else:
            self.help_timeouts += 1
            self._help_after = len(self.state.buffer) + tuning.help_backlog
        if self._on_unlock is not None:  # a SIGTERM deferred while this thread waited or held
            self._on_unlock()

    def overflow(self, record: Any) -> None:
        """A kept record met a queue at twice its cap: export a batch on this thread first.

        Backpressure instead of loss: the caller does the exporter's work, so session records
        are never dropped and the queue stays bounded (plain spans were dropped before this).
        """
        self.backpressure += 1
        self.flush(everything=False)
        self.state.buffer.append(record)

    def _run(self) -> None:
        interval = self.cfg.flush_interval_s
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            cycle = self.tuning.cycle_max
            self.flush(everything=False, batch=cycle)
            buf = self.state.buffer
            while len(buf) >= cycle and not self._stop.is_set():  # between batches the
                self.flush(everything=False, batch=cycle)  # lock is free: help() may run

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
                with otel_context.instrumentation_suppressed():  # exporters never trace themselves
                    self._cycle(batch)
                    if everything:
                        for q in self.queued:  # lines a disk fault held back are retried now
                            q.force_flush()
                        for rp in self.record_processors:
                            rp.force_flush()
                        if self.live is not None:
                            self.live.aggregate()  # what finished is counted, nothing held
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
        self.state.thread_names.refresh()
        follow_runtime_context()  # OTel's runtime context replaced since the last cycle: followed
        if self._step_scopes is not None and self.state.stepped:
            self.record_processors.append(self._step_scopes)  # the first step's records on
            self._step_scopes = None
        held = self.state.held_events
        if held:
            held.resolve()
        buf = self.state.buffer
        todo = len(buf) if batch is None else min(batch, len(buf))
        # one cycle at a time takes from the queue (under the pipeline's lock) and recording
        # threads only append, so ``todo`` records are there; taken in C (``popleft`` until
        # ``todo``: a record is never None)
        taken = list(islice(iter(buf.popleft, None), todo))
        if taken:  # a timed cycle may find none: processors are never handed an empty cycle
            for rp in self.record_processors:
                taken = self._feed(rp, taken)
        if self._direct:
            for q in self._record_sinks:  # the whole cycle at once (queued exporters take it)
                try:
                    q.on_end_batch(taken, self._sink_error)  # a record that fails is counted there
                except Exception as exc:  # the sink itself failed: the next one goes on
                    self._sink_error(exc)
        else:
            build = self.builder.build
            on_end = self.processor.on_end
            for rec in taken:
                try:
                    on_end(build(rec) if isinstance(rec, RecordBase) else rec)
                except Exception as exc:
                    self._sink_error(exc)
        self._drain()
        self._cycled_at = time.monotonic()

    def _feed(self, rp: RecordProcessor, records: list[Any]) -> list[Any]:
        """Give a cycle's records to record processor ``rp``; return those it did not fail on (a
        record a processor raised for is counted and not exported)."""
        failed: list[Record] = []

        def on_error(rec: Record, exc: Exception) -> None:
            failed.append(rec)
            self._sink_error(exc)

        rp.on_records(records, on_error)
        if not failed:
            return records
        gone = {id(rec) for rec in failed}
        return [rec for rec in records if id(rec) not in gone]

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
            counts = self.counters.snapshot()
            changed = {k: v for k, v in counts.items() if self._counters_seen.get(k) != v}
            if changed:
                self.chrome.write_counters(changed, time.time_ns())
                self._counters_seen.update(changed)
        dropped = self.state.dropped
        if dropped > self._dropped_reported:
            logger.warning(
                "rltrace dropped %d spans because the export queue was full (max_queue_size=%d);"
                " raise max_queue_size or lower flush_interval_s",
                dropped - self._dropped_reported, self.state.cap,
            )
            self._dropped_reported = dropped
        self._report_otlp_loss(final=False)
        live = self.live
        if live is not None:
            if self._helping and live.due():  # a snapshot of every open session: 1-45 ms that
                self._wake.set()  # the exporter thread spends, in slices the loop interleaves
            else:
                live.maybe_publish()  # rate-limited: one clock read when not due

    #: seconds the OTLP endpoint must have been failing before a warning during the run (a
    #: short run gets the one at shutdown only)
    OTLP_WARN_AFTER_S = 30.0

    def _report_otlp_loss(self, final: bool) -> None:
        """One warning per rank about spans the OTLP endpoint did not take: at shutdown, with
        the breakdown (sent, failed, dropped at the full queue, still queued at exit) and the
        last error the SDK reported; during a long run, once, after it has failed for
        ``OTLP_WARN_AFTER_S``.  The SDK's own lines are folded into it
        (:mod:`rltrace.pipeline.otlp_exporter`)."""
        otlp = self.otlp
        if otlp is None:
            return
        lost = otlp.dropped + otlp.failed + otlp.unsent_at_exit
        if lost == 0 or (not final and lost <= self._lost_reported):
            return
        now = time.monotonic()
        if not self._lost_warned_at:
            self._lost_warned_at = now  # when the loss was first seen
        if not final and (self._lost_reported or now - self._lost_warned_at < self.OTLP_WARN_AFTER_S):
            return
        last = self.sdk_logs.last
        reason = f"; last error: {last.rstrip('.')}" if last else ""
        if final:
            logger.warning(
                "rltrace rank %d: %d of %d spans did not reach the OTLP endpoint %s: %d failed "
                "(export errors), %d dropped (the send queue was full), %d still queued at exit "
                "(waited at most %.1f s, otlp.timeout_s)%s. Training was not slowed; check the "
                "collector.", self.rank, lost, lost + otlp.exported, self._otlp_endpoint(),
                otlp.failed, otlp.dropped, otlp.unsent_at_exit, otlp.shutdown_timeout_s, reason)
        else:
            logger.warning(
                "rltrace rank %d: the OTLP endpoint %s has not taken %d spans (%d failed, %d "
                "dropped) for %.0f s%s; training is not slowed, and the full count comes at "
                "shutdown.", self.rank, self._otlp_endpoint(), lost, otlp.failed, otlp.dropped,
                now - self._lost_warned_at, reason)
        self._lost_reported = lost

    def _otlp_endpoint(self) -> str:
        try:
            return redact_endpoint(otlp_endpoint(self.cfg.otlp)) or "?"
        except Exception:
            return "?"

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread, flush, and shut down rltrace's own processors (not the user's)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=10 if timeout is None else timeout)
        held = self.state.held_events
        if held:
            try:  # spans held for their CUDA events: wait for the events, then export them
                held.resolve(wait=True)
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
        ours: list[RecordSinkProcessor | RecordProcessor] = [
            *self.owned, *(r for r in self.record_processors if r not in self.user_record_processors)]
        for p in ours:
            try:
                p.shutdown()
            except Exception as exc:
                internal_error("processor shutdown", exc)
        if self.native is not None:  # after the Chrome file's last lines
            self.native.close()
        if meters is not None:
            meters.join(timeout + 1.0)
        self._report_otlp_loss(final=True)
        unfold_sdk_logs(self.sdk_logs)
        self._close_flight(remove=True)
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
        parents_flight, self.flight = self.flight, None
        if parents_flight is not None:  # the parent's ring: this child never writes to it
            parents_flight.close(remove=False)
            self.registry.flight = None
        if self.cfg.fork_mode == "disable":
            return False
        pid = os.getpid()
        if self.chrome is not None:
            self.chrome_path = self.log_dir / TRACES_DIR / self._file_name("traces", pid, True)
            self.chrome.reset_after_fork(self.chrome_path)
            if self.native is not None:
                self.native.after_fork(self.chrome_path.with_suffix(self.native.path.suffix))
        sp = self.session_processor
        if sp is not None and sp.writer is not None:
            self.sessions_path = self.log_dir / SESSIONS_DIR / self._file_name("sessions", pid, True)
            sp.writer.reset_after_fork(self.sessions_path)
            sp.reset_after_fork()
            if parents_flight is not None:
                self._new_flight(pid)
            if self.live is not None:
                self.live.reset_after_fork(live_path(self.log_dir, self._file_name("live", pid, True)))
        if self.otlp is not None:
            self.otlp.reset_after_fork()
        self.start()
        return True

    def diagnostics(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "queued": len(self.state.buffer), "dropped": self.state.dropped, "errors": self.errors,
            "log_dir": str(self.log_dir), "backpressure_cycles": self.backpressure,
            "helped_cycles": self.helped, "help_timeouts": self.help_timeouts,
        }
        for q in self.queued:
            out[type(q.exporter).__name__] = q.stats()
        if self.otlp is not None:
            out["otlp"] = self.otlp.stats()
        if self.native is not None:
            out["native"] = self.native.stats()
        sampling: dict[str, Any] = {"mode": self.cfg.sampling.mode or "parent"}
        if self.head_sampling is not None:
            sampling.update(self.head_sampling.stats())
        if self.tail_sampler is not None:
            sampling.update(self.tail_sampler.stats())
        out["sampling"] = sampling
        held = self.state.held_events
        if held is not None:
            out["device_events"] = held.stats()
        sp = self.session_processor
        if sp is not None:
            out["sessions"] = {"finalized": sp.sessions, "written": sp.writer.written,
                               "failed": sp.writer.failed, "lost": sp.writer.lost,
                               "orphaned": sp.orphaned,
                               "late_phases": sp.late_phases,
                               **self.registry.open_counts()}
        out["misuse"] = dict(self.registry.misuse)
        out["span_api"] = self.state.span_api.snapshot()
        return out
