"""3. Phase breakdown: where does the time go, overall and per step?

Two views, because session time and step time are different clocks:

* **session phases** (from the session records): each phase's share of the total session time
  (``generate``, ``toolcall``, ``reward``, custom phases; ``other`` is session time outside
  any phase — queueing, overhead).  Sessions run concurrently, so this is *where a session's
  time goes*, not wall-clock time.  A step where a phase's share jumps (above the median over
  steps by ``k * MAD`` and by at least 5 points) is flagged.
* **train-side scopes** (from the traces): the ``train.*`` scopes directly under each
  ``train.step`` (``train.rollout``, ``train.ppo_update``, ``train.weight_sync``, ...) as a
  share of step wall time, summed over ranks; ``untracked`` is step time in no such scope.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .run import Run
from .stats import fnum, median_mad

MIN_JUMP = 0.05


def _session(run: Run) -> dict[str, Any]:
    s = run.sessions
    if s.size == 0:
        return {"overall": [], "per_step": [], "anomalies": [], "phases": []}
    cols: dict[str, np.ndarray] = {p: c for p, c in s.phases.items() if np.any(c > 0)}  # float32, no copies
    other = run.other_s()
    if other.sum() > 0:
        cols["other"] = other
    total = s.total
    grand = float(total.sum(dtype=np.float64))
    overall = []
    for p, c in cols.items():
        ran = c[c > 0]
        pct = np.percentile(ran, (50, 99)) if ran.size else (None, None)
        csum = float(c.sum(dtype=np.float64))
        overall.append({"phase": p, "total_s": csum,
                        "share": fnum(csum / grand) if grand > 0 else None,
                        "sessions": int(ran.size),
                        "mean_s": fnum(ran.mean(dtype=np.float64)) if ran.size else None,
                        "p50_s": fnum(pct[0]), "p99_s": fnum(pct[1])})
        del ran
    overall.sort(key=lambda r: (r["phase"] == "other", -r["total_s"], r["phase"]))
    names = [r["phase"] for r in overall]
    steps, inv = np.unique(s.step, return_inverse=True)
    inv = inv.reshape(-1)
    tot_by = np.bincount(inv, weights=total, minlength=steps.size)
    sums = {p: np.bincount(inv, weights=cols[p], minlength=steps.size) for p in names}
    per_step = []
    shares = np.full((len(names), steps.size), np.nan)
    for j, st in enumerate(steps.tolist()):
        row: dict[str, Any] = {"step": None if st < 0 else st, "total_s": float(tot_by[j]),
                               "phases_s": {p: float(sums[p][j]) for p in names}}
        row["share"] = {p: fnum(sums[p][j] / tot_by[j]) if tot_by[j] > 0 else None for p in names}
        for i, p in enumerate(names):
            if tot_by[j] > 0:
                shares[i, j] = sums[p][j] / tot_by[j]
        per_step.append(row)
    anomalies = []
    k = run.options.k
    if steps.size >= 3:
        for i, p in enumerate(names):
            med, mad = median_mad(shares[i])
            for j, st in enumerate(steps.tolist()):
                v = shares[i, j]
                if np.isfinite(v) and v - med >= MIN_JUMP and v > med + k * mad:
                    anomalies.append({"step": None if st < 0 else st, "phase": p, "share": float(v),
                                      "median_share": med})
    anomalies.sort(key=lambda a: -(a["share"] - a["median_share"]))
    return {"overall": overall, "per_step": per_step, "anomalies": anomalies, "phases": names}


def _train(run: Run) -> dict[str, Any]:
    infos = run.steps_info
    if not infos:
        return {"overall": [], "per_step": [], "scopes": []}
    by_step: dict[int, dict[str, float]] = {}
    ranks_by_step: dict[int, int] = {}
    totals: dict[str, float] = {}
    step_total = 0.0
    for (_r, st), info in infos.items():
        d = by_step.setdefault(st, {})
        ranks_by_step[st] = ranks_by_step.get(st, 0) + 1
        inside = 0.0
        for name, us in info.breakdown.items():
            d[name] = d.get(name, 0.0) + us / 1e6
            totals[name] = totals.get(name, 0.0) + us / 1e6
            inside += us / 1e6
        rest = max(info.dur_us / 1e6 - inside, 0.0)
        d["untracked"] = d.get("untracked", 0.0) + rest
        totals["untracked"] = totals.get("untracked", 0.0) + rest
        d["_step"] = d.get("_step", 0.0) + info.dur_us / 1e6
        step_total += info.dur_us / 1e6
    names = [*sorted((n for n in totals if n != "untracked"), key=lambda n: -totals[n]), "untracked"]
    overall = [{"scope": n, "total_s": totals[n],
                "share": fnum(totals[n] / step_total) if step_total > 0 else None} for n in names]
    per_step = []
    for st in sorted(by_step):
        d = by_step[st]
        n = ranks_by_step[st]
        per_step.append({"step": st, "ranks": n, "step_s_mean": d["_step"] / n,
                         "mean_s": {name: d.get(name, 0.0) / n for name in names},
                         "share": {name: fnum(d.get(name, 0.0) / d["_step"]) if d["_step"] > 0 else None
                                   for name in names}})
    return {"overall": overall, "per_step": per_step, "scopes": names, "total_step_s": step_total}


def analyze(run: Run) -> dict[str, Any]:
    return {"session": _session(run), "train": _train(run)}
