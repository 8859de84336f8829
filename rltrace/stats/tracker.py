"""``StatsTracker``: AReaL's ``stats_tracker`` API, with named trackers and a default one.

Keys are built from the tracker's name, the open scopes and the recorded name
(``tracker/scope/inner/key``).  Each key keeps one :class:`~rltrace.stats.reduce.Aggregate`
(sum, count, min, max), so memory does not grow with the number of calls and reductions across
ranks are exact.  Scopes live in a ``ContextVar``: threads and asyncio tasks each see their own.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from ..resumptions import adrive, drive
from .distributed import resolve_reducer
from .reduce import DENOMINATOR, Aggregate, ReduceType, allreduce, finalize, merge_into
from .values import Deferred, is_bool_mask, mask_count, partial, scalar_value

__all__ = ["DEFAULT", "StatsTracker", "export_all", "get"]

F = TypeVar("F", bound=Callable[..., Any])

TIMEPERF = "timeperf"


def _check_name(name: Any, api: str) -> str:
    if not isinstance(name, str) or not name.strip("/"):
        raise TypeError(f"stats.{api}: the name must be a non-empty str, got {name!r}")
    return name.strip("/")


class _Scope:
    """``with tracker.scope("actor"):`` and ``@tracker.scope("actor")`` (one implementation)."""

    __slots__ = ("_token", "name", "tracker")

    def __init__(self, tracker: StatsTracker, name: str) -> None:
        self.tracker = tracker
        self.name = name
        self._token: Any = None

    def __enter__(self) -> _Scope:
        cv = self.tracker._scopes
        self._token = cv.set((*cv.get(), self.name))
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.tracker._scopes.reset(self._token)
        return False

    def __call__(self, fn: F) -> F:
        return _decorate(fn, self.tracker, self.name)


def _decorate(fn: Any, tracker: StatsTracker, name: str) -> Any:
    if not callable(fn):
        raise TypeError(f"stats.scope_func_wrapper must decorate a function, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def agen_wrapper(*a: Any, **k: Any) -> Any:
            # the scope is open only while the generator body runs, never in the consumer's code
            return adrive(fn(*a, **k), lambda: _Scope(tracker, name))

        return agen_wrapper
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*a: Any, **k: Any) -> Any:
            return drive(fn(*a, **k), lambda: _Scope(tracker, name))

        return gen_wrapper
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*a: Any, **k: Any) -> Any:
            with _Scope(tracker, name):
                return await fn(*a, **k)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        with _Scope(tracker, name):
            return fn(*a, **k)

    return wrapper


def _reduce_type(reduce_type: Any, keys: Any) -> str:
    if reduce_type is None:
        return ReduceType.AVG_MIN_MAX.value
    try:
        rt = ReduceType(reduce_type.value if isinstance(reduce_type, ReduceType) else reduce_type)
    except ValueError:
        raise ValueError(
            f"stats.stat: unknown reduce_type {reduce_type!r} for {', '.join(map(repr, keys))}; "
            f"use one of {', '.join(r.name for r in ReduceType)}"
        ) from None
    if rt is ReduceType.SCALAR:
        raise ValueError(
            f"stats.stat: reduce_type SCALAR is for stats.scalar(); record "
            f"{', '.join(map(repr, keys))} with stats.scalar(name=float_value)"
        )
    return rt.value


class StatsTracker:
    """Collects statistics under hierarchical keys and exports them, reduced across ranks.

    ``name`` prefixes every key of this tracker (``get("rollout").scalar(reward=1.0)`` records
    ``rollout/reward``).  All methods are thread-safe.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name.strip("/")
        self._scopes: ContextVar[tuple[str, ...]] = ContextVar(f"rltrace_stats_scopes_{self.name}",
                                                               default=())
        self._lock = threading.Lock()
        self._aggs: dict[str, Aggregate] = {}
        self._deferred: list[Deferred] = []
        self._denominators: dict[str, Any] = {}
        #: called with the tracker at the start of every export (e.g. the span-timings bridge)
        self.before_export: list[Callable[[StatsTracker], None]] = []

    # -- keys and scopes ------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        parts = [self.name] if self.name else []
        parts.extend(self._scopes.get())
        parts.append(name)
        return "/".join(parts)

    def _absolute(self, name: str) -> str:
        return f"{self.name}/{name}" if self.name else name

    def current_scope(self) -> str:
        """The prefix keys get right now (``"actor/optimizer"``; ``""`` at the top)."""
        return "/".join(([self.name] if self.name else []) + list(self._scopes.get()))

    def scope(self, name: str) -> Any:
        """Prefix keys with ``name/`` inside the block: ``with stats.scope("actor"): ...``.

        The returned object is also a decorator (sync, async, generator and async-generator
        functions), like :meth:`scope_func_wrapper`.
        """
        return _Scope(self, _check_name(name, "scope"))

    def scope_func_wrapper(self, name: str) -> Callable[[F], F]:
        """Decorator: every call of the function runs inside ``scope(name)``."""
        name = _check_name(name, "scope_func_wrapper")

        def deco(fn: F) -> F:
            return _decorate(fn, self, name)  # type: ignore[no-any-return]

        return deco

    # -- recording ------------------------------------------------------------------------------
    def _add(self, key: str, kind: str, part: Any) -> None:
        agg = self._aggs.get(key)
        if agg is None:
            agg = self._aggs[key] = Aggregate(kind)
        elif agg.kind != kind:
            raise ValueError(
                f"stats: {key!r} was recorded as {agg.kind!r} and now as {kind!r}; use one reduce "
                f"type per key (or another name)"
            )
        if type(part) is Deferred:
            self._deferred.append(part)
        else:
            agg.add(*part)

    def denominator(self, **masks: Any) -> None:
        """Register boolean masks by name for later ``stat(denominator=name, ...)`` calls.

        A mask replaces the previous one of the same name; the export holds each
        denominator's number of true elements.  Raises ``TypeError`` for a non-boolean mask.
        """
        for name, mask in masks.items():
            key = self._key(name)
            if not is_bool_mask(mask):
                dtype = getattr(mask, "dtype", type(mask).__name__)
                raise TypeError(
                    f"stats.denominator: {key!r} must be a boolean mask, got {dtype}; pass e.g. "
                    f"(lengths > 0) or mask.bool()"
                )
            part = mask_count(key, mask)
            with self._lock:
                self._add(key, DENOMINATOR, part)
                self._denominators[key] = mask

    def stat(self, denominator: str | None = None, reduce_type: ReduceType | str | None = None,
             **values: Any) -> None:
        """Record tensors/arrays reduced over the elements where ``denominator``'s mask is true.

        ``reduce_type`` None exports ``key/avg``, ``key/min`` and ``key/max``; ``AVG``, ``MIN``,
        ``MAX`` and ``SUM`` export ``key``.  Without a denominator every element counts.
        Raises ``ValueError`` for an unknown denominator, a shape mismatch or NaN/inf among
        the masked elements, ``TypeError`` for non-numeric values.
        """
        kind = _reduce_type(reduce_type, [self._key(k) for k in values])
        mask = None
        denom_key = None
        if denominator is not None:
            denom_key = self._key(denominator)
            with self._lock:
                mask = self._denominators.get(denom_key)
                known = sorted(self._denominators)
            if mask is None:
                keys = ", ".join(repr(self._key(k)) for k in values)
                raise ValueError(
                    f"stats.stat: unknown denominator {denom_key!r} for {keys}; register it first "
                    f"with stats.denominator({denominator}=mask) in the same scope "
                    f"(known: {', '.join(known) or 'none'})"
                )
        parts = []
        for name, value in values.items():
            key = self._key(name)
            parts.append((key, partial(key, value, mask, denom_key)))
        with self._lock:
            for key, part in parts:
                self._add(key, kind, part)

    def scalar(self, **values: Any) -> None:
        """Record floats; the export holds each key's mean and ``key__count`` (its weight)."""
        parts = []
        for name, value in values.items():
            key = self._key(name)
            v = scalar_value(key, value)
            parts.append((key, (v, 1.0, v, v)))
        with self._lock:
            for key, part in parts:
                self._add(key, ReduceType.SCALAR.value, part)

    def add_scalar_absolute(self, key: str, value: float, count: float = 1.0) -> None:
        """Record a scalar under ``key`` ignoring open scopes (the tracker name still applies)."""
        full = self._absolute(key)
        v = scalar_value(full, value)
        with self._lock:
            self._add(full, ReduceType.SCALAR.value, (v * count, count, v, v))

    @contextlib.contextmanager
    def record_timing(self, name: str) -> Iterator[None]:
        """Time the block (``time.perf_counter``) as the scalar ``timeperf/<name>`` in seconds.

        Open scopes do not apply: timings always sit under ``timeperf/``.  Also a decorator.
        """
        name = _check_name(name, "record_timing")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add_scalar_absolute(f"{TIMEPERF}/{name}", time.perf_counter() - t0)

    # -- export ---------------------------------------------------------------------------------
    def collect(self, key: str | None = None, reset: bool = True) -> dict[str, Aggregate]:
        """This process's aggregates (``key``: only that key and the keys below it)."""
        for hook in list(self.before_export):
            hook(self)
        with self._lock:
            deferred, self._deferred = self._deferred, []
        resolved = [(d.key, d.resolve()) for d in deferred]  # device reads, outside the lock
        with self._lock:
            for k, part in resolved:
                agg = self._aggs.get(k)
                if agg is not None:
                    agg.add(*part)
            selected = [k for k in self._aggs if key is None or k == key or k.startswith(key + "/")]
            out = {}
            for k in selected:
                a = self._aggs[k]
                out[k] = Aggregate(a.kind, a.total, a.count, a.lo, a.hi)
            if reset:
                for k in selected:
                    del self._aggs[k]
                    self._denominators.pop(k, None)
        return out

    def export(self, key: str | None = None, reduce_group: Any = None,
               reset: bool = True) -> dict[str, float]:
        """Everything recorded since the last reset, reduced across ranks, as ``{key: float}``.

        ``reduce_group``: None reduces over the default torch.distributed group (or all JAX
        processes) when there is more than one rank; a torch ``ProcessGroup``, ``"jax"``,
        ``False`` (no reduction) or a custom reducer (see :mod:`rltrace.stats.distributed`).
        With a reduction every rank of the group must call ``export`` (it is a collective).
        ``reset`` clears what was exported (stats, scalars and denominators).
        """
        return _reduce_and_finalize(self.collect(key, reset), reduce_group)

    def reset(self) -> None:
        """Drop everything recorded so far."""
        with self._lock:
            self._aggs.clear()
            self._deferred.clear()
            self._denominators.clear()

    def __repr__(self) -> str:
        return f"StatsTracker({self.name!r}, keys={len(self._aggs)})"


def _reduce_and_finalize(aggs: dict[str, Aggregate], reduce_group: Any) -> dict[str, float]:
    reducer = resolve_reducer(reduce_group)
    if reducer is not None:
        aggs = allreduce(aggs, reducer)
    return finalize(aggs)


#: the tracker behind the module-level functions (``stats.scalar``, ``stats.export``, ...)
DEFAULT = StatsTracker()
_TRACKERS: dict[str, StatsTracker] = {"": DEFAULT}
_TRACKERS_LOCK = threading.Lock()


def get(name: str = "") -> StatsTracker:
    """The named tracker (created on first use; ``""`` is the default tracker)."""
    name = name.strip("/")
    with _TRACKERS_LOCK:
        tracker = _TRACKERS.get(name)
        if tracker is None:
            tracker = _TRACKERS[name] = StatsTracker(name)
        return tracker


def export_all(reduce_group: Any = None, reset: bool = True) -> dict[str, float]:
    """Export every tracker (default and named) in one reduction; keys carry tracker names.

    Trackers that exist on only some ranks are fine: all keys are exchanged at once.
    """
    with _TRACKERS_LOCK:
        trackers = list(_TRACKERS.values())
    merged: dict[str, Aggregate] = {}
    for t in trackers:
        merge_into(merged, t.collect(None, reset))
    return _reduce_and_finalize(merged, reduce_group)

