"""The flight recorder's rings as input from a stranger: a ring or entry that is damaged, forged,
another user's or in a folder others can write is skipped, counted and named, never fatal and
never trusted; recovery reads what it must with bounded memory, and leaves no ring behind that
nobody will read.

Rings are forged byte by byte (both header layouts: an older rltrace's names its records file,
this one's derives it) and recovered for real: by ``flight.recover``, by ``rltrace recover`` in a
subprocess, or by ``configure`` in a subprocess.  The tests run as root in CI, so rings and
folders of another user are made with ``os.chown`` (skipped where that is not allowed).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any
from zlib import crc32

import orjson
import pytest
from conftest import REPO

import rltrace
from rltrace.logdir.pids import pid_alive
from rltrace.sessions import flight

OTHER_UID = 4242  # not this test's user
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another user")
T0 = 1_700_000_000_000_000_000  # ns: a plausible finalize time


def _logdir(root: Path) -> Path:
    return root / "logs" / "u" / "e" / "t0"


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has ended (its rings are a killed process's)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=60)
    return p.pid


def _entry(i: int, task: Any = 7) -> list[Any]:
    start, end = T0 + i * 1000, T0 + i * 1000 + 500
    return [task, i, "accepted", None, start, end, 3, [["generate", start, end, None, False]]]


def _line(entry: Any) -> bytes:
    payload = orjson.dumps(entry)
    return b"%s#%08x\n" % (payload, crc32(payload))


def _body(lines: list[bytes], capacity: int = 4096) -> bytes:
    data = b"".join(lines)
    assert len(data) <= capacity
    return data + bytes(capacity - len(data))


def _v1(folder: Path, rank: int, pid: int, records: bytes, lines: list[bytes], capacity: int = 4096,
        magic: bytes = b"RLFLIGHT") -> Path:
    """A ring of the older layout (its header names its records file), as a killed ``pid`` left
    it; read by the recovery before this one too."""
    folder.mkdir(parents=True, exist_ok=True)
    head = struct.pack("<8sQQ32s", magic, capacity, pid, records).ljust(flight.HEADER_SIZE, b"\0")
    path = folder / f".flight-r{rank}-p{pid}-0.ring"
    path.write_bytes(head + _body(lines, capacity))
    return path


def _good(folder: Path, rank: int, pid: int, n: int = 5) -> Path:
    return _v1(folder, rank, pid, f"sessions-r{rank}.jsonl".encode(), [_line(_entry(i)) for i in range(n)])


def _v2(folder: Path, rank: int, pid: int, lines: list[bytes], *, capacity: int = 4096,
        header_pid: int | None = None, flags: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    head = struct.pack("<8sQQQQQQ", flight.MAGIC, capacity, pid if header_pid is None else header_pid,
                       flags, 0, 0, 0).ljust(flight.HEADER_SIZE, b"\0")
    path = folder / f".flight-r{rank}-p{pid}-0.ring"
    path.write_bytes(head + _body(lines, capacity))
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def _cli_recover(logdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", "recover", str(logdir)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


# ---- item 3: one bad ring or entry never blocks the rest ------------------------------------

DAMAGE = {
    # an entry whose checksum holds, its contents not an entry
    "wrong-shape-entry": lambda d, pid: _v1(d, 0, pid, b"sessions-r0.jsonl", [_line([1, 2, 3])]),
    "string-start-time": lambda d, pid: _v1(d, 0, pid, b"sessions-r0.jsonl",
                                            [_line([7, 1, "accepted", None, "0", 5, 3, []])]),
    "status-an-object": lambda d, pid: _v1(d, 0, pid, b"sessions-r0.jsonl",
                                           [_line([7, 1, {"s": 1}, None, 1, 5, 3, []])]),
    "phase-not-a-list": lambda d, pid: _v1(d, 0, pid, b"sessions-r0.jsonl",
                                           [_line([7, 1, "accepted", None, 1, 5, 3, [7]])]),
    # headers
    "pid-2**64-1": lambda d, pid: _v1(d, 0, 2**64 - 1, b"sessions-r0.jsonl", [_line(_entry(9))]),
    "records-name-empty": lambda d, pid: _v1(d, 0, pid, b"", [_line(_entry(9))]),
    "records-name-dotdot": lambda d, pid: _v1(d, 0, pid, b"..", [_line(_entry(9))]),
    "records-name-up": lambda d, pid: _v1(d, 0, pid, b"../x", [_line(_entry(9))]),
    "wrong-magic": lambda d, pid: _v1(d, 0, pid, b"sessions-r0.jsonl", [_line(_entry(9))], magic=b"NOTARING"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_ring_beside_a_good_one_restores_every_session_of_the_good_one(
        tmp_path: Path, dead_pid: int, damage: str) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    bad = DAMAGE[damage](folder, dead_pid)
    if damage == "pid-2**64-1":  # the name says the pid too: made for the header's
        bad = bad.rename(folder / f".flight-r0-p{dead_pid}-0.ring")
    good = _good(folder, 1, dead_pid)
    done = _cli_recover(_logdir(tmp_path))
    assert "Traceback" not in done.stderr and done.returncode == 2, (done.returncode, done.stderr)
    got = _records(folder / "sessions-r1.jsonl")
    assert sorted(r["session_id"] for r in got) == list(range(5)) and all(r["recovered"] for r in got)
    assert str(bad) in done.stderr  # named, with the reason, on one line
    assert not good.exists() and not bad.exists()  # read and removed, or moved aside
    assert _records(folder / "sessions-r0.jsonl") == []  # nothing of the bad one written
    assert not (folder.parent / "x").exists() and not (folder / "..").is_file()
    again = _cli_recover(_logdir(tmp_path))  # said once: a damaged ring is not reported forever
    assert again.returncode == 0 and "nothing to recover" in again.stdout, again.stderr


def test_a_bad_entry_is_skipped_and_counted_and_its_neighbours_restored(tmp_path: Path,
                                                                        dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    lines = [_line(_entry(0)), _line([7, 1, "accepted", None, "0", 5, 3, []]), _line(_entry(2)),
             _line(_entry(3)[:7]), _line(_entry(4))]
    _v1(folder, 0, dead_pid, b"sessions-r0.jsonl", lines)
    back = flight.recover(_logdir(tmp_path))
    assert [r["session_id"] for r in _records(folder / "sessions-r0.jsonl")] == [0, 2, 4]
    assert back.sessions == 3 and back.bad_entries == 2 and len(back.problems) == 1
    assert "2 entr(ies) skipped" in back.problems[0][1] and "not nanoseconds" in back.problems[0][1]


def test_rltrace_recover_on_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rltrace.cli", "recover", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a folder" in done.stderr


def _rss_child(code: str) -> int:
    """Run ``code`` (which sets ``before``) in a fresh interpreter; the rise of its peak RSS in
    MiB after ``before`` was taken."""
    prog = ("import resource, sys\nfrom pathlib import Path\nfrom rltrace.sessions import flight\n" + code
            + "\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before)\n")
    done = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_header_claiming_1_gib_of_a_sparse_file_is_not_read(tmp_path: Path, dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    ring = _v1(folder, 0, dead_pid, b"sessions-r0.jsonl", [_line(_entry(0))], capacity=4096)
    with open(ring, "r+b") as fh:  # the header says 1 GiB, and the file is that long (sparse)
        fh.write(struct.pack("<8sQ", b"RLFLIGHT", 1 << 30))
        fh.truncate(flight.HEADER_SIZE + (1 << 30))
    good = _good(folder, 1, dead_pid)
    rise = _rss_child(f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
                      f"flight.recover(Path({str(_logdir(tmp_path))!r}))")
    assert rise < 100, f"peak RSS rose {rise} MiB reading a ring that claims 1 GiB"
    assert not good.exists() and len(_records(folder / "sessions-r1.jsonl")) == 5
    assert not ring.exists() and (folder / (ring.name + flight.DAMAGED)).exists()


def test_recovery_reads_the_records_file_with_a_line_cap(tmp_path: Path, dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    records = folder / "sessions-r0.jsonl"
    folder.mkdir(parents=True)
    with open(records, "wb") as fh:  # a 200 MB line (sparse zeros), then one of the ring's records
        fh.truncate(200 << 20)
        fh.seek(200 << 20)
        fh.write(b"\n")
    _v1(folder, 0, dead_pid, b"sessions-r0.jsonl", [_line(_entry(i)) for i in range(3)])
    rise = _rss_child(f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
                      f"flight.recover(Path({str(_logdir(tmp_path))!r}))")
    assert rise < 120, f"peak RSS rose {rise} MiB reading a 200 MB line"
    with open(records, "rb") as fh:
        fh.seek(200 << 20)
        assert [json.loads(x)["session_id"] for x in fh.read().splitlines() if x.strip()] == [0, 1, 2]


CONFIGURE = """
import logging, sys, rltrace
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
rltrace.configure(fileroot=sys.argv[1], experiment_name="e", trial_name="t0", user="u",
                  session_tracer={"enabled": True}, flush_at_exit=False, handle_sigterm=False)
rltrace.shutdown()
print("configured")
"""


def test_configure_beside_damaged_rings_warns_naming_them_and_logs_no_traceback(
        tmp_path: Path, dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    bad = [DAMAGE[d](folder / f"role{i}", dead_pid) for i, d in enumerate(sorted(DAMAGE))]
    _good(folder, 1, dead_pid)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", CONFIGURE, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0 and "configured" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert len(_records(folder / "sessions-r1.jsonl")) == 5
    assert sum(str(p) in done.stderr for p in bad) >= 5  # named (the first five of them)


# ---- item 4: ownership, folders, names, pids ------------------------------------------------


@ROOT_ONLY
def test_a_ring_of_another_user_is_not_read(tmp_path: Path, dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    forged = _good(folder, 0, dead_pid)
    os.chown(forged, OTHER_UID, OTHER_UID)
    mine = _good(folder, 1, dead_pid)
    done = _cli_recover(_logdir(tmp_path))
    assert _records(folder / "sessions-r0.jsonl") == [] and forged.exists()  # untouched, not read
    assert len(_records(folder / "sessions-r1.jsonl")) == 5 and not mine.exists()
    assert done.returncode == 2 and f"{forged}: belongs to another user (uid {OTHER_UID})" in done.stderr


@ROOT_ONLY
@pytest.mark.parametrize("how", ["group-writable", "world-writable", "sticky-world-writable",
                                 "another-users-folder"])
def test_rings_in_a_folder_others_can_write_are_not_read(tmp_path: Path, dead_pid: int, how: str) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    ring = _good(folder, 0, dead_pid)
    if how == "another-users-folder":
        os.chown(folder, OTHER_UID, OTHER_UID)
    else:
        folder.chmod({"group-writable": 0o775, "world-writable": 0o777,
                      "sticky-world-writable": 0o1777}[how])
    done = _cli_recover(_logdir(tmp_path))
    assert _records(folder / "sessions-r0.jsonl") == [] and ring.exists()
    assert done.returncode == 2 and str(ring) in done.stderr and "Traceback" not in done.stderr
    assert ("another user" if how == "another-users-folder" else "chmod go-w") in done.stderr


def test_a_ring_never_names_the_file_recovery_writes(tmp_path: Path, dead_pid: int) -> None:
    """An older ring's header names its records file: one naming config.yaml is refused, and a
    ring of this layout names none (the file is derived from its own name)."""
    logdir = _logdir(tmp_path)
    folder = logdir / "session_tracer"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_bytes(b"keep: me\n")
    forged = _v1(folder, 0, dead_pid, b"config.yaml", [_line(_entry(0))])
    _v2(folder / "rollout", 3, dead_pid, [_line(_entry(1))], flags=flight.FLAG_ROLE)
    done = _cli_recover(logdir)
    assert (folder / "config.yaml").read_bytes() == b"keep: me\n"
    assert "names the records file 'config.yaml'" in done.stderr and str(forged) in done.stderr
    (rec,) = _records(folder / "rollout" / "sessions-r3.jsonl")
    assert (rec["rank"], rec["role"], rec["session_id"]) == (3, "rollout", 1)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == [
        forged.name + flight.DAMAGED, "config.yaml", "sessions-r3.jsonl"]


def test_a_ring_outside_a_session_tracer_folder_is_not_read(tmp_path: Path, dead_pid: int) -> None:
    logdir = _logdir(tmp_path)
    stray = _good(logdir / "perf_tracer", 0, dead_pid)
    back = flight.recover(logdir)
    assert back.restored == [] and [p for p, _ in back.problems] == [stray]
    assert not (logdir / "perf_tracer" / "sessions-r0.jsonl").exists()


@pytest.mark.parametrize("pid", [0, -1, 2**22 + 1, 2**63 - 1, 2**64 - 1])
def test_a_pid_no_process_can_have_is_not_alive(pid: int) -> None:
    assert pid_alive(pid) is False


def test_a_ring_with_pid_0_is_reported_and_moved_aside_not_kept_forever(tmp_path: Path) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    ring = _v1(folder, 0, 0, b"sessions-r0.jsonl", [_line(_entry(0))])
    first = _cli_recover(_logdir(tmp_path))
    assert first.returncode == 2 and "pid 0 is out of range" in first.stderr and not ring.exists()
    assert _cli_recover(_logdir(tmp_path)).returncode == 0


@pytest.mark.parametrize("cut", [0, 10, 63])
def test_a_ring_too_short_for_its_header_is_named_and_moved_aside(tmp_path: Path, dead_pid: int,
                                                                  cut: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    ring = _good(folder, 0, dead_pid)
    os.truncate(ring, cut)
    first = _cli_recover(_logdir(tmp_path))
    assert first.returncode == 2 and f"{ring}: truncated: {cut} bytes" in first.stderr
    assert not ring.exists() and (folder / (ring.name + flight.DAMAGED)).exists()
    again = _cli_recover(_logdir(tmp_path))
    assert again.returncode == 0 and str(ring) not in again.stderr


def test_a_truncated_ring_gives_back_the_entries_it_still_holds(tmp_path: Path, dead_pid: int) -> None:
    folder = _logdir(tmp_path) / "session_tracer"
    ring = _good(folder, 0, dead_pid)
    first_three = flight.HEADER_SIZE + len(b"".join(_line(_entry(i)) for i in range(3)))
    os.truncate(ring, first_three + 5)  # the fourth entry cut
    back = flight.recover(_logdir(tmp_path))
    assert [r["session_id"] for r in _records(folder / "sessions-r0.jsonl")] == [0, 1, 2]
    assert [p for p, _ in back.problems] == [ring] and "truncated" in back.problems[0][1]
    assert not ring.exists()


def test_a_dead_writers_ring_is_recovered_even_when_its_pid_runs_again(tmp_path: Path) -> None:
    """A restarted container gives the new process the killed one's pid: the ring's lock, which
    the kernel dropped with its writer, says it is a dead process's ring."""
    folder = _logdir(tmp_path) / "session_tracer"
    folder.mkdir(parents=True)
    pid = os.getpid()  # running: this very process
    rec = flight.FlightRecorder(folder / flight.ring_name(0, pid), folder / "sessions-r0.jsonl",
                                capacity=4096)
    for i in range(4):
        rec.add(*_entry(i))
    assert flight.recover(_logdir(tmp_path)).running == 1  # its writer is alive: left alone
    rec.close(remove=False)  # as a kill leaves it: the lock is gone, the file stays
    back = flight.recover(_logdir(tmp_path))
    assert back.sessions == 4 and back.problems == [] and not list(folder.glob("*.ring"))


def test_a_ring_another_recovery_holds_is_not_restored_twice(tmp_path: Path) -> None:
    import fcntl

    folder = _logdir(tmp_path) / "session_tracer"
    folder.mkdir(parents=True)
    path = folder / flight.ring_name(0, os.getpid())
    rec = flight.FlightRecorder(path, folder / "sessions-r0.jsonl", capacity=4096)
    rec.add(*_entry(0))
    rec.close(remove=False)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a second process recovering it would
        back = flight.recover(_logdir(tmp_path))
        assert back.sessions == 0 and back.running == 1 and path.exists()
    finally:
        os.close(fd)
    assert flight.recover(_logdir(tmp_path)).sessions == 1
    assert len(_records(folder / "sessions-r0.jsonl")) == 1


# ---- item 7: no ring left behind ------------------------------------------------------------

TERM = """
import select, sys, rltrace
rltrace.configure(fileroot=sys.argv[1], experiment_name="e", trial_name="t0", user="u",
                  session_tracer={"enabled": True}, flush_interval_s=60)
for _ in range(50):
    sid = rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
print("ready", flush=True)
select.select([sys.stdin], [], [], 60)  # its own deadline: SIGTERM is expected long before
"""


def test_a_sigtermed_process_leaves_no_ring_once_its_sessions_are_on_disk(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.Popen([sys.executable, "-c", TERM, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    folder = _logdir(tmp_path) / "session_tracer"
    assert len(_records(folder / "sessions-r0.jsonl")) == 50
    assert not list(folder.glob("*.ring"))


def test_a_configure_that_fails_leaves_no_ring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4317")  # checked by the pipeline
    with pytest.raises(rltrace.ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t0", user="u",
                          session_tracer={"enabled": True}, flush_at_exit=False)
    assert not list(tmp_path.rglob("*.ring"))


# ---- fuzz: 200 damaged log dirs -------------------------------------------------------------


def _damage(rng: random.Random, ring: Path, folder: Path, pid: int) -> str:
    """Damage one ring (or its place) a random way; the kind of damage done."""
    kind = rng.choice(["truncate", "flip-header", "flip-data", "random-bytes", "bad-header",
                       "link", "owner", "folder-owner", "folder-mode", "dir", "fifo", "empty",
                       "huge-claim", "v1-name", "bad-entries"])
    if kind in ("owner", "folder-owner") and os.geteuid() != 0:
        kind = "truncate"
    data = bytearray(ring.read_bytes())
    if kind == "truncate":
        ring.write_bytes(data[:rng.randrange(len(data))])
    elif kind in ("flip-header", "flip-data"):
        lo, hi = (0, flight.HEADER_SIZE) if kind == "flip-header" else (flight.HEADER_SIZE, len(data))
        for _ in range(rng.randrange(1, 8)):
            data[rng.randrange(lo, hi)] ^= 1 << rng.randrange(8)
        ring.write_bytes(bytes(data))
    elif kind == "random-bytes":
        ring.write_bytes(rng.randbytes(rng.choice([1, 64, 100, len(data)])))
    elif kind == "bad-header":
        head = struct.pack("<8sQQQQQQ", rng.choice([flight.MAGIC, b"RLFLIGHT"]),
                           rng.choice([0, 1, 2**64 - 1, rng.getrandbits(64)]),
                           rng.choice([0, 1, pid, 2**64 - 1, rng.getrandbits(64)]),
                           rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64),
                           rng.getrandbits(64))
        ring.write_bytes(head + bytes(data[len(head):]))
    elif kind == "link":
        target = folder.parent / "precious.txt"
        ring.unlink()
        ring.symlink_to(rng.choice([target, folder / "sessions-r0.jsonl", Path("/etc/passwd"), ring]))
    elif kind == "owner":
        os.chown(ring, OTHER_UID, OTHER_UID)
    elif kind == "folder-owner":
        os.chown(folder, OTHER_UID, OTHER_UID)
    elif kind == "folder-mode":
        folder.chmod(0o777)
    elif kind == "dir":
        ring.unlink()
        ring.mkdir()
    elif kind == "fifo":
        ring.unlink()
        os.mkfifo(ring)
    elif kind == "empty":
        ring.write_bytes(b"")
    elif kind == "huge-claim":
        data[8:16] = struct.pack("<Q", rng.choice([1 << 30, 1 << 40, 2**64 - 1]))
        ring.write_bytes(bytes(data))
        if rng.random() < 0.5:
            os.truncate(ring, 1 << 30)  # sparse
    elif kind == "v1-name":
        name = rng.choice([b"", b"..", b"../x", b"../../config.yaml", b"/etc/passwd", b"config.yaml",
                           b"sessions-r0.jsonl\0x", rng.randbytes(32)])
        ring.write_bytes(struct.pack("<8sQQ32s", b"RLFLIGHT", 4096, pid, name).ljust(64, b"\0")
                         + bytes(data[64:]))
    elif kind == "bad-entries":
        junk = [_line(rng.choice([[1, 2], {"x": 1}, "s", None, [None] * 8, [7, 1, "a", None, 5, 1, 3, []],
                                  [7, 1, "a", 3, 1, 5, 3, []], [7, 1, "a", None, 1, 5, "3", []],
                                  [7, 1, "a", None, 1, 5, 3, [["g", 1, 2, "t", False]]],
                                  [7, 1, "", None, 1, 5, 3, []], [7, 1, "a", None, -1, 5, 3, []]]))
                for _ in range(rng.randrange(1, 5))]
        at = flight.HEADER_SIZE + rng.randrange(0, 2000)
        blob = b"".join(junk)
        data[at:at + len(blob)] = blob
        ring.write_bytes(bytes(data))
    return kind


def _fuzz_dir(rng: random.Random, logdir: Path, pid: int,
              layout: int) -> tuple[list[Path], list[Path], list[str]]:
    """A log dir with 1-3 rings of a killed ``pid`` (``layout`` 1: an older rltrace's, 2: this
    one's), some of them damaged; the rings, the damaged ones and the kinds of damage."""
    folder = logdir / "session_tracer"
    logdir.mkdir(parents=True)
    (logdir / "precious.txt").write_bytes(b"keep\n")
    (logdir / "config.yaml").write_bytes(b"keep\n")
    rings = []
    for r in range(rng.randrange(1, 4)):
        lines = [_line(_entry(i, task=r)) for i in range(rng.randrange(0, 8))]
        rings.append(_v1(folder, r, pid, f"sessions-r{r}.jsonl".encode(), lines) if layout == 1 else
                     _v2(folder, r, pid, lines, flags=rng.choice([0, flight.FLAG_LOCKED])))
    damaged = rng.sample(rings, rng.randrange(0, len(rings) + 1))
    return rings, damaged, [_damage(rng, ring, folder, pid) for ring in damaged]


def test_recover_survives_200_fuzzed_log_dirs(tmp_path: Path, dead_pid: int) -> None:
    rng = random.Random(4040)
    kinds: dict[str, int] = {}
    intact_sessions = 0
    for d in range(200):
        logdir = tmp_path / f"d{d}" / "logs" / "u" / "e" / "t0"
        folder = logdir / "session_tracer"
        rings, damaged, done_to = _fuzz_dir(rng, logdir, dead_pid, 1 + d % 2)
        for kind in done_to:
            kinds[kind] = kinds.get(kind, 0) + 1
        back = flight.recover(logdir)  # must not raise
        if folder.stat().st_uid == os.geteuid() and not folder.stat().st_mode & 0o022:
            for ring in rings:
                if ring not in damaged:  # an intact ring beside the damaged ones: all of it back
                    rank = int(ring.name.split("-")[1][1:])
                    mine = [r for r in _records(folder / f"sessions-r{rank}.jsonl") if r["task_id"] == rank]
                    intact_sessions += len(mine)
                    assert not ring.exists() and len(mine) == len({r["session_id"] for r in mine})
                    assert {r["session_id"] for r in mine} == set(range(len(mine)))
        assert (logdir / "precious.txt").read_bytes() == b"keep\n"
        assert (logdir / "config.yaml").read_bytes() == b"keep\n"
        assert len(back.problems) >= len([k for k in done_to if k in ("owner", "link", "dir", "fifo")])
        for f in folder.rglob("sessions-*.jsonl"):  # whatever was appended is whole records
            for rec in _records(f):
                assert rec["recovered"] is True and isinstance(rec["session_id"], int)
        again = flight.recover(logdir)  # and a second pass finds nothing new to restore
        assert again.sessions == 0
    assert len(kinds) >= 12 and intact_sessions > 100, kinds
    done = _cli_recover(tmp_path)  # the command line over all of them: no traceback
    assert done.returncode in (0, 2) and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_a_ring_made_in_a_folder_others_can_write_warns_at_once(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "session_tracer"
    folder.mkdir()
    folder.chmod(0o775)  # as a umask of 002 makes it
    rec = flight.FlightRecorder(folder / flight.ring_name(0, os.getpid()), folder / "sessions-r0.jsonl",
                                capacity=4096)
    rec.close(remove=True)
    assert f"chmod go-w {folder}" in caplog.text and "would not be trusted" in caplog.text


def test_one_owner_warns_once_about_a_folder_others_can_write(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "session_tracer"
    folder.mkdir()
    folder.chmod(0o775)
    warned: set[str] = set()
    for _ in range(2):  # a reconfigure makes a new ring in the same folder
        rec = flight.FlightRecorder(folder / flight.ring_name(0, os.getpid()), folder / "sessions-r0.jsonl",
                                    capacity=4096, warned=warned)
        rec.close(remove=True)
    assert caplog.text.count("would not be trusted") == 1 and warned == {str(folder)}


def test_a_ring_this_process_has_open_is_not_recovered_by_it_where_no_lock_says_so(tmp_path: Path) -> None:
    """Where ``flock`` is emulated (NFS), this process's own lock does not stop its own
    recovery: the ring's identity, passed as ``own``, does."""
    import fcntl

    folder = _logdir(tmp_path) / "session_tracer"
    folder.mkdir(parents=True)
    path = folder / flight.ring_name(0, os.getpid())
    rec = flight.FlightRecorder(path, folder / "sessions-r0.jsonl", capacity=4096)
    try:
        rec.add(*_entry(0))
        fcntl.flock(rec._fd, fcntl.LOCK_UN)  # as if the filesystem kept no lock
        back = flight.recover(_logdir(tmp_path), own=(rec.ring_id,))
        assert back.running == 1 and back.sessions == 0 and path.exists()
        unowned = flight.recover(_logdir(tmp_path))  # without it, the ring looks a dead writer's
        assert unowned.sessions == 1 and not path.exists()
    finally:
        rec.close(remove=False)


def test_rings_are_private_files(tmp_path: Path) -> None:
    folder = tmp_path / "session_tracer"
    rec = flight.FlightRecorder(folder / flight.ring_name(0, os.getpid()), folder / "sessions-r0.jsonl",
                                capacity=4096)
    try:
        assert stat.S_IMODE(os.stat(rec.path).st_mode) == 0o600
    finally:
        rec.close(remove=True)
