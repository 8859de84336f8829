"""Chrome-trace exporter: one JSON event per line in ``perf_tracer/traces-r{rank}.jsonl``.

Layout of the file (every line is a complete JSON object, appended and flushed per batch, so a
crash leaves every written line valid):

* process metadata (``process_name`` "rank R · role · host", ``process_labels``,
  ``process_sort_index`` = rank) the first time a process writes;
* ``thread_name`` metadata for each track the first time it is used;
* one ``X`` (complete) event per span, ``i`` events for instants and span events.

Timestamps are epoch microseconds written as exact decimal text (``1763780830123456.789``),
so files from different ranks and hosts line up and nanosecond ordering survives.

Concurrent scopes (threads, asyncio tasks, generators) carry a *lane* chosen when they
started: each thread's lanes are separate Chrome tracks, and scopes on one lane always nest,
so Perfetto never drops an overlapping slice.  Spans from other OpenTelemetry instrumentation
(which carry no lane) are written as async ``b``/``e`` pairs, which Perfetto lays out on their
own tracks.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace.status import StatusCode

logger = logging.getLogger("rltrace")

_LANE = "rl.lane"
_CATEGORY = "rl.category"
_INSTANT = "rl.instant"
_THREAD_ID = "thread.id"
_THREAD_NAME = "thread.name"
_HIDDEN = frozenset({_LANE, _CATEGORY, _INSTANT, _THREAD_ID, _THREAD_NAME})
_OPT = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(obj: Any) -> Any:
    try:
        return str(obj)
    except Exception:
        return f"<unprintable {type(obj).__name__}>"


def _dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, default=_default, option=_OPT)


def _us(ns: int) -> bytes:
    """Epoch nanoseconds as exact microsecond decimal text."""
    q, r = divmod(ns, 1000)
    return b"%d.%03d" % (q, r)


def chrome_args(attributes: Any) -> dict[str, Any]:
    """Chrome ``args`` from span attributes: ``args.`` prefix stripped, rltrace internals hidden."""
    out: dict[str, Any] = {}
    for k, v in attributes.items():
        if k in _HIDDEN:
            continue
        out[k[5:] if k.startswith("args.") else k] = v
    return out


class ChromeEncoder:
    """Encodes ``ReadableSpan``s as Chrome-trace JSON lines; remembers tracks already named."""

    def __init__(
        self, *, rank: int = 0, world_size: int = 1, role: str | None = None,
        host: str | None = None, experiment: str | None = None, trial: str | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.role = role
        self.host = host or socket.gethostname()
        self.experiment = experiment
        self.trial = trial
        self._pid = -1
        self._tids: dict[tuple[int, int], int] = {}

    def process_label(self) -> str:
        parts = [f"rank {self.rank}"]
        if self.role:
            parts.append(self.role)
        parts.append(self.host)
        return " · ".join(parts)

    def _process_metadata(self, pid: int, out: list[bytes]) -> None:
        labels = {"rank": self.rank, "world_size": self.world_size, "role": self.role,
                  "host": self.host, "experiment": self.experiment, "trial": self.trial}
        label_text = ",".join(f"{k}={v}" for k, v in labels.items() if v is not None)
        head = b'{"pid":%d,"tid":0,"ph":"M","name":' % pid
        out.append(head + b'"process_name","args":' + _dumps({"name": self.process_label()}) + b"}\n")
        out.append(head + b'"process_labels","args":' + _dumps({"labels": label_text}) + b"}\n")
        out.append(head + b'"process_sort_index","args":' + _dumps({"sort_index": self.rank}) + b"}\n")

    def _tid(self, pid: int, thread: int, lane: int, name: str, out: list[bytes]) -> int:
        key = (thread, lane)
        tid = self._tids.get(key)
        if tid is None:
            tid = self._tids[key] = len(self._tids) + 1
            label = name if lane == 0 else f"{name} [{lane}]"
            head = b'{"pid":%d,"tid":%d,"ph":"M","name":' % (pid, tid)
            out.append(head + b'"thread_name","args":' + _dumps({"name": label}) + b"}\n")
            out.append(head + b'"thread_sort_index","args":{"sort_index":%d}}\n' % tid)
        return tid

    def reset(self) -> None:
        """Forget named processes and tracks (after a fork, or for a new file)."""
        self._pid = -1
        self._tids = {}

    def encode(self, spans: Sequence[ReadableSpan], out: list[bytes]) -> None:
        """Append the JSON lines for ``spans`` to ``out``."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._tids = {}
            self._process_metadata(pid, out)
        for span in spans:
            attrs = span.attributes or {}
            lane = attrs.get(_LANE)
            name = _dumps(span.name)
            cat = _dumps(str(attrs.get(_CATEGORY, "otel")))
            args = chrome_args(attrs)
            if span.status.status_code is StatusCode.ERROR:
                args["error"] = span.status.description
            start = span.start_time or 0
            end = span.end_time or start
            if lane is None:
                self._encode_foreign(span, pid, name, cat, args, start, end, out)
                continue
            tid = self._tid(pid, attrs.get(_THREAD_ID, 0), lane,
                            str(attrs.get(_THREAD_NAME, "thread")), out)
            head = b'{"pid":%d,"tid":%d,"ph":' % (pid, tid)
            if attrs.get(_INSTANT):
                out.append(head + b'"i","s":"t","ts":' + _us(start) + b',"name":' + name
                           + b',"cat":' + cat + b',"args":' + _dumps(args) + b"}\n")
                continue
            out.append(head + b'"X","ts":' + _us(start) + b',"dur":' + _us(end - start)
                       + b',"name":' + name + b',"cat":' + cat + b',"args":' + _dumps(args)
                       + b"}\n")
            for ev in span.events:
                ev_attrs = ev.attributes or {}
                ev_cat = _dumps(str(ev_attrs.get(_CATEGORY, attrs.get(_CATEGORY, "misc"))))
                out.append(head + b'"i","s":"t","ts":' + _us(ev.timestamp) + b',"name":'
                           + _dumps(ev.name) + b',"cat":' + ev_cat + b',"args":'
                           + _dumps(chrome_args(ev_attrs)) + b"}\n")

    def _encode_foreign(
        self, span: ReadableSpan, pid: int, name: bytes, cat: bytes, args: dict[str, Any],
        start: int, end: int, out: list[bytes],
    ) -> None:
        sid = b'"0x%016x"' % span.context.span_id
        head = b'{"pid":%d,"tid":0,"ph":' % pid
        out.append(head + b'"b","id":' + sid + b',"ts":' + _us(start) + b',"name":' + name
                   + b',"cat":' + cat + b',"args":' + _dumps(args) + b"}\n")
        for ev in span.events:
            out.append(head + b'"n","id":' + sid + b',"ts":' + _us(ev.timestamp) + b',"name":'
                       + _dumps(ev.name) + b',"cat":' + cat + b',"args":'
                       + _dumps(chrome_args(ev.attributes or {})) + b"}\n")
        out.append(head + b'"e","id":' + sid + b',"ts":' + _us(end) + b',"name":' + name
                   + b',"cat":' + cat + b"}\n")


class ChromeTraceExporter(SpanExporter):
    """Appends Chrome-trace JSON lines for every exported span to ``path``.

    A write failure (unwritable directory, full disk) is logged once and the batch is reported
    as failed; tracing and training continue.
    """

    def __init__(self, path: str | os.PathLike[str], **encoder_kwargs: Any) -> None:
        self.path = Path(path)
        self.encoder = ChromeEncoder(**encoder_kwargs)
        self._file: Any = None
        self._lock = threading.Lock()
        self._warned = False
        self.lines_written = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        out: list[bytes] = []
        with self._lock:
            try:
                self.encoder.encode(spans, out)
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for appends
                self._file.write(b"".join(out))
                self._file.flush()
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    logger.warning("rltrace: cannot write Chrome trace %s: %s (training continues; "
                                   "spans still reach other exporters)", self.path, exc)
                return SpanExportResult.FAILURE
            self.lines_written += len(out)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self.encoder.reset()
        self._file = None  # the child reopens the file: its own buffer, no inherited bytes

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
