"""Forked and spawned children of a traced process, for tests/reliability/test_fork.py.

Usage: ``python fork_workload.py FILEROOT MODE``; prints one JSON line describing what it did.
The parent records spans and sessions that are *not* flushed before it forks (hour-long flush
interval, high session threshold), so a child that re-exported the parent's buffers would be
caught.

Modes:

* ``process``: one ``multiprocessing`` fork ``Process`` (a dataloader-like worker) records spans
  and sessions, calls ``rltrace.flush()`` and returns;
* ``process_noflush``: the same without the explicit flush (multiprocessing's exit must flush);
* ``pool``: a fork ``Pool`` of 2 workers maps 8 traced items, then ``close()``/``join()``;
* ``hammer``: 10 fork ``Process`` children and 10 raw ``os.fork`` children are started while
  another parent thread records spans and sessions as fast as it can; every join is bounded;
* ``disable``: ``fork_mode="disable"``: the child records but must write nothing;
* ``spawn``: a ``spawn`` ``Process`` child calls ``rltrace.configure_child()`` and exits without
  calling shutdown.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import threading
import time

import rltrace

PARENT_SPANS = 40


def child_work(tag: str, flush: bool) -> None:
    for i in range(20):
        with rltrace.trace_scope(f"child.{tag}.{i}"):
            pass
    for _ in range(3):
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    if flush:
        rltrace.flush()


def child_report(path: str) -> None:
    """A disabled child says whether rltrace is configured in it."""
    child_work("disabled", flush=True)
    with open(path, "w") as fh:
        json.dump({"configured": rltrace.is_configured(), "pid": os.getpid()}, fh)


def pool_item(i: int) -> int:
    with rltrace.trace_scope(f"pool.item.{i}"):
        pass
    return os.getpid()


def spawn_child(out: str) -> None:
    cfg = rltrace.configure_child()
    child_work("spawned", flush=False)  # no flush, no shutdown: interpreter exit must write it
    with open(out, "w") as fh:
        json.dump({"pid": os.getpid(), "rank": cfg.rank, "fileroot": cfg.fileroot}, fh)


def parent_prelude() -> list[int]:
    for i in range(PARENT_SPANS):
        with rltrace.trace_scope(f"parent.before_fork.{i}"):
            pass
    sids = []
    for _ in range(4):
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="rejected")
        sids.append(sid)
    open_sid = rltrace.register_session()  # open across the fork; the parent finalizes it
    rltrace.trace_session_event("mark_generate_start", session_id=open_sid)
    sids.append(open_sid)
    return sids


def main(argv: list[str]) -> int:
    fileroot, mode = argv
    rltrace.configure(fileroot=fileroot, experiment_name="fork", trial_name=mode, rank=3, world_size=4,
                      flush_interval_s=3600, fork_mode="disable" if mode == "disable" else "trace",
                      session_tracer={"enabled": True, "flush_threshold": 100_000})
    out: dict[str, object] = {"parent_pid": os.getpid(),
                              "log_dir": str(rltrace.diagnostics()["log_dir"])}
    parent_sids = parent_prelude()
    out["parent_sessions"] = parent_sids
    fork = mp.get_context("fork")
    if mode in ("process", "process_noflush"):
        p = fork.Process(target=child_work, args=("worker", mode == "process"))
        p.start()
        p.join(30)
        out["children"] = [p.pid]
        out["exitcodes"] = [p.exitcode]
    elif mode == "pool":
        with fork.Pool(2) as pool:
            pids = pool.map(pool_item, range(8), chunksize=1)
            pool.close()
            pool.join()
        out["children"] = sorted(set(pids))
        out["exitcodes"] = [0]
    elif mode == "disable":
        path = os.path.join(fileroot, "child.json")
        p = fork.Process(target=child_report, args=(path,))
        p.start()
        p.join(30)
        with open(path) as fh:
            out["child"] = json.load(fh)
        out["children"] = [p.pid]
        out["exitcodes"] = [p.exitcode]
    elif mode == "hammer":
        stop = threading.Event()
        hammered = [0]

        def hammer() -> None:
            while not stop.is_set():
                with rltrace.trace_scope("hammer.span"):
                    pass
                sid = rltrace.register_session()
                with rltrace.trace_session_phase("generate", session_id=sid):
                    pass
                rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
                rltrace.instant("hammer.instant")
                hammered[0] += 1
                if hammered[0] % 200 == 0:
                    rltrace.flush()

        t = threading.Thread(target=hammer)
        t.start()
        children, codes, slowest = [], [], 0.0
        try:
            for k in range(10):
                t0 = time.monotonic()
                p = fork.Process(target=child_work, args=(f"mp{k}", True))
                p.start()
                p.join(20)
                if p.exitcode is None:
                    p.kill()
                    p.join(5)
                children.append(p.pid)
                codes.append(p.exitcode)
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        child_work(f"raw{k}", True)
                        code = 0
                    finally:
                        os._exit(code)
                statuses: list[int] = []

                def reap(pid: int = pid, out: list[int] = statuses) -> None:
                    out.append(os.waitpid(pid, 0)[1])

                waiter = threading.Thread(target=reap)
                waiter.start()
                waiter.join(20)  # bounded: a deadlocked child is killed and reported
                if waiter.is_alive():
                    os.kill(pid, 9)
                    waiter.join(5)
                    statuses = []
                children.append(pid)
                codes.append(os.waitstatus_to_exitcode(statuses[0]) if statuses else None)
                slowest = max(slowest, time.monotonic() - t0)
        finally:
            stop.set()
            t.join(20)
        out["children"] = children
        out["exitcodes"] = codes
        out["slowest_fork_s"] = slowest
        out["hammered"] = hammered[0]
        out["hammer_alive"] = t.is_alive()
    elif mode == "spawn":
        path = os.path.join(fileroot, "spawned.json")
        p = mp.get_context("spawn").Process(target=spawn_child, args=(path,))
        p.start()
        p.join(60)
        with open(path) as fh:
            out["child"] = json.load(fh)
        out["children"] = [p.pid]
        out["exitcodes"] = [p.exitcode]
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    with rltrace.trace_scope("parent.after_fork"):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=parent_sids[-1], status="dropped")
    rltrace.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
