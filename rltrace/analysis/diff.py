"""``rltrace diff``: what changed between two runs (or two step ranges of one run), beyond the
runs' own step-to-step noise.

Each run is reduced to per-step series of the quantities a step's time is made of: the step's
length (its critical path's: its longest rank's own step, so ranks started apart add nothing),
each role's step time, each goodput bucket, each top-level train
scope, each session-time bucket (phase, queue wait, gap, group wait: mean per session), and
generate time by turn.  A quantity changed when the difference of its means is more than
:data:`Z` standard errors (from the two runs' step-to-step spread) and more than
:data:`MIN_SHARE` of run A's step time (a change too small to matter is not named); with a
single step in a run there is no spread, and only the size test applies.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rltrace.accounting.goodput import BUCKETS
from rltrace.analysis.report import build_report, fmt_pct, fmt_s
from rltrace.analysis.report_shape import Report
from rltrace.analysis.run import ReportOptions, Run, load_run
from rltrace.analysis.session_aggregates import NO_STEP

#: standard errors a difference must exceed
Z = 3.0
#: share of run A's mean step time a difference must exceed
MIN_SHARE = 0.02
STEP_TIME = "step time"


@dataclass
class Side:
    """One side of a diff: its label and per-quantity, per-step values."""

    label: str
    series: dict[str, dict[int, float]]
    steps: int


def series_of(run: Run, rep: Report) -> dict[str, dict[int, float]]:
    """quantity -> step -> value (seconds) for ``run`` and its report ``rep``."""
    out: dict[str, dict[int, float]] = {}

    def put(name: str, step: int, value: float) -> None:
        out.setdefault(name, {})[step] = value

    for st in rep["critical_path"]["steps"]:
        put(STEP_TIME, st["step"], st["length_s"])
    roles = {**run.traces.roles(), **run.reader.roles}
    role_step: dict[tuple[str, int], float] = {}
    scope_sum: dict[tuple[str, int], list[float]] = {}
    for (rank, step), info in run.steps_info.items():
        role = roles.get(rank) or f"rank {rank}"
        key = (role, step)
        role_step[key] = max(role_step.get(key, 0.0), info.dur_us / 1e6)
        for name, us in info.breakdown.items():
            scope_sum.setdefault((name, step), []).append(us / 1e6)
    for (role, step), v in role_step.items():
        put(f"role {role}", step, v)
    for (name, step), vs in scope_sum.items():
        put(f"scope {name}", step, sum(vs) / len(vs))
    ranks_in_step = Counter(step for _, step in run.steps_info)
    for row in rep["goodput"]["by_step"]:
        n = ranks_in_step[row["step"]] or 1
        for b in BUCKETS:
            put(f"goodput {b}", row["step"], row["seconds"][b] / n)
    sessions = _sessions_per_step(run)
    for step, buckets in run.buckets_by_step().items():
        if step == NO_STEP or not sessions.get(step):
            continue
        for label, sec in buckets.items():
            put(f"session {label}", step, sec / sessions[step])
    for (step, turn), (total, count) in run.reader.generate_by_turn.items():
        if step != NO_STEP and count:
            put(f"generate turn {turn}", step, total / count)
    return out


def _sessions_per_step(run: Run) -> dict[int, int]:
    s = run.sessions
    out: dict[int, int] = {}
    for step in s.step.tolist():
        out[step] = out.get(step, 0) + 1
    return out


def side(logdir: str | Path, steps: str | None, label: str) -> Side:
    """Load one side (a log dir, optionally a step range ``A:B``)."""
    from rltrace.analysis.load import StepRange

    opts = ReportOptions(steps=StepRange.parse(steps), progress=False)
    run = load_run(logdir, opts)
    rep = build_report(run)
    series = series_of(run, rep)
    return Side(label + (f" steps {steps}" if steps else ""), series,
                len(series.get(STEP_TIME, {})))


def _stats(values: list[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def compare(a: Side, b: Side) -> dict[str, Any]:
    """Every quantity both sides have: means, difference, its noise, and whether it changed."""
    base_step = statistics.fmean(a.series[STEP_TIME].values()) if a.series.get(STEP_TIME) else None
    rows: list[dict[str, Any]] = []
    for name in sorted(set(a.series) & set(b.series)):
        va, vb = list(a.series[name].values()), list(b.series[name].values())
        (ma, sa), (mb, sb) = _stats(va), _stats(vb)
        delta = mb - ma
        se = math.sqrt(sa * sa / len(va) + sb * sb / len(vb)) if sa is not None and sb is not None else None
        z = abs(delta) / se if se else (math.inf if se == 0 and delta else None)
        floor = MIN_SHARE * (base_step if base_step else max(abs(ma), 1e-12))
        changed = abs(delta) > floor and (z is None or z > Z)
        rows.append({"quantity": name, "a_mean_s": ma, "b_mean_s": mb, "delta_s": delta,
                     "delta_rel": delta / ma if ma else None, "noise_s": se, "z": z, "changed": changed,
                     "a_steps": len(va), "b_steps": len(vb)})
    rows.sort(key=lambda r: (r["quantity"] != STEP_TIME, not r["changed"], -abs(r["delta_s"])))
    only = sorted(set(a.series) ^ set(b.series))
    return {"a": a.label, "b": b.label, "a_steps": a.steps, "b_steps": b.steps, "z": Z,
            "min_share": MIN_SHARE,
            "step_time": next((r for r in rows if r["quantity"] == STEP_TIME), None),
            "changed": [r for r in rows if r["changed"] and r["quantity"] != STEP_TIME],
            "unchanged": [r for r in rows if not r["changed"] and r["quantity"] != STEP_TIME],
            "only_in_one": only}


def _row_text(r: dict[str, Any]) -> str:
    z = "" if r["z"] is None else f", {r['z']:.1f}x its noise" if math.isfinite(r["z"]) else ", no noise"
    sign = "+" if r["delta_s"] >= 0 else "-"
    rel = f", {sign}{fmt_pct(abs(r['delta_rel']))}" if r["delta_rel"] is not None else ""
    return (f"{r['quantity']}: {fmt_s(r['a_mean_s'])} -> {fmt_s(r['b_mean_s'])} "
            f"({sign}{fmt_s(abs(r['delta_s']))}{rel}{z})")


def render_text(d: dict[str, Any]) -> str:
    """The diff for a terminal."""
    lines = [f"rltrace diff: A = {d['a']} ({d['a_steps']} steps), B = {d['b']} ({d['b_steps']} steps)"]
    st = d["step_time"]
    lines.append(_row_text(st) + ("" if st is None or st["changed"] else " — within the runs' noise")
                 if st is not None else "step time: no rltrace.step scopes in one of the runs")
    if d["changed"]:
        lines.append(f"what changed beyond the runs' step-to-step noise (more than {d['z']:g} standard "
                     f"errors and {fmt_pct(d['min_share'])} of A's step time):")
        lines += [f"  {_row_text(r)}" for r in d["changed"]]
    else:
        lines.append("nothing else changed beyond the runs' step-to-step noise")
    if d["unchanged"]:
        lines.append(f"unchanged within noise: {len(d['unchanged'])} quantities")
    return "\n".join(lines)




def render_html(d: dict[str, Any]) -> str:
    """The diff as one HTML page."""
    import jinja2

    from rltrace.analysis.template import DIFF_HTML

    env = jinja2.Environment(autoescape=True)
    env.filters.update(s=fmt_s, pct=fmt_pct)
    rows = ([d["step_time"]] if d["step_time"] else []) + d["changed"] + d["unchanged"]
    return env.from_string(DIFF_HTML).render(d=d, rows=rows)
