"""A rank's native trace written as the run goes (``exporters.native: true``), one file per rank
next to its JSONL (``perf_tracer/[role/]traces-r{rank}.pftrace``), drawn onto Perfetto's tracks by
the same builder ``rltrace convert`` uses (:class:`~.native.FileBuilder`).

It is made from the records the rank's Chrome exporter has just written, with the tracks the
Chrome encoder gave them and the args it wrote (rank, role, OTel ids), so the two files agree
slice for slice; only the metadata lines (process and thread names) are read back.  A batch
holding what a record cannot say as its line reads back (another instrumentation's span, span
events, an error, an instant, a value JSON changes) and counter samples are drawn from the
Chrome lines instead, checked as ``rltrace convert`` checks them.

What it holds and when: the rank's process with its threads, task and session tracks, turns,
phases, waits and status instants, and the task -> session arrows, written at the end of each
export cycle for everything that has ended (a session once its task's span has: its group
wait needs the group's end; a scope once its parent has).  Counter tracks (sessions in
flight, queue depth, statuses per step, tokens/s) are written when the rank's trace closes
(their levels need every session before them; those of the first ``counter_cap`` sessions, a
million by default (``exporters.native_counter_cap``): about 50 MB of samples at most).  Arrows
that cross ranks (a session to the train step on another rank that consumed it, a task to
sessions run elsewhere) need every rank's file: ``rltrace convert`` draws them in the merged
trace, built from the JSONL lines.

The file is a stream of whole ``Trace`` messages, one per export cycle, so a process killed
mid-run leaves a file Perfetto loads up to its last complete cycle.  The cost is the
exporter thread's (``bench_compare``'s ``rltrace_native`` session row); nothing here runs on
the training thread, and a failure (an unwritable file, a planted link) is counted
(``errors``), logged once, stops this file only, and is never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO, Protocol

import orjson
from opentelemetry.sdk.trace import ReadableSpan

from rltrace.readers import check_trace_event
from rltrace.readers.trace_event import plain_ids
from rltrace.seams import Record
from rltrace.timeline.arrows import Plan
from rltrace.timeline.native import FileBuilder, NativeTrace
from rltrace.timeline.packets import PacketWriter

__all__ = ["SUFFIX", "RankTraceWriter"]

logger = logging.getLogger("rltrace")

SUFFIX = ".pftrace"
#: sessions whose counter samples a rank's trace keeps for its end by default (about 50 bytes each)
COUNTER_CAP = 1_000_000


class _Skipped:
    """What the builder could not draw (counted, as ``rltrace convert`` counts it)."""

    def __init__(self) -> None:
        self.lines = 0

    def skip_line(self, msg: str) -> None:
        self.lines += 1


class RankTraceWriter:
    """Draws the Chrome lines of one rank's exporter onto its native trace at ``path``."""

    def __init__(self, path: Path, opener: Callable[[Path], BinaryIO], *,
                 counter_cap: int = COUNTER_CAP) -> None:
        #: ``opener(path) -> binary file``: a fresh file, never through a link
        #: (:func:`rltrace.logdir.files.open_fresh`)
        self._opener = opener
        #: sessions whose counter samples the trace keeps for its end
        self.counter_cap = counter_cap
        self.path = Path(path)
        self.skipped = _Skipped()
        self.errors = 0
        self.events = 0
        #: records drawn as they are (not read back from their Chrome lines)
        self.records = 0
        self.stopped = False
        #: whether the counters reached ``counter_cap`` sessions
        self.capped = False
        self._trace: NativeTrace | None = None
        self._fh: BinaryIO | None = None
        self._builder: FileBuilder | None = None
        self._out: PacketWriter | None = None

    def stats(self) -> dict[str, object]:
        """Track events written, lines it could not draw, failures (the file stopped at the
        first), and whether the counters stopped at ``counter_cap`` (``diagnostics()["native"]``)."""
        return {"path": str(self.path), "events": self.events, "skipped": self.skipped.lines,
                "errors": self.errors, "stopped": self.stopped, "counters_capped": self.capped}

    def _start(self) -> FileBuilder:
        self._fh = self._opener(self.path)
        self._out = PacketWriter(self._fh)
        # no plan: no arrows across files; counters bounded (their samples wait for the end)
        self._trace = NativeTrace(self._out, Plan(), self.skipped, counter_cap=self.counter_cap)
        self._builder = FileBuilder(self._trace, 0, None, None)
        return self._builder

    def lines(self, lines: list[bytes], records: Sequence[Record | ReadableSpan] | None = None,
              tracks: ChromeTracks | None = None) -> None:
        """What the Chrome exporter just wrote: its ``lines`` (each a JSON event and its newline)
        and the ``records`` it wrote them from, with ``tracks``, its encoder (which track each
        record went to).  Records of the common kinds (scopes, tasks, sessions, phases with
        plain values) are drawn as they are, and only the metadata lines are read; a batch
        holding anything else is drawn from its lines."""
        if self.stopped:
            return
        try:
            fb = self._builder or self._start()
            slices = drawable(records, tracks) if records and tracks is not None else None
            if slices is None:
                self._draw_lines(fb, lines)
            else:
                assert tracks is not None
                self._draw_lines(fb, [raw for raw in lines if _META in raw[:_META_AT]])
                self._draw(fb, slices, tracks.pid)
                self.records += len(slices)
            if self._out is not None:
                self._out.flush()
                self.events = self._out.events
            if self._trace is not None and self._trace.counters_capped and not self.capped:
                self.capped = True
                logger.warning("rltrace: the counter tracks of %s hold the first %d sessions (their "
                               "samples are kept until the rank shuts down); `rltrace convert` "
                               "draws them all", self.path, self.counter_cap)
        except Exception as exc:
            self._failed(exc)

    @staticmethod
    def _draw_lines(fb: FileBuilder, lines: list[bytes]) -> None:
        """Chrome lines, read back and checked as ``rltrace convert`` reads them."""
        for raw in lines:
            ev = orjson.loads(raw)
            if type(ev) is dict and check_trace_event(ev, _ignore, None, False) is None:
                plain_ids(ev, _ignore)
                fb.event(ev)

    @staticmethod
    def _draw(fb: FileBuilder, slices: list[Slice], pid: int) -> None:
        """Slices made from records, on the process the Chrome lines name ``pid``."""
        p = fb.written(fb.proc(pid))
        span = fb.span
        for tid, start, end, name, cat, args in slices:
            span(p, pid, tid, start, end, name, cat, args)

    def close(self) -> None:
        """Write what is held (sessions whose task never ended, scopes, counters) and close."""
        try:
            if self._builder is not None:
                self._builder.close()
                self.events = self._out.events if self._out is not None else self.events
        except Exception as exc:
            self._failed(exc)
        finally:
            self._builder = None
            self._out = None
            fh, self._fh = self._fh, None
            if fh is not None:
                with suppress(OSError):
                    fh.close()

    def after_fork(self, path: Path) -> None:
        """In a forked child: its own file; the parent's held sessions are the parent's (the
        child's copy of the parent's descriptor is unbuffered: dropping it writes nothing)."""
        self._fh = None
        self._builder = None
        self._out = None
        self._trace = None
        self.capped = False
        self.path = Path(path)
        self.stopped = self.errors > 0

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.warning("rltrace: the native trace %s stopped being written (%r); the Chrome "
                           "JSONL beside it is complete and `rltrace convert` builds the native "
                           "trace from it (tracing continues)", self.path, exc)
        self.stopped = True  # what is on disk stays a loadable prefix


def _ignore(msg: str) -> None:
    return None


#: how a metadata line (process and thread names) is told from an event line
_META = b'"ph":"M"'
_META_AT = 64
_INT64_MIN, _UINT64_MAX = -(1 << 63), (1 << 64) - 1
_FLOAT_MAX = float("inf")
#: a record's slice: (track id, start ns, end ns, name, category, args)
Slice = tuple[int, int, int, str, str, dict[str, object]]


class ChromeTracks(Protocol):
    """The Chrome encoder as the native trace reads it: the process and track each record was
    written to, and the args it added."""

    @property
    def pid(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def role(self) -> str | None: ...
    @property
    def with_ids(self) -> bool: ...

    def track_id(self, thread: int, lane: int) -> int: ...

    def category_text(self, category: object) -> str: ...


def _plain_text(v: str) -> bool:
    if v.isascii():
        return True
    try:
        v.encode()
    except UnicodeEncodeError:  # a lone surrogate: the Chrome line holds its replacement
        return False
    return True


def _plain(args: Mapping[str, object]) -> bool:
    """Whether every key and value of ``args`` reads back from its Chrome line unchanged: text,
    booleans, 64-bit integers, finite floats, None."""
    for k, v in args.items():
        if type(k) is not str or not (k.isascii() or _plain_text(k)):
            return False
        if type(v) is str:
            if not (v.isascii() or _plain_text(v)):
                return False
        elif type(v) is int:
            if not _INT64_MIN <= v <= _UINT64_MAX:
                return False
        elif type(v) is float:
            if v != v or v in (_FLOAT_MAX, -_FLOAT_MAX):
                return False
        elif v is not None and type(v) is not bool:
            return False
    return True


def _slice(rec: Record | ReadableSpan, tracks: ChromeTracks, rank: int, role: str | None,
           with_ids: bool) -> Slice | None:
    """``rec``'s slice as its Chrome line reads back, or None when it must be read from the line
    (a span of another instrumentation, events, an error, an instant, a value JSON changes).
    ``rank``, ``role``, ``with_ids``: the encoder's (the args it adds to every line)."""
    if isinstance(rec, ReadableSpan):
        return None
    extra = rec.extra
    if extra is not None and (extra.get("error") is not None or extra.get("instant")
                              or extra.get("events")):
        return None
    own = rec.record_attrs() if extra is not None or getattr(rec, "slot_attrs", False) else None
    args = rec.args
    merged: dict[str, object] = {**args, **own} if args and own else dict(own or args or {})
    name = rec.name
    start = rec.start_ns // 1000 * 1000
    if not _plain(merged) or type(name) is not str or not _plain_text(name) or start < 0 \
            or rec.end_ns < start:
        return None
    merged.setdefault("rank", rank)
    if role is not None:
        merged.setdefault("role", role)
    if with_ids:
        sc = rec.get_span_context()
        merged["trace_id"] = f"{sc.trace_id:032x}"
        merged["span_id"] = f"{sc.span_id:016x}"
    return (tracks.track_id(rec.thread, rec.lane), start, rec.end_ns, name,
            tracks.category_text(rec.category), merged)


def drawable(records: Sequence[Record | ReadableSpan], tracks: ChromeTracks) -> list[Slice] | None:
    """The slices of ``records`` (see :func:`_slice`), or None when any must be read from its
    line (the batch is then drawn from its lines, in their order)."""
    out: list[Slice] = []
    try:
        rank, role, with_ids = tracks.rank, tracks.role, tracks.with_ids
        for rec in records:
            s = _slice(rec, tracks, rank, role, with_ids)
            if s is None:
                return None
            out.append(s)
    except Exception:  # attributes that cannot be read: the line holds what the encoder made of them
        return None
    return out
