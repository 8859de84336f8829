"""The span API: ``trace_scope``/``atrace_scope``, the ``trace_perf`` decorator, ``instant``.

Names and semantics follow AReaL's ``perf_tracer``; every scope is a real OpenTelemetry span.
When tracing is disabled each call costs one flag check and returns a shared no-op object.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from enum import Enum
from types import TracebackType
from typing import TypeVar, overload

from rltrace.device import DeviceScope, sync_needed
from rltrace.recording import recorder
from rltrace.recording.arguments import check_scope_args
from rltrace.recording.generators import adrive, drive
from rltrace.recording.recorder import NOOP, STATE, Scope, TracedScope, attach, detach, internal_error
from rltrace.recording.user_values import category_name, recorded

__all__ = ["Category", "TracedScope", "atrace_scope", "instant", "trace_perf", "trace_scope"]

F = TypeVar("F", bound=Callable[..., object])
_Y = TypeVar("_Y")
_S = TypeVar("_S")
_R = TypeVar("_R")
#: a scope's ``args``: names to values (copied and converted when recorded, never modified)
Args = Mapping[str, object]


class Category(str, Enum):
    """Event categories (Chrome ``cat``, OTel ``rl.category``).  Any other string passes through."""

    COMPUTE = "compute"
    IO = "io"
    COMM = "comm"
    SYNC = "sync"
    SCHEDULER = "scheduler"
    MISC = "misc"

    def __str__(self) -> str:
        return self.value


def _check_name(name: object, api: str) -> None:
    check_scope_args(api, name, None)


def _device_scope(name: str, category: Category | str | None, args: Args | None,
                  sync: bool | str | None, timing: str | None,
                  annotate: bool | None) -> TracedScope:
    d = STATE.device
    cat = category_name(category) or "misc"  # never the category object's own code
    if sync is None:
        sync = d is not None and cat in d.sync
    if timing is None and d is not None and cat in d.timing:
        timing = "events"
    if annotate is None:
        annotate = d is not None and d.annotate
    scope = Scope(name, category, recorded(args, STATE.kinds) if args else None)
    if not (sync or timing or annotate):
        return scope
    if not (timing or annotate or sync_needed(sync)):
        return scope  # nothing on an accelerator to wait for: a plain scope, cost ~0
    return DeviceScope(scope, sync, timing, annotate)


def trace_scope(
    name: str, category: Category | str | None = None, args: Args | None = None,
    *, device_sync: bool | str | None = None, device_timing: str | None = None,
    annotate: bool | None = None,
) -> TracedScope:
    """Trace a block: ``with trace_scope("train.step", Category.COMPUTE, {"step": 3}): ...``.

    The block becomes an OTel span (kind INTERNAL) named ``name`` with attributes
    ``rl.category`` and ``args.<key>``, and a Chrome ``X`` event.  ``args`` is copied here
    (deeply, bounded), never modified; small arrays/tensors become numbers, an object of a type
    rltrace does not know its ``<module.Class object at 0x...>``: none of the values' own code
    runs (docs/guide/values.md).  An exception leaving the block is recorded on the span (status
    ERROR plus an ``exception`` event) and re-raised unchanged.  The returned object is the
    span itself (``set_attribute``, ``add_event`` work on it).

    Device options (:mod:`rltrace.device`): ``device_sync`` waits for the GPU/TPU at entry and
    exit so the span covers device time; ``device_timing="events"`` measures it with CUDA
    events without stalling; ``annotate`` adds NVTX / JAX profiler annotations.  ``None``
    follows the config's per-category defaults.
    """
    if type(name) is not str or (args is not None and type(args) is not dict):
        check_scope_args("trace_scope", name, args)
    state = STATE
    if not state.enabled:
        return NOOP
    if category is not None and type(category) is not str and type(category) is not Category:
        category = category_name(category)  # its own __hash__/__str__ must not run at export
    if state.device is not None or device_sync or device_timing or annotate:
        return _device_scope(name, category, args, device_sync, device_timing, annotate)
    return Scope(name, category, recorded(args, state.kinds) if args else None)


def atrace_scope(
    name: str, category: Category | str | None = None, args: Args | None = None,
    *, device_sync: bool | str | None = None, device_timing: str | None = None,
    annotate: bool | None = None,
) -> TracedScope:
    """Async form of :func:`trace_scope`: ``async with atrace_scope("rollout"): ...``."""
    if type(name) is not str or (args is not None and type(args) is not dict):
        check_scope_args("atrace_scope", name, args)
    state = STATE
    if not state.enabled:
        return NOOP
    if category is not None and type(category) is not str and type(category) is not Category:
        category = category_name(category)  # its own __hash__/__str__ must not run at export
    if state.device is not None or device_sync or device_timing or annotate:
        return _device_scope(name, category, args, device_sync, device_timing, annotate)
    return Scope(name, category, recorded(args, state.kinds) if args else None)


def instant(
    name: str, category: Category | str | None = None, args: Args | None = None
) -> None:
    """Mark a point in time: a span event on the current span and a Chrome ``i`` event.

    Outside any span the instant is kept as a zero-length span so it is not lost.  ``args``
    is copied; the caller's dict is never modified.
    """
    if type(name) is not str or (args is not None and type(args) is not dict):
        check_scope_args("instant", name, args)
    if not STATE.enabled:
        return
    if category is not None and type(category) is not str and type(category) is not Category:
        category = category_name(category)  # its own __hash__/__str__ must not run at export
    try:
        recorder.record_instant(name, category, recorded(args, STATE.kinds) if args else None)
    except Exception as exc:  # pragma: no cover - defensive
        internal_error("instant", exc)


# ---- decorator -------------------------------------------------------------------------------


class _GeneratorSpan:
    """The span of a traced generator: begun at its first resumption, current only while the
    generator body runs (the consumer's scopes between resumptions are not its children), on a
    lane of its own in the Chrome timeline, ended when the generator is done."""

    __slots__ = ("begun", "scope", "token")

    def __init__(self, name: str, category: Category | str | None) -> None:
        self.scope = Scope(name, category, None)
        self.begun = False
        self.token: object = None

    def around(self) -> _GeneratorSpan:
        return self

    def __enter__(self) -> None:
        if not self.begun:
            self.scope.begin_detached()
            self.begun = True
        self.token = attach(self.scope)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        detach(self.token)

    def finish(self, error: BaseException | None) -> None:
        if self.begun:
            self.scope.finish(recorder.STATE.now_ns(), error)


def _traced_generator(gen: Generator[_Y, _S, _R], name: str,
                      category: Category | str | None) -> Generator[_Y, _S, _R]:
    span = _GeneratorSpan(name, category)
    return drive(gen, span.around, span.finish)


def _traced_async_generator(agen: AsyncGenerator[_Y, _S], name: str,
                            category: Category | str | None) -> AsyncGenerator[_Y, _S]:
    span = _GeneratorSpan(name, category)
    return adrive(agen, span.around, span.finish)


def _decorate_device(fn: Callable[..., object], name: str, category: Category | str | None,
                     sync: bool | str | None, timing: str | None,
                     annotate: bool | None) -> Callable[..., object]:
    """Wrapper for ``trace_perf`` with device options: JAX syncs on the function's outputs."""
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        raise TypeError(f"rltrace.trace_perf: device options are not supported on generator "
                        f"function {fn.__qualname__}; wrap the consuming loop in trace_scope")

    def scope() -> TracedScope:
        return _device_scope(name, category, None, sync, timing, annotate)

    if inspect.iscoroutinefunction(fn):
        afn = fn

        @functools.wraps(fn)
        async def async_wrapper(*a: object, **k: object) -> object:
            if not STATE.enabled:
                return await afn(*a, **k)
            ds = scope()
            with ds:
                out = await afn(*a, **k)
                if isinstance(ds, DeviceScope):
                    ds.outputs = out
                return out

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*a: object, **k: object) -> object:
        if not STATE.enabled:
            return fn(*a, **k)
        ds = scope()
        with ds:
            out = fn(*a, **k)
            if isinstance(ds, DeviceScope):
                ds.outputs = out
            return out

    return wrapper


def _decorate(fn: Callable[..., object], name: str,
              category: Category | str | None) -> Callable[..., object]:
    if category is not None and type(category) is not str and type(category) is not Category:
        category = category_name(category)  # its own __hash__/__str__ must not run at export
    if inspect.isasyncgenfunction(fn):
        agfn = fn

        @functools.wraps(fn)
        def agen_wrapper(*a: object, **k: object) -> AsyncGenerator[object, object]:
            agen = agfn(*a, **k)
            if not STATE.enabled:
                return agen
            return _traced_async_generator(agen, name, category)

        return agen_wrapper
    if inspect.isgeneratorfunction(fn):
        gfn = fn

        @functools.wraps(fn)
        def gen_wrapper(*a: object, **k: object) -> Generator[object, object, object]:
            gen = gfn(*a, **k)
            if not STATE.enabled:
                return gen
            return _traced_generator(gen, name, category)

        return gen_wrapper
    if inspect.iscoroutinefunction(fn):
        afn = fn
        device = _decorate_device(fn, name, category, None, None, None)

        @functools.wraps(fn)
        async def async_wrapper(*a: object, **k: object) -> object:
            if not STATE.enabled:
                return await afn(*a, **k)
            if STATE.device is not None:  # config-wide device options for this category
                return await device(*a, **k)  # type: ignore[misc]
            with Scope(name, category):
                return await afn(*a, **k)

        return async_wrapper

    device = _decorate_device(fn, name, category, None, None, None)

    @functools.wraps(fn)
    def wrapper(*a: object, **k: object) -> object:
        if not STATE.enabled:
            return fn(*a, **k)
        if STATE.device is not None:
            return device(*a, **k)
        with Scope(name, category):
            return fn(*a, **k)

    return wrapper


@overload
def trace_perf(name: F) -> F: ...
@overload
def trace_perf(name: str | None = None, category: Category | str | None = None, *,
               device_sync: bool | str | None = None, device_timing: str | None = None,
               annotate: bool | None = None) -> Callable[[F], F]: ...


def trace_perf(name: str | Callable[..., object] | None = None,
               category: Category | str | None = None, *,
               device_sync: bool | str | None = None, device_timing: str | None = None,
               annotate: bool | None = None) -> Callable[..., object]:
    """Decorator tracing every call of a sync, async, generator or async-generator function.

    ``@trace_perf("fsdp_engine.train_batch", category="compute")``; with no name the
    function's qualified name is used (``@trace_perf`` and ``@trace_perf()`` both work).
    The wrapper is chosen once, at decoration time; whether tracing is on is checked per call,
    so functions decorated before :func:`rltrace.configure` are traced once it runs.
    Device options as for :func:`trace_scope`; with ``device_sync`` a JAX function's outputs
    are what is waited on (``jax.block_until_ready``).
    """
    if callable(name) and category is None:
        fn = name
        return _decorate(fn, fn.__qualname__, None)
    if name is not None and type(name) is not str:
        _check_name(name, "trace_perf")
    label = name if isinstance(name, str) else None

    def deco(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"rltrace.trace_perf must decorate a function, got {type(fn).__name__}")
        if device_sync or device_timing or annotate:
            return _decorate_device(fn, label or fn.__qualname__, category,  # type: ignore[return-value]
                                    device_sync, device_timing, annotate)
        return _decorate(fn, label or fn.__qualname__, category)  # type: ignore[return-value]

    return deco
