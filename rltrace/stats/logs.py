"""Python ``logging`` for a run: one format, ``main.log`` in the log dir, trace ids on records.

:func:`setup_logging` installs (once; calling again replaces its own handlers) a console
handler and a file handler on the root logger, both with :class:`TraceContextFilter`, which
stamps every record with the current OTel span's ids (``otelTraceID``, ``otelSpanID`` - the
names OpenTelemetry's logging instrumentation uses - and ``trace_ctx``, a ready-to-print
`` trace_id=... span_id=...`` that is empty outside spans) and the rank.  A log line can then be
looked up in Jaeger/Tempo, and a span's logs found by grepping its trace id.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path
from typing import IO, Any

from opentelemetry import trace

from rltrace import runtime
from rltrace.config import TracerConfig, log_dir
from rltrace.logdir.files import GuardedDirs, open_for_append
from rltrace.process.ranks import detect_rank

__all__ = ["DEFAULT_FORMAT", "TraceContextFilter", "reset_logging", "setup_logging"]

DEFAULT_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s [rank %(rank)s]%(trace_ctx)s: %(message)s"
DATE_FORMAT = "%Y%m%d-%H:%M:%S"


class _Installed:
    """The handlers :func:`setup_logging` added, held by the runtime (``RUNTIME.part``) so that
    :func:`reset_logging` can remove them."""

    def __init__(self) -> None:
        self.handlers: list[logging.Handler] = []


class TraceContextFilter(logging.Filter):
    """Adds ``otelTraceID``, ``otelSpanID``, ``trace_ctx`` and ``rank`` to every record.

    Reads the OTel current span of the thread/task that logs (rltrace scopes are OTel spans, so
    records logged inside ``trace_scope`` carry that scope's ids).  Never rejects a record.
    """

    def __init__(self, rank: int | None = None) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = span_id = "0"
        ctx_text = ""
        try:
            sc = trace.get_current_span().get_span_context()
            if sc.is_valid:
                trace_id, span_id = f"{sc.trace_id:032x}", f"{sc.span_id:016x}"
                ctx_text = f" trace_id={trace_id} span_id={span_id}"
        except Exception:  # a logging filter must never break logging
            pass
        record.otelTraceID = trace_id
        record.otelSpanID = span_id
        record.trace_ctx = ctx_text
        if not hasattr(record, "rank"):
            record.rank = self.rank if self.rank is not None else _rank()
        return True


def _rank() -> int:
    p = runtime.get_pipeline()
    if p is not None:
        return p.rank
    return detect_rank()[0]


def _default_log_dir() -> Path:
    p = runtime.get_pipeline()
    if p is not None:
        return Path(p.log_dir)
    cfg = runtime.get_config() or TracerConfig()
    return log_dir(cfg)


def setup_logging(
    level: int | str = logging.INFO,
    *,
    log_dir: str | os.PathLike[str] | None = None,
    filename: str | None = None,
    fmt: str = DEFAULT_FORMAT,
    datefmt: str = DATE_FORMAT,
    stream: IO[str] | bool | None = None,
    rank: int | None = None,
    logger: logging.Logger | str | None = None,
) -> Path:
    """Configure logging for this run; returns the log file's path.

    ``log_dir`` defaults to the configured rltrace log dir
    (``{fileroot}/logs/{user}/{experiment}/{trial}``); the file is ``main.log`` on rank 0 and
    ``main-r{rank}.log`` elsewhere (``filename`` overrides).  ``stream`` is the console stream
    (default ``sys.stderr``; ``False``: no console handler).  ``logger`` is the logger to
    configure (default the root logger).  Calling it again replaces the handlers it added.
    """
    rk = rank if rank is not None else _rank()
    directory = Path(log_dir) if log_dir is not None else _default_log_dir()
    path = directory / (filename or ("main.log" if rk == 0 else f"main-r{rk}.log"))
    target = logger if isinstance(logger, logging.Logger) else logging.getLogger(logger)
    reset_logging()
    installed = runtime.RUNTIME.part(_Installed).handlers
    formatter = logging.Formatter(fmt, datefmt)
    ctx_filter = TraceContextFilter(rk)
    handlers: list[logging.Handler] = [LogFileHandler(path, guard=runtime.RUNTIME.guarded)]
    if stream is not False:
        out: Any = stream if stream not in (None, True) else sys.stderr
        handlers.append(logging.StreamHandler(out))
    for h in handlers:
        h.setFormatter(formatter)
        h.addFilter(ctx_filter)
        target.addHandler(h)
        installed.append(h)
    target.setLevel(level)
    return path


class LogFileHandler(logging.FileHandler):
    """A :class:`logging.FileHandler` (UTF-8, appending) whose file is opened like every log
    file (:func:`rltrace.logdir.files.open_for_append`): made with its folder, never through a
    link, nor below a base of ``guard`` through another user's folder or file; refused with
    :class:`rltrace.logdir.files.UnsafeFileError`."""

    def __init__(self, path: str | os.PathLike[str], *, guard: GuardedDirs | None = None) -> None:
        self._guard = guard  # (read by ``_open``, which the base class calls)
        super().__init__(path, encoding="utf-8")

    def _open(self) -> io.TextIOWrapper:
        raw = open_for_append(Path(self.baseFilename), guard=self._guard)
        # (buffered: a raw file may take part of a write; each record is flushed by emit)
        return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8",
                                errors=self.errors)


def reset_logging() -> None:
    """Remove and close the handlers :func:`setup_logging` installed."""
    installed = runtime.RUNTIME.part(_Installed).handlers
    for h in installed:
        for lg in [*logging.Logger.manager.loggerDict.values(), logging.getLogger()]:
            if isinstance(lg, logging.Logger) and h in lg.handlers:
                lg.removeHandler(h)
        h.close()
    installed.clear()
