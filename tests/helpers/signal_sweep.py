"""Seeded sweep of termination timings: is every session finalized before the end on disk?

Usage: ``signal_sweep.py OUT_DIR MODE SIGNAL RUNS SEED``; prints one JSON summary line.

MODE is ``asyncio`` (an event loop on the main thread runs 20 sessions per ``train.step`` with
1 ms generate phases), ``threads`` (4 recording threads, the main thread joins them) or
``self`` (asyncio, and a watchdog thread of the process itself sends SIGNAL).  For each run
this process forks a fresh child (cheap: rltrace is imported once here), which resets its
signal dispositions to the defaults, configures rltrace with a large ``flush_threshold`` and
an hour-long flush interval (nothing is written by the background cycle), and appends every
finalized session id to ``counted.bin`` right after ``mark_finalized`` returned (an unbuffered
``os.write``).  The parent waits for a seeded number of finalized steps, spins a seeded
number of microseconds and sends SIGNAL (SIGTERM or SIGINT); after the child ended it checks
that every counted id is in ``sessions-r0.jsonl`` exactly once and every line parses.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import rltrace

STEP_SESSIONS = 20


def _counter(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


async def _session(fd: int) -> None:
    sid = rltrace.register_session()
    async with rltrace.atrace_session_phase("generate", session_id=sid):
        await asyncio.sleep(0.001)
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    os.write(fd, b"%d\n" % sid)


async def _asyncio_loop(fd: int, progress: int) -> None:
    step = 0
    while True:
        with rltrace.trace_scope("train.step", args={"global_step": step}):
            rltrace.register_task()
            await asyncio.gather(*(_session(fd) for _ in range(STEP_SESSIONS)))
        os.write(progress, b".")
        step += 1


def _thread_loop(fd: int, progress: int, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            time.sleep(0.001)
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        os.write(fd, b"%d\n" % sid)
        n += 1
        if n % 5 == 0:
            os.write(progress, b".")


def _spin(us: int) -> None:
    """Busy-wait ``us`` microseconds: the seeded sub-step timing of the signal."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def child(root: Path, mode: str, sig: int, progress: int, steps: int, spin_us: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever the parent had
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.dump_traceback_later(60, exit=True)  # a hung child shows its stacks and ends
    rltrace.configure(fileroot=str(root), experiment_name="sweep", trial_name="t", rank=0,
                      world_size=1, flush_interval_s=3600,
                      session_tracer={"enabled": True, "flush_threshold": 100_000})
    fd = _counter(root / "counted.bin")
    if mode == "threads":
        stop = threading.Event()
        threads = [threading.Thread(target=_thread_loop, args=(fd, progress, stop)) for _ in range(4)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:  # SIGINT: KeyboardInterrupt here (even while starting); the loop stops its workers
            stop.set()
            for t in threads:
                if t.ident is not None:
                    t.join()
        return
    if mode == "self":  # a watchdog thread of this process ends it after ``steps`` steps
        cue_r, cue_w = os.pipe()

        def watchdog() -> None:
            seen = 0
            while seen < steps:
                seen += len(os.read(cue_r, 64))
            _spin(spin_us)
            os.kill(os.getpid(), sig)

        threading.Thread(target=watchdog, daemon=True).start()
        progress = cue_w
    asyncio.run(_asyncio_loop(fd, progress))


def main(argv: list[str]) -> int:
    out, mode, signame, runs, seed = Path(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    sig = getattr(signal, signame)
    rng = random.Random(seed)
    summary = {"runs": 0, "counted": 0, "lost": 0, "duplicated": 0, "bad_lines": 0,
               "exit_codes": {}, "killed_mid_step": 0,
               "closed_at_shutdown": 0, "other_status": 0}
    for i in range(runs):
        root = out / str(i)
        root.mkdir(parents=True)
        steps, spin_us = rng.randint(1, 12), rng.randint(0, 3000)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            code = 0
            try:
                os.close(r)
                child(root, mode, sig, w, steps, spin_us)
            except KeyboardInterrupt:
                code = 130
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
            sys.exit(code)  # interpreter exit: atexit (rltrace's final flush) runs
        os.close(w)
        if mode != "self":
            seen = 0
            while seen < steps:
                chunk = os.read(r, 64)
                if not chunk:
                    break
                seen += len(chunk)
            _spin(spin_us)
            os.kill(pid, sig)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        code = os.waitstatus_to_exitcode(status)
        summary["exit_codes"][str(code)] = summary["exit_codes"].get(str(code), 0) + 1
        counted = [int(x) for x in (root / "counted.bin").read_bytes().split()]
        on_disk: dict[int, int] = {}
        status: dict[int, str] = {}
        for f in root.rglob("sessions-*.jsonl"):
            for line in f.read_bytes().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    summary["bad_lines"] += 1
                    continue
                on_disk[rec["session_id"]] = on_disk.get(rec["session_id"], 0) + 1
                status[rec["session_id"]] = rec["status"]
        summary["runs"] += 1
        summary["counted"] += len(counted)
        summary["lost"] += sum(1 for s in counted if s not in on_disk)
        summary["duplicated"] += sum(1 for n in on_disk.values() if n > 1)
        summary["killed_mid_step"] += int(len(counted) % STEP_SESSIONS != 0)
        # a session still open when termination began is written as pending ("open at
        # shutdown"); a thread that finalizes it afterwards is too late for its own status
        summary["closed_at_shutdown"] += sum(1 for s in counted if status.get(s) == "pending")
        summary["other_status"] += sum(1 for s in counted if status.get(s) not in
                                       (None, "accepted", "pending"))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
