"""Chrome tracks: each slice on the track of the thread (and its name) that recorded it.

The encoder keeps each track's line pieces for the records of the same thread, lane, name and
category; a thread renamed between export cycles must still get a track under its new name.
"""

from __future__ import annotations

import threading
from pathlib import Path

import rltrace
from rltrace import runtime
from rltrace.testing import read_jsonl


def _steps_by_track_name(log_dir: Path) -> list[str]:
    events = read_jsonl(log_dir / "perf_tracer" / "traces-r0.jsonl")
    named = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    return [named[e["tid"]] for e in events if e["ph"] == "X" and e["name"] == "step"]


def test_a_renamed_threads_later_slices_go_on_a_track_under_its_new_name(tmp_path: Path) -> None:
    me = threading.current_thread()
    old = me.name
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    try:
        log_dir = runtime.get_pipeline().log_dir
        try:
            me.name = "rollout-a"
            for _ in range(3):
                with rltrace.trace_scope("step"):
                    pass
            with rltrace.trace_scope("step", args={"k": 1}):  # a slice with args between
                pass
            rltrace.flush()
            me.name = "rollout-b"
            for _ in range(2):
                with rltrace.trace_scope("step"):
                    pass
            rltrace.flush()
        finally:
            me.name = old
    finally:
        rltrace.shutdown()
    assert _steps_by_track_name(log_dir) == ["rollout-a"] * 4 + ["rollout-b"] * 2
