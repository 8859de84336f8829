"""Span processors rltrace installs in its pipeline.

:class:`BoundedBatchProcessor` sends spans to a network exporter (OTLP) from its own thread
through a bounded queue, counting every span it drops or fails to send.
:class:`QueuedExportProcessor` hands finished spans to an exporter in batches on rltrace's
background exporter thread (the one that builds spans from the recorder), so exporting costs
the training loop nothing and needs no extra thread.  Spans that other OTel instrumentation
ends on any thread are queued the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .otel_compat import EncodedBatch, instrumentation_suppressed
from .recorder import RecordBase

logger = logging.getLogger("rltrace")

#: an encoded OTLP request larger than this is sent in halves: the OTel Collector's gRPC
#: receiver (and gRPC servers generally) refuse messages over 4 MiB by default
MAX_REQUEST_BYTES = 3 << 20


class QueuedExportProcessor(SpanProcessor):
    """Collects ended spans; :meth:`drain` exports everything collected so far in one batch."""

    def __init__(self, exporter: SpanExporter, max_batch: int = 16_384) -> None:
        self.exporter = exporter
        self.max_batch = max_batch
        self._queue: deque[ReadableSpan] = deque()
        self._lock = threading.RLock()  # reentrant: the SIGTERM flush may interrupt a drain
        self.exported = 0
        self.failed = 0
        self.held = 0
        self._closed = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not self._closed:
            self._queue.append(span)

    def on_end_batch(self, spans: list[Any],
                     on_error: Callable[[Exception], None] | None = None) -> None:
        """:meth:`on_end` for each of ``spans`` (the pipeline's export cycle hands them over
        at once; queueing them cannot fail, so ``on_error`` is never called)."""
        if not self._closed:
            self._queue.extend(spans)

    def drain(self) -> None:
        """Export the queued spans (called by the exporter thread or a flush)."""
        with self._lock:
            q = self._queue
            while q:
                n = min(len(q), self.max_batch)
                batch = list(islice(iter(q.popleft, None), n))  # n pops, in C (only here)
                try:
                    result = self.exporter.export(batch)
                except Exception as exc:  # an exporter must never take tracing down
                    logger.warning("rltrace: %s failed: %r", type(self.exporter).__name__, exc)
                    result = SpanExportResult.FAILURE
                if result is SpanExportResult.SUCCESS:
                    self.exported += n + self.held
                    self.held = 0
                elif getattr(self.exporter, "holds_on_failure", False):
                    self.held += n  # kept by the exporter and retried, not lost
                else:
                    self.failed += n

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.drain()
        flush = getattr(self.exporter, "force_flush", None)
        ok = bool(flush(timeout_millis)) if flush is not None else True
        if ok and self.held:  # what a disk fault held back has now been written
            with self._lock:
                self.exported += self.held
                self.held = 0
        return ok

    def shutdown(self) -> None:
        self.drain()
        self._closed = True
        self.exporter.shutdown()

    def reset_after_fork(self) -> None:
        """In a forked child: forget spans the parent still owns, take a fresh lock.

        (The exporter is reset by its owner, which knows where the child should write.)
        """
        self._queue = deque()
        self._lock = threading.RLock()

    def stats(self) -> dict[str, Any]:
        out = {"exported": self.exported, "failed": self.failed, "held": self.held,
               "queued": len(self._queue)}
        extra = getattr(self.exporter, "stats", None)
        if extra is not None:
            out.update(extra())
        return out


class BoundedBatchProcessor(SpanProcessor):
    """Batches spans to a (network) exporter on its own thread; never blocks the caller.

    Like the SDK's ``BatchSpanProcessor`` but it *counts* what it loses: spans refused because
    the bounded queue is full (``dropped``) and spans in batches the exporter failed to send
    (``failed``), so rltrace can warn with the counts and show them in ``diagnostics()``.
    ``shutdown`` waits at most ``shutdown_timeout_s`` for the last export.
    """

    def __init__(
        self, exporter: SpanExporter, *, max_queue_size: int = 65_536,
        max_export_batch_size: int = 512, schedule_delay_s: float = 1.0,
        shutdown_timeout_s: float = 5.0, name: str = "rltrace-otlp",
        encoder: Any = None,
    ) -> None:
        self.exporter = exporter
        #: builds requests from rltrace's records (:class:`rltrace.otlp_encode.RecordEncoder`)
        #: when the exporter takes them; otherwise records become ``ReadableSpan``s first
        self.encoder = encoder if getattr(exporter, "accepts_encoded", False) else None
        self._builder = getattr(encoder, "builder", None)
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self.schedule_delay_s = schedule_delay_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.name = name
        self.exported = 0
        self.dropped = 0
        self.failed = 0
        #: spans not sent because their trace was not sampled
        self.unsampled = 0
        #: whether the last export succeeded (the collector answers)
        self.last_ok = True
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._queue: deque[Any] = deque()  # ReadableSpans, or records
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._export_lock = threading.Lock()
        self._inflight = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    @property
    def takes_records(self) -> bool:
        """Whether rltrace's records can be queued as they are (no ``ReadableSpan`` built)."""
        return self._builder is not None

    def on_end(self, span: Any) -> None:
        """Queue a span: a ``ReadableSpan``, or an rltrace record (:attr:`takes_records`)."""
        rec = getattr(span, "rltrace_record", span)
        if isinstance(rec, RecordBase):
            if not rec.get_span_context().trace_flags.sampled:
                self.unsampled += 1  # its trace was not sampled (rltrace.sampling): not sent
                return
            if self.encoder is not None:  # a span built from a record: encode from the record
                span = rec
        elif not span.context.trace_flags.sampled:  # a foreign span recorded, not sampled
            self.unsampled += 1
            return
        q = self._queue
        if self._stop or len(q) >= self.max_queue_size:
            self.dropped += 1
            return
        q.append(span)
        if len(q) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()  # once: the sender clears it, then empties the queue

    def on_end_batch(self, records: list[Any],
                     on_error: Callable[[Exception], None] | None = None) -> None:
        """:meth:`on_end` for each of the pipeline's ``records`` (one export cycle at once):
        unsampled records are counted, the rest queued up to ``max_queue_size``, the sender
        woken as the queue reaches a batch.  A record that raises is handed to ``on_error``
        (the pipeline counts it) and the others go on, as with one ``on_end`` each."""
        q = self._queue
        if self.encoder is None:  # records become ReadableSpans: one at a time, as on_end
            for rec in records:
                try:
                    self.on_end(rec)
                except Exception as exc:
                    if on_error is None:
                        raise
                    on_error(exc)
            return
        limit, batch, wake = self.max_queue_size, self.max_export_batch_size, self._wake
        room = 0 if self._stop else limit - len(q)
        due = batch - len(q)  # records until the sender has a batch to send
        keep = q.append
        unsampled = 0
        if due <= 0 and not wake.is_set():
            wake.set()
        try:
            for rec in records:
                try:
                    if not isinstance(rec, RecordBase):
                        self.on_end(rec)  # not a record of rltrace's: as it comes
                        room = 0 if self._stop else limit - len(q)
                        continue
                    # ``get_span_context().trace_flags.sampled`` without its two properties: the
                    # flags are the SpanContext tuple's fourth field, bit 0 the sampled flag
                    if not rec.get_span_context()[3] & 1:
                        unsampled += 1
                        continue
                    if room <= 0:  # the sender may have taken some meanwhile
                        room = 0 if self._stop else limit - len(q)
                        if room <= 0:
                            self.dropped += 1
                            continue
                    keep(rec)
                    room -= 1
                    due -= 1
                    if due == 0 and not wake.is_set():
                        wake.set()  # a batch is ready: the sender starts on it while we go on
                except Exception as exc:
                    if on_error is None:
                        raise
                    on_error(exc)
        finally:
            self.unsampled += unsampled
        if len(q) >= batch and not wake.is_set():
            wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.schedule_delay_s)
            self._wake.clear()
            self._export_all()

    def _export_all(self, deadline: float | None = None) -> None:
        with self._export_lock:
            q = self._queue
            while q and not (deadline is not None and time.monotonic() > deadline):
                self._idle.clear()
                n = min(len(q), self.max_export_batch_size)
                batch = list(islice(iter(q.popleft, None), n))  # n pops, in C (as one by one)
                self._inflight = n
                with instrumentation_suppressed():  # an instrumented HTTP client stays quiet
                    sent = self._send(batch)
                self.last_ok = sent == n
                if self._inflight:  # not already written off by a timed-out shutdown
                    self._inflight = 0
                    self.exported += sent
                    self.failed += n - sent
            self._idle.set()

    def _send(self, batch: list[Any]) -> int:
        """Export ``batch``; returns how many of its spans the exporter accepted.  An encoded
        request over :data:`MAX_REQUEST_BYTES` goes in halves."""
        try:
            prepared = self._prepare(batch)
            if (len(batch) > 1 and type(prepared) is EncodedBatch
                    and prepared.request.ByteSize() > MAX_REQUEST_BYTES):
                half = len(batch) // 2
                return self._send(batch[:half]) + self._send(batch[half:])
            ok = self.exporter.export(prepared) is SpanExportResult.SUCCESS
        except Exception as exc:
            logger.debug("rltrace: %s export raised %r", self.name, exc)
            ok = False
        return len(batch) if ok else 0

    def _prepare(self, batch: list[Any]) -> Any:
        """What the exporter is given: an encoded request, or ``ReadableSpan``s."""
        if self.encoder is not None:
            return EncodedBatch(self.encoder.request(batch), len(batch))
        builder = self._builder
        if builder is None:
            return batch
        return [builder.build(s) if isinstance(s, RecordBase) else s for s in batch]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        if not self._export_lock.acquire(timeout=max(0.0, timeout_millis / 1000)):
            return False
        self._export_lock.release()
        self._export_all(deadline)
        return not self._queue

    def send_now(self, timeout_s: float) -> bool:
        """Send what is queued on this thread, waiting at most ``timeout_s``, while the collector
        answers; after a failed export only wake the sender's thread (a dead collector costs
        one wait, not one per call).  Returns whether the queue was emptied here."""
        if not self.last_ok:
            self._wake.set()
            return False
        return self.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(self.shutdown_timeout_s)
        if not self._thread.is_alive():
            self._export_all(time.monotonic() + self.shutdown_timeout_s)
        self.dropped += len(self._queue)  # could not be sent in time
        self._queue.clear()
        try:
            try:
                self.exporter.shutdown(timeout_millis=int(self.shutdown_timeout_s * 1000))  # type: ignore[call-arg]
            except TypeError:
                self.exporter.shutdown()
        except Exception as exc:
            logger.debug("rltrace: %s exporter shutdown raised %r", self.name, exc)
        self._thread.join(1.0)
        stuck, self._inflight = self._inflight, 0
        self.failed += stuck  # an export still hanging after shutdown: written off

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's queue is the parent's; start a fresh worker."""
        self._init_runtime()

    def stats(self) -> dict[str, Any]:
        out = {"exported": self.exported, "dropped": self.dropped, "failed": self.failed,
               "queued": len(self._queue), "unsampled": self.unsampled}
        enc = self.encoder
        if enc is not None:  # spans encoded from records directly / through the SDK's encoder
            out.update(encoded_direct=enc.fast, encoded_by_sdk=enc.slow)
        return out
