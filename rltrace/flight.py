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
64-byte header (magic, the data capacity, the pid, the name of the records file it backs up),
then the data, written
round: each entry one line, a JSON array and its CRC-32 (JSON never holds a raw newline).  A
reader takes every line whose checksum holds: an entry cut by the kill, or the rest of one the
ring has written over, runs into the next line and does not.  It keeps the last ``capacity`` bytes: some
35,000 sessions at the default 8 MiB, allocated on disk when the ring is made (a full disk
then switches the recorder off with a warning; a page first touched on a full disk would end
the process).
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from zlib import crc32

import orjson

from rltrace.exporters.files import open_for_append, open_no_follow
from rltrace.exporters.values import dumps_line, json_safe

from .pids import pid_alive
from .semconv import ATTR_REASON, ATTR_SESSION, ATTR_STATUS, ATTR_STEP, ATTR_TASK
from .session_metrics import build_record, group_phases
from .sessions.records import Execution

MAGIC = b"RLFLIGHT"
_HEADER = struct.Struct("<8sQQ32s")  # magic, capacity, pid, records file name
HEADER_SIZE = 64
#: data bytes a ring keeps, allocated on disk when it is made (a page first touched on a full
#: disk would otherwise end the process with SIGBUS)
DEFAULT_CAPACITY = 8 << 20
SUFFIX = ".ring"
_SERIAL = itertools.count()


def ring_name(rank: int, pid: int) -> str:
    """A new ring's file name: one per recorder, so a reconfigure never truncates a ring another
    thread may still be writing to (its map would fault)."""
    return f".flight-r{rank}-p{pid}-{next(_SERIAL)}{SUFFIX}"


class FlightRecorder:
    """This process's ring: :meth:`add` one finished session (the registry calls it)."""

    def __init__(self, path: Path, records_file: str, capacity: int = DEFAULT_CAPACITY) -> None:
        self.path = path
        self.capacity = capacity
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, HEADER_SIZE + capacity)  # ENOSPC now, not SIGBUS later
            else:  # pragma: no cover - not Linux
                os.ftruncate(fd, HEADER_SIZE + capacity)
            self._map = mmap.mmap(fd, HEADER_SIZE + capacity)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)  # the map keeps the file
        self._written = 0
        self._lock = threading.Lock()
        self._map[:_HEADER.size] = _HEADER.pack(MAGIC, capacity, os.getpid(),
                                                 records_file.encode()[:32])
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
    """A ring's pid, records file name and entries (by end time); raises ``ValueError`` for a
    file that is not a ring, ``OSError`` when it cannot be read."""
    data = path.read_bytes()
    if len(data) < HEADER_SIZE:
        raise ValueError(f"{path}: too short for a flight recorder ring")
    magic, capacity, pid, name = _HEADER.unpack_from(data)
    if magic != MAGIC or len(data) < HEADER_SIZE + capacity:
        raise ValueError(f"{path}: not a flight recorder ring")
    ring = data[HEADER_SIZE:HEADER_SIZE + capacity]
    entries, seen = [], set()
    # the ring twice over: an entry written round its end reads whole across the seam
    for line in (ring + ring).split(b"\n"):
        payload, _, crc = line.rpartition(b"#")
        if not payload.startswith(b"[") or len(crc) != 8:
            continue  # unwritten (zeros), or a fragment
        try:
            if int(crc, 16) != crc32(payload):
                continue  # cut by the kill, or the rest of an entry written over
            entry = orjson.loads(payload)
        except (ValueError, orjson.JSONDecodeError):
            continue
        if isinstance(entry, list) and len(entry) == 8 and isinstance(entry[5], int):
            key = line
            if key not in seen:
                seen.add(key)
                entries.append(entry)
    entries.sort(key=lambda e: e[5])
    return pid, name.rstrip(b"\0").decode(), entries


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
    record = build_record(attrs, start, end, 0, group_phases(phases), rank, role, (),
                          counters_possible=False)
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
        if only_dead and pid_alive(pid):
            continue
        records = ring.with_name(records_name)
        n = _append_missing(records, entries, _rank_of(ring.name), _role_of(ring))
        ring.unlink(missing_ok=True)
        if n:
            out.append((records, n))
    return out


def _append_missing(records: Path, entries: list[list[Any]], rank: int, role: str | None) -> int:
    known = _known(records)
    lines = [orjson.dumps(recovered_record(e, rank, role)) + b"\n" for e in entries
             if _key(e[0], e[1]) not in known]
    if lines:
        with open_for_append(records) as fh:
            fh.write(b"".join(lines))
    return len(lines)


def _rank_of(name: str) -> int:
    head = name[len(".flight-r"):].split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def _role_of(ring: Path) -> str | None:
    """``session_tracer/{role}/.flight-...``: the role folder, if any."""
    parent = ring.parent
    return parent.name if parent.parent.name == "session_tracer" else None
