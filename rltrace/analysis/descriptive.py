"""Small statistics helpers shared by the analyses: percentiles, median/MAD, bounded quantiles."""

from __future__ import annotations

import array
import math
from typing import Any

import numpy as np

from rltrace.accounting.quantiles import hist_quantile, quantile

#: the percentiles every latency table reports, and their JSON keys
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
PCT_KEYS = ("p50_s", "p90_s", "p99_s", "p999_s")


def pct(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """Percentiles ``ps`` (0..100) of ``values`` (not empty), by
    :data:`rltrace.accounting.quantiles.DEFINITION`."""
    v = np.sort(values, axis=None)
    return [quantile(v, p / 100) for p in ps]


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """P50/P90/P99/P99.9 (:data:`rltrace.accounting.quantiles.DEFINITION`: numpy's default), max and count."""
    if values.size == 0:
        return {"count": 0, **dict.fromkeys(PCT_KEYS), "max_s": None}
    qs = pct(values, PERCENTILES)
    return {"count": int(values.size), **dict(zip(PCT_KEYS, qs, strict=True)),
            "max_s": float(values.max())}


def median_mad(values: np.ndarray) -> tuple[float, float]:
    """Median and median absolute deviation (unscaled) of the finite values."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return math.nan, math.nan
    med = float(np.median(v))
    return med, float(np.median(np.abs(v - med)))


def quantile_curve(sorted_values: np.ndarray, points: int = 101) -> tuple[np.ndarray, np.ndarray]:
    """A CDF downsampled to ``points`` quantiles: (values, cumulative fractions)."""
    q = np.linspace(0.0, 1.0, points)
    if sorted_values.size == 0:
        return np.zeros(0), np.zeros(0)
    return np.array([quantile(sorted_values, float(x)) for x in q]), q


def group_index(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys and, for each element, the index of its key (``np.unique`` inverse)."""
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, inv.reshape(-1)


def fnum(x: Any) -> float | None:
    """A JSON-ready float (None for NaN/inf/None)."""
    if x is None:
        return None
    f = float(x)
    return f if math.isfinite(f) else None


class BoundedQuantiles:
    """Count, total, min, max and quantiles of a stream of non-negative values in bounded memory.

    The first ``exact_limit`` values are kept (quantiles are then exact,
    :func:`rltrace.accounting.quantiles.quantile`); past that every value goes into a log-spaced histogram
    with ``bins_per_decade`` bins per factor of ten, whose quantiles
    (:func:`rltrace.accounting.quantiles.hist_quantile`, the same definition) are off by at most a bin
    (~2.3% relative at 100 bins per decade).  Memory: ``8 * exact_limit`` bytes, then a fixed
    ~12 KB histogram.
    """

    LO_EXP, HI_EXP = -4, 13  # values (µs) from 1e-4 to 1e13

    __slots__ = ("_bins", "_buf", "bins_per_decade", "count", "exact_limit", "hist", "max", "min",
                 "total")

    def __init__(self, exact_limit: int = 8192, bins_per_decade: int = 100) -> None:
        self.exact_limit = exact_limit
        self.bins_per_decade = bins_per_decade
        self._bins = (self.HI_EXP - self.LO_EXP) * bins_per_decade + 2
        self._buf = array.array("d")
        self.hist: np.ndarray | None = None
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    @property
    def buffer(self) -> array.array[float]:
        """Append values here; call :meth:`maybe_flush` when it may have grown past the limit."""
        return self._buf

    def add(self, value: float) -> None:
        self._buf.append(value)
        if len(self._buf) >= self.exact_limit:
            self._flush()

    def maybe_flush(self) -> None:
        if len(self._buf) >= self.exact_limit:
            self._flush()

    def _absorb(self, v: np.ndarray) -> None:
        self.count += int(v.size)
        self.total += float(v.sum())
        self.min = min(self.min, float(v.min()))
        self.max = max(self.max, float(v.max()))

    def _flush(self) -> None:
        v = np.frombuffer(self._buf, dtype=np.float64).copy()
        self._buf = array.array("d")
        if v.size == 0:
            return
        self._absorb(v)
        if self.hist is None:
            self.hist = np.zeros(self._bins, dtype=np.int64)
        self.hist += np.bincount(self._bin_of(v), minlength=self._bins)

    def _bin_of(self, v: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            x = (np.log10(np.maximum(v, 0.0)) - self.LO_EXP) * self.bins_per_decade
        bins: np.ndarray = np.clip(np.floor(np.nan_to_num(x, neginf=-1.0)) + 1, 0,
                                   self._bins - 1).astype(np.int64)
        return bins

    def _bin_bounds(self, b: int) -> tuple[float, float]:
        """Bin ``b``'s (lower, upper) edges: bin 0 holds everything below 10**LO_EXP."""
        upper = 10 ** (self.LO_EXP + b / self.bins_per_decade)
        return (0.0 if b <= 0 else 10 ** (self.LO_EXP + (b - 1) / self.bins_per_decade)), upper

    def summary(self, qs: tuple[float, ...] = (50.0, 99.0)) -> dict[str, Any]:
        """count, total, mean, min, max and the requested percentiles; ``exact`` says how."""
        buf = np.frombuffer(self._buf, dtype=np.float64)
        if self.hist is None:
            if buf.size == 0:
                return {"count": 0, "total": 0.0, "mean": None, "min": None, "max": None,
                        "q": [None] * len(qs), "exact": True}
            exact = np.sort(buf)
            return {"count": int(buf.size), "total": float(buf.sum()), "mean": float(buf.mean()),
                    "min": float(buf.min()), "max": float(buf.max()),
                    "q": [quantile(exact, q / 100) for q in qs],
                    "exact": True}
        if buf.size:
            self._flush()
        nonzero = np.flatnonzero(self.hist)
        counts = dict(zip(nonzero.tolist(), self.hist[nonzero].tolist(), strict=True))
        out = [hist_quantile(counts, q / 100, self._bin_bounds, low=self.min, high=self.max) for q in qs]
        return {"count": self.count, "total": self.total, "mean": self.total / self.count,
                "min": self.min, "max": self.max, "q": out, "exact": False}
