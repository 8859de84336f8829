"""4. Turns: how many turns do sessions take, and what does each turn cost?

* distribution of turns per session (sessions and fraction by number of turns);
* mean generate time by turn index (every ``generate`` execution, by its ``turn``), overall and
  per step;
* mean session time by number of turns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .run import Run
from .stats import fnum


def analyze(run: Run) -> dict[str, Any]:
    s = run.sessions
    turns = s.turns.astype(np.int64)
    n = s.size
    dist, by_turns = [], []
    if n:
        counts = np.bincount(np.maximum(turns, 0))
        total_by = np.bincount(np.maximum(turns, 0), weights=s.total.astype(np.float64))
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
        per_step.setdefault(None if step < 0 else step, {})[turn] = total / count
    generate_by_turn = [{"turn": t, "executions": int(c), "mean_s": tot / c}
                        for t, (tot, c) in sorted(gen.items())]
    return {
        "sessions": n,
        "mean_turns": fnum(turns.mean()) if n else None,
        "distribution": dist,
        "generate_by_turn": generate_by_turn,
        "session_time_by_turns": by_turns,
        "generate_by_turn_per_step": [
            {"step": st, "mean_s": {str(t): v for t, v in sorted(d.items())}}
            for st, d in sorted(per_step.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
        ],
    }
