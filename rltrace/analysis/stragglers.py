"""3. Stragglers: which rank holds the step up, and what does it cost?

Rollout time per (rank, step): the rollout scope's duration, else the last session's
finalization minus the step start.  Per step: the fastest and slowest rank, the barrier wait
(slowest minus fastest: what a synchronous step loses to its slowest rank), the idle rank
time (every rank's wait for the slowest) and who held the step: on the slowest rank, the
session that finished its own work last, with its slowest segment (phase and turn).
Outliers: a (rank, step) whose rollout time exceeds ``median + k * MAD`` over all (rank, step)
rollout times (MAD floored at 1% of the median, so identical ranks do not flag noise) and whose
*excess over the step's fastest rank* (rollout / fastest - 1) exceeds the run's own noise:
``median + k * spread`` of that excess over every (rank, step), the spread being 1.4826 × its MAD
(a standard deviation for normal noise), floored at 1%. So a whole slow step is no straggler, nor
is a rank a few percent slower in a run whose ranks vary more than that from step to step. A
straggler is slower than another rank of its step: a step with one rank that has a rollout time
(every step of a one-rank run) has nobody to straggle behind, so it is never an outlier here,
however slow (a slow step is the long tail's and the critical path's business), and its barrier
wait is 0. Each outlier names the rank and the sessions that finished their own work last there,
with the segment that made them slow. The same noise limit decides whether a rank that is the
slowest in most steps is worth a finding (its median excess must pass it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rltrace.analysis.descriptive import fnum, median_mad
from rltrace.analysis.run import Run

MAD_FLOOR = 0.01
#: MAD -> standard deviation, for normally distributed noise
MAD_TO_SD = 1.4826


def matrix(run: Run) -> tuple[list[int], list[int], np.ndarray]:
    """Ranks, steps and the ranks x steps matrix of rollout seconds (NaN where missing)."""
    ranks, steps = run.ranks, run.steps
    m = np.full((len(ranks), len(steps)), np.nan)
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: j for j, s in enumerate(steps)}
    for (r, st), rs in run.rank_steps.items():
        if st is None:
            continue
        v = rs.rollout_s
        if v is not None:
            m[ri[r], si[st]] = v
    return ranks, steps, m


HOLDER_KEYS = ("rank", "role", "step", "task_id", "session_id", "own_s", "completion_s", "slow_phase",
               "slow_turn", "slow_kind", "slow_phase_s", "slow_phase_x_median", "slow_share")


def holder(run: Run, rank: int, step: int) -> dict[str, Any] | None:
    """The session that held a step on its slowest rank: the last to finish its own work there."""
    latest = run.reader.latest.get((rank, step))
    if not latest:
        return None
    b = run.explain(max(latest, key=lambda t: (t[0], t[1]))[2])
    return {k: b.get(k) for k in HOLDER_KEYS}


def excess_over_fastest(m: np.ndarray) -> np.ndarray:
    """Each (rank, step)'s rollout over its step's fastest rank's, minus 1 (NaN where it has no
    rollout time, or its step fewer than two ranks with one, or a fastest of 0)."""
    finite = np.isfinite(m)
    fastest = np.min(np.where(finite, m, np.inf), axis=0, initial=np.inf)
    usable = (finite.sum(axis=0) >= 2) & (fastest > 0) & np.isfinite(fastest)
    e = np.full(m.shape, np.nan)
    cols = np.flatnonzero(usable)
    e[:, cols] = m[:, cols] / fastest[cols] - 1.0
    return e


def noise(e: np.ndarray, k: float) -> dict[str, float | None]:
    """The run's own noise in the excess over the step's fastest rank (``e``): its median, its
    spread (1.4826 × MAD, floored at MAD_FLOOR) and the limit ``median + k * spread`` a straggler
    must pass (all None without two ranks in any step)."""
    med, mad = median_mad(e)
    if not math.isfinite(med):
        return {"excess_median": None, "excess_spread": None, "excess_limit": None}
    spread = max(MAD_TO_SD * mad, MAD_FLOOR)
    return {"excess_median": med, "excess_spread": spread, "excess_limit": med + k * spread}


def analyze(run: Run) -> dict[str, Any]:
    """The stragglers section of the report (see the module docstring)."""
    k = run.options.k
    ranks, steps, m = matrix(run)
    med, mad = median_mad(m)
    mad_used = max(mad, MAD_FLOOR * med) if math.isfinite(med) else math.nan
    threshold = med + k * mad_used if math.isfinite(med) else math.nan
    excess = excess_over_fastest(m)
    nz = noise(excess, k)
    per_step = [_step_row(run, ranks, st, m[:, j]) for j, st in enumerate(steps)]
    outliers = _outliers(run, ranks, steps, m, per_step, med, mad_used, threshold,
                         _beyond_noise(excess, nz["excess_limit"]))
    total_wait, total_idle, total_step = _totals(run, ranks, per_step)
    return {
        "k": k, "median_s": fnum(med), "mad_s": fnum(mad), "threshold_s": fnum(threshold),
        "noise": nz,
        "ranks": ranks, "per_step": per_step, "per_rank": _per_rank(ranks, m, outliers), "outliers": outliers,
        "total_barrier_wait_s": total_wait, "total_idle_rank_s": total_idle,
        "total_step_s": total_step,
        "barrier_wait_share": fnum(total_wait / total_step) if total_step > 0 else None,
        "_matrix": (ranks, steps, m),
    }


def _fastest_slowest(col: np.ndarray, have: np.ndarray) -> tuple[int, int]:
    """Row indices of the fastest and the slowest rank among those with a rollout time (``have``)."""
    return int(have[np.argmin(col[have])]), int(have[np.argmax(col[have])])


def _step_row(run: Run, ranks: list[int], st: int, col: np.ndarray) -> dict[str, Any]:
    """One step: each rank's rollout seconds (``col``), and where any rank has one, the fastest and
    slowest rank, the barrier wait, the idle rank time and the session that held the step."""
    have = np.flatnonzero(np.isfinite(col))
    row: dict[str, Any] = {"step": st, "rollout_s": {str(ranks[i]): float(col[i]) for i in have}}
    if not have.size:
        return row
    fast_i, slow_i = _fastest_slowest(col, have)
    fast, slow = float(col[fast_i]), float(col[slow_i])
    row.update(fastest_rank=ranks[fast_i], slowest_rank=ranks[slow_i], fastest_s=fast,
               slowest_s=slow, barrier_wait_s=slow - fast,
               idle_rank_s=float(np.sum(slow - col[have])),
               slowest_over_fastest=fnum(slow / fast) if fast > 0 else None)
    row["held_by"] = holder(run, ranks[slow_i], st)
    return row


def _totals(run: Run, ranks: list[int], per_step: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Over the steps with rollout times: barrier wait, idle rank time and step time (the longest
    step scope of the step's ranks, else its slowest rollout), in seconds."""
    total_wait = total_idle = total_step = 0.0
    for row in per_step:
        if "slowest_s" not in row:
            continue
        st, slow = row["step"], row["slowest_s"]
        total_wait += row["barrier_wait_s"]
        total_idle += row["idle_rank_s"]
        durs = [run.steps_info[(r, st)].dur_us / 1e6 for r in ranks if (r, st) in run.steps_info]
        total_step += max(durs) if durs else slow
    return total_wait, total_idle, total_step


def _beyond_noise(excess: np.ndarray, limit: float | None) -> np.ndarray:
    """Where a (rank, step) may be an outlier by the noise test: its excess over the step's fastest
    rank passes ``limit``.  Never where it cannot be compared (its step has one rank with a
    rollout time, NaN excess): a rank is no straggler against itself."""
    if limit is None:  # no step has two ranks with a rollout time
        return np.zeros(excess.shape, dtype=bool)
    ok: np.ndarray = np.isfinite(excess) & (excess > limit)
    return ok


def _outliers(run: Run, ranks: list[int], steps: list[int], m: np.ndarray, per_step: list[dict[str, Any]],
              med: float, mad_used: float, threshold: float, noisy_ok: np.ndarray) -> list[dict[str, Any]]:
    """The (rank, step) rollout times above ``threshold`` where ``noisy_ok`` (beyond the run's
    noise), by step then slowest first, each with the sessions that finished their own work last
    there (none when the threshold is NaN)."""
    outliers: list[dict[str, Any]] = []
    if not math.isfinite(threshold):
        return outliers
    hit = (np.nan_to_num(m, nan=-np.inf) > threshold) & noisy_ok
    for i, j in zip(*np.nonzero(hit), strict=True):
        r, st = ranks[int(i)], steps[int(j)]
        v = float(m[i, j])
        latest = sorted(run.reader.latest.get((r, st), []), reverse=True)
        outliers.append({
            "step": st, "rank": r, "rollout_s": v, "median_s": med,
            "excess_mads": fnum((v - med) / mad_used) if mad_used > 0 else None,
            "slowest_rank_of_step": per_step[int(j)].get("slowest_rank") == r,
            "sessions": [run.explain(b) for _, _, b in latest],
        })
    outliers.sort(key=lambda o: (o["step"], -o["rollout_s"]))
    return outliers


def _rank_tallies(ranks: list[int], m: np.ndarray) -> tuple[dict[int, int], dict[int, list[float]]]:
    """Over the steps where two or more ranks have a rollout time: per rank, how often it was the
    slowest, and its rollout time over the fastest rank's in each (when the fastest's is > 0)."""
    slowest_count = dict.fromkeys(ranks, 0)
    ratios: dict[int, list[float]] = {r: [] for r in ranks}
    for j in range(m.shape[1]):
        col = m[:, j]
        have = np.flatnonzero(np.isfinite(col))
        if have.size <= 1:
            continue
        fast_i, slow_i = _fastest_slowest(col, have)
        fast = float(col[fast_i])
        slowest_count[ranks[slow_i]] += 1
        if fast > 0:
            for i in have:
                ratios[ranks[i]].append(float(col[i]) / fast)
    return slowest_count, ratios


def _per_rank(ranks: list[int], m: np.ndarray, outliers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: steps with a rollout time, mean rollout, median ratio to the fastest rank, steps
    where it was the slowest, and its outlier steps."""
    slowest_count, ratios = _rank_tallies(ranks, m)
    per_rank = []
    for ri, r in enumerate(ranks):
        row_vals = m[ri][np.isfinite(m[ri])]
        per_rank.append({
            "rank": r, "steps": int(row_vals.size),
            "mean_rollout_s": fnum(row_vals.mean()) if row_vals.size else None,
            "median_ratio_to_fastest": fnum(np.median(ratios[r])) if ratios[r] else None,
            "slowest_in_steps": slowest_count[r],
            "outlier_steps": sum(1 for o in outliers if o["rank"] == r),
        })
    return per_rank
