"""Append-only JSON-lines files shared by the exporters: crash-, disk- and deletion-tolerant,
and never written through a link they did not make.

Files are opened with ``O_NOFOLLOW`` (a symbolic link planted where a log file goes is refused,
its target untouched) and must be regular files (a FIFO or device planted there is refused);
whole-file writes (:func:`write_atomically`) go to a fresh temporary name (``O_EXCL``, random)
renamed over the target, which replaces a planted link instead of writing through it.

:class:`LineFile` appends whole lines and flushes per batch (a crash leaves every complete
line valid).  When a write fails (unwritable directory, full disk, file-size limit) it warns
once, keeps the unwritten lines in memory up to a cap and retries them with the next batch, so
a transient fault loses nothing; past the cap the oldest lines are dropped and counted.  If
the file is deleted while open it is recreated (``on_reopen`` lets the caller re-emit headers).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger("rltrace")

#: unwritten bytes kept in memory while the disk refuses writes
DEFAULT_PENDING_CAP = 64 * 1024 * 1024


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafeFileError(OSError):
    """A log file's path holds something rltrace will not write through (a symbolic link, a
    FIFO, a device, a directory)."""


def _refuse(path: Path, what: str) -> UnsafeFileError:
    return UnsafeFileError(errno.ELOOP if what == "a symbolic link" else errno.EINVAL,
                           f"{path} is {what}, not a file rltrace made: it will not write through "
                           f"it (remove it, or choose another fileroot)")


def open_no_follow(path: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags)`` that refuses a symbolic link and anything but a regular file
    (a planted FIFO does not block the open); returns the descriptor."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and path.is_symlink()):
            raise _refuse(path, "a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refuse(path, "not a regular file")
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def open_for_append(path: Path) -> BinaryIO:
    """Open ``path`` for appending whole lines, creating its directory; never through a link.

    If a previous writer crashed mid-line, the cut-off fragment is ended with a newline first,
    so the first new line stays valid JSON (readers skip the fragment and say so).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_no_follow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
    fh = open(fd, "ab", buffering=0)  # noqa: SIM115 - the caller keeps it open
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            fh.write(b"\n")
    except OSError:
        fh.close()
        raise
    return fh


def open_fresh(path: Path) -> BinaryIO:
    """Open ``path`` to write it from its start (created, or emptied), creating its directory;
    never through a link.  Unbuffered: each write is the caller's whole unit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    return open(fd, "wb", buffering=0)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: written to a fresh, unpredictable name beside it
    (``O_EXCL``; the umask applies), then renamed over it, so a reader sees the old file or the
    new one, and a link planted at ``path`` is replaced, never written through."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class LineFile:
    """An append-only lines file that survives write failures and deletion (see module doc)."""

    def __init__(self, path: str | os.PathLike[str], *, pending_cap: int = DEFAULT_PENDING_CAP,
                 on_reopen: Callable[[], bytes] | None = None) -> None:
        self.path = Path(path)
        self.pending_cap = pending_cap
        self.on_reopen = on_reopen
        self._fh: BinaryIO | None = None
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._partial = False
        self._warned = False
        self._warned_lost = False
        self.written_bytes = 0
        #: complete lines on disk (written by this object)
        self.written_lines = 0
        self.lost_bytes = 0
        self.lost_lines = 0
        self.reopened = 0

    def _deleted(self) -> bool:
        fh = self._fh
        if fh is None:
            return False
        try:
            return os.fstat(fh.fileno()).st_nlink == 0
        except OSError:
            return True

    def append(self, data: bytes, lines: int | None = None) -> bool:
        """Append ``data`` (whole lines; ``lines`` of them, when the caller knows: else they
        are counted); True when it and everything pending reached the file.

        Writes are unbuffered and resumed exactly where a failed write stopped, so a line split
        by a fault is completed by the retry, never duplicated.
        """
        if data:
            self._pending.append(data)
            self._pending_bytes += len(data)
        try:
            if self._fh is not None and self._deleted():
                self._recreate()
            if self._fh is None:
                self._fh = open_for_append(self.path)
            while self._pending:
                chunk = self._pending[0]
                n = self._fh.write(chunk) or 0
                self.written_bytes += n
                self._pending_bytes -= n
                if n < len(chunk):
                    self.written_lines += chunk.count(b"\n", 0, n)
                    self._pending[0] = chunk[n:]
                    self._partial = n > 0 or self._partial
                    continue
                # written whole in one piece: the caller's count of its lines, if it gave one
                self.written_lines += lines if lines is not None and chunk is data \
                    else chunk.count(b"\n")
                self._pending.popleft()
                self._partial = False
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                why = str(exc) if isinstance(exc, UnsafeFileError) else exc.strerror or exc
                logger.warning("rltrace: cannot write %s: %s. Keeping up to %d MiB in memory and "
                               "retrying; training continues.", self.path, why,
                               self.pending_cap >> 20)
            while self._pending_bytes > self.pending_cap and self._pending:
                if not self._drop_oldest():
                    break
                if not self._warned_lost:
                    self._warned_lost = True
                    logger.warning("rltrace: %s is still unwritable and %d MiB are held in memory; "
                                   "dropping the oldest lines (counted in rltrace.diagnostics())",
                                   self.path, self.pending_cap >> 20)
            return False

    def _drop_oldest(self) -> bool:
        """Drop the oldest pending lines to stay under the cap, but never the rest of a line a
        fault cut on disk: that stays, so the retry completes it and no later line is appended
        onto a fragment.  False when nothing but that rest is held."""
        head = self._pending[0]
        if self._partial:
            cut = head.find(b"\n") + 1  # the rest of the cut line (every chunk ends a line)
            if cut >= len(head):
                if len(self._pending) == 1:
                    return False
                dropped = self._pending[1]
                del self._pending[1]
            else:
                self._pending[0] = head[:cut]
                dropped = head[cut:]
        else:
            dropped = self._pending.popleft()
        self._pending_bytes -= len(dropped)
        self.lost_bytes += len(dropped)
        self.lost_lines += dropped.count(b"\n")
        return True

    @property
    def pending_lines(self) -> int:
        """Lines held in memory by a disk fault, retried with the next write."""
        return sum(chunk.count(b"\n") for chunk in tuple(self._pending))  # (a copy: atomic)

    def _recreate(self) -> None:
        self._close_quietly()
        self.reopened += 1
        logger.warning("rltrace: %s was deleted during the run; recreating it", self.path)
        if self._pending and self._partial:  # a line cut by a fault can't be finished elsewhere
            head = self._pending[0]
            cut = head.find(b"\n") + 1
            self._pending[0] = head[cut:]
            self._pending_bytes -= cut
            self.lost_bytes += cut
            self._partial = False
        if self.on_reopen is not None:
            header = self.on_reopen()
            if header:
                self._pending.appendleft(header)
                self._pending_bytes += len(header)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def _close_quietly(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None

    def after_fork(self, path: str | os.PathLike[str] | None = None) -> None:
        """In a forked child: drop the parent's handle and pending lines; maybe a new path."""
        self._fh = None  # the parent's lines stay the parent's
        self._pending = deque()
        self._pending_bytes = 0
        self._partial = False
        self.written_lines = 0
        if path is not None:
            self.path = Path(path)

    def close(self) -> None:
        self.append(b"")
        self._close_quietly()
