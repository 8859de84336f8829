"""Append-only JSON-lines files shared by the exporters: crash-, disk- and deletion-tolerant,
and never written through a link they did not make.

Files are opened with ``O_NOFOLLOW`` (a symbolic link planted where a log file goes is refused,
its target untouched) and must be regular files (a FIFO or device planted there is refused);
whole-file writes (:func:`write_atomically`) go to a fresh temporary name (``O_EXCL``, random)
renamed over the target, which replaces a planted link instead of writing through it.

Folders are input from a stranger too: in a log dir that others can write to, another user could
plant ``perf_tracer/`` as a link to her folder, or make it a real folder of her own, and read or
swap what rltrace writes there.  Below a base declared in the :class:`GuardedDirs` handed to an
opener as ``guard`` (the runtime's: its log dirs' ``{fileroot}/logs``), every file is opened
relative to its folder's descriptor, and each folder on the way down is opened with
``O_DIRECTORY | O_NOFOLLOW`` (made when missing) and refused when it is a link or a folder owned
by another user (or, for the file itself, a file owned by another user).  A link the user made
herself (``exp -> /scratch/exp``) is followed.

:class:`LineFile` appends whole lines and flushes per batch (a crash leaves every complete
line valid).  When a write fails (unwritable directory, full disk, file-size limit) it warns
once, keeps the unwritten lines in memory up to a cap and retries them with the next batch, so
a transient fault loses nothing; past the cap the oldest lines are dropped and counted.  If
the file is deleted while open it is recreated (``on_reopen`` lets the caller re-emit headers).
"""

from __future__ import annotations

import errno
import fcntl
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


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


class GuardedDirs:
    """The bases below which every folder on the way to a file is checked (see module doc):
    absolute, links not resolved, newest last, at most ``MAX``.

    The runtime holds one (``Runtime.guarded``): each ``configure`` declares its log dir's
    ``{fileroot}/logs`` in it, and the writers of that log dir are handed it as ``guard``.  A
    forked child keeps it (it writes into the same log dirs); another ``Runtime`` has its own.
    """

    __slots__ = ("_bases",)

    MAX = 64

    def __init__(self) -> None:
        self._bases: list[str] = []

    def add(self, base: str | os.PathLike[str]) -> None:
        """From now on, check every folder below ``base`` on the way to a file opened with this
        guard.  ``configure`` declares ``{fileroot}/logs``: above it the fileroot may be a team's
        volume, below it every folder must be this user's."""
        b = os.path.abspath(base)
        bases = self._bases
        if b in bases:
            bases.remove(b)
        bases.append(b)
        del bases[:-self.MAX]

    def base_of(self, folder: str) -> str | None:
        """The longest declared base that ``folder`` (absolute) is inside (None: not guarded)."""
        best = None
        for b in tuple(self._bases):  # (a copy: another thread may declare one meanwhile)
            if (folder == b or folder.startswith(b.rstrip(os.sep) + os.sep)) \
                    and (best is None or len(b) > len(best)):
                best = b
        return best


def _trusted_uids() -> tuple[int, int]:
    return (os.geteuid(), 0)


def _other_user(path: str | Path, what: str, uid: int) -> UnsafeFileError:
    return UnsafeFileError(errno.EPERM,
                           f"{path} is {what} owned by another user (uid {uid}), who could read or "
                           f"replace what rltrace writes there: rltrace will not use it (remove it, "
                           f"or choose a fileroot of your own)")


def _child_folder(dfd: int, name: str, shown: str, create: bool) -> int:
    """Open the folder ``name`` inside the folder ``dfd`` without following a link another user
    made, making it when missing; refused when another user owns it."""
    flags = _DIR_FLAGS | _NOFOLLOW
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o777, dir_fd=dfd)
        except FileExistsError:
            pass
        return _child_folder(dfd, name, shown, False)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if st.st_uid not in _trusted_uids():
            raise _other_user(shown, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file",
                              st.st_uid) from None
        if not stat.S_ISLNK(st.st_mode):  # the user's own file: a fault to retry, not an attack
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", shown) from None
        fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)  # the user's own link: followed
    uid = os.fstat(fd).st_uid
    if uid not in _trusted_uids():
        os.close(fd)
        raise _other_user(shown, "a folder", uid)
    return fd


def _folder_fd(folder: Path, create: bool, guard: GuardedDirs | None) -> tuple[int, bool]:
    """A descriptor of ``folder`` (made when ``create``), every folder below a base of ``guard``
    checked on the way down (see module doc), and whether it is below one."""
    absolute = os.path.abspath(folder)
    base = guard.base_of(absolute) if guard is not None else None
    if base is None:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        return os.open(folder, _DIR_FLAGS), False
    if create:
        os.makedirs(base, exist_ok=True)
    fd = os.open(base, _DIR_FLAGS)
    shown = base
    try:
        for part in Path(absolute).relative_to(base).parts:
            shown = os.path.join(shown, part)
            inner = _child_folder(fd, part, shown, create)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd, True


def make_folders(folder: str | os.PathLike[str], *, guard: GuardedDirs | None = None) -> None:
    """``folder.mkdir(parents=True, exist_ok=True)``, refusing (:class:`UnsafeFileError`) a link
    or a folder of another user below a base of ``guard``: for outputs written by a library by
    name (the torch profiler), checked right before use."""
    os.close(_folder_fd(Path(folder), True, guard)[0])


def open_no_follow(path: Path, flags: int, mode: int = 0o666, *,
                   guard: GuardedDirs | None = None) -> int:
    """``os.open(path, flags)`` that refuses a symbolic link and anything but a regular file
    (a planted FIFO does not block the open); returns the descriptor.  Below a base of ``guard``
    the folders on the way are checked (and made, with ``O_CREAT``) and the file must be this
    user's."""
    path = Path(path)
    dfd, guarded = _folder_fd(path.parent, bool(flags & os.O_CREAT), guard)
    try:
        fd = os.open(path.name, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and path.is_symlink()):
            raise _refuse(path, "a symbolic link") from None
        raise
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(path, "not a regular file")
    if guarded and st.st_uid not in _trusted_uids():
        os.close(fd)
        raise _other_user(path, "a file", st.st_uid)
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def open_for_append(path: Path, *, guard: GuardedDirs | None = None) -> BinaryIO:
    """Open ``path`` for appending whole lines, creating its directory; never through a link
    (nor, below a base of ``guard``, through another user's folder).

    If a previous writer crashed mid-line, the cut-off fragment is ended with a newline first,
    so the first new line stays valid JSON (readers skip the fragment and say so).
    """
    fd = open_no_follow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, guard=guard)
    fh = open(fd, "ab", buffering=0)  # noqa: SIM115 - the caller keeps it open
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            fh.write(b"\n")
    except OSError:
        fh.close()
        raise
    return fh


class FileBusyError(OSError):
    """Another process holds the file (:func:`open_fresh`): two writers would interleave it."""


def open_fresh(path: Path, *, guard: GuardedDirs | None = None) -> BinaryIO:
    """Open ``path`` to write it from its start (created, or emptied), creating its directory;
    never through a link (nor, below a base of ``guard``, through another user's folder).
    Unbuffered: each write is the caller's whole unit.

    The file is locked (``flock``, exclusive) for as long as it is open, and emptied only once
    the lock is held: a second process given the same path (two processes of one rank) gets
    :class:`FileBusyError` and leaves the first one's file whole, where both writing from
    offset 0 would interleave their bytes into a file no reader can parse."""
    fd = open_no_follow(path, os.O_WRONLY | os.O_CREAT, guard=guard)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileBusyError(errno.EBUSY, f"{path} is being written by another process (two "
                                             f"processes of the same rank?); this one leaves it "
                                             f"to that process") from None
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "wb", buffering=0)


def write_atomically(path: Path, data: bytes, *, guard: GuardedDirs | None = None) -> None:
    """Replace ``path`` with ``data``: written to a fresh, unpredictable name beside it
    (``O_EXCL``; the umask applies), then renamed over it, so a reader sees the old file or the
    new one, and a link planted at ``path`` is replaced, never written through.  The folder is
    made when missing and checked like :func:`open_no_follow`'s."""
    path = Path(path)
    tmp = f".{path.name}.{secrets.token_hex(8)}.tmp"
    dfd, _ = _folder_fd(path.parent, True, guard)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666,
                     dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


class LineFile:
    """An append-only lines file that survives write failures and deletion (see module doc)."""

    def __init__(self, path: str | os.PathLike[str], *, pending_cap: int = DEFAULT_PENDING_CAP,
                 on_reopen: Callable[[], bytes] | None = None,
                 guard: GuardedDirs | None = None) -> None:
        self.path = Path(path)
        #: the bases below which the folders on the way to the file are checked at each open
        self.guard = guard
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
        #: why the path was refused (a link, not a file, another user's): the output is off
        self.refused: str | None = None

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
        if self.refused is not None:
            if data:
                self.lost_bytes += len(data)
                self.lost_lines += lines if lines is not None else data.count(b"\n")
            return False
        if data:
            self._pending.append(data)
            self._pending_bytes += len(data)
        try:
            self._write_pending(data, lines)
            return True
        except UnsafeFileError as exc:
            self._refused(exc)
            return False
        except OSError as exc:
            self._write_failed(exc)
            return False

    def _write_pending(self, data: bytes, lines: int | None) -> None:
        """Write every pending chunk, oldest first, reopening the file when it was deleted;
        a short write leaves the rest of its chunk at the head, to be resumed."""
        if self._fh is not None and self._deleted():
            self._recreate()
        if self._fh is None:
            self._fh = open_for_append(self.path, guard=self.guard)
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

    def _write_failed(self, exc: OSError) -> None:
        """The file cannot be written now: warn once, keep what is pending up to the cap (the
        oldest lines dropped past it, warned once and counted), and retry on the next append."""
        if not self._warned:
            self._warned = True
            why = exc.strerror or exc
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

    def _refused(self, exc: UnsafeFileError) -> None:
        """The path is a link, not a file, or another user's (file or folder): this output is off
        for the run, one warning says why, and every line from now on is dropped and counted."""
        self.refused = str(exc)
        self._close_quietly()
        logger.warning("rltrace: %s; this output is off for the rest of the run (its lines are "
                       "counted as lost in rltrace.diagnostics()), training continues.", exc)
        self.lost_bytes += self._pending_bytes
        self.lost_lines += sum(chunk.count(b"\n") for chunk in self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._partial = False

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
