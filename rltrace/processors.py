"""Span processors rltrace installs in its pipeline.

:class:`QueuedExportProcessor` hands finished spans to an exporter in batches on rltrace's
background exporter thread (the one that builds spans from the recorder), so exporting costs
the training loop nothing and needs no extra thread.  Spans that other OTel instrumentation
ends on any thread are queued the same way.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger("rltrace")


class QueuedExportProcessor(SpanProcessor):
    """Collects ended spans; :meth:`drain` exports everything collected so far in one batch."""

    def __init__(self, exporter: SpanExporter, max_batch: int = 16_384) -> None:
        self.exporter = exporter
        self.max_batch = max_batch
        self._queue: deque[ReadableSpan] = deque()
        self._lock = threading.Lock()
        self.exported = 0
        self.failed = 0
        self._closed = False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not self._closed:
            self._queue.append(span)

    def drain(self) -> None:
        """Export the queued spans (called by the exporter thread or a flush)."""
        with self._lock:
            q = self._queue
            while q:
                n = min(len(q), self.max_batch)
                batch = [q.popleft() for _ in range(n)]
                try:
                    result = self.exporter.export(batch)
                except Exception as exc:  # an exporter must never take tracing down
                    logger.warning("rltrace: %s failed: %r", type(self.exporter).__name__, exc)
                    result = SpanExportResult.FAILURE
                if result is SpanExportResult.SUCCESS:
                    self.exported += n
                else:
                    self.failed += n

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.drain()
        flush = getattr(self.exporter, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else True

    def shutdown(self) -> None:
        self.drain()
        self._closed = True
        self.exporter.shutdown()

    def reset_after_fork(self) -> None:
        """In a forked child: forget spans the parent still owns, take a fresh lock."""
        self._queue = deque()
        self._lock = threading.Lock()
        reset = getattr(self.exporter, "reset_after_fork", None)
        if reset is not None:
            reset()

    def stats(self) -> dict[str, Any]:
        return {"exported": self.exported, "failed": self.failed, "queued": len(self._queue)}
