"""Sampling: which traces rltrace sends over OpenTelemetry (OTLP and your span processors).

The local outputs never sample: the Chrome trace file, the session records and the session
metrics see every span and session, whatever the mode.  What is sampled is what leaves the
process through OTel, where volume costs money.

Head sampling (modes ``parent``, ``ratio``, ``always_off``, or a ``Sampler`` passed to
``configure(sampler=...)``; ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` when no mode
is configured) is decided **once per trace**, when the root's ids are drawn: the root asks the
sampler (trace id, name, and the parent context when the root continues a foreign or remote
span), and every rltrace span under it inherits the root's flags, so a task's sessions and
phases are kept or dropped whole.  The decision is the span context's ``sampled`` flag, so it
also travels to inference servers in ``traceparent``.  An rltrace span under a foreign span
asks the sampler with that parent (``ParentBased`` samplers follow its flag).  With no
sampler configured rltrace does what the SDK's default (``parentbased_always_on``) does, at no
cost: roots are sampled, and a foreign parent's flag is followed.

Session-aware sampling (mode ``sessions``) keeps whole **task** traces for OTLP: a ``ratio`` of
tasks chosen by trace id, plus every task with a session whose status is in
``keep_statuses`` (failed, rejected) or that took at least ``slow_s``, decided when the task
ends (its last session finalized).  The task's spans are held until then (at most
``max_held``; past that the oldest task is decided early on what is known).  Traces that are
not a task's (train steps, weight syncs) are all sent.

A task whose sessions run in other processes (``rltrace.ray``: an actor's sessions join the
driver's task) is decided by each process for its own part, as no process sees the others'
sessions: the ratio part by the task's trace id, the same everywhere, so a task kept by ratio
is whole in every process; an actor's sessions of the task are held until the last of them
there is finalized, then kept if the task is in the ratio or one of them is of a kept status
or slow.  The driver sends the task's span even when it drops the task (one span), so what an
actor keeps is never an orphan in the backend.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, TraceFlags

from rltrace.config import SAMPLING_MODES, ConfigError, SamplingConfig
from rltrace.pipeline.processors import RecordSinkProcessor
from rltrace.recording.recorder import _SAMPLED as SAMPLED
from rltrace.recording.recorder import _UNSAMPLED as UNSAMPLED
from rltrace.recording.recorder import RecordBase, Scope

logger = logging.getLogger("rltrace")
MODES = SAMPLING_MODES
#: the decision that keeps a trace (``Decision.is_sampled`` is untyped)
_SAMPLED_DECISIONS = frozenset({Decision.RECORD_AND_SAMPLE})
_ENV_SAMPLERS: Mapping[str, Callable[[float], Sampler]] = MappingProxyType({
    "always_on": lambda arg: ALWAYS_ON,
    "always_off": lambda arg: ALWAYS_OFF,
    "traceidratio": lambda arg: TraceIdRatioBased(arg),
    "parentbased_always_on": lambda arg: ParentBased(ALWAYS_ON),
    "parentbased_always_off": lambda arg: ParentBased(ALWAYS_OFF),
    "parentbased_traceidratio": lambda arg: ParentBased(TraceIdRatioBased(arg)),
})


def _ratio(value: float | None, where: str) -> float:
    """The configured ratio, else ``OTEL_TRACES_SAMPLER_ARG``, else 1.0.

    A bad variable is warned about and ignored, as the OTel SDK does (it is the environment's,
    read by other OTel components too); a bad config value was refused by the config loader.
    """
    if value is None:
        raw = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        if not raw:
            return 1.0
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            logger.warning("rltrace: OTEL_TRACES_SAMPLER_ARG=%r is not a number in [0, 1]; "
                           "using 1.0 (set sampling.ratio to choose)", raw)
            return 1.0
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"rltrace: {where} must be in [0, 1], got {value!r}")
    return float(value)


def head_sampler(cfg: SamplingConfig, user: Sampler | None) -> Sampler | None:
    """The sampler rltrace's roots ask, or None for the default (parent-based, always on).

    ``user`` (``configure(sampler=...)``) wins; then ``sampling.mode``; then
    ``OTEL_TRACES_SAMPLER``.  Mode ``sessions`` samples at the tail, so its head is the default.
    """
    if user is not None:
        if not isinstance(user, Sampler):
            raise TypeError(f"rltrace.configure: sampler must be an opentelemetry.sdk.trace."
                            f"sampling.Sampler, got {type(user).__name__}")
        return user
    mode = cfg.mode
    if mode is None:
        name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        if not name or name == "parentbased_always_on":
            return None
        if name not in _ENV_SAMPLERS:  # as the SDK does: warn, keep the default
            logger.warning("rltrace: OTEL_TRACES_SAMPLER=%r is not one rltrace knows (%s); "
                           "using parentbased_always_on (set sampling.mode to choose)",
                           name, ", ".join(sorted(_ENV_SAMPLERS)))
            return None
        return _ENV_SAMPLERS[name](_ratio(None, "OTEL_TRACES_SAMPLER_ARG"))
    if mode == "parent" or mode == "sessions":
        return None
    if mode == "ratio":
        return ParentBased(TraceIdRatioBased(_ratio(cfg.ratio, "sampling.ratio")))
    return ParentBased(ALWAYS_OFF)  # "always_off" (validated by the config loader)


class HeadSampling:
    """Decides the flags of trace roots (and of rltrace spans under foreign parents).

    Installed on the recorder state while a pipeline is configured; counts its decisions.
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.sampled = 0
        self.unsampled = 0

    def flags(self, rec: Scope, trace_id: int, parent: trace.Span | None) -> TraceFlags:
        """The flags of ``rec``'s new context: a root (``parent`` None) or under a foreign span.

        A root's sampler is given an empty context, not None: with None, OTel's samplers read
        the current context, where ``rec`` itself may be the current span (its ids are drawn
        when a child or a processor first asks, inside its ``with``), so ``ParentBased`` would
        ask ``rec`` for the context being decided."""
        ctx = Context() if parent is None else trace.set_span_in_context(
            trace.NonRecordingSpan(parent.get_span_context()))
        try:
            result = self.sampler.should_sample(ctx, trace_id, rec.name, SpanKind.INTERNAL)
            keep = result.decision in _SAMPLED_DECISIONS
        except Exception:  # a user's sampler must not take tracing down: keep the trace
            keep = True
        if keep:
            self.sampled += 1
            return SAMPLED
        self.unsampled += 1
        return UNSAMPLED

    def stats(self) -> dict[str, object]:
        return {"sampler": self.sampler.get_description(), "traces_sampled": self.sampled,
                "traces_unsampled": self.unsampled}


def _root(rec: Scope) -> Scope:
    node = rec
    for _ in range(256):
        parent = getattr(node, "parent", None)
        if not isinstance(parent, RecordBase):
            return node
        node = parent
    return node


class TaskTailSampler(RecordSinkProcessor):
    """In front of the OTLP processor: holds each task trace until its task ends, then sends it
    whole or drops it (mode ``sessions``; see the module docstring)."""

    def __init__(self, target: RecordSinkProcessor, cfg: SamplingConfig) -> None:
        from rltrace.sessions import RemoteTaskScope, SessionScope, TaskScope

        self.target = target
        self._task_cls, self._session_cls = TaskScope, SessionScope
        self._remote_cls = RemoteTaskScope
        self.ratio = _ratio(cfg.ratio, "sampling.ratio")
        self._by_id = TraceIdRatioBased(self.ratio)
        self.keep_statuses = frozenset(cfg.keep_statuses)
        self.slow_ns = None if cfg.slow_s is None else int(cfg.slow_s * 1e9)
        self.max_held = cfg.max_held
        #: trace id (or, for another process's task, its stand-in record) -> [task record,
        #: spans held]; oldest first
        self._held: OrderedDict[Any, list[Any]] = OrderedDict()
        #: another process's tasks held here -> how many of their sessions arrived
        self._parts: dict[Any, int] = {}
        self._reasons: dict[Any, str] = {}  # held key -> why it is kept (once any is known)
        self._decided: OrderedDict[int, bool] = OrderedDict()  # recently decided traces
        self._n_held = 0
        self._lock = threading.Lock()
        self.kept = {"ratio": 0, "status": 0, "slow": 0}
        self.dropped_tasks = 0
        self.roots_sent = 0  # task spans sent for dropped tasks whose sessions ran elsewhere
        self.spans_kept = 0
        self.spans_dropped = 0
        self.early = 0

    @property
    def takes_records(self) -> bool:
        return self.target.takes_records

    def on_end(self, span: Any) -> None:
        rec = getattr(span, "rltrace_record", span)
        if not isinstance(rec, RecordBase):
            self.target.on_end(span)  # a foreign span: the SDK's sampler decided already
            return
        root = _root(rec)
        if not isinstance(root, self._task_cls):
            self.target.on_end(span)  # not a task's trace
            return
        remote = root.__class__ is self._remote_cls
        # the task's trace: one id for all its spans; another process's task: its part here
        key: Any = root if remote else rec.get_span_context().trace_id
        forward: list[Any] = []
        with self._lock:
            done = root.decision if remote else self._decided.get(key)  # type: ignore[attr-defined]
            if done is not None:  # a straggler of a task decided already
                if done:
                    forward.append(span)
                else:
                    self.spans_dropped += 1
            else:
                held = self._held.get(key)
                if held is None:
                    held = self._held[key] = [root]  # the root first: what a decision reads
                held.append(span)
                self._n_held += 1
                if key not in self._reasons:
                    why = self._interesting(rec)
                    if why:
                        self._reasons[key] = why
                if rec is root:
                    forward = self._decide(key)
                elif remote and isinstance(rec, self._session_cls):
                    self._parts[key] = self._parts.get(key, 0) + 1
                    if self._part_done(key):
                        forward = self._decide(key)
                while self._n_held > self.max_held and self._held:
                    self.early += 1
                    forward += self._decide(next(iter(self._held)))
        for item in forward:
            self.target.on_end(item)

    def _interesting(self, rec: Scope) -> str | None:
        if isinstance(rec, self._session_cls):
            if getattr(rec, "status", None) in self.keep_statuses:
                return "status"
            if self.slow_ns is not None and rec.end_ns - rec.start_ns >= self.slow_ns:
                return "slow"
        return None

    def _part_done(self, key: Any) -> bool:
        """Whether every session of another process's task held as ``key`` has arrived: the
        task's part here ended (its last session here was finalized) and as many sessions
        arrived as were registered under it (holds the lock)."""
        return bool(key.end_ns) and self._parts.get(key, 0) >= key.parts

    def sweep(self) -> None:
        """Decide the parts of other processes' tasks whose last session arrived before the
        part ended (once per export cycle)."""
        if not self._parts:
            return
        forward: list[Any] = []
        with self._lock:
            for key in [k for k in self._parts if self._part_done(k)]:
                forward += self._decide(key)
        for item in forward:
            self.target.on_end(item)

    def _decide(self, key: Any) -> list[Any]:
        """Keep or drop the held task trace ``key`` (holds the lock); returns what to send."""
        root, *items = self._held.pop(key)
        self._n_held -= len(items)
        why = self._reasons.pop(key, None)
        remote = root.__class__ is self._remote_cls
        trace_id = root.get_span_context().trace_id
        if why is None and self._by_id.should_sample(
                None, trace_id, root.name).decision in _SAMPLED_DECISIONS:
            why = "ratio"
        keep = why is not None
        if remote:
            self._parts.pop(key, None)
            root.decision = keep  # its stragglers follow; a later part here is decided anew
        else:
            self._decided[key] = keep
            if len(self._decided) > 65_536:
                self._decided.popitem(last=False)
        if why is not None:
            self.kept[why] += 1
            self.spans_kept += len(items)
            return items
        self.dropped_tasks += 1
        sent: list[Any] = []
        if root.spread:  # its sessions ran elsewhere too: what they keep needs this parent
            sent = [x for x in items if getattr(x, "rltrace_record", x) is root]
            self.roots_sent += len(sent)
            self.spans_kept += len(sent)
        self.spans_dropped += len(items) - len(sent)
        return sent

    def decide_all(self) -> None:
        """Decide every held task now (final flush: tasks still open are decided as they are)."""
        with self._lock:
            forward: list[Any] = []
            for key in list(self._held):
                forward += self._decide(key)
        for item in forward:
            self.target.on_end(item)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.target.force_flush(timeout_millis))

    def shutdown(self) -> None:
        self.decide_all()
        self.target.shutdown()

    def reset_after_fork(self) -> None:
        self._held = OrderedDict()
        self._parts = {}
        self._reasons = {}
        self._n_held = 0
        self._lock = threading.Lock()

    def stats(self) -> dict[str, object]:
        return {"mode": "sessions", "ratio": self.ratio, "tasks_kept": dict(self.kept),
                "tasks_dropped": self.dropped_tasks, "task_spans_sent": self.roots_sent,
                "spans_kept": self.spans_kept,
                "spans_dropped": self.spans_dropped, "spans_held": self._n_held,
                "decided_early": self.early}
