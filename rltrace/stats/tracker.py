"""``StatsTracker``: AReaL's ``stats_tracker`` API, with named trackers and a default one.

Keys are built from the tracker's name, the open scopes and the recorded name
(``tracker/scope/inner/key``).  Each key keeps one :class:`~rltrace.stats.reduce.Aggregate`
(sum, count, min, max), so values are reduced when recorded and reductions across ranks are
exact.  Scopes live in a ``ContextVar``: threads and asyncio tasks each see their own.

Denominators pair with stats as in AReaL: every ``denominator(name=mask)`` call appends one
mask to ``name``'s list, and the *n*-th ``stat`` call of a key that uses ``name`` is reduced
over ``name``'s *n*-th mask (the usual loop "denominator, then its stats, per micro-batch"
pairs each stat with the mask of its micro-batch).  A stat whose mask has not been given yet
waits for it; one still waiting at export counts nothing (AReaL leaves it out too) and is
reported with a warning.  The masks are kept until the export that resets them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

from rltrace.recording.generators import adrive, drive
from rltrace.runtime import RUNTIME
from rltrace.stats.distributed import resolve_reducer
from rltrace.stats.partials import (
    Deferred,
    Partial,
    StatsTypeError,
    check_value,
    is_bool_mask,
    mask_count,
    partial,
    scalar_value,
    size_of,
    snapshot,
)
from rltrace.stats.reduce import DENOMINATOR, Aggregate, ReduceType, allreduce, finalize, merge_into

__all__ = ["DEFAULT", "LOCK", "TRACKERS", "StatsTracker", "Trackers", "default_tracker", "export_all", "get",
           "trackers"]

F = TypeVar("F", bound=Callable[..., Any])

TIMEPERF = "timeperf"

log = logging.getLogger("rltrace.stats")


def _check_name(name: object, api: str) -> str:
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

    def __exit__(self, *exc: object) -> None:
        self.tracker._scopes.reset(self._token)

    def __call__(self, fn: F) -> F:
        wrapped: F = _decorate(fn, self.tracker, self.name)
        return wrapped


def _decorate(fn: Any, tracker: StatsTracker, name: str) -> Any:
    if not callable(fn):
        raise TypeError(f"stats.scope_func_wrapper must decorate a function, got {type(fn).__name__}")
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def agen_wrapper(*a: object, **k: object) -> object:
            # the scope is open only while the generator body runs, never in the consumer's code
            return adrive(fn(*a, **k), lambda: _Scope(tracker, name))

        return agen_wrapper
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen_wrapper(*a: object, **k: object) -> object:
            return drive(fn(*a, **k), lambda: _Scope(tracker, name))

        return gen_wrapper
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*a: object, **k: object) -> object:
            with _Scope(tracker, name):
                return await fn(*a, **k)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*a: object, **k: object) -> object:
        with _Scope(tracker, name):
            return fn(*a, **k)

    return wrapper


_NOT_A_REDUCE_TYPE = "reduce_type must be a ReduceType enum"  # AReaL's message


def _reduce_type(reduce_type: object, keys: Iterable[str]) -> str:
    """The kind string of ``reduce_type``: a :class:`ReduceType`, its value, or an enum member
    of the same name (AReaL's own ``ReduceType``)."""
    if reduce_type is None:
        return ReduceType.AVG_MIN_MAX.value
    if isinstance(reduce_type, ReduceType):
        rt = reduce_type
    elif isinstance(reduce_type, Enum) and reduce_type.name in ReduceType.__members__:
        rt = ReduceType[reduce_type.name]
    else:
        try:
            rt = ReduceType(reduce_type)
        except ValueError:
            raise ValueError(
                f"{_NOT_A_REDUCE_TYPE}: stats.stat: unknown reduce_type {reduce_type!r} for "
                f"{', '.join(map(repr, keys))}; use one of {', '.join(r.name for r in ReduceType)}"
            ) from None
    if rt is ReduceType.SCALAR:
        raise ValueError(
            f"Cannot use the scalar reduce type for a tensor: stats.stat: reduce_type SCALAR is for "
            f"stats.scalar(); record {', '.join(map(repr, keys))} with stats.scalar(name=float_value)"
        )
    return str(rt.value)


class _Waiting:
    """A stat recorded before its denominator's mask of the same index: kept until it arrives."""

    __slots__ = ("denominator", "index", "key", "kind", "value")

    def __init__(self, key: str, kind: str, denominator: str, index: int, value: object) -> None:
        self.key = key
        self.kind = kind
        self.denominator = denominator
        self.index = index
        self.value = value


class StatsTracker:
    """Collects statistics under hierarchical keys and exports them, optionally reduced across ranks.

    ``name`` prefixes every key of this tracker (``get("rollout").scalar(reward=1.0)`` records
    ``rollout/reward``).  All methods are thread-safe.  ``DistributedStatsTracker`` (AReaL's
    name) is this class.
    """

    #: AReaL's name for the scope context manager class (``tracker.Scope(tracker, name)``)
    Scope = _Scope

    def __init__(self, name: str = "") -> None:
        self.name = name.strip("/")
        base: tuple[str, ...] = (self.name,) if self.name else ()
        self._scopes: ContextVar[tuple[str, ...]] = ContextVar(f"rltrace_stats_scopes_{self.name}",
                                                               default=base)
        self._lock = threading.Lock()
        #: AReaL's attribute name for the tracker's lock
        self.lock = self._lock
        self._aggs: dict[str, Aggregate] = {}
        self._deferred: list[Deferred] = []
        # denominator key -> its masks since the last reset, in call order (AReaL's pairing)
        self._masks: dict[str, list[object]] = {}
        # stat key -> number of stat() values recorded since the last reset (the next index)
        self._counts: dict[str, int] = {}
        # denominator key -> stats waiting for a mask of that denominator
        self._waiting: dict[str, list[_Waiting]] = {}
        #: called with the tracker at the start of every export (e.g. the span-timings bridge)
        self.before_export: list[Callable[[StatsTracker], None]] = []

    def after_fork_in_child(self) -> None:
        """A forked child's tracker: a fresh lock (another thread may have held it at fork time);
        what was recorded stays, as the parent had it."""
        self._lock = threading.Lock()
        self.lock = self._lock

    # -- keys and scopes ------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return "/".join((*self._scopes.get(), name))

    def _get_full_key(self, key: str) -> str:
        """The key ``key`` gets right now (AReaL's name): tracker name, open scopes, ``key``."""
        return self._key(key)

    def _absolute(self, name: str) -> str:
        return f"{self.name}/{name}" if self.name else name

    def current_scope(self) -> str:
        """The prefix keys get right now (``"actor/optimizer"``; ``""`` at the top)."""
        return "/".join(self._scopes.get())

    def scope(self, name: str) -> _Scope:
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

    @contextlib.contextmanager
    def disable_scope(self) -> Iterator[None]:
        """Inside the block keys get no prefix at all: neither open scopes nor the tracker's name.

        Scopes opened inside the block apply as usual; the outer ones come back at its end.
        """
        token = self._scopes.set(())
        try:
            yield
        finally:
            self._scopes.reset(token)

    # -- recording ------------------------------------------------------------------------------
    def _check_kind(self, key: str, kind: str) -> None:
        agg = self._aggs.get(key)
        if agg is not None and agg.kind != kind:
            raise ValueError(
                f"stats: {key!r} was recorded as {agg.kind!r} and now as {kind!r}; use one reduce "
                f"type per key (or another name)"
            )

    def _add(self, key: str, kind: str, part: Partial | Deferred) -> None:
        agg = self._aggs.get(key)
        if agg is None:
            agg = self._aggs[key] = Aggregate(kind)
        elif agg.kind != kind:
            self._check_kind(key, kind)
        if isinstance(part, Deferred):
            self._deferred.append(part)
        else:
            agg.add(*part)

    def _set_reduce_type(self, key: str, reduce_type: ReduceType) -> None:
        """Check that ``key`` may be recorded with ``reduce_type`` (AReaL's helper of that name).

        Raises ``ValueError`` when ``reduce_type`` is not a :class:`ReduceType` or ``key`` was
        already recorded with another one (rltrace fixes a key's type at its first record).
        """
        if not isinstance(reduce_type, ReduceType):
            raise ValueError(f"{_NOT_A_REDUCE_TYPE}, got {reduce_type!r} for {key!r}")
        with self._lock:
            self._check_kind(key, reduce_type.value)

    def denominator(self, **masks: object) -> None:
        """Append boolean masks to the named denominators, for ``stat(denominator=name, ...)``.

        The *n*-th ``stat`` of a key with ``denominator=name`` is reduced over ``name``'s *n*-th
        mask (AReaL's pairing).  The export holds each denominator's number of true elements.
        Raises :class:`~rltrace.stats.partials.StatsTypeError` (a ``TypeError`` and a
        ``ValueError``) for a non-boolean mask and ``ValueError`` for an empty one.
        """
        prepared = []
        for name, mask in masks.items():
            key = self._key(name)
            if not is_bool_mask(mask):
                dtype = getattr(mask, "dtype", type(mask).__name__)
                raise StatsTypeError(
                    f"`{name}` must be a pytorch bool tensor: {dtype} (stats.denominator: {key!r} "
                    f"must be a boolean mask, torch, numpy or jax; pass e.g. (lengths > 0) or "
                    f"mask.bool())"
                )
            if size_of(mask) == 0:
                raise ValueError(f"`{name}` must be non-empty (stats.denominator: {key!r} is an empty mask)")
            prepared.append((key, mask_count(key, mask), snapshot(mask)))
        with self._lock:
            for key, _, _ in prepared:
                self._check_kind(key, DENOMINATOR)
            late: list[tuple[_Waiting, Any]] = []
            for key, part, kept in prepared:
                self._add(key, DENOMINATOR, part)
                kept_masks = self._masks.setdefault(key, [])
                kept_masks.append(kept)
                index = len(kept_masks) - 1
                waiting = self._waiting.get(key)
                if waiting:
                    late.extend((w, kept) for w in waiting if w.index == index)
                    waiting[:] = [w for w in waiting if w.index != index]
            # stats recorded before their mask: reduce them now; a bad one (shape, NaN) is
            # dropped and its error raised here, after every other one is recorded
            errors: list[Exception] = []
            for w, mask in late:
                try:
                    self._add(w.key, w.kind, partial(w.key, w.value, mask, w.denominator))
                except (TypeError, ValueError) as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]

    def stat(self, denominator: str | None = None, reduce_type: ReduceType | str | None = None,
             **values: object) -> None:
        """Record tensors/arrays reduced over the elements where ``denominator``'s mask is true.

        ``reduce_type`` None exports ``key/avg``, ``key/min`` and ``key/max``; ``AVG``, ``MIN``,
        ``MAX`` and ``SUM`` export ``key``.  Without a denominator every element counts.
        Raises ``ValueError`` for an unknown denominator, an empty value or NaN/inf among the
        masked elements, :class:`~rltrace.stats.partials.StatsShapeError` (a ``ValueError`` and
        an ``AssertionError``) when the value's shape differs from its mask's, and
        :class:`~rltrace.stats.partials.StatsTypeError` for non-numeric values.  Nothing of a call
        that raises is recorded.
        """
        kind = _reduce_type(reduce_type, [self._key(k) for k in values])
        with self._lock:
            masks = None
            denom_key = None
            if denominator is not None:
                denom_key = self._key(denominator)
                masks = self._masks.get(denom_key)
                if not masks:
                    keys = ", ".join(repr(self._key(k)) for k in values)
                    raise ValueError(
                        f"Denominator `{denom_key}` does not exist: stats.stat: unknown denominator "
                        f"{denom_key!r} for {keys}; register it first with "
                        f"stats.denominator({denominator}=mask) in the same scope "
                        f"(known: {', '.join(sorted(self._masks)) or 'none'})"
                    )
            parts: list[tuple[str, Partial | Deferred | _Waiting]] = []
            for name, value in values.items():
                key = self._key(name)
                if check_value(key, value) == 0:
                    raise ValueError(f"`{name}` should be non-empty (stats.stat: {key!r} has no elements)")
                self._check_kind(key, kind)
                if masks is None:
                    parts.append((key, partial(key, value, None, None)))
                    continue
                assert denom_key is not None
                index = self._counts.get(key, 0)
                if index < len(masks):
                    parts.append((key, partial(key, value, masks[index], denom_key)))
                else:  # its mask is not there yet: keep a copy until it comes
                    parts.append((key, _Waiting(key, kind, denom_key, index, snapshot(value))))
            for key, part in parts:
                if denom_key is not None:
                    self._counts[key] = self._counts.get(key, 0) + 1
                if isinstance(part, _Waiting):
                    self._waiting.setdefault(part.denominator, []).append(part)
                else:
                    self._add(key, kind, part)

    def scalar(self, **values: object) -> None:
        """Record floats; the export holds each key's mean and ``key__count`` (an int)."""
        parts = []
        for name, value in values.items():
            key = self._key(name)
            v = scalar_value(key, value)
            parts.append((key, (v, 1.0, v, v)))
        with self._lock:
            for key, _ in parts:
                self._check_kind(key, ReduceType.SCALAR.value)
            for key, part in parts:
                self._add(key, ReduceType.SCALAR.value, part)

    def _add_scalar(self, key: str, value: float, count: float = 1.0) -> None:
        v = scalar_value(key, value)
        with self._lock:
            self._add(key, ReduceType.SCALAR.value, (v * count, count, v, v))

    def add_scalar_absolute(self, key: str, value: float, count: float = 1.0) -> None:
        """Record a scalar under ``key`` ignoring open scopes (the tracker name still applies)."""
        self._add_scalar(self._absolute(key), value, count)

    @contextlib.contextmanager
    def record_timing(self, name: str) -> Iterator[None]:
        """Time the block (``time.perf_counter``) as the scalar ``timeperf/<name>`` in seconds.

        As in AReaL the key is always ``timeperf/<name>``: neither open scopes nor the tracker's
        name apply.  Also a decorator.
        """
        name = _check_name(name, "record_timing")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._add_scalar(f"{TIMEPERF}/{name}", time.perf_counter() - t0)

    # -- export ---------------------------------------------------------------------------------
    def collect(self, key: str | None = None, reset: bool = True) -> dict[str, Aggregate]:
        """This process's aggregates (``key``: a full key; only it and the keys below it).

        With ``reset`` the selected keys are dropped: their values, their masks when they are
        denominators, their stat counts, and stats still waiting for a mask (with a warning).
        """
        for hook in list(self.before_export):
            hook(self)
        resolved = self._resolve_deferred()
        chosen = _selector(key)
        dropped: list[str] = []
        with self._lock:
            for k, part in resolved:
                agg = self._aggs.get(k)
                if agg is not None:
                    agg.add(*part)
            out = {k: Aggregate(a.kind, a.total, a.count, a.lo, a.hi)
                   for k, a in self._aggs.items() if chosen(k)}
            if reset:
                self._drop_locked(out, chosen)
                dropped = self._drop_waiting_locked(chosen)
        if dropped:
            _warn_left_out(dropped)
        return out

    def _resolve_deferred(self) -> list[tuple[str, Partial]]:
        """Take the values still on a device and read them back, outside the lock (device reads)."""
        with self._lock:
            deferred, self._deferred = self._deferred, []
        return [(d.key, d.resolve()) for d in deferred]

    def _drop_locked(self, exported: dict[str, Aggregate], chosen: Callable[[str], bool]) -> None:
        """Drop the exported values, and the masks and stat counts of the chosen keys (lock held)."""
        for k in exported:
            del self._aggs[k]
        for d in [d for d in self._masks if chosen(d)]:
            del self._masks[d]
        for k in [k for k in self._counts if chosen(k)]:
            del self._counts[k]

    def _drop_waiting_locked(self, chosen: Callable[[str], bool]) -> list[str]:
        """Drop the stats still waiting for a mask whose key or denominator is chosen (lock held);
        returns their keys, one per value dropped."""
        dropped: list[str] = []
        for d in list(self._waiting):
            keep = []
            for w in self._waiting[d]:
                if chosen(w.key) or chosen(d):
                    dropped.append(w.key)
                else:
                    keep.append(w)
            if keep:
                self._waiting[d] = keep
            else:
                del self._waiting[d]
        return dropped

    def export(self, key: str | None = None, reduce_group: object = None,
               reset: bool = True) -> dict[str, float]:
        """Everything recorded since the last reset, as ``{key: float}`` (``__count`` keys: int).

        ``key``: only that key (and the keys below it), named as when recording: the tracker's
        name and the open scopes apply.  ``reduce_group``: None (default, as in AReaL) exports
        this process's values only; a torch ``ProcessGroup``, ``"jax"``, ``"auto"`` or a custom
        reducer reduces across ranks, and then every rank of the group must call ``export``
        (it is a collective; see :mod:`rltrace.stats.distributed`).  ``reset`` clears what was
        exported (stats, scalars and denominators).
        """
        full = None if key is None else self._key(key)
        return _reduce_and_finalize(self.collect(full, reset), reduce_group)

    def reset(self) -> None:
        """Drop everything recorded so far."""
        with self._lock:
            self._aggs.clear()
            self._deferred.clear()
            self._masks.clear()
            self._counts.clear()
            self._waiting.clear()

    def __repr__(self) -> str:
        return f"StatsTracker({self.name!r}, keys={len(self._aggs)})"


def _reduce_and_finalize(aggs: dict[str, Aggregate], reduce_group: object) -> dict[str, float]:
    reducer = resolve_reducer(reduce_group)
    if reducer is not None:
        aggs = allreduce(aggs, reducer)
    return finalize(aggs)


def _selector(key: str | None) -> Callable[[str], bool]:
    """Whether a full key is ``key`` or below it (every key when ``key`` is None)."""

    def chosen(k: str) -> bool:
        return key is None or k == key or k.startswith(key + "/")

    return chosen


def _warn_left_out(dropped: list[str]) -> None:
    """Warn that stat values still waiting for their denominator's mask were left out of an export."""
    log.warning(
        "rltrace.stats: %d stat value(s) of %s had no denominator mask of their index at "
        "export and were left out (as AReaL leaves them out); call stats.denominator() "
        "once per stats.stat() of each key", len(dropped), ", ".join(sorted(set(dropped))))


class Trackers:
    """The process's trackers by name, held by the runtime (``RUNTIME.part(Trackers)``).

    ``""`` is the default tracker, the one behind the module-level functions
    (``stats.scalar``, ``stats.export``, ...).  The module exposes them under AReaL's names:
    ``DEFAULT`` (:attr:`default`), ``TRACKERS`` (:attr:`by_name`) and ``LOCK`` (:attr:`lock`).
    """

    def __init__(self) -> None:
        self.default = StatsTracker()
        self.by_name: dict[str, StatsTracker] = {"": self.default}
        self.lock = threading.Lock()
        #: AReaL's ``MOE_AUX_LOSSES`` (kept for code that writes to it; rltrace does not read it)
        self.moe_aux_losses: dict[str, object] = {}

    def after_fork_in_child(self) -> None:
        """Another thread may have held a lock at fork time: this one's and every tracker's."""
        self.lock = threading.Lock()
        for tracker in self.by_name.values():
            tracker.after_fork_in_child()


def trackers() -> Trackers:
    """The runtime's :class:`Trackers`."""
    return RUNTIME.part(Trackers)


def default_tracker() -> StatsTracker:
    """The tracker behind the module-level functions (``stats.scalar``, ``stats.export``, ...)."""
    return RUNTIME.part(Trackers).default


if TYPE_CHECKING:
    #: the default tracker (see :func:`default_tracker`)
    DEFAULT: StatsTracker
    #: every tracker by name (AReaL's name; ``""`` is the default tracker)
    TRACKERS: dict[str, StatsTracker]
    #: the lock guarding :data:`TRACKERS` (AReaL's name)
    LOCK: threading.Lock


def __getattr__(name: str) -> object:
    """AReaL's module attributes ``DEFAULT``, ``TRACKERS`` and ``LOCK``, read from the runtime."""
    if name == "DEFAULT":
        return default_tracker()
    if name == "TRACKERS":
        return trackers().by_name
    if name == "LOCK":
        return trackers().lock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str = "") -> StatsTracker:
    """The named tracker (created on first use; ``""`` is the default tracker)."""
    name = name.strip("/")
    state = trackers()
    with state.lock:
        tracker = state.by_name.get(name)
        if tracker is None:
            tracker = state.by_name[name] = StatsTracker(name)
        return tracker


def export_all(reduce_group: object = None, reset: bool = True) -> dict[str, float]:
    """Export every tracker (default and named); keys carry tracker names.

    ``reduce_group`` as for :meth:`StatsTracker.export`: None (default) is this process only.
    With a group all trackers are reduced in one exchange, so trackers and keys that exist
    on only some ranks are fine.  A key recorded by several trackers (``timeperf/...``) is
    merged: its mean and count cover every tracker's records.
    """
    state = trackers()
    with state.lock:
        every = list(state.by_name.values())
    merged: dict[str, Aggregate] = {}
    for t in every:
        merge_into(merged, t.collect(None, reset))
    return _reduce_and_finalize(merged, reduce_group)
