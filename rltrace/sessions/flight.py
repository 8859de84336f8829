"""The flight recorder: every finished session reaches memory that outlives the process.

A session record is built and written by the exporter a cycle after the session ends, so a
SIGKILL or an OOM kill (the common death of RL jobs) loses the last second of them, exactly
the ones that say why the job died.  Here each session, as it is finalized, leaves its
essentials (ids, status, reason, times, step, phase executions) in a ring in a shared memory map
of a file beside the session records: the stores are the kernel's page cache the moment they
are made, so they survive the process however it ends.  A clean shutdown (everything written)
removes the ring; after a kill, the next ``configure`` on that log dir, or ``rltrace recover
LOGDIR``, appends every session the ring holds that its records file lacks, marked
``"recovered": true``, and removes the ring.

The ring (``session_tracer/[role/].flight-r{rank}-p{pid}-{n}.ring``, one per recorder): a
64-byte header, then the data, written round: each entry one line, a JSON array and its CRC-32
(JSON never holds a raw newline).  A reader takes every line whose checksum holds: an entry cut
by the kill, or the rest of one the ring has written over, runs into the next line and does
not.  It keeps the last ``capacity`` bytes: some 35,000 sessions at the default 8 MiB,
allocated on disk when the ring is made (a full disk then switches the recorder off with a
warning; a page first touched on a full disk would end the process).

The header names no file: the records file a ring backs up is derived from the ring's own name
and folder by rltrace's layout (``sessions-r{rank}[-p{pid}].jsonl`` beside it), so a forged
ring cannot make recovery write anywhere else.  It holds the attempt's identity instead: the
records file's device, inode and size when the ring was made.  Records this attempt wrote are
the ones after that offset (in that same file), and a session is the same session only with the
same ids *and* the same finalize time, so an earlier attempt's sessions (ids restart at 0 in
every process) never hide the killed attempt's.

The writer holds an exclusive ``flock`` on its ring for its whole life; the kernel drops it
when the process dies however it dies, so a ring that can be locked is a dead process's (a pid
can be reused, another host's pids mean nothing here).  Recovery takes the same lock while it
appends, so two processes starting on one log dir never restore a ring twice.

Recovery treats rings as input from a stranger (:func:`recover`): only regular files owned by
this user, in folders of this user (or root) that group and others cannot write, are read; the
header is bounded (capacity, pid) before anything is allocated; each entry is validated on its
own; a ring that cannot be used is named with the reason, and one that is damaged is moved
aside (``.ring.damaged``), never left to be reported forever nor allowed to stop the others.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard
from zlib import crc32

import orjson

from rltrace.logdir.files import GuardedDirs, open_no_follow
from rltrace.logdir.pids import pid_alive
from rltrace.readers.lines import Oversize, iter_lines
from rltrace.recording.user_values import dumps_line, json_safe
from rltrace.semconv import ATTR_REASON, ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK
from rltrace.sessions.metrics_processor import build_record, group_phases
from rltrace.sessions.records import Execution

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

MAGIC = b"RLFLIGH2"
#: magic, capacity, pid, flags, the records file's device, inode and size when the ring was made
_HEADER = struct.Struct("<8sQQQQQQ")
#: rings of an older rltrace: magic, capacity, pid, the records file's name (checked strictly)
MAGIC_V1 = b"RLFLIGHT"
_HEADER_V1 = struct.Struct("<8sQQ32s")
HEADER_SIZE = 64
#: data bytes a ring keeps, allocated on disk when it is made (a page first touched on a full
#: disk would otherwise end the process with SIGBUS)
DEFAULT_CAPACITY = 8 << 20
#: the largest capacity a header may claim (rings are made at 8 MiB): more is a damaged or
#: forged ring, never read, so a header claiming 1 GiB of a sparse file costs nothing
MAX_CAPACITY = 32 << 20
#: pids above this do not exist on Linux (``/proc/sys/kernel/pid_max`` is at most 2**22)
PID_MAX = 1 << 22
SUFFIX = ".ring"
#: what a damaged ring is renamed to (its name plus this): never read again, kept to look at
DAMAGED = ".damaged"
#: header flags: the records file is the per-process one; the ring is in a role folder; the
#: writer holds a ``flock`` on it while it lives; (read only) the ring is an older rltrace's
FLAG_PER_PROCESS, FLAG_ROLE, FLAG_LOCKED, FLAG_V1 = 1, 2, 4, 8
#: problems listed one by one in a summary (the rest are counted)
SHOWN_PROBLEMS = 20
logger = logging.getLogger("rltrace")
_NAME = re.compile(r"\.flight-r([0-9]{1,9})-p([0-9]{1,10})-([0-9]{1,20})\.ring")
_SESSIONS_DIR = "session_tracer"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def ring_name(rank: int, pid: int) -> str:
    """A new ring's file name: one per recorder (numbered by the monotonic clock, so every ring
    of a process has its own name), so a reconfigure never truncates a ring another thread may
    still be writing to (its map would fault); the file is created exclusively, never reused."""
    return f".flight-r{rank}-p{pid}-{time.monotonic_ns()}{SUFFIX}"


def records_name(rank: int, pid: int, per_process: bool) -> str:
    """The records file a ring of ``rank`` and ``pid`` backs up, by rltrace's layout."""
    return f"sessions-r{rank}-p{pid}.jsonl" if per_process else f"sessions-r{rank}.jsonl"


class FlightRecorder:
    """This process's ring: :meth:`add` one finished session (the registry calls it).

    ``path`` is named by :func:`ring_name`; ``records`` is the records file it backs up, beside
    it and named by rltrace's layout (:func:`records_name`), else ``ValueError``.  ``warned``:
    the folders its owner has already warned about (others can write them, so recovery will not
    read their rings); the ring's folder is added when it warns, so one owner warns once.
    """

    def __init__(self, path: Path, records: Path, capacity: int = DEFAULT_CAPACITY,
                 role: bool = False, warned: set[str] | None = None,
                 guard: GuardedDirs | None = None) -> None:
        m = _NAME.fullmatch(path.name)
        if m is None or not 0 < capacity <= MAX_CAPACITY:
            raise ValueError(f"flight recorder: {path.name!r} is not a ring name of "
                             f"ring_name(), or capacity {capacity} is out of range")
        rank, pid = int(m[1]), int(m[2])
        if records.parent != path.parent \
                or records.name not in (records_name(rank, pid, False), records_name(rank, pid, True)):
            raise ValueError(f"flight recorder: {records} is not the records file of ring "
                             f"{path.name} (it must be {records_name(rank, pid, False)} or "
                             f"{records_name(rank, pid, True)} beside it)")
        flags = (FLAG_PER_PROCESS if records.name == records_name(rank, pid, True) else 0) \
            | (FLAG_ROLE if role else 0)
        self.path = path
        self.capacity = capacity
        path.parent.mkdir(parents=True, exist_ok=True)
        _warn_if_untrusted(path.parent, set() if warned is None else warned)
        dev = ino = offset = 0
        try:  # the attempt's identity: what the records file held before it
            st = os.stat(records, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                dev, ino, offset = st.st_dev, st.st_ino, st.st_size
        except OSError:
            pass
        fd = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600, guard=guard)
        try:
            if fcntl is not None:
                try:  # held while the process lives: the kernel drops it however it dies
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    flags |= FLAG_LOCKED
                except OSError:
                    pass  # no locks on this filesystem: recovery asks whether the pid runs
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, HEADER_SIZE + capacity)  # ENOSPC now, not SIGBUS later
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, HEADER_SIZE + capacity)
            self._map = mmap.mmap(fd, HEADER_SIZE + capacity)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd = fd  # kept open: it holds the lock (and the map keeps the file)
        st = os.fstat(fd)
        #: (device, inode) of the ring: its owner passes it to :func:`recover` while the ring is
        #: open, so the process never recovers its own ring (where ``flock`` is emulated by POSIX
        #: locks, as on NFS, its own lock would not stop it) and tells it apart from a dead
        #: process's ring of the same pid (a restarted container) when no lock says it
        self.ring_id = (st.st_dev, st.st_ino)
        self._written = 0
        self._lock = threading.Lock()
        self._map[:_HEADER.size] = _HEADER.pack(MAGIC, capacity, os.getpid(), flags, dev, ino,
                                                 offset)
        #: entries added (sessions), entries too large for the ring (never expected), and
        #: sessions whose entry could not be encoded at all (never expected either)
        self.entries = 0
        self.too_large = 0
        self.unencodable = 0

    def add(self, task_id: Any, session_id: Any, status: str, reason: Any, start_ns: int,
            end_ns: int, step: Any, phases: Sequence[Execution]) -> None:
        """Keep one finished session: its ids, status, reason, times, step and phase executions
        ``(phase, start_ns, end_ns, turn, interrupted)``."""
        entry = (task_id, session_id, status, reason, start_ns, end_ns, step, phases)
        try:
            payload = orjson.dumps(entry)
        except TypeError:  # ids JSON has no form for, a lone surrogate: made JSON-safe
            try:
                payload = dumps_line(json_safe(entry))
            except Exception:
                self.unencodable += 1
                return
        line = b"%s#%08x\n" % (payload, crc32(payload))
        n = len(line)
        if n > self.capacity:
            self.too_large += 1
            return
        with self._lock:
            at = self._written
            self._written = at + n
            self.entries += 1
        try:
            self._put(at % self.capacity, line)
        except ValueError:  # closed meanwhile (a reconfigure): that pipeline's records are written
            pass

    def _put(self, at: int, frame: bytes) -> None:
        base, n = HEADER_SIZE + at, len(frame)
        first = self.capacity - at
        if n <= first:  # in one piece (all but one entry per round): no copy of the frame
            self._map[base:base + n] = frame
            return
        self._map[base:base + first] = frame[:first]
        self._map[HEADER_SIZE:HEADER_SIZE + n - first] = frame[first:]  # round to the start

    def close(self, remove: bool) -> None:
        """Unmap and let go of the ring; ``remove``: the records it backed up are all on disk (a
        clean shutdown).  In a forked child it lets go of the parent's ring: closing the child's
        copy of the descriptor leaves the parent's lock held."""
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
        if remove:  # before the lock goes: no recovery can take a ring that is being removed
            try:
                self.path.unlink()
            except OSError:
                pass
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _warn_if_untrusted(folder: Path, warned: set[str]) -> None:
    """Say now, not after a kill, that recovery will not read rings in ``folder`` (another user's,
    or writable by group or others: a umask of 002 makes it so), unless ``warned`` holds it."""
    key = os.path.abspath(folder)
    if key in warned:
        return
    try:
        st = os.stat(folder)
    except OSError:
        return
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        warned.add(key)
        logger.warning("rltrace: %s is writable by group or others (mode %o) or another user's: "
                       "the flight recorder's ring there would not be trusted after a kill, and "
                       "the sessions it keeps not recovered. Make it private: chmod go-w %s",
                       folder, stat.S_IMODE(st.st_mode), folder)


# ---- reading a ring -------------------------------------------------------------------------


class BadRing(ValueError):
    """A ring that cannot be used: its message says why; ``damaged``: move it aside."""

    def __init__(self, why: str, damaged: bool = True) -> None:
        super().__init__(why)
        self.damaged = damaged


@dataclass
class Ring:
    """One ring as read: who wrote it, what it backs up, its valid entries and what was not."""

    pid: int
    flags: int
    #: the records file's device, inode and size when the ring was made (0s: unknown)
    dev: int
    ino: int
    offset: int
    #: the records file's name, derived from the ring's own name (never read from the ring)
    records_name: str
    entries: list[list[Any]]
    #: entries whose checksum held but whose contents did not: how many, and the first reasons
    bad_entries: int = 0
    bad_reasons: list[str] = field(default_factory=list)
    #: the file was shorter than its header says (the entries present were read)
    truncated: str | None = None


def read_ring(path: Path) -> Ring:
    """The ring at ``path`` (opened without following a link), parsed and validated: raises
    :class:`BadRing` for a file that is not a usable ring, ``OSError`` when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
    try:
        return _read_fd(fd, path.name)
    finally:
        os.close(fd)


def _read_fd(fd: int, name: str) -> Ring:
    m = _NAME.fullmatch(name)
    if m is None:
        raise BadRing("its name is not a ring's (.flight-r{rank}-p{pid}-{n}.ring)")
    rank, name_pid = int(m[1]), int(m[2])
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise BadRing("not a regular file", damaged=False)
    head = os.pread(fd, HEADER_SIZE, 0)
    if len(head) < HEADER_SIZE:
        raise BadRing(f"truncated: {len(head)} bytes, shorter than a ring's {HEADER_SIZE}-byte header")
    magic = head[:8]
    if magic == MAGIC:
        _, capacity, pid, flags, dev, ino, offset = _HEADER.unpack_from(head)
        flags &= FLAG_PER_PROCESS | FLAG_ROLE | FLAG_LOCKED
        records = records_name(rank, name_pid, bool(flags & FLAG_PER_PROCESS))
    elif magic == MAGIC_V1:  # an older rltrace's ring: its records name must be the layout's
        _, capacity, pid, raw = _HEADER_V1.unpack_from(head)
        records = raw.rstrip(b"\0").decode("ascii", "replace")
        if records not in (records_name(rank, name_pid, False), records_name(rank, name_pid, True)):
            raise BadRing(f"its header names the records file {records[:40]!r}, not "
                          f"{records_name(rank, name_pid, False)} (or its -p{name_pid} form)")
        flags = FLAG_V1 | (FLAG_PER_PROCESS if records == records_name(rank, name_pid, True) else 0)
        dev = ino = offset = 0
    else:
        raise BadRing(f"not a flight recorder ring (magic {magic!r})")
    if not 0 < capacity <= MAX_CAPACITY:
        raise BadRing(f"its header claims a capacity of {capacity} bytes (rings hold 1 byte to "
                      f"{MAX_CAPACITY >> 20} MiB)")
    if not 0 < pid <= PID_MAX or pid != name_pid:
        raise BadRing(f"its header's pid {pid} is not the pid {name_pid} of its name"
                      if 0 < pid <= PID_MAX else f"its header's pid {pid} is out of range")
    want = HEADER_SIZE + capacity
    data = os.pread(fd, capacity, HEADER_SIZE)  # at most ``capacity``: bounded above
    truncated = None
    if st.st_size < want or len(data) < capacity:
        truncated = f"truncated: {HEADER_SIZE + len(data)} of {want} bytes (the entries present were read)"
    entries, bad, reasons = _entries(data)
    return Ring(pid, flags, dev, ino, offset, records, entries, bad, reasons, truncated)


def _entries(ring: bytes) -> tuple[list[list[Any]], int, list[str]]:
    """A ring's valid entries by end time, and its entries whose checksum held but whose
    contents are not an entry (how many, the first reasons)."""
    lines = ring.split(b"\n")
    # an entry written round the ring's end reads whole across the seam (last line + first)
    candidates: Iterator[bytes] = itertools.chain(lines, (lines[-1] + lines[0],)) \
        if len(lines) > 1 else iter(lines)
    entries: list[list[Any]] = []
    seen: set[bytes] = set()
    bad = 0
    reasons: list[str] = []
    for line in candidates:
        if not line.startswith(b"[") or line in seen:
            continue  # unwritten (zeros), a fragment, or read already
        payload, _, crc = line.rpartition(b"#")
        if len(crc) != 8:
            continue
        try:
            if int(crc, 16) != crc32(payload):
                continue  # cut by the kill, or the rest of an entry written over
            entry = orjson.loads(payload)
        except (ValueError, orjson.JSONDecodeError):
            continue
        seen.add(line)
        why = entry_problem(entry)
        if why is None:
            entries.append(entry)
        else:
            bad += 1
            if len(reasons) < 3:
                reasons.append(why)
    entries.sort(key=lambda e: e[5])
    return entries, bad, reasons


def _is_int(v: object, lo: int = 0, hi: int = (1 << 63) - 1) -> TypeGuard[int]:
    return type(v) is int and lo <= v <= hi


def entry_problem(e: Any) -> str | None:
    """Why ``e`` is not a ring entry ``[task_id, session_id, status, reason, start_ns, end_ns,
    step, phases]`` as :meth:`FlightRecorder.add` writes it, or None."""
    if type(e) is not list or len(e) != 8:
        return f"not an 8-item list ({type(e).__name__}{'' if type(e) is not list else f' of {len(e)}'})"
    _, _, status, reason, start, end, step, phases = e
    return _session_problem(status, reason, start, end, step) or _phases_problem(phases)


def _session_problem(status: object, reason: object, start: object, end: object,
                     step: object) -> str | None:
    """Why an entry's status, reason, times or step are not what :meth:`FlightRecorder.add`
    writes, or None."""
    if type(status) is not str or not status:
        return f"status {type(status).__name__} is not a name"
    if reason is not None and type(reason) is not str:
        return f"reason is a {type(reason).__name__}, not text"
    if not _is_int(start) or not _is_int(end) or end < start:
        return f"times {str(start)[:24]!r}..{str(end)[:24]!r} are not nanoseconds in order"
    if step is not None and not _is_int(step, -(1 << 63)):
        return f"step {str(step)[:24]!r} is not an integer"
    return None


def _phases_problem(phases: object) -> str | None:
    """Why an entry's phases are not a list of ``[name, start_ns, end_ns, turn, interrupted]``,
    or None."""
    if type(phases) is not list:
        return f"phases is a {type(phases).__name__}, not a list"
    for x in phases:
        if type(x) is not list or len(x) != 5 or type(x[0]) is not str or not x[0] \
                or not _is_int(x[1]) or not _is_int(x[2]) or x[2] < x[1] \
                or (x[3] is not None and not _is_int(x[3], 0, 1 << 31)) or type(x[4]) is not bool:
            return f"a phase execution {str(x)[:60]} is not [name, start_ns, end_ns, turn, interrupted]"
    return None


# ---- recovery -------------------------------------------------------------------------------


@dataclass
class Recovery:
    """What :func:`recover` did: sessions restored per records file, rings left to running
    processes, and every ring or entry it could not use, with the reason."""

    restored: list[tuple[Path, int]] = field(default_factory=list)
    #: rings read (wholly or in part) and done with
    rings: int = 0
    #: rings of processes still running (or being recovered by another process), not read
    running: int = 0
    #: (path, why) of each ring skipped or read only in part; ``damaged`` of them moved aside
    problems: list[tuple[Path, str]] = field(default_factory=list)
    damaged: list[Path] = field(default_factory=list)
    #: entries whose checksum held but whose contents were not an entry, skipped
    bad_entries: int = 0

    @property
    def sessions(self) -> int:
        return sum(n for _, n in self.restored)

    def problem_lines(self, limit: int = SHOWN_PROBLEMS) -> list[str]:
        """One line per problem (the first ``limit``), then how many more."""
        out = [f"{p}: {why}" for p, why in self.problems[:limit]]
        if len(self.problems) > limit:
            out.append(f"... and {len(self.problems) - limit} more ring problem(s)")
        return out


def recover(logdir: Path, *, only_dead: bool = True,
            own: Collection[tuple[int, int]] = ()) -> Recovery:
    """Append to their records files the sessions that rings in ``logdir`` (searched without
    following links) hold and the files lack, then remove the rings; ``only_dead``: skip rings
    of processes still running (else read them too, and leave them to their process); ``own``:
    the :attr:`FlightRecorder.ring_id` of the rings this process has open (a running one's).

    Never raises for what it finds: each ring is read on its own, and one it cannot use is in
    :attr:`Recovery.problems` with the reason."""
    out = Recovery()
    for folder, names in _ring_folders(Path(logdir), out):
        try:
            _recover_folder(folder, names, only_dead, frozenset(own), out)
        except Exception as exc:  # a folder that vanished or cannot be listed: the others go on
            out.problems.append((folder, f"not read: {_why(exc)}"))
    return out


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"[:200]


def _ring_folders(root: Path, out: Recovery) -> list[tuple[Path, list[str]]]:
    """Folders holding ring-like names: ``session_tracer/`` and its role folders.  Ring names
    found anywhere else are reported, never read (recovery would write beside them)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        names = sorted(n for n in filenames + dirnames if n.startswith(".flight-") and n.endswith(SUFFIX))
        if not names:
            continue
        folder = Path(dirpath)
        if folder.name == _SESSIONS_DIR or folder.parent.name == _SESSIONS_DIR:
            found.append((folder, names))
        else:
            out.problems.extend((folder / n, f"not in a {_SESSIONS_DIR}/ folder: not read") for n in names)
    return found


def _recover_folder(folder: Path, names: list[str], only_dead: bool,
                    own: frozenset[tuple[int, int]], out: Recovery) -> None:
    dfd = os.open(folder, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    try:
        st = os.fstat(dfd)
        me = os.geteuid()
        if st.st_uid not in (me, 0):
            out.problems.extend((folder / n, f"its folder belongs to another user (uid {st.st_uid}): "
                                 "not read") for n in names)
            return
        if st.st_mode & 0o022:
            out.problems.extend((folder / n, f"its folder is writable by group or others (mode "
                                 f"{stat.S_IMODE(st.st_mode):o}): not read; make it private "
                                 f"(chmod go-w {folder}) and run rltrace recover") for n in names)
            return
        for name in names:
            try:
                _recover_ring(dfd, folder, name, only_dead, own, out)
            except Exception as exc:  # never let one ring stop the others
                out.problems.append((folder / name, f"not read: {_why(exc)}"))
    finally:
        os.close(dfd)


def _recover_ring(dfd: int, folder: Path, name: str, only_dead: bool,
                  own: frozenset[tuple[int, int]], out: Recovery) -> None:
    path = folder / name
    fd = _open_ring(dfd, path, name, out)
    if fd is None:
        return
    try:
        st = os.fstat(fd)
        why = _not_ours(st)
        if why is not None:
            out.problems.append((path, why))
            return
        mine = (st.st_dev, st.st_ino) in own  # this process's own, still being written
        locked = False if mine else _try_lock(fd)
        if locked is False:  # its writer holds it (or another recovery does)
            out.running += 1
            if only_dead:
                return
        if st.st_nlink == 0:
            return  # removed by the recovery that held the lock before us
        try:
            ring = _read_fd(fd, name)
        except BadRing as bad:
            out.problems.append((path, str(bad)))
            if bad.damaged and locked is not False:  # never a ring someone holds
                _quarantine(dfd, folder, name, out)
            return
        if locked is None or not ring.flags & FLAG_LOCKED:  # no lock says it: ask the pid
            alive = mine or (ring.pid != os.getpid() and pid_alive(ring.pid))
            if alive:
                out.running += 1
                if only_dead:
                    return
            locked = not alive
        _restore(dfd, folder, name, ring, out)
        if locked:  # a dead process's: done with (a running one's is its own to remove)
            os.unlink(name, dir_fd=dfd)
    finally:
        os.close(fd)


def _open_ring(dfd: int, path: Path, name: str, out: Recovery) -> int | None:
    """The ring ``name`` in the folder ``dfd``, opened without following a link; None (and the
    reason in ``out``, unless it is gone) when it cannot be."""
    try:
        return os.open(name, os.O_RDWR | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            out.problems.append((path, "a symbolic link: not read"))
        elif exc.errno == errno.EISDIR:
            out.problems.append((path, "a folder, not a ring: not read"))
        elif exc.errno != errno.ENOENT:  # gone meanwhile: recovered by another process
            out.problems.append((path, f"cannot be opened: {_why(exc)}"))
        return None


def _not_ours(st: os.stat_result) -> str | None:
    """Why an opened ring is not read (not a regular file, another user's), or None."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file: not read"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid}): not read (rltrace reads only rings of your own)"
    return None


def _restore(dfd: int, folder: Path, name: str, ring: Ring, out: Recovery) -> None:
    """Append the ring's missing sessions to its records file and note what was done and what
    was skipped."""
    path = folder / name
    n = _append_missing(dfd, folder, ring, name)
    out.rings += 1
    out.bad_entries += ring.bad_entries
    if ring.bad_entries:
        out.problems.append((path, f"{ring.bad_entries} entr(ies) skipped: "
                                   + "; ".join(ring.bad_reasons)))
    if ring.truncated:
        out.problems.append((path, ring.truncated))
    if n:
        out.restored.append((folder / ring.records_name, n))


def _try_lock(fd: int) -> bool | None:
    """True: locked (its writer is gone); False: held by another; None: no locks here."""
    if fcntl is None:  # pragma: no cover - not POSIX
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None


def _quarantine(dfd: int, folder: Path, name: str, out: Recovery) -> None:
    """Move a damaged ring aside (``.damaged``): named once, never read again."""
    try:
        os.rename(name, name + DAMAGED, src_dir_fd=dfd, dst_dir_fd=dfd)
        out.damaged.append(folder / (name + DAMAGED))
    except OSError as exc:
        out.problems.append((folder / name, f"could not be moved aside: {_why(exc)}"))


def _key(task_id: Any, session_id: Any, finalized_ts: Any) -> bytes:
    return orjson.dumps([task_id, session_id, finalized_ts], default=str,
                        option=orjson.OPT_SORT_KEYS)


def _entry_key(e: list[Any]) -> bytes:
    return _key(e[0], e[1], e[5] / 1e9)  # as the record's finalized_ts is computed


def _written(dfd: int, ring: Ring, wanted: set[bytes]) -> set[bytes]:
    """Those of ``wanted`` (entry keys) that the ring's records file holds among the records its
    own attempt wrote: after the ring's offset when the file is the one the ring was made
    beside, else anywhere in it.  Lines are read up to the readers' cap, never whole."""
    found: set[bytes] = set()
    try:
        fd = os.open(ring.records_name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
    except FileNotFoundError:
        return found
    with open(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"records file {ring.records_name} is not a regular file")
        if ring.ino and (st.st_dev, st.st_ino) == (ring.dev, ring.ino) and st.st_size >= ring.offset:
            fh.seek(ring.offset)
        for line in iter_lines(fh):
            if isinstance(line, Oversize) or b'"finalized_ts"' not in line:
                continue
            try:
                rec = orjson.loads(line)
                key = _key(rec["task_id"], rec["session_id"], rec["finalized_ts"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if key in wanted:
                found.add(key)
                if len(found) == len(wanted):
                    break
    return found


def recovered_record(entry: list[Any], rank: int, role: str | None) -> dict[str, Any]:
    """The session record of one ring entry (as the exporter would have written it, its trace
    id unknown), marked ``recovered``."""
    task_id, session_id, status, reason, start, end, step, phases = entry
    attrs = {ATTR_TASK: task_id, ATTR_SESSION: session_id, ATTR_STATUS: status, ATTR_STEP: step}
    if reason is not None:
        attrs[ATTR_REASON] = reason
    record = build_record(attrs, start, end, 0, group_phases([tuple(p) for p in phases]), rank,
                          role, (), counters_possible=False)
    record["trace_id"] = None
    record["recovered"] = True
    return record


def _append_missing(dfd: int, folder: Path, ring: Ring, name: str) -> int:
    """Append the ring's entries its records file lacks; how many."""
    if not ring.entries:
        return 0
    keys = [_entry_key(e) for e in ring.entries]
    written = _written(dfd, ring, set(keys))
    m = _NAME.fullmatch(name)
    rank = int(m[1]) if m else 0
    in_role = ring.flags & FLAG_ROLE if not ring.flags & FLAG_V1 else folder.name != _SESSIONS_DIR
    role = folder.name if in_role else None
    lines = [orjson.dumps(recovered_record(e, rank, role)) + b"\n"
             for e, k in zip(ring.entries, keys, strict=True) if k not in written]
    if not lines:
        return 0
    fd = os.open(ring.records_name, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC
                 | os.O_NONBLOCK, 0o666, dir_fd=dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0):
            raise OSError(errno.EPERM, f"records file {ring.records_name} is not a regular file "
                                       f"of yours: nothing appended")
        os.set_blocking(fd, True)
        head = b"\n" if st.st_size and os.pread(fd, 1, st.st_size - 1) != b"\n" else b""
        # a line the killed writer cut is ended first, so the next one is whole; a short write
        # (a nearly full disk, a signal) is continued until every byte is down, or raises
        data = memoryview(head + b"".join(lines))
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    return len(lines)
