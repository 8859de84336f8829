"""Timings from spans: every finished rltrace scope becomes part of a ``timeperf/<name>`` stat.

:class:`SpanTimings` is a record processor (:func:`rltrace.add_record_processor`): on rltrace's
exporter thread it adds each scope's duration to a per-step, per-name sum, the step being the
one of the enclosing ``rltrace.step(n)`` (:func:`rltrace.steps.step_of`).  Session phases are
summed per step under ``timeperf/session/<phase>`` (and whole sessions under
``timeperf/session/total``); task spans and instants are skipped.

At every export of the default tracker the bridge flushes the pipeline (so every scope that
has finished is counted) and moves its sums into the tracker as scalars: one value per step and
name, so ``timeperf/<name>`` is that step's total time, the mean over steps when one export
covers several, and the mean over ranks after a distributed export (weighted by ``__count``).
A user instruments once and gets both the Perfetto timeline and the W&B curves.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rltrace import runtime
from rltrace.recording.recorder import Scope
from rltrace.semconv import ATTR_PHASE, ATTR_SESSION, ATTR_STEP, SESSION_SPAN, TASK_SPAN
from rltrace.stats.tracker import TIMEPERF, StatsTracker, default_tracker
from rltrace.steps import step_of

__all__ = ["SpanTimings", "disable_span_timings", "enable_span_timings", "span_timings"]

logger = logging.getLogger("rltrace.stats")

_UNSET = object()


class SpanTimings:
    """Per-step sums of span durations, drained into a tracker as ``timeperf/<name>`` scalars.

    ``exclude``: span names never counted.  ``sessions``: count session phases as
    ``timeperf/session/<phase>``.  ``max_steps`` bounds the steps held between two drains (the
    oldest are dropped first, with one warning) so a process that never exports stays flat.
    """

    def __init__(self, *, prefix: str = TIMEPERF, sessions: bool = True,
                 exclude: tuple[str, ...] | list[str] = (), max_steps: int = 4096) -> None:
        self.prefix = prefix.strip("/")
        self.sessions = sessions
        self.exclude = frozenset(exclude)
        self.max_steps = max_steps
        self.dropped_steps = 0
        # written only by the exporter thread, one cycle at a time; drain() swaps it out
        self._sums: dict[int | None, dict[str, int]] = {}
        self._cached_parent: object = None
        self._cached_step: int | None = None

    # -- record processor ---------------------------------------------------------------------
    def on_record(self, rec: object) -> None:
        """Add one finished scope (called on rltrace's exporter thread, one cycle at a time)."""
        if not isinstance(rec, Scope):
            return
        name = rec.name
        extra = rec.extra
        step: Any = _UNSET
        if extra is not None or rec.slot_attrs:
            if extra is not None and extra.get("instant"):
                return
            attrs = rec.record_attrs()
            if attrs:
                if ATTR_SESSION in attrs or name == TASK_SPAN:
                    if not self.sessions or name == TASK_SPAN:
                        return
                    phase = attrs.get(ATTR_PHASE)
                    if phase is not None:
                        name = f"session/{phase}"
                    elif name == SESSION_SPAN:
                        name = "session/total"
                    else:
                        return
                step = attrs.get(ATTR_STEP, _UNSET)
        if name in self.exclude:
            return
        if step is _UNSET:
            # siblings share a parent: look its step up once (the walk is the costly part)
            parent = rec.parent
            if parent is self._cached_parent:
                step = self._cached_step
            else:
                step = step_of(parent) if isinstance(parent, Scope) else None
                self._cached_parent, self._cached_step = parent, step
        all_sums = self._sums
        sums = all_sums.get(step)
        if sums is None:
            if len(all_sums) >= self.max_steps:
                self._drop_oldest()
            sums = all_sums[step] = {}
        sums[name] = sums.get(name, 0) + rec.end_ns - rec.start_ns

    def _drop_oldest(self) -> None:
        oldest = next(iter(self._sums))
        del self._sums[oldest]
        self.dropped_steps += 1
        if self.dropped_steps == 1:
            logger.warning(
                "rltrace.stats: span timings of more than %d steps are waiting for an export; the "
                "oldest are dropped (call stats.export() every step, or disable_span_timings())",
                self.max_steps,
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        return None

    # -- reading --------------------------------------------------------------------------------
    def pending(self) -> dict[int | None, dict[str, float]]:
        """Seconds per step and span name not yet drained (a snapshot, without draining)."""
        return {s: {n: ns / 1e9 for n, ns in dict(d).items()} for s, d in dict(self._sums).items()}

    def drain(self) -> dict[int | None, dict[str, float]]:
        """Take the sums (seconds per step and name) of every scope finished so far.

        Flushes the pipeline first (every finished scope is counted), swaps the sums out, and
        flushes again: that second flush waits for an exporter cycle that may still be adding
        to the old sums, so every scope is counted exactly once, in this drain or the next.
        """
        p = runtime.get_pipeline()
        if p is not None:
            p.flush(everything=False)
        sums, self._sums = self._sums, {}
        if p is not None:
            p.flush(everything=False)
        return {s: {n: ns / 1e9 for n, ns in d.items()} for s, d in sums.items()}

    def drain_into(self, tracker: StatsTracker) -> None:
        """Record the drained sums in ``tracker``: one ``timeperf/<name>`` scalar per step."""
        for _step, sums in self.drain().items():
            for name, seconds in sums.items():
                tracker.add_scalar_absolute(f"{self.prefix}/{name}", seconds)

    def reset_after_fork(self) -> None:
        """In a forked child (the runtime calls it on record processors that have it)."""
        self._sums = {}  # the parent exports what it measured; never twice


class _Installed:
    """The installed bridge and the tracker it feeds, held by the runtime
    (``RUNTIME.part(_Installed)``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bridge: SpanTimings | None = None
        self.hooked: StatsTracker | None = None

    def hook(self, tracker: StatsTracker) -> None:
        """Before ``tracker`` exports: record the span timings drained since the last export."""
        b = self.bridge
        if b is not None:
            b.drain_into(tracker)

    def disable_locked(self) -> None:
        """Remove the bridge from the pipeline and its hook from its tracker (lock held)."""
        if self.bridge is not None:
            runtime.remove_record_processor(self.bridge)
        hooked = self.hooked
        if hooked is not None and self.hook in hooked.before_export:
            hooked.before_export.remove(self.hook)
        self.bridge = self.hooked = None

    def after_fork_in_child(self) -> None:
        """Another thread may have held the lock at fork time."""
        self.lock = threading.Lock()


def enable_span_timings(tracker: StatsTracker | None = None, **options: Any) -> SpanTimings:
    """Turn span durations into ``timeperf/<name>`` stats of ``tracker`` (the default one).

    A :class:`~rltrace.stats.StatsLogger` turns it on when it is created (unless it is on
    already); call it yourself to feed another tracker or to change ``options`` (see
    :class:`SpanTimings`).  Returns the installed bridge.
    """
    target = tracker if tracker is not None else default_tracker()
    installed = runtime.RUNTIME.part(_Installed)
    with installed.lock:
        installed.disable_locked()
        bridge = SpanTimings(**options)
        runtime.add_record_processor(bridge)
        target.before_export.append(installed.hook)
        installed.bridge, installed.hooked = bridge, target
        return bridge


def disable_span_timings() -> None:
    """Stop deriving ``timeperf/`` stats from spans (spans are unaffected)."""
    installed = runtime.RUNTIME.part(_Installed)
    with installed.lock:
        installed.disable_locked()


def span_timings() -> SpanTimings | None:
    """The installed bridge, if any."""
    return runtime.RUNTIME.part(_Installed).bridge
