"""2. Long tail: when do sessions finish, measured from their step's start?

A session completes when its own work ends (its last phase), not when its group is finalized:
a GRPO sample that waits for its slowest sibling is done before it.  Per step (all ranks
pooled) and overall: P50/P90/P99/P99.9 and max of completion time, and
the *tail fraction* — the share of the step's rollout time (step start to the last session)
spent after 80% of the sessions had finished, i.e. waiting for the last 20%.  Overall it is
``sum(T_end - T_80) / sum(T_end)`` over steps.  The slowest sessions by their own time (submit
to own end) are listed with their time decomposition and the segment that made them slow: the
phase execution (with its turn), queue wait or gap with the largest excess over its median.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from rltrace.analysis.descriptive import fnum, pct, percentiles, quantile_curve
from rltrace.analysis.run import Run
from rltrace.analysis.session_aggregates import step_or_none

TAIL_QUANTILE = 80.0


def _tail(values: np.ndarray) -> tuple[float, float]:
    """(T_end, T_80) of one step's completion times."""
    return float(values.max()), pct(values, (TAIL_QUANTILE,))[0]


def step_groups(steps: np.ndarray) -> tuple[np.ndarray, list[int], list[slice]]:
    """A stable order of sessions by step, the steps in it (NO_STEP = none), a slice per step."""
    order = np.argsort(steps, kind="stable")
    ss = steps[order]
    if ss.size == 0:
        return order, [], []
    cuts = np.flatnonzero(np.diff(ss)) + 1
    bounds = [0, *cuts.tolist(), int(ss.size)]
    return order, [int(ss[b]) for b in bounds[:-1]], [slice(a, b) for a, b in pairwise(bounds)]


def analyze(run: Run) -> dict[str, Any]:
    s = run.sessions
    c = run.completion
    ok = np.isfinite(c)
    out: dict[str, Any] = {"tail_quantile": TAIL_QUANTILE}
    overall = percentiles(c[ok])
    order, steps, slices = step_groups(s.step)
    per_step = []
    curves: dict[int | None, tuple[np.ndarray, np.ndarray]] = {}
    sum_end = sum_wait = 0.0
    for step, sl in zip(steps, slices, strict=True):
        vals = c[order[sl]]
        vals = np.sort(vals[np.isfinite(vals)])
        key = step_or_none(step)
        row: dict[str, Any] = {"step": key, **percentiles(vals)}
        if vals.size:
            t_end, t80 = _tail(vals)
            row["tail_fraction"] = fnum((t_end - t80) / t_end) if t_end > 0 else None
            row["p80_s"] = t80
            if t_end > 0:
                sum_end += t_end
                sum_wait += t_end - t80
            curves[key] = quantile_curve(vals)
        else:
            row["tail_fraction"], row["p80_s"] = None, None
        sources = sorted({rs.start_source for (r, st), rs in run.rank_steps.items() if st == key})
        row["start_source"] = ", ".join(sources)
        per_step.append(row)
    overall["tail_fraction"] = fnum(sum_wait / sum_end) if sum_end > 0 else None
    out["overall"] = overall
    out["per_step"] = per_step
    xs, qs = quantile_curve(np.sort(c[ok]))
    out["cdf"] = {"completion_s": [float(x) for x in xs], "fraction": [float(q) for q in qs]}
    out["slowest_sessions"] = [run.explain(b) for _, _, b in sorted(run.reader.slowest, reverse=True)]
    out["_curves"] = curves
    return out
