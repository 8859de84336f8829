"""Chrome-trace exporter: one JSON event per line in ``perf_tracer/traces-r{rank}.jsonl``.

Layout of the file (every line is a complete JSON object, appended and flushed per batch, so a
crash leaves every written line valid):

* process metadata (``process_name`` as AReaL's merged traces name processes plus the host,
  "[role] Rank R, Process PID · host" or "[Rank R, Process PID] · host", ``process_labels``,
  ``process_sort_index`` = rank) the first time a process writes;
* ``thread_name`` metadata for each track the first time it is used;
* one ``X`` (complete) event per span, ``i`` events for instants and span events; as in
  AReaL, every event's ``args`` carry ``rank`` (and ``role`` when set) unless the caller's
  args already hold those keys.

When the run sends spans over OTLP (``with_ids``), every slice's args also carry the span's
OTel ``trace_id`` and ``span_id`` (hex, as Jaeger and Tempo show them), so a slice on the
timeline can be looked up in the tracing backend; without OTLP no ids are drawn (the hot path
never draws them) and none are written.

Timestamps are epoch microseconds (``ts`` a whole number, ``dur`` exact to the nanosecond from
that floored start), so files from different ranks and hosts line up, end times are exact and
nested slices stay nested in Perfetto.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace.status import StatusCode

from rltrace.logdir.files import GuardedDirs, LineFile
from rltrace.recording.recorder import STATE
from rltrace.recording.user_values import category_name, dumps_line
from rltrace.seams import Record

logger = logging.getLogger("rltrace")

_LANE = "rl.lane"
_CATEGORY = "rl.category"
_INSTANT = "rl.instant"
_THREAD_ID = "thread.id"
_THREAD_NAME = "thread.name"
_HIDDEN = frozenset({_LANE, _CATEGORY, _INSTANT, _THREAD_ID, _THREAD_NAME})
_OPT = orjson.OPT_NON_STR_KEYS


_dumps = dumps_line


def chrome_args(attributes: Mapping[str, object]) -> dict[str, object]:
    """Chrome ``args`` from span attributes: ``args.`` prefix stripped, rltrace internals hidden."""
    out: dict[str, object] = {}
    for k, v in attributes.items():
        if k in _HIDDEN:
            continue
        out[k[5:] if k.startswith("args.") else k] = v
    return out


#: a duration's microseconds are written as ``%d`` and ``_FRACTION[ns % 1000]`` (the table
#: costs less than formatting ``.%03d``, whose width takes the slow path)
_FRACTION = tuple(b".%03d" % i for i in range(1000))
_X = b'{"pid":%d,"tid":%d,"ph":"X","ts":%d,"dur":%d%b,"name":%s,"cat":%s,"args":%s}\n'
#: the tail of a line (encode's loop writes a track's head, the times, then this)
_TAIL = b',"name":%s,"cat":%s,"args":%s}\n'
#: the tail's head, before a record's own args
_NAMECAT = b',"name":%s,"cat":%s,"args":'
#: a record with attributes of its own: head, times, name and category, its args, the brace
_OWN = b'%b%d,"dur":%d%b%b%b}\n'
#: a plain record's line: its track's head, the times, its name's tail
_PLAIN = b'%b%d,"dur":%d%b%b'
#: the same with the span's OTel ids (``with_ids``): its tail is left with its args open
_PLAIN_IDS = b'%b%d,"dur":%d%b%b,"trace_id":"%032x","span_id":"%016x"}}\n'
_plain_dumps = orjson.dumps
_I = b'{"pid":%d,"tid":%d,"ph":"i","s":"t","ts":%d,"name":%s,"cat":%s,"args":%s}\n'
_CACHE_MAX = 4096
#: the span's OTel ids, appended inside a record's args (``with_ids``)
_IDS = b',"trace_id":"%032x","span_id":"%016x"}'


class _SpanTimes:
    """A ``ReadableSpan``'s name and times in a record's field names (for its marker line)."""

    def __init__(self, span: ReadableSpan) -> None:
        self.name = span.name
        self.start_ns = span.start_time or 0
        self.end_ns = span.end_time or self.start_ns
        self.category = (span.attributes or {}).get(_CATEGORY, "otel")
        self.thread = 0
        self.lane = 0


class ChromeEncoder:
    """Encodes spans as Chrome-trace JSON lines; remembers the tracks it has already named.

    Accepts rltrace records (or ``ReadableSpan``s built from them, which carry
    ``rltrace_record``) on a fast path, and any other OTel ``ReadableSpan``.
    """

    def __init__(
        self, *, rank: int = 0, world_size: int = 1, role: str | None = None,
        host: str | None = None, experiment: str | None = None, trial: str | None = None,
        with_ids: bool = False,
    ) -> None:
        self.rank = rank
        self._ids = with_ids
        self.world_size = world_size
        self.role = role
        self.host = host or socket.gethostname()
        self.experiment = experiment
        self.trial = trial
        self._pid = -1
        tail = b'"rank":%d' % rank + (b',"role":' + _dumps(role) if role is not None else b"")
        self._args_tail = b"," + tail + b"}"  # appended to a non-empty args object
        self._args_only = b"{" + tail + b"}"  # args of an event without any
        #: (thread ident, lane) -> (the thread's name when the track was named, its tid); a
        #: new thread reusing an ident under another name gets a track of its own
        self._tids: dict[tuple[int, int], tuple[str, int]] = {}
        self._next_tid = 1
        self._heads: dict[int, bytes] = {}
        #: records written with a marker in place of attributes that could not be encoded
        self.unencodable = 0
        #: records not written at all (not even their marker could be)
        self.dropped = 0
        self._names: dict[object, bytes] = {}
        self._cats: dict[object, bytes] = {}
        #: (thread ident, lane) -> its track's head, while its thread keeps its name
        self._tracks: dict[tuple[int, int], bytes] = {}
        #: (thread ident, lane, name, category) -> (head, tail) of a plain record's line
        self._plain: dict[tuple[object, ...], tuple[bytes, bytes]] = {}
        #: (thread ident, lane, name, category) -> (head, name and category) of the line of a
        #: record with attributes of its own (a task, session or phase)
        self._owned: dict[tuple[object, ...], tuple[bytes, bytes]] = {}
        #: thread ident -> its name when ``_tracks``, ``_plain`` and ``_owned`` took it
        self._named: dict[int, str] = {}

    @property
    def with_ids(self) -> bool:
        """Write each record's OTel trace and span ids into its args (drawn if not yet)."""
        return self._ids

    @with_ids.setter
    def with_ids(self, on: bool) -> None:
        self._ids = on
        self._plain = {}  # its tails are made for one setting

    @property
    def pid(self) -> int:
        """The process the last batch was written for."""
        return self._pid

    def track_id(self, thread: int, lane: int) -> int:
        """The Chrome track (``tid``) a record of ``thread``'s ``lane`` was last written to."""
        return self._tids[(thread, lane)][1]

    def category_text(self, category: object) -> str:
        """A record's category as its line names it."""
        return category_name(category)

    def process_label(self, pid: int | None = None) -> str:
        """The process name: AReaL's (as its trace converter writes it) plus the host."""
        proc = f"Rank {self.rank}, Process {os.getpid() if pid is None else pid}"
        name = f"[{self.role}] {proc}" if self.role else f"[{proc}]"
        return f"{name} · {self.host}"

    def args_json(self, args: Mapping[str, object] | None) -> bytes:
        """``args`` as JSON with AReaL's ``rank``/``role`` added (the caller's keys win)."""
        if not args:
            return self._args_only
        if type(args) is not dict:  # a mapping of another kind (OTel event attributes)
            args = dict(args)
        if "rank" in args or "role" in args:
            merged = dict(args)
            merged.setdefault("rank", self.rank)
            if self.role is not None:
                merged.setdefault("role", self.role)
            return _dumps(merged)
        return _dumps(args)[:-1] + self._args_tail

    def _process_metadata(self, pid: int, out: list[bytes]) -> None:
        labels = {"rank": self.rank, "world_size": self.world_size, "role": self.role,
                  "host": self.host, "experiment": self.experiment, "trial": self.trial}
        label_text = ",".join(f"{k}={v}" for k, v in labels.items() if v is not None)
        head = b'{"pid":%d,"tid":0,"ph":"M","name":' % pid
        out.append(head + b'"process_name","args":' + _dumps({"name": self.process_label(pid)}) + b"}\n")
        out.append(head + b'"process_labels","args":' + _dumps({"labels": label_text}) + b"}\n")
        out.append(head + b'"process_sort_index","args":' + _dumps({"sort_index": self.rank}) + b"}\n")

    def _tid(self, pid: int, thread: int, lane: int, out: list[bytes]) -> int:
        """The track of ``thread``'s ``lane``, named (metadata lines) the first time it is used."""
        name = STATE.thread_names.name(thread)
        known = self._tids.get((thread, lane))
        if known is not None and known[0] == name:
            return known[1]
        tid = self._next_tid
        self._next_tid = tid + 1
        self._tids[(thread, lane)] = (name, tid)
        label = name if lane == 0 else f"{name} [{lane}]"
        head = b'{"pid":%d,"tid":%d,"ph":"M","name":' % (pid, tid)
        out.append(head + b'"thread_name","args":' + _dumps({"name": label}) + b"}\n")
        out.append(head + b'"thread_sort_index","args":{"sort_index":%d}}\n' % tid)
        return tid

    def _name(self, name: object) -> bytes:
        b = self._names.get(name)
        if b is None:
            if len(self._names) >= _CACHE_MAX:
                self._names.clear()
            b = self._names[name] = _dumps(name if type(name) is str else str(name))
        return b

    def _cat(self, category: object) -> bytes:
        try:
            b = self._cats.get(category)
        except TypeError:  # unhashable category object
            return _dumps(category_name(category))
        if b is None:
            if len(self._cats) >= _CACHE_MAX:
                self._cats.clear()
            b = self._cats[category] = _dumps(category_name(category))
        return b

    def reset(self) -> None:
        """Forget named processes and tracks (after a fork, or for a new file)."""
        self._pid = -1
        self._tids = {}
        self._heads = {}
        self._next_tid = 1
        self._forget_tracks()

    def _forget_tracks(self) -> None:
        self._tracks = {}
        self._plain = {}
        self._owned = {}
        self._named = {}

    def _track_head(self, pid: int, thread: int, lane: int, out: list[bytes]) -> bytes:
        """``{"pid":P,"tid":T,"ph":"X","ts":`` of ``thread``'s ``lane`` (named the first time)."""
        tid = self._tid(pid, thread, lane, out)
        head = self._heads.get(tid)
        if head is None:
            head = self._heads[tid] = b'{"pid":%d,"tid":%d,"ph":"X","ts":' % (pid, tid)
        self._named[thread] = self._tids[(thread, lane)][0]
        self._tracks[(thread, lane)] = head
        return head

    def _head(self, item: Any, pid: int, out: list[bytes]) -> bytes:
        """The head of the lines of ``item``'s track (kept while its thread keeps its name)."""
        head = self._tracks.get((item.thread, item.lane))
        return head if head is not None else self._track_head(pid, item.thread, item.lane, out)

    def _plain_pieces(self, item: Any, pid: int, out: list[bytes]) -> tuple[bytes, bytes]:
        """The head and tail of a plain record's line (no args or attributes of its own), kept
        for its track, name and category; with ids, the tail stops where they go."""
        tail = _TAIL % (self._name(item.name), self._cat(item.category), self._args_only)
        return self._kept(self._plain, item, tail[:-3] if self._ids else tail, pid, out)

    def _own_pieces(self, item: Any, pid: int, out: list[bytes]) -> tuple[bytes, bytes]:
        """The head and the name and category of the line of a record with attributes of its
        own, kept for its track, name and category."""
        return self._kept(self._owned, item, self._namecat(item.name, item.category), pid, out)

    def _kept(self, cache: dict[tuple[object, ...], tuple[bytes, bytes]], item: Any, piece: bytes,
              pid: int, out: list[bytes]) -> tuple[bytes, bytes]:
        """``(head of item's track, piece)``, kept in ``cache`` under its track, name and
        category (not kept for an unhashable category object)."""
        pieces = (self._head(item, pid, out), piece)
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        try:
            cache[(item.thread, item.lane, item.name, item.category)] = pieces
        except TypeError:
            pass
        return pieces

    def encode(self, items: Sequence[Any], out: list[bytes]) -> None:
        """Append the JSON lines for ``items`` (records or ``ReadableSpan``s) to ``out``.

        A plain record (no attributes, events or error of its own: most scopes) is written
        here, from the encoder's caches, a task, session or phase with :meth:`_own_body`;
        everything else by :meth:`_encode_item`.
        """
        pid = self._begin(out)
        plain, owned, append = self._plain, self._owned, out.append
        with_ids = self._ids
        for item in items:
            try:
                own = item.slot_attrs
            except AttributeError:  # a ReadableSpan
                own = None
            if own is None or item.extra is not None:
                self._encode_isolated(item, pid, out)  # a ReadableSpan, or events or an error
                continue
            args = item.args
            us = item.start_ns // 1000
            d = item.end_ns - us * 1000
            if not own and args is not None:  # a scope with args: its tail made for it
                append(_PLAIN % (self._head(item, pid, out), us, d // 1000, _FRACTION[d % 1000],
                                 self._tail(item, args)))
                continue
            try:  # its track's head, and its tail (plain) or name and category (own)
                head, piece = (owned if own else plain)[
                    (item.thread, item.lane, item.name, item.category)]
            except (KeyError, TypeError):
                head, piece = self._own_pieces(item, pid, out) if own else \
                    self._plain_pieces(item, pid, out)
            if own:  # a task, session or phase
                append(_OWN % (head, us, d // 1000, _FRACTION[d % 1000], piece, self._own_body(item, args)))
            elif with_ids:
                sc = item.get_span_context()
                append(_PLAIN_IDS % (head, us, d // 1000, _FRACTION[d % 1000], piece, sc[0], sc[1]))
            else:  # a plain scope (the common case)
                append(_PLAIN % (head, us, d // 1000, _FRACTION[d % 1000], piece))

    def _begin(self, out: list[bytes]) -> int:
        """The process id, with the process named (a new process: after a fork) and the tracks
        of a renamed thread (or a reused ident) forgotten, before a batch is encoded."""
        pid = os.getpid()
        if pid != self._pid:
            self.reset()
            self._pid = pid
            self._process_metadata(pid, out)
        names_now = STATE.thread_names.names
        for thread, name in self._named.items():
            if names_now.get(thread, name) != name:
                self._forget_tracks()
                break
        return pid

    def _own_body(self, item: Any, args: Mapping[str, object] | None) -> bytes:
        """The args of a record with attributes of its own (a task, session or phase): its
        attributes built from its slots and the caller's args, in one piece from orjson's plain
        call when it can, AReaL's keys added."""
        try:
            attrs = item.record_attrs()
            if args:
                attrs = {**args, **attrs}
            body = None if self._ids or "rank" in attrs or "role" in attrs else _plain_dumps(attrs)
        except Exception:  # a value the careful path below encodes (or marks)
            body = None
        if body is not None and len(body) > 2:
            return body[:-1] + self._args_tail
        return self._own_args(item, args)

    def _tail(self, item: Any, args: Mapping[str, object]) -> bytes:
        """``,"name":…,"cat":…,"args":…}`` and the newline of a record with args (its ids in
        them with ``with_ids``): a value that cannot be encoded costs only its own args, a
        marker."""
        try:
            encoded = self.args_json(args)
        except Exception as exc:  # one bad value costs its own args, never a neighbour
            encoded = self._unencodable(exc)
        if self._ids:
            encoded = self._with_ids(item, encoded)
        return _TAIL % (self._name(item.name), self._cat(item.category), encoded)

    def _namecat(self, name: object, category: object) -> bytes:
        """``,"name":…,"cat":…,"args":`` of a record with attributes of its own."""
        return _NAMECAT % (self._name(name), self._cat(category))

    def _own_args(self, item: Any, args: Mapping[str, object] | None) -> bytes:
        """The ``args`` of a record with attributes of its own (its slots' and the caller's;
        its own win), as JSON: a value that cannot be encoded costs only these args."""
        try:
            own = item.record_attrs()
            encoded = self.args_json({**args, **own} if args else own)
        except Exception as exc:  # one bad value costs its own args, never a neighbour
            encoded = self._unencodable(exc)
        return self._with_ids(item, encoded) if self.with_ids else encoded

    def _with_ids(self, item: Any, args: bytes) -> bytes:
        """``args`` (a JSON object) with the record's OTel ids added."""
        sc = item.get_span_context()
        return args[:-1] + (_IDS if len(args) > 2 else _IDS[1:]) % (sc[0], sc[1])

    def _encode_isolated(self, item: Any, pid: int, out: list[bytes]) -> None:
        """:meth:`_encode_item` into lines of its own: a record whose attributes cannot be
        encoded is written with a marker in their place (counted in ``unencodable``), and its
        neighbours, the process and track names are unaffected."""
        lines: list[bytes] = []
        try:
            self._encode_item(item, pid, lines)
        except Exception as exc:
            lines = self._marker_lines(item, pid, exc)
        out.extend(lines)

    def _marker_lines(self, item: Any, pid: int, exc: Exception) -> list[bytes]:
        """The record's slice with ``args`` replaced by the marker (nothing if even that fails)."""
        rec = getattr(item, "rltrace_record", item)
        lines: list[bytes] = []
        try:
            marker = self._unencodable(exc)
            if isinstance(rec, ReadableSpan):
                rec = _SpanTimes(rec)
            tid = self._tid(pid, getattr(rec, "thread", 0), getattr(rec, "lane", 0), lines)
            us = rec.start_ns // 1000
            d = rec.end_ns - us * 1000
            lines.append(_X % (pid, tid, us, d // 1000, _FRACTION[d % 1000], self._name(rec.name),
                               self._cat(getattr(rec, "category", None)), marker))
        except Exception:
            self.dropped += 1
            return []
        return lines

    def _unencodable(self, exc: Exception) -> bytes:
        self.unencodable += 1
        if self.unencodable == 1:
            logger.warning("rltrace: a span's attributes could not be encoded (%s: %s); it is written "
                           "with a marker in their place, its neighbours as they are (counted in "
                           "rltrace.diagnostics())", type(exc).__name__, exc)
        return _dumps({"rl.unencodable": f"{type(exc).__name__}: {exc}"[:200]})

    def _encode_item(self, item: Any, pid: int, out: list[bytes]) -> None:
        """One record or ``ReadableSpan``."""
        rec = getattr(item, "rltrace_record", item)
        if isinstance(rec, ReadableSpan):
            self._encode_foreign(rec, pid, out)
            return
        tid = self._tid(pid, rec.thread, rec.lane, out)
        name = self._names.get(rec.name) or self._name(rec.name)
        cat = self._cat(rec.category)
        args = rec.args
        extra = rec.extra
        us = rec.start_ns // 1000
        ids = self._with_ids if self.with_ids else _no_ids
        if extra is None and not rec.slot_attrs:
            d = rec.end_ns - us * 1000
            out.append(_X % (pid, tid, us, d // 1000, _FRACTION[d % 1000], name, cat,
                               ids(rec, self.args_json(args))))
            return
        own = rec.record_attrs()
        if not args:
            args = own if own else {}  # the record's own dict: only read below
            if extra is not None:
                args = dict(args)  # an error may be added to it
        elif own:
            args = {**args, **own}
        else:
            args = dict(args)
        if extra is None:
            d = rec.end_ns - us * 1000
            out.append(_X % (pid, tid, us, d // 1000, _FRACTION[d % 1000], name, cat,
                               ids(rec, self.args_json(args))))
            return
        error = extra.get("error")
        if error is not None:
            args["error"] = f"{error[0]}: {error[1]}"
        if extra.get("instant"):
            out.append(_I % (pid, tid, us, name, cat, ids(rec, self.args_json(args))))
            return
        d = rec.end_ns - us * 1000
        out.append(_X % (pid, tid, us, d // 1000, _FRACTION[d % 1000], name, cat,
                               ids(rec, self.args_json(args))))
        for ev_name, ts, ev_args, ev_cat in extra.get("events", ()):
            out.append(_I % (pid, tid, ts // 1000, self._name(ev_name),
                             self._cat(ev_cat) if ev_cat is not None else cat,
                             self.args_json(ev_args)))

    def encode_counters(self, values: dict[str, float], ts_ns: int, out: list[bytes]) -> None:
        """Counter-track samples (``ph: "C"``) for user counters at ``ts_ns``."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._tids = {}
            self._heads = {}
            self._next_tid = 1
            self._process_metadata(pid, out)
        for name, value in values.items():
            out.append(b'{"pid":%d,"tid":0,"ph":"C","ts":%d,"name":%s,"args":{"value":%s}}\n'
                       % (pid, ts_ns // 1000, _dumps(name), _dumps(value)))

    def _encode_foreign(self, span: ReadableSpan, pid: int, out: list[bytes]) -> None:
        attrs = span.attributes or {}
        name = self._name(span.name)
        cat = _dumps(str(attrs.get(_CATEGORY, "otel")))
        args = chrome_args(attrs)
        if span.status.status_code is StatusCode.ERROR:
            args["error"] = span.status.description
        if self.with_ids:
            args["trace_id"] = f"{span.context.trace_id:032x}"
            args["span_id"] = f"{span.context.span_id:016x}"
        start = span.start_time or 0
        end = span.end_time or start
        sid = b'"0x%016x"' % span.context.span_id
        head = b'{"pid":%d,"tid":0,"ph":' % pid
        out.append(head + b'"b","id":' + sid + b',"ts":%d' % (start // 1000) + b',"name":' + name
                   + b',"cat":' + cat + b',"args":' + _dumps(args) + b"}\n")
        for ev in span.events:
            out.append(head + b'"n","id":' + sid + b',"ts":%d' % (ev.timestamp // 1000)
                       + b',"name":' + _dumps(ev.name) + b',"cat":' + cat + b',"args":'
                       + _dumps(chrome_args(ev.attributes or {})) + b"}\n")
        out.append(head + b'"e","id":' + sid + b',"ts":%d' % (end // 1000) + b',"name":' + name
                   + b',"cat":' + cat + b"}\n")


def _no_ids(item: Any, args: bytes) -> bytes:
    return args


#: what the exporter hands on after each write: its lines, the records, its encoder
Tap = Callable[[list[bytes], "Sequence[Record | ReadableSpan] | None", ChromeEncoder], None]


class ChromeTraceExporter(SpanExporter):
    """Appends Chrome-trace JSON lines for every exported span to ``path``.

    Writes go through :class:`~rltrace.logdir.files.LineFile`: a write failure (unwritable
    directory, full disk) is logged once and the lines are kept (bounded) and retried; a file
    deleted during the run is recreated with its metadata.  Tracing and training continue.
    """

    def __init__(self, path: str | os.PathLike[str], *, guard: GuardedDirs | None = None,
                 **encoder_kwargs: Any) -> None:
        self.encoder = ChromeEncoder(**encoder_kwargs)
        self.file = LineFile(path, on_reopen=self._header_again, guard=guard)
        self._lock = threading.RLock()  # reentrant: a SIGTERM flush may interrupt a write
        self.lines_written = 0
        #: called with each batch of lines once written, the records they were written from
        #: (None for counter samples) and the encoder (the rank's native trace as the run goes,
        #: :meth:`rltrace.timeline.stream.RankTraceWriter.lines`); it never raises
        self.tap: Tap | None = None

    @property
    def path(self) -> Path:
        return self.file.path

    def _header_again(self) -> bytes:
        self.encoder.reset()  # process/thread names are written again into the new file
        return b""

    def export(self, spans: Sequence[Record | ReadableSpan]) -> SpanExportResult:
        return self._write(lambda out: self.encoder.encode(spans, out), spans)

    def write_counters(self, values: dict[str, float], ts_ns: int) -> SpanExportResult:
        """Append counter samples (user counters) to the file."""
        return self._write(lambda out: self.encoder.encode_counters(values, ts_ns, out))

    def _write(self, fill: Callable[[list[bytes]], None],
               records: Sequence[Record | ReadableSpan] | None = None) -> SpanExportResult:
        out: list[bytes] = []
        with self._lock:
            if self.file._fh is not None and self.file._deleted():
                self.file.append(b"")  # recreate now, so metadata precedes the new events
            fill(out)
            ok = self.file.append(b"".join(out), len(out))  # one line each
            self.lines_written += len(out)
            if self.tap is not None and out:
                self.tap(out, records, self.encoder)
        # a refused file (a link, another user's) holds nothing to retry: its lines are counted
        # as lost (``stats``), not as held
        return SpanExportResult.SUCCESS if ok or self.file.refused else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            return self.file.append(b"")

    #: a failed export is held by the file and retried, not lost (see ``stats``)
    holds_on_failure = True

    def stats(self) -> dict[str, int]:
        """Bytes held back by a disk fault, lines dropped past the in-memory cap (or because the
        file was refused), records written with a marker for attributes that could not be
        encoded, records not written, and whether the file was refused (1: a link, not a file,
        or another user's file or folder; the output is off)."""
        return {"held_bytes": self.file.pending_bytes, "lost": self.file.lost_lines,
                "unencodable": self.encoder.unencodable, "unwritable": self.encoder.dropped,
                "refused": int(self.file.refused is not None)}

    def reset_after_fork(self, path: str | os.PathLike[str] | None = None) -> None:
        """In a forked child: fresh lock, names written again, optionally a per-process file."""
        self._lock = threading.RLock()
        self.encoder.reset()
        self.file.after_fork(path)

    def shutdown(self) -> None:
        with self._lock:
            self.file.close()
