"""7. Run summary (the azul plan's ``print_summary``, from the trace files of every rank).

Per scope name: count, total, mean, p50, p99, max and share of wall time, where wall time is
summed over ranks (each rank: first to last event), so a scope that runs on every rank for the
whole run has share 1.0; concurrent scopes (sessions, phases) can exceed it.  Percentiles
(:data:`rltrace.accounting.quantiles.DEFINITION`, as everywhere) are exact up to 8192 executions of a name,
then estimated from a log histogram within one bin, ~2.3% (bounded memory).
User counters (``rltrace.counter(name).add(n)``, written as ``"C"`` events holding the running
total): per rank the last value (minus the value before the first selected step, with
``--steps``) divided by that rank's wall time; the run's rate is the sum over ranks.
"""

from __future__ import annotations

from typing import Any

from rltrace.analysis.descriptive import fnum
from rltrace.analysis.run import Run


def analyze(run: Run) -> dict[str, Any]:
    walls = run.traces.rank_walls()
    wall_total = sum(walls.values())
    scopes = []
    for name, q in run.traces.scopes.items():
        sm = q.summary((50.0, 99.0))
        if not sm["count"]:
            continue
        scopes.append({
            "name": name, "count": sm["count"], "total_s": sm["total"] / 1e6,
            "mean_s": sm["mean"] / 1e6, "p50_s": sm["q"][0] / 1e6, "p99_s": sm["q"][1] / 1e6,
            "max_s": sm["max"] / 1e6,
            "wall_share": fnum(sm["total"] / 1e6 / wall_total) if wall_total > 0 else None,
            "exact_percentiles": sm["exact"],
        })
    scopes.sort(key=lambda r: -r["total_s"])
    counters = []
    for name, per_rank in sorted(run.traces.counter_totals().items()):
        rates = {r: (v / walls[r] if walls.get(r) else None) for r, v in per_rank.items()}
        counters.append({
            "name": name, "total": sum(per_rank.values()),
            "rate_per_s": fnum(sum(v for v in rates.values() if v is not None)),
            "per_rank": {str(r): {"total": v, "rate_per_s": fnum(rates[r])}
                         for r, v in sorted(per_rank.items())},
        })
    return {"wall_s": {str(r): w for r, w in walls.items()}, "wall_total_s": wall_total,
            "trace_events": run.traces.events, "scopes": scopes, "counters": counters}
