"""One time unit per view of the report, shared by its tables and its plots.

A *view* is a block of the HTML or Markdown report with its tables and plots: goodput, the
critical path, the slow groups, the long tail, the stragglers, session time by bucket, the
train-side scopes, turns and tools, the run summary.  Its unit is the largest of s, ms and µs in
which the median of the durations the view shows is at least 1 (:func:`pick`): most of its
numbers have a digit before the point, the longest get thousands separators (``12,345``), the
shortest three significant digits.  A table's header says ``P50 (ms)`` over bare numbers and the
plot beside it has ``(ms)`` on its axis.  Findings, sentences in plain words, keep a unit per
value (:func:`~.report.fmt_s`).  The JSON report stays in seconds (``*_s`` keys).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from rltrace.analysis.report_shape import Report

SCALE: Mapping[str, float] = MappingProxyType({"s": 1.0, "ms": 1e-3, "µs": 1e-6})
#: the unit of a view with no duration
DEFAULT = "s"
#: decimals kept for a value below 1 in its unit (3 significant digits, at most this many)
MAX_DECIMALS = 6


def pick(values: Iterable[float | None]) -> str:
    """The unit of a view whose durations (seconds; None, NaN and 0 skipped) are ``values``: the
    largest in which their median is at least 1."""
    have = sorted(abs(float(v)) for v in values if v is not None and math.isfinite(v) and v != 0)
    if not have:
        return DEFAULT
    mid = have[len(have) // 2]
    for unit in ("s", "ms"):
        if mid >= 0.9995 * SCALE[unit]:
            return unit
    return "µs"


def number(x: float | None, unit: str) -> str:
    """Seconds ``x`` as a bare number in ``unit``: ``1,234``, ``12.3``, ``4.56``, ``0.0123``."""
    if x is None or not math.isfinite(x):
        return "–"
    v = float(x) / SCALE[unit]
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 99.95:
        return f"{v:,.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    if a >= 0.9995:
        return f"{v:.2f}"
    decimals = min(MAX_DECIMALS, 2 - math.floor(math.log10(a)))
    text = f"{v:.{decimals}f}"
    return text if float(text) != 0 else f"<{10.0 ** -MAX_DECIMALS:.{MAX_DECIMALS}f}"


def with_unit(x: float | None, unit: str) -> str:
    """``number(x, unit)`` followed by the unit (``–`` alone when there is no value)."""
    n = number(x, unit)
    return n if n == "–" else f"{n} {unit}"


def _keys(rows: Iterable[dict[str, Any]], *keys: str) -> list[float | None]:
    return [r.get(k) for r in rows for k in keys]


def _goodput(rep: Report) -> list[float | None]:
    gp = rep["goodput"]
    return [*_keys(gp["by_step"], "wall_s"), *_keys(gp["staleness"]["thrown_away"], "seconds")]


def _critical(rep: Report) -> list[float | None]:
    steps = rep["critical_path"]["steps"]
    return [*_keys(steps, "length_s"), *_keys((k for s in steps for k in s["links"]), "seconds")]


def _groups(rep: Report) -> list[float | None]:
    gs = rep["groups"]["groups"]
    return [*_keys(gs, "span_s"), *_keys((m for g in gs for m in g["members"]), "own_s", "total_s")]


def _longtail(rep: Report) -> list[float | None]:
    lt = rep["longtail"]
    pcts = ("p50_s", "p90_s", "p99_s", "p999_s", "max_s")
    return [*_keys([lt["overall"], *lt["per_step"]], *pcts),
            *_keys(lt["slowest_sessions"], "own_s", "total_s", "completion_s")]


def _stragglers(rep: Report) -> list[float | None]:
    sg = rep["stragglers"]
    return [*_keys(sg["per_step"], "fastest_s", "slowest_s"), *_keys(sg["per_rank"], "mean_rollout_s")]


def _session_phases(rep: Report) -> list[float | None]:
    ps = rep["phases"]["session"]
    return [*_keys(ps["overall"], "total_s", "mean_s", "p50_s", "p99_s"), *_keys(ps["per_step"], "total_s")]


def _train_phases(rep: Report) -> list[float | None]:
    tr = rep["phases"]["train"]
    return [*_keys(tr["overall"], "total_s"), *(v for r in tr["per_step"] for v in r["mean_s"].values())]


def _turns(rep: Report) -> list[float | None]:
    tu = rep["turns"]
    return [*_keys(tu["session_time_by_turns"], "mean_s"), *_keys(tu["generate_by_turn"], "mean_s"),
            *(v for r in tu["phase_by_turn"]["rows"] for v in r["mean_s"].values()),
            *_keys(tu["tools"], "total_s", "mean_s", "p50_s", "p99_s", "max_s"),
            *_keys(tu["workers"], "mean_own_s", "max_own_s", "mean_generate_s")]


def _summary(rep: Report) -> list[float | None]:
    return _keys(rep["summary"]["scopes"], "total_s", "mean_s", "p50_s", "p99_s", "max_s")


#: view -> the durations that decide its unit
VIEWS: Mapping[str, Callable[[Report], list[float | None]]] = MappingProxyType({
    "goodput": _goodput, "critical": _critical, "groups": _groups, "longtail": _longtail,
    "stragglers": _stragglers, "session_phases": _session_phases, "train_phases": _train_phases,
    "turns": _turns, "summary": _summary,
})


def view_units(rep: Report) -> dict[str, str]:
    """view -> its time unit (see the module docstring)."""
    return {view: pick(values(rep)) for view, values in VIEWS.items()}


def unit_of(rep: Report, view: str) -> str:
    """The unit of ``view`` in ``rep`` (:data:`DEFAULT` when the report has none: a plot drawn
    from a hand-made report)."""
    units: dict[str, str] = rep.get("_units") or {}
    return units.get(view, DEFAULT)
