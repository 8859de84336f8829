"""Spans held for their CUDA events (``device_timing="events"``): owned by the runtime, resolved
when their events complete, dropped past the bound and counted, waited for when the pipeline
closes, and none of them in a forked child.  Stand-in events replace ``torch.cuda.Event`` here,
so that this runs on every machine; ``test_device.py``'s CUDA section times real events on a
GPU host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rltrace
from rltrace.testing import capture_spans


class _StandInEvent:
    """Stands in for ``torch.cuda.Event`` (its ``query``, ``synchronize`` and ``elapsed_time``)
    where no CUDA device runs."""

    def __init__(self, t_ms: float, done: bool = True) -> None:
        self.t_ms, self.done, self.synchronized = t_ms, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = self.synchronized = True

    def elapsed_time(self, end: _StandInEvent) -> float:
        return end.t_ms - self.t_ms


def _held_scope(name: str) -> Any:
    from rltrace.recording.recorder import Scope

    scope = Scope(name)
    scope.begin_detached()
    scope.extras().setdefault("attrs", {})  # as DeviceScope's entry leaves it
    return scope


def test_held_spans_are_the_runtimes_resolved_when_done_dropped_past_the_bound_waited_for_at_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rltrace import device
    from rltrace.recording.recorder import STATE, now_ns

    held = rltrace.runtime.RUNTIME.state.held_events
    assert held is STATE.held_events and isinstance(held, device.HeldEvents)
    with capture_spans(tmp_path / "before"):  # an earlier pipeline's counts are its own
        held.hold(_held_scope("earlier"), _StandInEvent(0.0), _StandInEvent(1.0), now_ns(), None)
        rltrace.flush()
        assert rltrace.diagnostics()["device_events"]["resolved"] == 1
    pooled = len(held.pools.get(0, []))
    with capture_spans(tmp_path) as cap:
        late0, late1 = _StandInEvent(0.0), _StandInEvent(7.5, done=False)
        held.hold(_held_scope("late"), late0, late1, now_ns(), None)
        held.hold(_held_scope("ready"), _StandInEvent(1.0), _StandInEvent(3.5), now_ns(), None)
        assert [s.name for s in cap.spans()] == ["ready"]  # the cycle resolved what completed
        assert cap.one("ready").attributes["rl.device.time_s"] == pytest.approx(0.0025)
        assert rltrace.diagnostics()["device_events"] == {"resolved": 1, "unresolved": 0, "pending": 1}
        assert len(held.pools[0]) == pooled + 2  # the completed pair went back to the pool
        late1.done = True
        assert cap.one("late").attributes["rl.device.time_s"] == pytest.approx(0.0075)
        monkeypatch.setattr(held, "max_pending", 1)
        waited = _StandInEvent(9.0, done=False)
        held.hold(_held_scope("waited"), _StandInEvent(4.0), waited, now_ns(), None)
        held.hold(_held_scope("over"), _StandInEvent(0.0), _StandInEvent(1.0), now_ns(), None)
        over = cap.one("over")  # exported at once, unresolved, and counted
        assert over.attributes["rl.device.timing"] == "dropped (too many outstanding events)"
        assert "rl.device.time_s" not in over.attributes
        assert rltrace.diagnostics()["device_events"] == {"resolved": 2, "unresolved": 1, "pending": 1}
        rltrace.shutdown()  # the close waits for the events still outstanding
        assert waited.synchronized and len(held) == 0
        assert cap.exporter.get_finished_spans()[-1].attributes["rl.device.time_s"] == pytest.approx(0.005)


FORK = """
import os, sys
import rltrace
from rltrace.recording.recorder import STATE, Scope, now_ns

class Event:  # a stand-in for torch.cuda.Event (no CUDA here)
    def __init__(self, done): self.done = done
    def query(self): return self.done
    def synchronize(self): self.done = True
    def elapsed_time(self, end): return 1.0

rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False)
scope = Scope("parent.only")
scope.begin_detached()
scope.extras().setdefault("attrs", {})
held = STATE.held_events
held.hold(scope, Event(True), Event(False), now_ns(), None)
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the child: report what it holds, then leave without exit hooks
    os.write(write, str(len(held)).encode())
    os._exit(0)
os.close(write)
child = os.read(read, 16).decode()
assert os.waitpid(pid, 0)[1] == 0
print(child, len(held))
held.pending[0][2].done = True
rltrace.shutdown()
"""


def test_a_forked_child_holds_none_of_its_parents_spans(tmp_path: Path) -> None:
    """Its parent's events belong to the parent's CUDA context; the parent exports them.  Run
    in a fresh interpreter: no other library's threads are forked with it."""
    proc = subprocess.run([sys.executable, "-c", FORK, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1"]  # none in the child; the parent still holds its own
