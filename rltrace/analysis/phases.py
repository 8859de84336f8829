"""4. Time breakdown: where does the time go, overall and per step?

Two views, because session time and step time are different clocks:

* **session time** (from the session records), decomposed by :mod:`.timeline` into queue
  wait, each phase, the gaps between phases (``after generate, before toolcall``), group wait
  (done, waiting for the slowest sibling of its GRPO group) and ``before finalize``: shares add
  up to 100%.  Sessions run concurrently, so this is *where a session's time goes*, not
  wall-clock time.  A step where a bucket's share jumps (above the median over steps by
  ``k * MAD`` and by at least 5 points) is flagged.
* **train-side scopes** (from the traces): the ``train.*`` scopes directly under each
  ``train.step`` (``train.rollout``, ``train.ppo_update``, ``train.weight_sync``, ...) as a
  share of step wall time, summed over ranks; ``untracked`` is step time in no such scope.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rltrace.analysis import columns
from rltrace.analysis.descriptive import fnum, median_mad, pct
from rltrace.analysis.run import Run
from rltrace.analysis.session_aggregates import step_or_none

MIN_JUMP = 0.05


def _bucket_stats(run: Run) -> dict[str, dict[str, Any]]:
    """Per bucket: sessions that had it, mean/P50/P99 of its seconds per session."""
    out: dict[str, dict[str, Any]] = {}
    for label, q in run.reader.bucket_q.items():
        sm = q.summary((50.0, 99.0))
        out[label] = {"sessions": sm["count"], "mean_s": fnum(sm["mean"]), "p50_s": fnum(sm["q"][0]),
                      "p99_s": fnum(sm["q"][1])}
    wait, fin, _ = run.tail()
    for label, v in ((columns.GROUP, wait), (columns.FINALIZE, fin)):
        ran = v[v > 0]
        p50, p99 = pct(ran, (50.0, 99.0)) if ran.size else (None, None)
        out[label] = {"sessions": int(ran.size), "mean_s": fnum(ran.mean()) if ran.size else None,
                      "p50_s": fnum(p50), "p99_s": fnum(p99)}
    return out


def _session(run: Run) -> dict[str, Any]:
    """Session time by bucket of :mod:`.timeline` (adding up to 100%), overall and per step."""
    if run.sessions.size == 0:
        return {"overall": [], "per_step": [], "anomalies": [], "phases": []}
    by_step = run.buckets_by_step()
    totals: dict[str, float] = {}
    for d in by_step.values():
        for label, v in d.items():
            totals[label] = totals.get(label, 0.0) + v
    grand = sum(totals.values())
    stats = _bucket_stats(run)
    overall = [{"phase": label, "kind": kind_of(label), "total_s": v,
                "share": fnum(v / grand) if grand > 0 else None,
                **stats.get(label, {"sessions": 0, "mean_s": None, "p50_s": None, "p99_s": None})}
               for label, v in totals.items() if v > 0]
    overall.sort(key=lambda r: (-r["total_s"], r["phase"]))
    names = [r["phase"] for r in overall]
    steps = sorted(by_step)
    per_step = []
    shares = np.full((len(names), len(steps)), np.nan)
    for j, st in enumerate(steps):
        d = by_step[st]
        tot = sum(d.values())
        row: dict[str, Any] = {"step": step_or_none(st), "total_s": tot,
                               "phases_s": {p: d.get(p, 0.0) for p in names}}
        row["share"] = {p: fnum(d.get(p, 0.0) / tot) if tot > 0 else None for p in names}
        for i, p in enumerate(names):
            if tot > 0:
                shares[i, j] = d.get(p, 0.0) / tot
        per_step.append(row)
    return {"overall": overall, "per_step": per_step, "anomalies": _anomalies(run, names, steps, shares),
            "phases": names}


def kind_of(label: str) -> str:
    """What a bucket is: queue, phase, gap, group, finalize or none."""
    return {columns.QUEUE: "queue", columns.GROUP: "group", columns.FINALIZE: "finalize",
            columns.NO_PHASE: "none"}.get(label, "gap" if label.startswith("after ") else "phase")


def _anomalies(run: Run, names: list[str], steps: list[int], shares: np.ndarray) -> list[dict[str, Any]]:
    """Steps where a bucket's share jumps above the median over steps by k * MAD and 5 points."""
    out: list[dict[str, Any]] = []
    k = run.options.k
    if len(steps) >= 3:
        for i, p in enumerate(names):
            med, mad = median_mad(shares[i])
            for j, st in enumerate(steps):
                v = shares[i, j]
                if np.isfinite(v) and v - med >= MIN_JUMP and v > med + k * mad:
                    out.append({"step": step_or_none(st), "phase": p, "share": float(v),
                                "median_share": med})
    out.sort(key=lambda a: -(a["share"] - a["median_share"]))
    return out


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
