"""Device-aware timing for PyTorch (CUDA) and JAX: sync, CUDA events, profiler annotations.

GPU and TPU work is asynchronous: a scope that ends when the host returns measures dispatch,
not compute.  Options on ``trace_scope`` / ``atrace_scope`` / ``trace_perf`` / session phases:

* ``device_sync=True`` (or ``"torch"`` / ``"jax"``) waits for the device at entry (before the
  span starts, so earlier queued work is not counted) and at exit (before it ends, so its own
  work is): ``torch.cuda.synchronize()`` when CUDA is initialised; for JAX, once it has
  initialised a backend, ``jax.block_until_ready`` on the decorated function's outputs, else on
  a trivial op queued on every local device (JAX dispatches asynchronously on every backend, the
  CPU included; the cost does not grow with the number of live arrays).  With neither framework
  busy it is a no-op, and it never initialises one (a jax imported but unused under a torch job
  keeps its GPU memory unclaimed).  The span gets ``rl.device.sync`` (what was used) and
  ``rl.device.sync_wait_s`` (time spent waiting, entry + exit), so the cost of syncing shows.
* ``device_timing="events"`` records CUDA events at start/end on the current stream without
  stalling the host; the exporter thread resolves them later and sets ``rl.device.time_s``
  (bounded number outstanding; unresolved ones at shutdown are synchronised or counted).
* ``annotate=True`` also emits the span as an NVTX range (Nsight Systems) and as a
  ``jax.profiler.TraceAnnotation`` (XLA/TensorBoard profiler traces).

Config-wide defaults per category: ``device: {sync_categories: [comm], timing_categories:
[compute], annotate: false}``.  torch and jax are imported lazily: processes without them work,
and asking for a framework that is missing raises a clear error.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import Protocol

from rltrace.config import DeviceDefaults
from rltrace.process.frameworks import jax_in_use, torch_cuda
from rltrace.recording import recorder
from rltrace.recording.recorder import STATE, Scope, attach, detach, internal_error, push

__all__ = ["DeviceDefaults", "DeviceScope", "HeldEvents", "device_sync", "require"]

ATTR_SYNC = "rl.device.sync"
ATTR_SYNC_WAIT = "rl.device.sync_wait_s"
ATTR_DEVICE_TIME = "rl.device.time_s"
ATTR_TIMING = "rl.device.timing"

#: ``device_sync``'s modes: every framework in use (True), one of them by name (``"torch"``,
#: ``"jax"``), or none (False, None)
SyncMode = bool | str | None


class CudaEvent(Protocol):
    """What rltrace uses of a ``torch.cuda.Event`` (timing enabled)."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: CudaEvent) -> float: ...


#: at most this many spans wait for their CUDA events at once, by default (more are exported
#: unresolved); :attr:`HeldEvents.max_pending` is the one in force
MAX_PENDING = 4096
#: completed events kept per device for reuse
EVENT_POOL_MAX = 2 * MAX_PENDING


def sync_needed(mode: object) -> bool:
    """Whether ``device_sync(mode)`` could have anything to wait for (cheap check)."""
    if mode is True:
        return jax_in_use() is not None or torch_cuda() is not None
    return bool(mode)


def require(framework: str) -> ModuleType:
    try:
        return __import__(framework)
    except ImportError:
        raise ImportError(
            f"rltrace: device option asks for {framework!r}, which is not installed; "
            f"pip install 'rltrace[{framework}]' or use device_sync=True (auto)"
        ) from None


def device_sync(mode: SyncMode = True, outputs: object = None) -> tuple[str, int]:
    """Wait for outstanding device work; returns (what was synchronised, wait in ns).

    ``mode``: True = every framework in use; ``"torch"`` / ``"jax"`` = that one (an error if
    it is not installed).  ``outputs``: arrays (any pytree) to wait on instead of every live
    JAX array.
    """
    t0 = recorder.STATE.now_ns()
    used = []
    if mode in (True, "torch"):
        torch = torch_cuda() if mode is True else require("torch")
        if torch is not None and (mode is True or torch.cuda.is_available()):
            torch.cuda.synchronize()
            used.append("torch.cuda")
    if mode in (True, "jax"):
        jax = jax_in_use() if mode is True else require("jax")
        if jax is not None:
            if outputs is not None:
                jax.block_until_ready(outputs)
            else:
                _held().jax_fence.wait(jax)
            used.append("jax")
    return ("+".join(used) or "none"), recorder.STATE.now_ns() - t0


class JaxFence:
    """Waits for the work queued on every local JAX device (GPU, TPU cores, CPU).

    A trivial jitted op is dispatched on each device and blocked on: a device runs what was
    queued on it in order, so it completes after everything before it.  The cost does not
    depend on how many arrays are alive (waiting on ``jax.live_arrays()`` grows with them);
    the op is compiled once, and its input committed once per device, on first use (kept here,
    by the runtime's :class:`HeldEvents`).
    """

    __slots__ = ("inputs", "op")

    def __init__(self) -> None:
        self.op: Callable[[object], object] | None = None
        #: per local device, a committed scalar to run the fence op on
        self.inputs: dict[object, object] = {}

    def wait(self, jax: ModuleType) -> None:
        op = self.op
        if op is None:
            op = self.op = jax.jit(lambda v: v + 1)
        outs = []
        for dev in jax.local_devices():
            x = self.inputs.get(dev)
            if x is None:
                import numpy as np

                x = self.inputs[dev] = jax.device_put(np.zeros((), np.int32), dev)
            outs.append(op(x))
        jax.block_until_ready(outs)


def _jax_fence(jax: ModuleType) -> None:
    """Wait for the work queued on every local JAX device, with the runtime's fence."""
    _held().jax_fence.wait(jax)


def _held() -> HeldEvents:
    """The runtime's :class:`HeldEvents` (made with the runtime, before any scope runs)."""
    held: HeldEvents | None = STATE.held_events
    if held is None:
        raise RuntimeError("rltrace: the runtime's device state is not set up")
    return held


class _Annotation:
    """NVTX range + JAX TraceAnnotation for one span (whichever frameworks are present)."""

    __slots__ = ("jax_ann", "nvtx")

    def __init__(self, name: str) -> None:
        self.nvtx = None
        self.jax_ann = None
        torch = torch_cuda()
        if torch is not None:
            try:
                torch.cuda.nvtx.range_push(name)
                self.nvtx = torch
            except Exception as exc:
                internal_error("nvtx range", exc)
        jax = sys.modules.get("jax")
        if jax is not None:
            try:
                self.jax_ann = jax.profiler.TraceAnnotation(name)
                self.jax_ann.__enter__()
            except Exception as exc:
                internal_error("jax annotation", exc)
                self.jax_ann = None

    def close(self) -> None:
        if self.jax_ann is not None:
            self.jax_ann.__exit__(None, None, None)
        if self.nvtx is not None:
            self.nvtx.cuda.nvtx.range_pop()


class DeviceScope:
    """A scope with device options; entering yields the span (an rltrace ``Scope``)."""

    __slots__ = ("_ann", "_ev", "_token", "_wait", "annotate", "outputs", "scope", "sync",
                 "timing")

    def __init__(self, scope: Scope, sync: SyncMode = None, timing: str | None = None,
                 annotate: bool = False) -> None:
        if timing not in (None, "events"):
            raise ValueError(f"rltrace: device_timing must be None or 'events', got {timing!r}")
        if sync not in (None, False, True, "torch", "jax"):
            raise ValueError(f"rltrace: device_sync must be True, False, 'torch' or 'jax', got {sync!r}")
        self.scope = scope
        self.sync = sync
        self.timing = timing
        self.annotate = annotate
        self.outputs: object = None
        self._ann: _Annotation | None = None
        self._ev: CudaEvent | None = None
        self._wait = 0
        self._token: object = None

    def __enter__(self) -> Scope:
        kind = None
        if self.sync:
            kind, self._wait = device_sync(self.sync)
        if self.annotate:
            self._ann = _Annotation(self.scope.name)
        scope = self.scope
        scope.begin_detached(share_lane=True)
        self._token = attach(scope)
        attrs = scope.extras().setdefault("attrs", {})
        if kind is not None:
            attrs[ATTR_SYNC] = kind
        if self.timing == "events":
            torch = torch_cuda()
            if torch is not None:
                ev = _held().event(torch)
                ev.record()
                self._ev = ev
            else:
                attrs[ATTR_TIMING] = "unavailable (no CUDA device in use)"
        return scope

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        scope = self.scope
        end_ev = None
        try:
            torch = torch_cuda() if self._ev is not None else None
            if torch is not None:
                end_ev = _held().event(torch)
                end_ev.record()
            if self.sync:
                kind, wait = device_sync(self.sync, self.outputs)
                attrs = scope.extra["attrs"]  # type: ignore[index]
                attrs[ATTR_SYNC] = kind
                attrs[ATTR_SYNC_WAIT] = (self._wait + wait) / 1e9
        except Exception as err:
            internal_error("device sync", err)
        end = recorder.STATE.now_ns()
        detach(self._token)
        if self._ann is not None:
            self._ann.close()
        if end_ev is not None and self._ev is not None:
            _held().hold(scope, self._ev, end_ev, end, exc)
        else:
            scope.finish(end, exc)

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


class HeldEvents:
    """Spans held for their CUDA events (``device_timing="events"``), and the events to reuse.

    Owned by the runtime (its recorder state's ``held_events``), with the device room's other
    process state (the :class:`JaxFence` ``device_sync`` waits with): a scope in events mode is
    closed at once but held here until its end event has completed; the exporter's cycle
    resolves what completed (``rl.device.time_s``) and queues it, and a pipeline's close waits
    for the rest.  Completed events go back to a pool per device (creating an event pair per
    scope cost ~60 µs on an H100 host; a recycled one costs a list pop).
    """

    __slots__ = ("jax_fence", "lock", "max_pending", "pending", "pools", "resolved", "unresolved")

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        #: at most this many spans wait for their events at once (more are exported unresolved)
        self.max_pending = max_pending
        #: (scope, start event, end event) awaiting resolution, oldest first
        self.pending: deque[tuple[Scope, CudaEvent, CudaEvent]] = deque()
        self.lock = threading.RLock()  # reentrant: a SIGTERM drain may interrupt a holder
        self.pools: dict[int, list[CudaEvent]] = {}
        self.resolved = 0
        self.unresolved = 0
        self.jax_fence = JaxFence()

    def __len__(self) -> int:
        return len(self.pending)

    def stats(self) -> dict[str, int]:
        """The counts since the pipeline was configured, and how many are held now."""
        return {"resolved": self.resolved, "unresolved": self.unresolved, "pending": len(self.pending)}

    def reset_counts(self) -> None:
        """Counts are per pipeline, as the others in ``diagnostics()`` are."""
        self.resolved = self.unresolved = 0

    def event(self, torch: ModuleType) -> CudaEvent:
        """A timing-enabled CUDA event for the current device, from the pool when one is free."""
        pool = self.pools.get(torch.cuda.current_device())
        if pool:
            try:
                return pool.pop()
            except IndexError:  # emptied by another thread meanwhile
                pass
        event: CudaEvent = torch.cuda.Event(enable_timing=True)
        return event

    def _recycle(self, *events: CudaEvent) -> None:
        """Return completed events to their device's pool (bounded; extras are let go)."""
        for ev in events:
            device = getattr(getattr(ev, "device", None), "index", None)
            pool = self.pools.setdefault(device if device is not None else 0, [])
            if len(pool) < EVENT_POOL_MAX:
                pool.append(ev)

    def hold(self, scope: Scope, start_ev: CudaEvent, end_ev: CudaEvent, end: int,
             exc: BaseException | None) -> None:
        """Close the span now but export it once its CUDA events have completed."""
        scope.finish(end, exc, hold=True)
        with self.lock:
            if len(self.pending) >= self.max_pending:
                self.unresolved += 1
                scope.extra["attrs"][ATTR_TIMING] = "dropped (too many outstanding events)"  # type: ignore[index]
                push(scope)
                return
            self.pending.append((scope, start_ev, end_ev))

    def resolve(self, wait: bool = False) -> int:
        """Export held spans whose CUDA events completed (all of them, synchronising, if
        ``wait``); returns how many.  Called by the exporter's cycle, and with ``wait=True``
        when a pipeline closes."""
        done = 0
        with self.lock:
            items = list(self.pending)
            self.pending.clear()
        keep = []
        for scope, ev0, ev1 in items:
            try:
                if wait:
                    ev1.synchronize()
                if wait or ev1.query():
                    scope.extra["attrs"][ATTR_DEVICE_TIME] = ev0.elapsed_time(ev1) / 1000.0  # type: ignore[index]
                    self.resolved += 1
                    push(scope)
                    self._recycle(ev0, ev1)  # both completed: safe to record again
                    done += 1
                else:
                    keep.append((scope, ev0, ev1))
            except Exception as exc:
                self.unresolved += 1
                scope.extra["attrs"][ATTR_TIMING] = f"unresolved: {exc!r}"  # type: ignore[index]
                push(scope)
        if keep:
            with self.lock:
                self.pending.extendleft(reversed(keep))
        return done

    def after_fork_in_child(self) -> None:
        """A forked child starts with none held: the events are the parent's CUDA context's
        (unusable in the child) and the parent exports its own spans."""
        self.pending = deque()
        self.lock = threading.RLock()
        self.pools = {}
