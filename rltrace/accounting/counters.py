"""User counters and the end-of-run summary (the azul plan's ``print_summary``).

* ``rltrace.counter("samples").add(n)`` — thread-safe counters; their running totals go to the
  Chrome trace as counter tracks (``ph: "C"``) and into the summary with a rate per second.
* :class:`ScopeSummary` — a record processor keeping, per scope name, count, total, min, max
  and a bounded uniform sample for p50/p99 (:func:`rltrace.accounting.quantiles.quantile`, the definition
  ``rltrace report`` and ``rltrace top`` use); ``rltrace.summary()`` renders it and
  ``print_summary: true`` prints it at ``shutdown()``.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from rltrace.accounting.quantiles import quantile
from rltrace.seams import Record, RecordProcessor

__all__ = ["Counter", "Counters", "ScopeSummary"]

_RESERVOIR = 2048


class Counter:
    """A named, thread-safe running total."""

    __slots__ = ("_lock", "_value", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._value = 0.0
        self._lock = threading.Lock()

    def add(self, n: float = 1) -> None:
        """Add ``n`` (may be fractional; negative values are allowed for gauges-like use)."""
        with self._lock:
            self._value += n

    @property
    def value(self) -> float:
        return self._value


class Counters:
    """The named counters of a process (the runtime owns them: ``rltrace.counter`` is
    :meth:`get` of ``RUNTIME.counters``); kept across reconfiguration."""

    def __init__(self) -> None:
        self._counters: dict[str, Counter] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Counter:
        """The counter named ``name`` (created on first use)."""
        if type(name) is not str or not name:
            raise TypeError(f"rltrace.counter: name must be a non-empty str, got {name!r}")
        c = self._counters.get(name)
        if c is None:
            with self._lock:
                c = self._counters.setdefault(name, Counter(name))
        return c

    def snapshot(self) -> dict[str, float]:
        """Current totals of every counter."""
        return {name: c.value for name, c in list(self._counters.items())}

    def clear(self) -> None:
        """Forget every counter (tests that must not see another test's counters)."""
        with self._lock:
            self._counters = {}

    def after_fork(self) -> None:
        """In a forked child: fresh locks (another thread may have held one at the fork)."""
        self._lock = threading.Lock()
        for c in list(self._counters.values()):
            c._lock = threading.Lock()


class _Stat:
    __slots__ = ("count", "max", "min", "sample", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.min = 1 << 62
        self.max = 0
        self.sample: list[int] = []


class ScopeSummary(RecordProcessor):
    """Record processor aggregating scope durations by name (bounded memory)."""

    def __init__(self, max_names: int = 10_000, counters: Counters | None = None) -> None:
        self.max_names = max_names
        #: the counters whose totals the summary shows with their rates (None: none)
        self.counters = counters
        self.started_ns = time.time_ns()
        self._stats: dict[str, _Stat] = {}
        self._rng = random.Random(0)

    def on_record(self, rec: Record) -> None:
        extra = rec.extra
        if extra is not None and extra.get("instant"):
            return
        st = self._stats.get(rec.name)
        if st is None:
            if len(self._stats) >= self.max_names:
                return
            st = self._stats[rec.name] = _Stat()
        d = rec.end_ns - rec.start_ns
        st.count += 1
        st.total += d
        if d < st.min:
            st.min = d
        if d > st.max:
            st.max = d
        if len(st.sample) < _RESERVOIR:
            st.sample.append(d)
        else:  # reservoir sampling keeps a uniform sample of every duration seen
            j = self._rng.randrange(st.count)
            if j < _RESERVOIR:
                st.sample[j] = d

    def rows(self, now_ns: int | None = None) -> list[dict[str, Any]]:
        """Per scope name: count, total_s, mean_s, p50_s, p99_s, min_s, max_s, share of wall."""
        wall = max(1, (now_ns or time.time_ns()) - self.started_ns)
        out: list[dict[str, Any]] = []
        for name, st in self._stats.items():
            s = sorted(st.sample)
            out.append({
                "name": name, "count": st.count, "total_s": st.total / 1e9,
                "mean_s": st.total / st.count / 1e9,
                "p50_s": _q(s, 0.50) / 1e9, "p99_s": _q(s, 0.99) / 1e9,
                "min_s": st.min / 1e9, "max_s": st.max / 1e9, "wall_share": st.total / wall,
            })
        out.sort(key=lambda r: -r["total_s"])
        return out

    def render(self, now_ns: int | None = None) -> str:
        """The summary as a plain-text table (scopes, then counters with rates)."""
        now = now_ns or time.time_ns()
        wall_s = max(1e-9, (now - self.started_ns) / 1e9)
        lines = [f"rltrace summary over {wall_s:.1f} s",
                 f"{'scope':<32}{'count':>9}{'total s':>10}{'mean ms':>10}{'p50 ms':>10}"
                 f"{'p99 ms':>10}{'wall %':>8}"]
        for r in self.rows(now):
            lines.append(f"{r['name'][:31]:<32}{r['count']:>9}{r['total_s']:>10.3f}"
                         f"{r['mean_s'] * 1e3:>10.3f}{r['p50_s'] * 1e3:>10.3f}"
                         f"{r['p99_s'] * 1e3:>10.3f}{r['wall_share'] * 100:>8.1f}")
        counts = self.counters.snapshot() if self.counters is not None else {}
        if counts:
            lines.append(f"{'counter':<32}{'total':>14}{'per s':>14}")
            for name, v in sorted(counts.items()):
                lines.append(f"{name[:31]:<32}{v:>14.6g}{v / wall_s:>14.6g}")
        return "\n".join(lines)


def _q(sorted_values: list[int], q: float) -> float:
    """Quantile ``q`` of a sorted sample (0 when empty), by
    :data:`rltrace.accounting.quantiles.DEFINITION`."""
    return quantile(sorted_values, q) if sorted_values else 0.0
