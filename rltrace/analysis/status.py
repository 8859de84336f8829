"""6. Status and staleness: what happened to the sessions?

Sessions by status over steps, acceptance rate per step, reasons for everything not accepted
(``stale_weight``, exceptions, ...), and acceptance rate per task (a task = one dataset item
on one rank: task ids are per process): its distribution and the tasks accepted least.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rltrace.analysis.descriptive import fnum
from rltrace.analysis.run import Run
from rltrace.analysis.session_aggregates import step_or_none

HIST_EDGES = tuple(i / 10 for i in range(11))
LOWEST = 10


def analyze(run: Run) -> dict[str, Any]:
    s = run.sessions
    names = s.status_names
    n = s.size
    counts = np.bincount(s.status.astype(np.int64), minlength=len(names)) if n else np.zeros(len(names))
    acc_code = names.index("accepted") if "accepted" in names else -1
    overall = {names[i]: int(counts[i]) for i in np.argsort(-counts, kind="stable").tolist()}
    per_step = []
    if n:
        steps, inv = np.unique(s.step, return_inverse=True)
        inv = inv.reshape(-1)
        grid = np.zeros((steps.size, len(names)), dtype=np.int64)
        np.add.at(grid, (inv, s.status.astype(np.int64)), 1)
        for j, st in enumerate(steps.tolist()):
            tot = int(grid[j].sum())
            per_step.append({
                "step": step_or_none(st), "sessions": tot,
                "counts": {names[i]: int(grid[j, i]) for i in range(len(names)) if grid[j, i]},
                "acceptance_rate": fnum(grid[j, acc_code] / tot) if acc_code >= 0 and tot else 0.0,
            })
    not_accepted = {st: c for st, c in overall.items() if st != "accepted"}
    reasons = [{"status": st, "reason": reason, "sessions": c,
                "share_of_status": fnum(c / not_accepted[st]) if not_accepted.get(st) else None}
               for (st, reason), c in sorted(run.reader.reasons.items(), key=lambda kv: -kv[1])]
    return {
        "sessions": n, "counts": overall,
        "acceptance_rate": fnum(counts[acc_code] / n) if n and acc_code >= 0 else (0.0 if n else None),
        "per_step": per_step, "reasons": reasons, "tasks": _tasks(run, acc_code),
    }


def _tasks(run: Run, acc_code: int) -> dict[str, Any]:
    s = run.sessions
    if s.size == 0:
        return {"tasks": 0}
    order = np.lexsort((s.task, s.rank))
    rk, tk = s.rank[order], s.task[order]
    change = np.flatnonzero((np.diff(rk) != 0) | (np.diff(tk) != 0)) + 1
    starts = np.concatenate(([0], change))
    sessions = np.diff(np.concatenate((starts, [order.size])))
    accepted = np.add.reduceat((s.status[order] == acc_code).astype(np.int64), starts)
    rate = accepted / sessions
    hist, _ = np.histogram(rate, bins=HIST_EDGES)
    low = np.lexsort((-sessions, rate))[:LOWEST]
    return {
        "tasks": int(starts.size),
        "mean_acceptance_rate": float(rate.mean()),
        "all_accepted": int(np.sum(rate == 1.0)), "none_accepted": int(np.sum(rate == 0.0)),
        "acceptance_histogram": [{"from": HIST_EDGES[i], "to": HIST_EDGES[i + 1], "tasks": int(hist[i])}
                                 for i in range(len(HIST_EDGES) - 1)],
        "lowest": [{"rank": int(rk[starts[i]]), "task_id": s.task_label(int(tk[starts[i]])),
                    "sessions": int(sessions[i]), "accepted": int(accepted[i]),
                    "acceptance_rate": float(rate[i])} for i in low.tolist()],
    }
