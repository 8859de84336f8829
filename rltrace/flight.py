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

The ring (``session_tracer/[role/].flight-r{rank}-p{pid}.ring``): a 64-byte header (magic, the
data capacity, the bytes written so far, the pid, the name of the records file it backs up),
then the data, written round: each entry a 4-byte length, a JSON array, the length again.  The
count of bytes written is stored after the entry, so an entry cut by the kill is never read;
a reader walks back from the end by the trailing lengths.  It keeps the last
``capacity`` bytes: some 50,000 sessions at the default 16 MiB.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from rltrace.exporters.files import open_no_follow
from rltrace.exporters.values import dumps_line, json_safe

from .semconv import ATTR_REASON, ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK
from .session_metrics import build_record

MAGIC = b"RLFLIGHT"
_HEADER = struct.Struct("<8sQQQ32s")  # magic, capacity, written, pid, records file name
HEADER_SIZE = 64
_LEN = struct.Struct("<I")
#: data bytes a ring keeps (a sparse file: pages never written take no space)
DEFAULT_CAPACITY = 16 << 20
SUFFIX = ".ring"


def ring_name(rank: int, pid: int) -> str:
    return f".flight-r{rank}-p{pid}{SUFFIX}"


class FlightRecorder:
    """This process's ring: :meth:`add` one finished session (the registry calls it)."""

    def __init__(self, path: Path, records_file: str, capacity: int = DEFAULT_CAPACITY) -> None:
        self.path = path
        self.capacity = capacity
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, HEADER_SIZE + capacity)
            self._map = mmap.mmap(fd, HEADER_SIZE + capacity)
        finally:
            os.close(fd)  # the map keeps the file
        self._written = 0
        self._lock = threading.Lock()
        self._map[:_HEADER.size] = _HEADER.pack(MAGIC, capacity, 0, os.getpid(),
                                                 records_file.encode()[:32])
        #: entries added (sessions), entries too large for the ring (never expected), and
        #: sessions whose entry could not be encoded at all (never expected either)
        self.entries = 0
        self.too_large = 0
        self.unencodable = 0

    def add(self, task_id: Any, session_id: Any, status: str, reason: Any, start_ns: int,
            end_ns: int, step: Any, phases: list[tuple[Any, ...]]) -> None:
        """Keep one finished session: its ids, status, reason, times, step and phase executions
        ``(phase, start_ns, end_ns, turn, interrupted)``."""
        entry = [task_id, session_id, status, reason, start_ns, end_ns, step, phases]
        try:
            payload = orjson.dumps(entry)
        except TypeError:  # ids JSON has no form for, a lone surrogate: made JSON-safe
            try:
                payload = dumps_line(json_safe(entry))
            except Exception:
                self.unencodable += 1
                return
        n = len(payload)
        if n + 8 > self.capacity:
            self.too_large += 1
            return
        frame = _LEN.pack(n) + payload + _LEN.pack(n)
        with self._lock:
            self._put(self._written % self.capacity, frame)
            self._written += len(frame)
            struct.pack_into("<Q", self._map, 16, self._written)  # after the entry: it is whole
            self.entries += 1

    def _put(self, at: int, frame: bytes) -> None:
        base, cap = HEADER_SIZE, self.capacity
        first = min(len(frame), cap - at)
        self._map[base + at:base + at + first] = frame[:first]
        if first < len(frame):  # round to the start
            self._map[base:base + len(frame) - first] = frame[first:]

    def close(self, remove: bool) -> None:
        """Unmap; ``remove``: the records it backed up are all on disk (a clean shutdown)."""
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
        if remove:
            try:
                self.path.unlink()
            except OSError:
                pass


def read_ring(path: Path) -> tuple[int, str, list[list[Any]]]:
    """A ring's pid, records file name and entries (oldest first); raises ``ValueError`` for a
    file that is not a ring, ``OSError`` when it cannot be read."""
    data = path.read_bytes()
    if len(data) < HEADER_SIZE:
        raise ValueError(f"{path}: too short for a flight recorder ring")
    magic, capacity, written, pid, name = _HEADER.unpack_from(data)
    if magic != MAGIC or len(data) < HEADER_SIZE + capacity:
        raise ValueError(f"{path}: not a flight recorder ring")
    ring = data[HEADER_SIZE:HEADER_SIZE + capacity]
    return pid, name.rstrip(b"\0").decode(), list(_entries(ring, capacity, written))


def _entries(ring: bytes, capacity: int, written: int) -> Iterator[list[Any]]:
    """The entries that end by ``written``, walked back by their trailing lengths (an entry the
    ring has already overwritten in part is where the walk stops), returned oldest first."""
    def take(end: int, n: int) -> bytes:  # ``n`` bytes ending at stream position ``end``
        start = (end - n) % capacity
        stop = start + n
        return ring[start:stop] if stop <= capacity else ring[start:] + ring[:stop - capacity]

    out: list[list[Any]] = []
    end, oldest = written, max(0, written - capacity)
    while end - 8 >= oldest:
        (n,) = _LEN.unpack(take(end, 4))
        start = end - 8 - n
        if n > capacity or start < oldest:
            break
        if _LEN.unpack(take(start + 4, 4))[0] != n:
            break  # not an entry's start: torn or overwritten
        try:
            entry = orjson.loads(take(end - 4, n))
        except orjson.JSONDecodeError:
            break
        if isinstance(entry, list) and len(entry) == 8:
            out.append(entry)
        end = start
    out.reverse()
    return iter(out)


def _key(task_id: Any, session_id: Any) -> bytes:
    return orjson.dumps([task_id, session_id], default=str)


def _known(records: Path) -> set[bytes]:
    """(task, session) ids of the records already in ``records`` (bad lines skipped)."""
    known: set[bytes] = set()
    try:
        with open(records, "rb") as fh:
            for line in fh:
                try:
                    rec = orjson.loads(line)
                    known.add(_key(rec["task_id"], rec["session_id"]))
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return known


def recovered_record(entry: list[Any], rank: int, role: str | None) -> dict[str, Any]:
    """The session record of one ring entry (as the exporter would have written it, its trace
    id unknown), marked ``recovered``."""
    task_id, session_id, status, reason, start, end, step, phases = entry
    attrs = {ATTR_TASK: task_id, ATTR_SESSION: session_id, ATTR_STATUS: status, ATTR_STEP: step}
    if reason is not None:
        attrs[ATTR_REASON] = reason
    by_phase: dict[str, list[tuple[int, int, Any, bool]]] = {}
    for name, s, e, turn, interrupted in phases:
        by_phase.setdefault(name, []).append((s, e, turn, bool(interrupted)))
    record = build_record(attrs, start, end, 0, by_phase, rank, role, (), counters_possible=False)
    record["trace_id"] = None
    record["recovered"] = True
    return record


def recover(logdir: Path, *, only_dead: bool = True) -> list[tuple[Path, int]]:
    """Append to their records files the sessions that rings in ``logdir`` hold and the files
    lack, then remove the rings; ``only_dead``: skip rings of processes still running.  Returns
    each records file appended to and how many sessions it got back."""
    out = []
    for ring in sorted(Path(logdir).rglob(f".flight-r*{SUFFIX}")):
        if ring.is_symlink():
            continue
        try:
            pid, records_name, entries = read_ring(ring)
        except (OSError, ValueError):
            continue
        if only_dead and _alive(pid):
            continue
        records = ring.with_name(records_name)
        n = _append_missing(records, entries, _rank_of(ring.name), _role_of(ring, logdir))
        ring.unlink(missing_ok=True)
        if n:
            out.append((records, n))
    return out


def _append_missing(records: Path, entries: list[list[Any]], rank: int, role: str | None) -> int:
    known = _known(records)
    lines = [orjson.dumps(recovered_record(e, rank, role)) + b"\n" for e in entries
             if _key(e[0], e[1]) not in known]
    if lines:
        from rltrace.exporters.files import open_for_append

        with open_for_append(records) as fh:
            fh.write(b"".join(lines))
    return len(lines)


def _rank_of(name: str) -> int:
    head = name[len(".flight-r"):].split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def _role_of(ring: Path, logdir: Path) -> str | None:
    """``session_tracer/{role}/.flight-...``: the role folder, if any."""
    parent = ring.parent
    return parent.name if parent.parent.name == "session_tracer" else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
