"""Session-record writer: ``session_tracer/sessions-r{rank}.jsonl``, one JSON record per line.

Records are buffered and appended every ``flush_threshold`` records, and on every explicit
flush (``rltrace.save``/``flush``/``shutdown``, interpreter exit), so no finished session is
lost whatever the threshold.  Each append writes whole lines and flushes.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import orjson

from rltrace.logdir.files import GuardedDirs, LineFile
from rltrace.recording.user_values import dumps_line

_dumps, _NEWLINE = orjson.dumps, orjson.OPT_APPEND_NEWLINE


class SessionRecordWriter:
    """Appends session records (dicts) to a JSONL file in batches of ``flush_threshold``.

    Writes go through :class:`~rltrace.logdir.files.LineFile` (disk faults: kept and
    retried, bounded; a deleted file is recreated).
    """

    def __init__(self, path: str | os.PathLike[str], flush_threshold: int = 100, *,
                 guard: GuardedDirs | None = None) -> None:
        self.file = LineFile(path, guard=guard)
        self.flush_threshold = max(1, flush_threshold)
        #: the lines not yet appended, in one bytearray: each encoded line is copied in and
        #: freed at once (holding orjson's outputs alive would keep each at its initial 1 KiB
        #: allocation until the batch is written)
        self._buf = bytearray()
        self._lines = 0
        self._lock = threading.RLock()
        self._tallied = 0  # records on disk already counted in ``tally``
        #: counts that outlive the process (a writable int64 sequence: slot ``tally_slot``
        #: gets each record on disk; ``rltrace.sessions.shared_counts``), or None
        self.tally: Any = None
        self.tally_slot = 2

    @property
    def path(self) -> Path:
        return self.file.path

    def add(self, record: dict[str, Any]) -> None:
        """Buffer one record; append the buffer once it holds ``flush_threshold`` records."""
        try:
            line = _dumps(record, option=_NEWLINE)  # the common case: orjson's plain call
        except TypeError:  # values JSON has no plain form for
            line = dumps_line(record) + b"\n"
        with self._lock:
            self._buf += line
            self._lines += 1
            if self._lines >= self.flush_threshold:
                self._write_locked()

    def flush(self) -> None:
        """Append every buffered record now (and retry anything a disk fault held back)."""
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        self.file.append(bytes(self._buf), self._lines)  # one line each
        self._buf.clear()
        self._lines = 0
        if self.tally is not None:  # records that reached the disk since the last count
            on_disk = self.file.written_lines
            self.tally[self.tally_slot] += on_disk - self._tallied
            self._tallied = on_disk

    @property
    def tally(self) -> Any:
        """Counts that outlive the process (a writable int64 sequence: slot ``tally_slot`` gets
        each record that reaches the disk from now on; ``rltrace.sessions.shared_counts``), or None."""
        return self._tally

    @tally.setter
    def tally(self, view: Any) -> None:
        self._tally = view
        self._tallied = self.file.written_lines

    @property
    def written(self) -> int:
        """Records on disk: whole lines the file wrote (a line cut by a fault counts once the
        retry completed it)."""
        return self.file.written_lines

    @property
    def failed(self) -> int:
        """Records a disk fault is holding back (in memory, retried with the next write)."""
        return self.file.pending_lines

    @property
    def lost(self) -> int:
        """Records dropped: past the in-memory cap while the disk refused writes, or because the
        file was refused (a link, or another user's file or folder)."""
        return self.file.lost_lines

    def reset_after_fork(self, path: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.RLock()
        self._buf = bytearray()
        self._lines = 0
        self.file.after_fork(path)
        self.tally = None  # the parent's counts stay the parent's

    def close(self) -> None:
        self.flush()
        with self._lock:
            self.file.close()
