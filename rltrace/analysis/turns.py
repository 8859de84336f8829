"""5. Turns, tools and workers: what does each turn, tool and rollout worker cost?

The tables of verl's multi-turn profiling study, from the session records and traces:

* distribution of turns per session (sessions and fraction by number of turns);
* mean generate time by turn index (every ``generate`` execution, by its ``turn``), overall and
  per step; every phase's time by turn index (time credited by :mod:`.timeline`);
* mean session time by number of turns (own time: submit to its last phase's end, so a
  sample's group wait does not count);
* tool calls by tool (``gen_ai.tool.name`` of the tool-call spans in the traces);
* per worker (rank) and step: sessions, mean and max own time, mean generate time, group wait.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rltrace.analysis.descriptive import fnum
from rltrace.analysis.run import Run
from rltrace.analysis.session_aggregates import rank_step_keys, rank_step_of, step_or_none


def analyze(run: Run) -> dict[str, Any]:
    s = run.sessions
    turns = s.turns.astype(np.int64)
    n = s.size
    dist, by_turns = [], []
    if n:
        counts = np.bincount(np.maximum(turns, 0))
        total_by = np.bincount(np.maximum(turns, 0), weights=s.own.astype(np.float64))
        for t in np.flatnonzero(counts).tolist():
            dist.append({"turns": t, "sessions": int(counts[t]), "fraction": counts[t] / n})
            by_turns.append({"turns": t, "sessions": int(counts[t]), "mean_s": total_by[t] / counts[t]})
    gen: dict[int, list[float]] = {}
    per_step: dict[int | None, dict[int, float]] = {}
    for (step, turn), (total, count) in run.reader.generate_by_turn.items():
        if not isinstance(turn, int):
            continue
        acc = gen.setdefault(turn, [0.0, 0])
        acc[0] += total
        acc[1] += count
        per_step.setdefault(step_or_none(step), {})[turn] = total / count
    generate_by_turn = [{"turn": t, "executions": int(c), "mean_s": tot / c}
                        for t, (tot, c) in sorted(gen.items())]
    return {
        "phase_by_turn": _phase_by_turn(run),
        "tools": _tools(run),
        "workers": _workers(run),
        "sessions": n,
        "mean_turns": fnum(turns.mean()) if n else None,
        "distribution": dist,
        "generate_by_turn": generate_by_turn,
        "session_time_by_turns": by_turns,
        "generate_by_turn_per_step": [
            {"step": st, "mean_s": {str(t): v for t, v in sorted(d.items())}}
            for st, d in sorted(per_step.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))
        ],
    }


def _phase_by_turn(run: Run) -> dict[str, Any]:
    """Turn index -> per phase: executions and mean seconds."""
    phases = sorted({p for p, _ in run.reader.phase_by_turn})
    rows: dict[int, dict[str, Any]] = {}
    for (p, t), (tot, cnt) in run.reader.phase_by_turn.items():
        row = rows.setdefault(t, {"turn": t, "executions": {}, "mean_s": {}, "total_s": {}})
        row["executions"][p] = int(cnt)
        row["mean_s"][p] = tot / cnt
        row["total_s"][p] = tot
    return {"phases": phases, "rows": [rows[t] for t in sorted(rows)]}


def _tools(run: Run) -> list[dict[str, Any]]:
    """Tool calls by tool name, from the traces' tool-call spans."""
    out = []
    for name, q in run.traces.tools.items():
        sm = q.summary((50.0, 99.0))
        if sm["count"]:
            out.append({"tool": name, "calls": sm["count"], "total_s": sm["total"] / 1e6,
                        "mean_s": sm["mean"] / 1e6, "p50_s": sm["q"][0] / 1e6, "p99_s": sm["q"][1] / 1e6,
                        "max_s": sm["max"] / 1e6})
    out.sort(key=lambda r: -r["total_s"])
    return out


def _workers(run: Run) -> list[dict[str, Any]]:
    """Per (rank, step): sessions, own time (mean, max), generate per session, group wait."""
    s = run.sessions
    if s.size == 0:
        return []
    keys = rank_step_keys(s.rank, s.step)
    uniq, inv = np.unique(keys, return_inverse=True)
    inv = inv.reshape(-1)
    count = np.bincount(inv, minlength=uniq.size)
    own = s.own.astype(np.float64)
    own_sum = np.bincount(inv, weights=own, minlength=uniq.size)
    own_max = np.full(uniq.size, -np.inf)
    np.maximum.at(own_max, inv, own)
    gen = s.phases.get("generate")
    gen_sum = np.bincount(inv, weights=gen, minlength=uniq.size) if gen is not None else np.zeros(uniq.size)
    wait = np.bincount(inv, weights=run.tail()[0], minlength=uniq.size)
    out = []
    for i, key in enumerate(uniq.tolist()):
        rank, step = rank_step_of(key)
        out.append({"rank": rank, "step": step_or_none(step), "sessions": int(count[i]),
                    "mean_own_s": own_sum[i] / count[i], "max_own_s": float(own_max[i]),
                    "mean_generate_s": gen_sum[i] / count[i], "group_wait_s": float(wait[i])})
    return out
