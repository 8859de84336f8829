"""Session-record writer: ``session_tracer/sessions-r{rank}.jsonl``, one JSON record per line.

Records are buffered and appended every ``flush_threshold`` records, and on every explicit
flush (``rltrace.save``/``flush``/``shutdown``, interpreter exit), so no finished session is
lost whatever the threshold.  Each append writes whole lines and flushes.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import orjson

from .files import open_for_append
from .values import json_default

logger = logging.getLogger("rltrace")


class SessionRecordWriter:
    """Appends session records (dicts) to a JSONL file in batches of ``flush_threshold``."""

    def __init__(self, path: str | os.PathLike[str], flush_threshold: int = 100) -> None:
        self.path = Path(path)
        self.flush_threshold = max(1, flush_threshold)
        self._buf: list[bytes] = []
        self._file: Any = None
        self._lock = threading.Lock()
        self._warned = False
        self.written = 0
        self.failed = 0

    def add(self, record: dict[str, Any]) -> None:
        """Buffer one record; append the buffer once it holds ``flush_threshold`` records."""
        line = orjson.dumps(record, default=json_default, option=orjson.OPT_NON_STR_KEYS) + b"\n"
        with self._lock:
            self._buf.append(line)
            if len(self._buf) >= self.flush_threshold:
                self._write_locked()

    def flush(self) -> None:
        """Append every buffered record now."""
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        n = len(self._buf)
        try:
            if self._file is None:
                self._file = open_for_append(self.path)
            self._file.write(data)
            self._file.flush()
        except OSError as exc:
            self.failed += n
            if not self._warned:
                self._warned = True
                logger.warning("rltrace: cannot write session records to %s: %s "
                               "(training continues)", self.path, exc)
            if len(self._buf) > 100 * self.flush_threshold:  # keep memory bounded
                del self._buf[: len(self._buf) // 2]
            return
        self._buf.clear()
        self.written += n

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._buf = []
        self._file = None

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
