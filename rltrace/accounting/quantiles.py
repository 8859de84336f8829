"""One definition of a quantile (P50, P90, P99, ...) for every figure rltrace shows.

The definition: *linear interpolation between the closest ranks* — for ``n`` sorted values
and a quantile ``q`` in [0, 1], the value at position ``h = (n - 1) * q``, interpolated between
the values at ``floor(h)`` and ``floor(h) + 1``.  It is numpy's default (``method="linear"``)
and ``statistics.quantiles(..., method="inclusive")``; :func:`quantile` computes it exactly as
numpy does, to the last bit.

``rltrace report`` applies it to the values themselves (:func:`quantile`; past 8192 values of
one scope name, to a log histogram: :func:`hist_quantile`).  ``rltrace top`` only has the
histograms the live files carry (19%-wide buckets), so it applies the same definition to them
with :func:`hist_quantile`: the two order statistics are located in their buckets and each is
placed evenly within its bucket (the j-th of c values of a bucket from ``lo`` to ``hi`` at
``lo + (hi - lo) * (j + 0.5) / c``), then interpolated the same way.  Both name the definition
(:data:`DEFINITION`) in what they show.

No numpy here: ``rltrace top`` and ``rltrace.summary()`` run without the analysis extra.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

__all__ = ["DEFINITION", "hist_quantile", "quantile"]

#: what the percentiles shown by ``rltrace report``, ``rltrace top`` and ``rltrace.summary()`` are
DEFINITION = "linear interpolation between the closest ranks (numpy's default)"


class Sorted(Protocol):
    """Values in ascending order: a list, a tuple, an ``array.array`` or a 1-d numpy array."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Any: ...


def _position(n: int, q: float) -> tuple[int, float]:
    """The lower rank ``floor((n - 1) * q)`` and the weight of the next one (numpy's ``linear``)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q!r} is not in [0, 1]")
    h = (n - 1) * q
    lo = math.floor(h)
    return lo, h - lo


def _lerp(a: float, b: float, t: float) -> float:
    """``a + (b - a) * t``, computed as numpy does (from ``b`` when ``t >= 0.5``)."""
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def quantile(sorted_values: Sorted, q: float) -> float:
    """Quantile ``q`` (0..1) of ``sorted_values`` (ascending, not empty), by :data:`DEFINITION`."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("quantile of no values")
    lo, t = _position(n, q)
    if lo >= n - 1:
        return float(sorted_values[n - 1])
    return _lerp(float(sorted_values[lo]), float(sorted_values[lo + 1]), t)


def hist_quantile(counts: Mapping[int, int], q: float, bounds: Callable[[int], tuple[float, float]], *,
                  low: float = -math.inf, high: float = math.inf) -> float | None:
    """Quantile ``q`` (0..1) of the values counted in a histogram, by :data:`DEFINITION`.

    ``counts``: bucket index -> how many values fell in it; ``bounds(i)``: bucket ``i``'s
    (lower, upper) edges.  A value is estimated evenly within its bucket (see the module
    docstring), then clamped to [``low``, ``high``] (the smallest and largest values, where
    known).  None when the histogram is empty.
    """
    buckets = sorted((b, c) for b, c in counts.items() if c > 0)
    n = sum(c for _, c in buckets)
    if n == 0:
        return None
    lo, t = _position(n, q)
    ranks = (lo,) if lo >= n - 1 or t == 0 else (lo, lo + 1)
    values = [min(max(_estimate(buckets, r, bounds), low), high) for r in ranks]
    return values[0] if len(values) == 1 else _lerp(values[0], values[1], t)


def _estimate(buckets: list[tuple[int, int]], rank: int,
              bounds: Callable[[int], tuple[float, float]]) -> float:
    """The value of order statistic ``rank`` (0-based) of a histogram: placed evenly in its bucket."""
    before = 0
    for b, c in buckets:
        if rank < before + c:
            lower, upper = bounds(b)
            return lower + (upper - lower) * (rank - before + 0.5) / c
        before += c
    lower, upper = bounds(buckets[-1][0])  # pragma: no cover - rank < n always
    return upper
