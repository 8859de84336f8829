"""Span processors rltrace installs in its pipeline, over one batching mechanism.

:class:`BatchQueue` is how every exporter is fed: a queue of spans (or rltrace records) taken in
batches of at most ``max_batch``, each handed to the exporter, with exact accounting of what
was exported, what failed, and what an exporter that keeps a failed batch holds for its retry
(as the SDK's shared ``BatchProcessor`` serves both its span and log processors).  Two
schedules drain it:

* :class:`QueuedExportProcessor` on rltrace's exporter thread, at the end of each export cycle
  (files: the Chrome trace), so exporting needs no thread of its own;
* :class:`BoundedBatchProcessor` on a sender thread of its own, behind a bounded queue that
  never blocks the caller (the network: OTLP), counting what it drops.

Spans that other OTel instrumentation ends on any thread are queued the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from rltrace.recording.otel_context import EncodedBatch, instrumentation_suppressed
from rltrace.recording.recorder import RecordBase
from rltrace.seams import Record, RecordExporter, SinkErrorHandler

if TYPE_CHECKING:
    from rltrace.pipeline.otlp_encode import RecordEncoder

#: what a sink queues and an exporter is handed: rltrace's records, or other instrumentation's
#: ``ReadableSpan``s
Item = Record | ReadableSpan

logger = logging.getLogger("rltrace")

#: an encoded OTLP request larger than this is sent in halves: the OTel Collector's gRPC
#: receiver (and gRPC servers generally) refuse messages over 4 MiB by default
MAX_REQUEST_BYTES = 3 << 20


class BatchQueue:
    """Spans (or records) queued for one exporter, exported in batches, each one counted.

    :meth:`drain` takes batches of at most ``max_batch`` and hands each to ``send``, which
    returns how many of the batch were accepted (the rest: ``failed``); an exporter that keeps
    what it could not write and retries it (``holds_on_failure``: a file on a full disk) has
    them ``held`` instead, counted as exported once a later batch goes through.  A drain that
    runs past its deadline leaves the rest queued; an export still in flight when its owner
    gives up on it can be written off as failed (:meth:`write_off_inflight`).
    """

    def __init__(self, max_batch: int, *, holds_on_failure: bool = False) -> None:
        self.max_batch = max_batch
        self.holds_on_failure = holds_on_failure
        self.exported = 0
        self.failed = 0
        self.held = 0
        self.reset()

    def reset(self) -> None:
        """An empty queue and a fresh lock (a new object, or a forked child: the parent's spans
        are the parent's)."""
        self.items: deque[Any] = deque()
        self.lock = threading.RLock()  # reentrant: the SIGTERM flush may interrupt a drain
        self.inflight = 0

    def __len__(self) -> int:
        return len(self.items)

    def drain(self, send: Callable[[list[Any]], int], deadline: float | None = None) -> None:
        """Export what is queued, batch by batch, until empty (or past ``deadline``, a
        ``time.monotonic()`` value)."""
        with self.lock:
            q = self.items
            while q and not (deadline is not None and time.monotonic() > deadline):
                n = min(len(q), self.max_batch)
                batch = list(islice(iter(q.popleft, None), n))  # n pops, in C
                self.inflight = n
                sent = send(batch)
                if self.inflight:  # not already written off by a timed-out shutdown
                    self.inflight = 0
                    self._count(n, sent)

    def _count(self, n: int, sent: int) -> None:
        if sent == n:
            self.exported += n + self.held
            self.held = 0
        elif self.holds_on_failure:
            self.held += n  # kept by the exporter and retried, not lost
        else:
            self.exported += sent
            self.failed += n - sent

    def settle_held(self) -> None:
        """What the exporter held has now been written (its flush succeeded)."""
        with self.lock:
            self.exported += self.held
            self.held = 0

    def write_off_inflight(self) -> int:
        """Count an export still hanging as failed; returns how many spans that was."""
        stuck, self.inflight = self.inflight, 0
        self.failed += stuck
        return stuck


class RecordSinkProcessor(SpanProcessor):
    """A span processor of rltrace's that the pipeline can also hand its records directly
    (:class:`rltrace.seams.RecordSink`): a whole export cycle at once, no ``ReadableSpan`` built
    when :attr:`takes_records`."""

    @property
    def takes_records(self) -> bool:
        """Whether records can be handed over as they are (else the pipeline builds spans)."""
        return False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: Item) -> None:
        """An ended span, or one of rltrace's records (subclasses queue it)."""

    def on_end_batch(self, records: Sequence[Item],
                     on_error: SinkErrorHandler | None = None) -> None:
        """:meth:`on_end` for each of an export cycle's ``records``; one that raises is handed to
        ``on_error`` (the pipeline counts it) and the others go on."""
        on_end = self.on_end
        for rec in records:
            try:
                on_end(rec)
            except Exception as exc:
                if on_error is None:
                    raise
                on_error(exc)


def _export_result(exporter: RecordExporter | SpanExporter, batch: Any, count: int,
                   name: str) -> int:
    """``exporter.export(batch)`` as the number of spans accepted: all or none (an exporter
    that raises has failed: it must never take tracing down)."""
    try:
        ok = exporter.export(batch) is SpanExportResult.SUCCESS
    except Exception as exc:
        logger.warning("rltrace: %s failed: %r", name, exc)
        ok = False
    return count if ok else 0


class QueuedExportProcessor(RecordSinkProcessor):
    """Collects ended spans and records; :meth:`drain` exports them on the calling thread (the
    pipeline's exporter thread, or a flush), through a :class:`BatchQueue`."""

    def __init__(self, exporter: RecordExporter, max_batch: int = 16_384) -> None:
        self.exporter = exporter
        self.batches = BatchQueue(max_batch, holds_on_failure=exporter.holds_on_failure)
        self._closed = False

    @property
    def takes_records(self) -> bool:
        return True

    @property
    def exported(self) -> int:
        return self.batches.exported

    @property
    def failed(self) -> int:
        return self.batches.failed

    @property
    def held(self) -> int:
        return self.batches.held

    def on_end(self, span: Item) -> None:
        if not self._closed:
            self.batches.items.append(span)

    def on_end_batch(self, spans: Sequence[Item],
                     on_error: SinkErrorHandler | None = None) -> None:
        """:meth:`on_end` for each of ``spans`` (the pipeline's export cycle hands them over
        at once; queueing them cannot fail, so ``on_error`` is never called)."""
        if not self._closed:
            self.batches.items.extend(spans)

    def drain(self) -> None:
        """Export the queued spans (called by the exporter thread or a flush)."""
        exporter, name = self.exporter, type(self.exporter).__name__
        self.batches.drain(lambda batch: _export_result(exporter, batch, len(batch), name))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.drain()
        ok = bool(self.exporter.force_flush(timeout_millis))
        if ok and self.batches.held:  # what a disk fault held back has now been written
            self.batches.settle_held()
        return ok

    def shutdown(self) -> None:
        self.drain()
        self._closed = True
        self.exporter.shutdown()

    def reset_after_fork(self) -> None:
        """In a forked child: forget spans the parent still owns, take a fresh lock.

        (The exporter is reset by its owner, which knows where the child should write.)
        """
        self.batches.reset()

    def stats(self) -> dict[str, int]:
        b = self.batches
        out = {"exported": b.exported, "failed": b.failed, "held": b.held, "queued": len(b)}
        out.update(self.exporter.stats())
        return out


class BoundedBatchProcessor(RecordSinkProcessor):
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
        encoder: RecordEncoder | None = None,
    ) -> None:
        self.exporter = exporter
        #: builds requests from rltrace's records when the exporter takes them (an SDK OTLP
        #: exporter that ``accepts_encoded``); otherwise records become ``ReadableSpan``s first
        self.encoder = encoder if getattr(exporter, "accepts_encoded", False) else None
        self._builder = encoder.builder if encoder is not None else None
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = max_export_batch_size
        self.schedule_delay_s = schedule_delay_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.name = name
        #: ReadableSpans, or records (:attr:`takes_records`), queued for the sender thread
        self.batches = BatchQueue(max_export_batch_size)
        #: spans refused because the queue was full
        self.dropped = 0
        #: spans still queued when shutdown's wait ended (or the collector had stopped answering)
        self.unsent_at_exit = 0
        #: spans not sent because their trace was not sampled
        self.unsampled = 0
        #: whether the last export succeeded (the collector answers)
        self.last_ok = True
        self._init_runtime()

    @property
    def exported(self) -> int:
        return self.batches.exported

    @property
    def failed(self) -> int:
        return self.batches.failed

    def _init_runtime(self) -> None:
        self.batches.reset()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def takes_records(self) -> bool:
        """Whether rltrace's records can be queued as they are (no ``ReadableSpan`` built)."""
        return self._builder is not None

    def on_end(self, span: Any) -> None:
        """Queue a span: a ``ReadableSpan``, or an rltrace record (:attr:`takes_records`)."""
        rec = getattr(span, "rltrace_record", span)
        if isinstance(rec, RecordBase):
            if not rec.get_span_context().trace_flags.sampled:
                self.unsampled += 1  # its trace was not sampled (rltrace.pipeline.sampling): not sent
                return
            if self.encoder is not None:  # a span built from a record: encode from the record
                span = rec
        elif not span.context.trace_flags.sampled:  # a foreign span recorded, not sampled
            self.unsampled += 1
            return
        q = self.batches.items
        if self._stop or len(q) >= self.max_queue_size:
            self.dropped += 1
            return
        q.append(span)
        if len(q) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()  # once: the sender clears it, then empties the queue

    def on_end_batch(self, records: Sequence[Item],
                     on_error: SinkErrorHandler | None = None) -> None:
        """:meth:`on_end` for each of the pipeline's ``records`` (one export cycle at once):
        unsampled records are counted, the rest queued up to ``max_queue_size``, the sender
        woken as the queue reaches a batch.  A record that raises is handed to ``on_error``
        (the pipeline counts it) and the others go on, as with one ``on_end`` each."""
        if self.encoder is None:  # records become ReadableSpans: one at a time, as on_end
            super().on_end_batch(records, on_error)
            return
        q, wake = self.batches.items, self._wake
        if len(q) >= self.max_export_batch_size and not wake.is_set():
            wake.set()
        self._queue_records(records, on_error)
        if len(q) >= self.max_export_batch_size and not wake.is_set():
            wake.set()

    def _queue_records(self, records: Sequence[Item], on_error: SinkErrorHandler | None) -> None:
        """The intake of :meth:`on_end_batch` for an encoding exporter: one pass with the queue's
        free room and the next batch mark kept in locals, so it costs no Python call per span
        (the per-record steps are :meth:`on_end`'s)."""
        q = self.batches.items
        limit, wake = self.max_queue_size, self._wake
        room = 0 if self._stop else limit - len(q)
        due = self.max_export_batch_size - len(q)  # records until the sender has a batch
        keep = q.append
        unsampled = 0
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

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.schedule_delay_s)
            self._wake.clear()
            self._export_all()

    def _export_all(self, deadline: float | None = None) -> None:
        with self.batches.lock:
            self.batches.drain(self._send_one, deadline)
            self._idle.set()

    def _send_one(self, batch: list[Any]) -> int:
        """One batch of :meth:`_export_all`, with instrumentation suppressed (an instrumented
        HTTP client stays quiet); notes whether the collector took it."""
        self._idle.clear()
        with instrumentation_suppressed():
            sent = self._send(batch)
        self.last_ok = sent == len(batch)
        return sent

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
        if not self.batches.lock.acquire(timeout=max(0.0, timeout_millis / 1000)):
            return False
        self.batches.lock.release()
        self._export_all(deadline)
        return not self.batches.items

    def send_now(self, timeout_s: float) -> bool:
        """Send what is queued on this thread, waiting at most ``timeout_s``, while the collector
        answers; after a failed export only wake the sender's thread (a dead collector costs
        one wait, not one per call).  Returns whether the queue was emptied here."""
        if not self.last_ok:
            self._wake.set()
            return False
        return self.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Send what is queued, waiting at most ``shutdown_timeout_s`` for the sender (and as
        long again for the last batch); what is left then is counted in ``unsent_at_exit``."""
        self._stop = True
        self._wake.set()
        self._thread.join(self.shutdown_timeout_s)
        if not self._thread.is_alive():
            self._export_all(time.monotonic() + self.shutdown_timeout_s)
        self.unsent_at_exit += len(self.batches.items)  # could not be sent in time
        self.batches.items.clear()
        self._shutdown_exporter()
        self._thread.join(1.0)
        self.batches.write_off_inflight()  # an export still hanging after shutdown

    def _shutdown_exporter(self) -> None:
        try:
            try:
                self.exporter.shutdown(timeout_millis=int(self.shutdown_timeout_s * 1000))  # type: ignore[call-arg]
            except TypeError:
                self.exporter.shutdown()
        except Exception as exc:
            logger.debug("rltrace: %s exporter shutdown raised %r", self.name, exc)

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's queue is the parent's; start a fresh worker."""
        self._init_runtime()

    def stats(self) -> dict[str, Any]:
        out = {"exported": self.exported, "dropped": self.dropped, "failed": self.failed,
               "unsent_at_exit": self.unsent_at_exit, "queued": len(self.batches.items),
               "unsampled": self.unsampled}
        enc = self.encoder
        if enc is not None:  # spans encoded from records directly / through the SDK's encoder
            out.update(encoded_direct=enc.fast, encoded_by_sdk=enc.slow)
        return out
