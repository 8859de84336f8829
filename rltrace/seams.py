"""The typed seams of the export loop: what a record is, what consumes records, what writes them.

The recorder hands the pipeline *records* (finished rltrace scopes, :class:`Record`).  Each export
cycle the pipeline gives them first to every *record processor* (:class:`RecordProcessor`:
session metrics, the run summary, the stats bridge, the user's), then to every *record sink*
(:class:`RecordSink`: the queue in front of the Chrome file, the OTLP sender), which hands
batches to an *exporter* (:class:`RecordExporter`) that writes them.  The session records go to a
:class:`SessionRecordSink`.

A user's record processor needs only ``on_record``; :func:`as_record_processor` gives it the
rest of the contract with the defaults of :class:`RecordProcessor`, so the pipeline calls every
hook without probing for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext

from rltrace.logdir.files import GuardedDirs

__all__ = [
    "ChromeSink",
    "ChromeSinkFactory",
    "Record",
    "RecordErrorHandler",
    "RecordExporter",
    "RecordProcessor",
    "RecordSink",
    "SessionRecordSink",
    "SinkErrorHandler",
    "Sinks",
    "SupportsOnRecord",
    "as_record_processor",
]


class Record(Protocol):
    """A finished rltrace scope as the pipeline hands it on (:class:`rltrace.recording.recorder.Scope`).

    ``record_attrs()`` gives its attributes (the ``rl.*`` attributes of tasks, sessions and
    phases, and any set through ``set_attribute``); :func:`rltrace.steps.step_of` its training
    step.
    """

    @property
    def name(self) -> str: ...
    @property
    def category(self) -> object: ...
    @property
    def args(self) -> Mapping[str, object] | None: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...
    @property
    def thread(self) -> int: ...
    @property
    def lane(self) -> int: ...
    @property
    def extra(self) -> Mapping[str, object] | None: ...

    def record_attrs(self) -> Mapping[str, object] | None: ...

    def get_span_context(self) -> SpanContext: ...


#: called by a record processor for a record it failed on (the record is counted and not exported)
RecordErrorHandler = Callable[[Record, Exception], None]
#: called by a record sink for a record it could not take (the pipeline counts it)
SinkErrorHandler = Callable[[Exception], None]


class SupportsOnRecord(Protocol):
    """The least a user's record processor has: ``on_record(record)`` for every finished scope.

    It may also define any hook of :class:`RecordProcessor` (``on_records``, ``force_flush``,
    ``shutdown``, ``reset_after_fork``); those it does not define do nothing.
    """

    def on_record(self, record: Record) -> None: ...


class RecordProcessor:
    """Consumes records on the exporter thread, before any ``ReadableSpan`` is built.

    Subclasses override :meth:`on_record`, or :meth:`on_records` to take each export cycle's
    records at once; the other hooks default to doing nothing.
    """

    def on_record(self, record: Record) -> None:
        """One finished record."""

    def on_records(self, records: Sequence[Record], on_error: RecordErrorHandler) -> None:
        """An export cycle's records, in order; ``on_error(record, exc)`` for each one this
        processor fails on (counted, and not exported), the others go on."""
        on_record = self.on_record
        for rec in records:
            try:
                on_record(rec)
            except Exception as exc:
                on_error(rec, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write what is held (every explicit flush calls it); True when all of it was."""
        return True

    def shutdown(self) -> None:
        """The pipeline closes (rltrace's own processors only; the user's outlive it)."""

    def reset_after_fork(self) -> None:
        """In a forked child: forget what belongs to the parent."""


class _UserRecordProcessor(RecordProcessor):
    """A user's processor given the whole contract: each hook it defines, resolved once.

    It compares equal to the processor it wraps, so the runtime's lists find it by the user's
    object."""

    def __init__(self, inner: SupportsOnRecord) -> None:
        self.inner = inner
        self._on_record = inner.on_record
        self._on_records: Callable[[Sequence[Record], RecordErrorHandler], None] | None = getattr(
            inner, "on_records", None)
        self._force_flush: Callable[[], object] | None = getattr(inner, "force_flush", None)
        self._shutdown: Callable[[], object] | None = getattr(inner, "shutdown", None)
        self._reset: Callable[[], object] | None = getattr(inner, "reset_after_fork", None)

    def on_record(self, record: Record) -> None:
        self._on_record(record)

    def on_records(self, records: Sequence[Record], on_error: RecordErrorHandler) -> None:
        if self._on_records is not None:
            self._on_records(records, on_error)
        else:
            super().on_records(records, on_error)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True if self._force_flush is None else bool(self._force_flush())

    def shutdown(self) -> None:
        if self._shutdown is not None:
            self._shutdown()

    def reset_after_fork(self) -> None:
        if self._reset is not None:
            self._reset()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _UserRecordProcessor):
            return other.inner is self.inner
        return other is self.inner

    def __hash__(self) -> int:
        return id(self.inner)


def as_record_processor(processor: RecordProcessor | SupportsOnRecord) -> RecordProcessor:
    """``processor`` with every hook of :class:`RecordProcessor` (itself when it is one)."""
    if isinstance(processor, RecordProcessor):
        return processor
    return _UserRecordProcessor(processor)


class RecordSink(Protocol):
    """Takes each export cycle's records for an exporter (rltrace's span processors)."""

    @property
    def takes_records(self) -> bool:
        """Whether records can be handed over as they are (no ``ReadableSpan`` built first)."""
        ...

    def on_end_batch(self, records: Sequence[Record | ReadableSpan],
                     on_error: SinkErrorHandler | None = None) -> None:
        """The cycle's records at once; ``on_error(exc)`` for one it could not take."""
        ...


class RecordExporter(Protocol):
    """Writes batches of records (or ``ReadableSpan``s) somewhere: the Chrome trace file."""

    #: whether a failed batch is kept and retried by the exporter (then counted as held, not lost)
    holds_on_failure: bool

    def export(self, records: Sequence[Record | ReadableSpan]) -> SpanExportResult: ...

    def force_flush(self, timeout_millis: int = 30000) -> bool: ...

    def shutdown(self) -> None: ...

    def stats(self) -> Mapping[str, int]: ...


class ChromeSink(RecordExporter, Protocol):
    """The per-rank Chrome trace file (:class:`rltrace.exporters.ChromeTraceExporter`): a record
    exporter that also writes counter samples and follows a forked child to its own file."""

    #: called with each batch of lines once written (the native trace drawn as the run goes:
    #: :class:`rltrace.timeline.stream.RankTraceWriter`, whose signature the Chrome sink sets)
    tap: Callable[..., None] | None

    @property
    def encoder(self) -> _ChromeEncoding: ...

    def write_counters(self, values: dict[str, float], ts_ns: int) -> SpanExportResult: ...

    def reset_after_fork(self, path: str | Path | None = None) -> None: ...


class _ChromeEncoding(Protocol):
    #: whether each slice names its OTel ids (on when the spans also go out over OTLP)
    with_ids: bool


class ChromeSinkFactory(Protocol):
    """Builds the Chrome sink for one rank's file at ``path``, opened with ``guard`` (the
    runtime's guarded log dirs: :class:`rltrace.logdir.files.GuardedDirs`)."""

    def __call__(self, path: Path, *, rank: int, world_size: int, role: str | None, host: str,
                 experiment: str, trial: str, guard: GuardedDirs | None) -> ChromeSink: ...


class SessionRecordSink(Protocol):
    """Writes session records (one JSON object a line): the ``sessions-r{rank}.jsonl`` writer."""

    #: counts that outlive the process (:mod:`rltrace.sessions.shared_counts`), or None
    tally: object

    @property
    def written(self) -> int: ...
    @property
    def failed(self) -> int: ...
    @property
    def lost(self) -> int: ...

    def add(self, record: dict[str, object]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def reset_after_fork(self, path: str | Path | None = None) -> None: ...


@dataclass(frozen=True)
class Sinks:
    """What the pipeline writes its local files with, given to it by whoever composes it (the
    core builds no exporter itself): ``chrome(path, ...)`` for the rank's Chrome trace,
    ``session_records(path, flush_threshold, guard)`` for its session records."""

    chrome: ChromeSinkFactory
    session_records: Callable[[Path, int, GuardedDirs | None], SessionRecordSink]
