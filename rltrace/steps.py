"""Training steps: ``with rltrace.step(n): ...`` scopes one step and tags what runs inside.

The step scope is an ordinary span (default name ``train.step``) with ``rl.step = n``.  Spans
nested inside carry ``rl.step`` in OTel (looked up through their parents when they are
exported, so the hot path pays nothing), and tasks/sessions registered inside carry it in
their spans and session records, which is what per-step analyses group by.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span

from rltrace.recording.recorder import (
    NOOP,
    STATE,
    RecordBase,
    Scope,
    TracedScope,
    context_value,
    current_span,
)
from rltrace.semconv import ATTR_POLICY_VERSION, ATTR_STEP

__all__ = ["current_step", "policy_version", "scope_arg_step", "set_policy_version", "step", "step_of"]

_STEP_CV: ContextVar[int | None] = ContextVar("rltrace_step", default=None)
#: the OTel context key under which a remote caller's step arrives (``rltrace.ray``: Ray's trace
#: propagation carries it beside ``traceparent``)
CALLER_STEP_KEY = otel_context.create_key("rltrace-caller-step")
_MAX_DEPTH = 64


class _StepContext:
    """Sets the current step and (when span tracing is on) enters the step's scope."""

    __slots__ = ("_token", "n", "scope")

    def __init__(self, n: int, scope: Scope | None) -> None:
        self.n = n
        self.scope = scope

    def __enter__(self) -> Span:
        self._token = _STEP_CV.set(self.n)
        return self.scope.__enter__() if self.scope is not None else NOOP

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.scope is not None:
            self.scope.__exit__(exc_type, exc, tb)
        _STEP_CV.reset(self._token)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


def step(n: int, name: str = "train.step", category: object = "compute",
         args: Mapping[str, object] | None = None) -> TracedScope:
    """Scope training step ``n``: ``with rltrace.step(global_step): rollout(); train()``.

    Usable with ``with`` and ``async with``; yields the step's span (a no-op span when span
    tracing is off, in which case only the current step is set, for session records).
    """
    if type(n) is not int:
        raise TypeError(f"rltrace.step: the step must be an int, got {type(n).__name__} {n!r}")
    scope = None
    if STATE.enabled:
        scope = Scope(name, category, dict(args) if args else None)
        attrs: dict[str, object] = {ATTR_STEP: n}
        if STATE.policy_version is not None:
            attrs[ATTR_POLICY_VERSION] = STATE.policy_version
        scope.extra = {"attrs": attrs}
        STATE.stepped = True
    return _StepContext(n, scope)


def set_policy_version(version: int | None) -> None:
    """The policy (weights) version this process now generates and trains with: call it when
    the weights change (after a weight sync or an optimizer step).  Sessions registered from now
    on record it as the version that generated them (``policy_version`` in their records), and
    ``rltrace.step(n)`` scopes as the version that trained (``rl.policy.version``); the report
    turns the two into each trained sample's version lag.  None: no version.

    A process that sets none and runs AReaL's trainer gets AReaL's own version instead (see
    :func:`rltrace.perf_tracer.trace_scope`); once this is called, its version is the one used."""
    if version is not None and (type(version) is not int or version < 0):
        raise TypeError(f"rltrace.set_policy_version: the version must be an int >= 0 (or None), "
                        f"got {type(version).__name__} {version!r}")
    STATE.policy_version = version
    STATE.policy_version_set = version is not None


def policy_version() -> int | None:
    """The version :func:`set_policy_version` last set (None: none)."""
    return STATE.policy_version


def current_step() -> int | None:
    """The step of the innermost ``rltrace.step`` scope in this context, if any."""
    return _STEP_CV.get()


def step_of(rec: Scope) -> int | None:
    """The step a record belongs to: its own ``rl.step`` or its nearest ancestor's."""
    node: Any = rec
    for _ in range(_MAX_DEPTH):
        if node is None:
            return None
        if not isinstance(node, RecordBase):  # another instrumentation's span (Ray's remote call)
            attrs = getattr(node, "attributes", None)
            step = attrs.get(ATTR_STEP) if attrs is not None else None
            return step if type(step) is int else None
        own: int | None = node.own_step()
        if own is not None:
            return own
        node = node.parent
    return None


def enclosing_scope_args() -> Iterator[dict[str, Any]]:
    """The ``args`` of the open rltrace scopes in this context, innermost first."""
    node: Any = current_span()
    for _ in range(_MAX_DEPTH):
        if not isinstance(node, RecordBase):
            return
        args = node.args
        if type(args) is dict:
            yield args
        node = getattr(node, "parent", None)


def scope_arg_step() -> int | None:
    """The step AReaL-style code marks in a scope's args, for tasks/sessions without ``rltrace.step``.

    AReaL's guide never calls ``rltrace.step``: it writes ``trace_scope("train.rollout",
    args={"global_step": n, "epoch_step": i})``.  Returns the nearest enclosing scope's
    ``global_step`` (else the nearest ``epoch_step``), or None.  Costs one context lookup when
    no scope is open (e.g. a rollout executor thread, where the report assigns the step from the
    trace instead).
    """
    node: Any = current_span()
    if node is None:  # no scope open (a rollout thread): only a remote caller's step
        v = context_value(CALLER_STEP_KEY)
        return v if type(v) is int else None
    epoch = None
    for _ in range(_MAX_DEPTH):  # enclosing_scope_args(), inline: tasks and sessions ask
        if not isinstance(node, RecordBase):
            break
        args = node.args
        if type(args) is dict:
            v = args.get("global_step")
            if type(v) is int:
                return v
            v = args.get("epoch_step")
            if epoch is None and type(v) is int:
                epoch = v
        node = getattr(node, "parent", None)
    if epoch is None:  # in a remote call (rltrace.ray): the caller's step
        v = context_value(CALLER_STEP_KEY)
        if type(v) is int:
            return v
    return epoch
