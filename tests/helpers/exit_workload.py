"""A traced training process that leaves in a chosen way, for tests/reliability/test_exit_paths.py.

Usage: ``python exit_workload.py FILEROOT MODE [SPANS DONE OPEN]``.

Records ``SPANS`` finished scopes ``work.{i}``, ``DONE`` finished sessions (generate, toolcall,
reward; accepted) and ``OPEN`` sessions left open with a ``toolcall`` phase still running, all
with nothing flushed yet (``flush_interval_s`` is an hour, the session threshold far above
``DONE``), prints one JSON line (log dir, pid, session ids) and ``ready``, then:

* ``normal``: returns; ``sys_exit``: ``sys.exit(3)``; ``exception``: raises ``RuntimeError``;
* ``wait``: blocks reading stdin (the test delivers a signal);
* ``compute``: spins in a pure-Python loop with no rltrace call (the test delivers a signal);
* ``busy``: keeps registering/finalizing sessions and flushing on the main thread (the test
  delivers SIGTERM while rltrace's own code is running there);
* ``stream``: writes continuously with a 10 ms flush interval and a session threshold of 1
  (the test SIGKILLs it mid-run); ``ready`` once lines are on disk;
* ``fsize``: a file-size limit (``RLIMIT_FSIZE``, SIGXFSZ ignored) makes writes fail like a full
  disk, then is lifted; prints the counts it saw as JSON.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

import rltrace
from rltrace import runtime


def record(spans: int, done: int, open_: int) -> tuple[list[int], list[int]]:
    for i in range(spans):
        with rltrace.trace_scope(f"work.{i}", "compute", {"i": i}):
            pass
    task = rltrace.register_task()
    done_ids, open_ids = [], []
    for _ in range(done):
        sid = rltrace.register_session(task)
        with rltrace.trace_session_phase("generate", {"model": "m"}, session_id=sid):
            pass
        with rltrace.trace_session_phase("toolcall", session_id=sid):
            pass
        with rltrace.trace_session_phase("reward", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        done_ids.append(sid)
    for _ in range(open_):
        sid = rltrace.register_session(task)
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_toolcall_start", session_id=sid)  # still running
        open_ids.append(sid)
    return done_ids, open_ids


def announce(done_ids: list[int], open_ids: list[int]) -> None:
    p = runtime.get_pipeline()
    assert p is not None
    print(json.dumps({"log_dir": str(p.log_dir), "pid": os.getpid(), "done": done_ids,
                      "open": open_ids}), flush=True)
    print("ready", flush=True)


def busy() -> None:
    n = 0
    while True:
        task = rltrace.register_task()
        sid = rltrace.register_session(task)
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        n += 1
        if n % 50 == 0:
            rltrace.flush()
        if n == 1000:
            print("ready", flush=True)


def stream(log_dir_printed: list[bool]) -> None:
    p = runtime.get_pipeline()
    assert p is not None and p.chrome_path is not None
    i = 0
    while True:
        with rltrace.trace_scope(f"stream.{i}", "compute", {"pad": "x" * (i % 997)}):
            sum(range(20_000))  # some work: recording must not outrun the exporter thread here
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        i += 1
        if not log_dir_printed[0] and i % 100 == 0 and p.chrome_path.exists() \
                and p.sessions_path is not None and p.sessions_path.exists() \
                and p.chrome_path.stat().st_size > 100_000:
            log_dir_printed[0] = True
            print(json.dumps({"log_dir": str(p.log_dir)}), flush=True)
            print("ready", flush=True)


def fsize() -> int:
    """Writes fail with EFBIG past RLIMIT_FSIZE (SIGXFSZ ignored); lifting the limit clears it."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    p = runtime.get_pipeline()
    assert p is not None and p.chrome_path is not None and p.sessions_path is not None
    record(10, 5, 0)
    rltrace.flush()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    biggest = max(p.chrome_path.stat().st_size, p.sessions_path.stat().st_size)
    resource.setrlimit(resource.RLIMIT_FSIZE, (biggest + 512, hard))  # the "disk" is now full
    steps = 0
    for step in range(20):  # the training loop goes on; nothing raises
        for i in range(25):
            with rltrace.trace_scope(f"full.{step}.{i}", args={"pad": "y" * 200}):
                pass
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.flush()
        steps += 1
    during = rltrace.diagnostics()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space again
    with rltrace.trace_scope("after.fault"):
        pass
    rltrace.flush()
    after = rltrace.diagnostics()
    print(json.dumps({"log_dir": str(p.log_dir), "steps": steps, "during": during, "after": after}),
          flush=True)
    rltrace.shutdown()
    return 0


def main(argv: list[str]) -> int:
    fileroot, mode = argv[0], argv[1]
    spans, done, open_ = (int(x) for x in argv[2:5]) if len(argv) >= 5 else (0, 0, 0)
    stream_mode = mode == "stream"
    # the defaults, whatever the test process inherited (a shell's background job ignores
    # SIGINT, and its children would too); set here, not by a preexec_fn in the parent
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rltrace.configure(fileroot=fileroot, experiment_name="exit", trial_name=mode, rank=0, world_size=1,
                      flush_interval_s=0.01 if stream_mode else 3600,
                      session_tracer={"enabled": True, "flush_threshold": 1 if stream_mode else 100_000})
    if mode == "busy":
        busy()
    if mode == "stream":
        stream([False])
    if mode == "fsize":
        return fsize()
    done_ids, open_ids = record(spans, done, open_)
    announce(done_ids, open_ids)
    if mode == "normal":
        return 0
    if mode == "sys_exit":
        sys.exit(3)
    if mode == "exception":
        raise RuntimeError("boom: unhandled in the training loop")
    if mode == "wait":
        sys.stdin.readline()
        return 5  # only reached if no signal came
    if mode == "compute":
        x = 0
        while True:  # a long pure-Python computation (the signal ends it)
            x = (x * 31 + 7) % 1_000_003
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
