"""A rank's native trace written as the run goes (``exporters.native: true``): the Chrome lines the
rank's exporter writes, drawn onto Perfetto's tracks by the same builder ``rltrace convert``
uses (:class:`~.native.FileBuilder`), one file per rank next to its JSONL
(``perf_tracer/[role/]traces-r{rank}.pftrace``).

What it holds and when: the rank's process with its threads, task and session tracks, turns,
phases, waits and status instants, and the task -> session arrows, written at the end of each
export cycle for everything that has ended (a session once its task's span has: its group
wait needs the group's end; a scope once its parent has).  Counter tracks (sessions in
flight, queue depth, statuses per step, tokens/s) are written when the rank's trace closes
(their levels need every session before them; the first ``COUNTER_CAP`` sessions, about 50 MB
of samples at most).  Arrows that cross ranks (a session to the
train step on another rank that consumed it, a task to sessions run elsewhere) need every
rank's file: ``rltrace convert`` draws them in the merged trace, built from the same JSONL
lines.

The file is a stream of whole ``Trace`` messages, one per export cycle, so a process killed
mid-run leaves a file Perfetto loads up to its last complete cycle.  The cost is the
exporter thread's (parsing its own lines and building packets: ``bench_compare``'s
``rltrace_native`` session row); nothing here runs on the training thread, and a failure
(an unwritable file, a planted link) is counted (``errors``), logged once, stops this file
only, and is never raised.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..readers import check_trace_event
from ..readers.trace_event import plain_ids
from .arrows import Plan
from .native import FileBuilder, NativeTrace
from .packets import PacketWriter

__all__ = ["SUFFIX", "RankTraceWriter"]

logger = logging.getLogger("rltrace")

SUFFIX = ".pftrace"
#: sessions whose counter samples a rank's trace keeps for its end (about 50 bytes each)
COUNTER_CAP = 1_000_000


class _Skipped:
    """What the builder could not draw (counted, as ``rltrace convert`` counts it)."""

    def __init__(self) -> None:
        self.lines = 0

    def skip_line(self, msg: str) -> None:
        self.lines += 1


class RankTraceWriter:
    """Draws the Chrome lines of one rank's exporter onto its native trace at ``path``."""

    def __init__(self, path: Path, opener: Any) -> None:
        #: ``opener(path) -> binary file``: a fresh file, never through a link
        #: (:func:`rltrace.exporters.files.open_fresh`)
        self._opener = opener
        self.path = Path(path)
        self.skipped = _Skipped()
        self.errors = 0
        self.events = 0
        self.stopped = False
        #: whether the counters reached ``COUNTER_CAP`` sessions
        self.capped = False
        self._trace: NativeTrace | None = None
        self._fh: BinaryIO | None = None
        self._builder: FileBuilder | None = None
        self._out: PacketWriter | None = None

    def stats(self) -> dict[str, Any]:
        """Track events written, lines it could not draw, failures (the file stopped at the
        first), and whether the counters stopped at ``COUNTER_CAP`` (``diagnostics()["native"]``)."""
        return {"path": str(self.path), "events": self.events, "skipped": self.skipped.lines,
                "errors": self.errors, "stopped": self.stopped, "counters_capped": self.capped}

    def _start(self) -> FileBuilder:
        self._fh = self._opener(self.path)
        self._out = PacketWriter(self._fh)
        # no plan: no arrows across files; counters bounded (their samples wait for the end)
        self._trace = NativeTrace(self._out, Plan(), self.skipped, counter_cap=COUNTER_CAP)
        self._builder = FileBuilder(self._trace, 0, None, None)
        return self._builder

    def lines(self, lines: list[bytes]) -> None:
        """The lines the Chrome exporter just wrote (each a JSON event and its newline)."""
        if self.stopped:
            return
        try:
            fb = self._builder or self._start()
            for raw in lines:
                ev = orjson.loads(raw)
                if type(ev) is dict and check_trace_event(ev, _ignore, None, False) is None:
                    plain_ids(ev, _ignore)
                    fb.event(ev)
            if self._out is not None:
                self._out.flush()
                self.events = self._out.events
            if self._trace is not None and self._trace.counters_capped and not self.capped:
                self.capped = True
                logger.warning("rltrace: the counter tracks of %s hold the first %d sessions (their "
                               "samples are kept until the rank shuts down); `rltrace convert` "
                               "draws them all", self.path, COUNTER_CAP)
        except Exception as exc:
            self._failed(exc)

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
