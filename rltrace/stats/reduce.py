"""Reduce types, per-key aggregates, and the cross-rank reduction of those aggregates.

Every recorded key holds one :class:`Aggregate`: ``sum``, ``count``, ``min`` and ``max`` of
everything recorded under it.  Aggregates of several calls, trackers or ranks combine exactly
(sums and counts add, minima and maxima fold), so a mean exported across ranks equals the mean
of the concatenated data.  :func:`allreduce` first exchanges the keys (so a key recorded on only
some ranks is filled with the identity elsewhere instead of hanging a collective), then runs one
SUM, one MIN and one MAX all-reduce over packed vectors.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

INF = math.inf


class ReduceType(str, Enum):
    """How a key's values are reduced (AReaL's names, in AReaL's order).

    The values are strings, so ``reduce_type="sum"`` works as well as ``ReduceType.SUM``.
    """

    #: masked mean, min and max: exports ``key/avg``, ``key/min``, ``key/max`` (stat's default)
    AVG_MIN_MAX = "avg_min_max"
    #: masked mean: exports ``key``
    AVG = "avg"
    #: masked sum: exports ``key``
    SUM = "sum"
    #: masked minimum: exports ``key``
    MIN = "min"
    #: masked maximum: exports ``key``
    MAX = "max"
    #: mean of recorded floats plus ``key__count`` (what ``scalar`` records)
    SCALAR = "scalar"


#: the kind of a denominator's own entry: exports the number of true mask elements
DENOMINATOR = "denominator"


class Aggregate:
    """Everything recorded under one key: kind, sum, count, min, max."""

    __slots__ = ("count", "hi", "kind", "lo", "total")

    def __init__(self, kind: str, total: float = 0.0, count: float = 0.0,
                 lo: float = INF, hi: float = -INF) -> None:
        self.kind = kind
        self.total = total
        self.count = count
        self.lo = lo
        self.hi = hi

    def add(self, total: float, count: float, lo: float, hi: float) -> None:
        self.total += total
        self.count += count
        if lo < self.lo:
            self.lo = lo
        if hi > self.hi:
            self.hi = hi

    def merge(self, key: str, other: Aggregate) -> None:
        if other.kind != self.kind:
            raise ValueError(_kind_conflict(key, self.kind, other.kind))
        self.add(other.total, other.count, other.lo, other.hi)

    def __repr__(self) -> str:
        return f"Aggregate({self.kind}, sum={self.total}, count={self.count}, min={self.lo}, max={self.hi})"


def _kind_conflict(key: str, a: str, b: str) -> str:
    return (f"stats: {key!r} is recorded as {a!r} in one place and as {b!r} in another; "
            f"use one reduce type per key")


def merge_into(out: dict[str, Aggregate], more: dict[str, Aggregate]) -> None:
    """Fold ``more`` into ``out`` key by key."""
    for key, agg in more.items():
        mine = out.get(key)
        if mine is None:
            out[key] = Aggregate(agg.kind, agg.total, agg.count, agg.lo, agg.hi)
        else:
            mine.merge(key, agg)


def _as_count(n: float) -> float:
    """A scalar's weight as AReaL exports it: an ``int`` (unless fractional weights were added)."""
    return int(n) if float(n).is_integer() else n


def finalize(aggs: dict[str, Aggregate]) -> dict[str, float]:
    """Exported values: means, minima, maxima, sums, scalars with an integer ``__count``, denominators.

    Keys whose mask selected nothing anywhere (count 0) export nothing for means/min/max.
    Raises ``ValueError`` naming the keys whose values are not finite (accelerator values are
    checked here, after reduction, so every rank raises alike).
    """
    out: dict[str, float] = {}
    bad: list[str] = []
    for key in sorted(aggs):
        a = aggs[key]
        kind, n = a.kind, a.count
        if kind == DENOMINATOR:
            out[key] = n
        elif kind == ReduceType.SCALAR.value:
            if n > 0:
                out[key] = a.total / n
                out[key + "__count"] = _as_count(n)
        elif kind == ReduceType.SUM.value:
            out[key] = a.total
            if not math.isfinite(a.total):
                bad.append(key)
        elif n > 0:
            if not (math.isfinite(a.total) and math.isfinite(a.lo) and math.isfinite(a.hi)):
                bad.append(key)
            if kind == ReduceType.AVG_MIN_MAX.value:
                out[key + "/avg"] = a.total / n
                out[key + "/min"] = a.lo
                out[key + "/max"] = a.hi
            elif kind == ReduceType.AVG.value:
                out[key] = a.total / n
            elif kind == ReduceType.MIN.value:
                out[key] = a.lo
            elif kind == ReduceType.MAX.value:
                out[key] = a.hi
    if bad:
        raise ValueError(
            f"stats: non-finite (NaN or inf) values were recorded under {', '.join(map(repr, bad))}; "
            f"mask them out with the denominator or fix the computation"
        )
    return out


# ---- cross-rank reduction ----------------------------------------------------------------------


class Reducer(Protocol):
    """A process group: gathers small Python objects and all-reduces float64 vectors."""

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def all_reduce(self, vec: np.ndarray, op: str) -> np.ndarray: ...


def allreduce(aggs: dict[str, Aggregate], reducer: Reducer) -> dict[str, Aggregate]:
    """Reduce ``aggs`` over every rank of ``reducer``; every rank gets the same result.

    Keys are exchanged first, so keys recorded on only some ranks reduce correctly.  A key
    recorded with different reduce types on different ranks raises ``ValueError`` on every
    rank (after the exchange, so no rank is left waiting in a collective).
    """
    kinds: dict[str, str] = {}
    conflicts: list[str] = []
    for theirs in reducer.all_gather_object({k: a.kind for k, a in aggs.items()}):
        for key, kind in theirs.items():
            have = kinds.setdefault(key, kind)
            if have != kind:
                conflicts.append(_kind_conflict(key, have, kind) + " (on different ranks)")
    if conflicts:
        raise ValueError(conflicts[0])
    import numpy as np

    keys = sorted(kinds)
    n = len(keys)
    if n == 0:
        return {}
    sums = np.zeros(2 * n, dtype=np.float64)
    los = np.full(n, INF, dtype=np.float64)
    his = np.full(n, -INF, dtype=np.float64)
    for i, key in enumerate(keys):
        a = aggs.get(key)
        if a is not None:
            sums[i], sums[n + i], los[i], his[i] = a.total, a.count, a.lo, a.hi
    sums = reducer.all_reduce(sums, "sum")
    # min/max only when some key needs them (the same decision on every rank)
    if any(kinds[k] not in (ReduceType.SCALAR.value, ReduceType.SUM.value, DENOMINATOR) for k in keys):
        los = reducer.all_reduce(los, "min")
        his = reducer.all_reduce(his, "max")
    return {
        key: Aggregate(kinds[key], float(sums[i]), float(sums[n + i]), float(los[i]), float(his[i]))
        for i, key in enumerate(keys)
    }
