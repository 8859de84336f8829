"""The report: every analysis of a :class:`~.run.Run`, plus findings in plain words."""

from __future__ import annotations

import datetime
import math
from collections import Counter
from typing import Any

from . import longtail, phases, status, stragglers, summary, turns
from .run import Run

SCHEMA_VERSION = 1
MAX_OUTLIER_FINDINGS = 5


def fmt_s(x: float | None) -> str:
    """Seconds for people: ``850 µs``, ``12.3 ms``, ``4.56 s``."""
    if x is None or not math.isfinite(x):
        return "–"
    a = abs(x)
    if a < 0.9995e-3:
        return f"{x * 1e6:.0f} µs"
    if a < 0.9995:
        return f"{x * 1e3:.1f} ms"
    if a < 99.995:
        return f"{x:.2f} s"
    return f"{x:.0f} s"


def fmt_pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def session_name(b: dict[str, Any]) -> str:
    step = "–" if b.get("step") is None else b["step"]
    return f"rank {b['rank']} step {step} task {b.get('task_id')} session {b.get('session_id')}"


def why_slow(b: dict[str, Any]) -> str:
    p = b.get("slow_phase")
    if p is None:
        return "no phase recorded"
    ratio = b.get("slow_phase_x_median")
    return f"{p} {fmt_s(b.get('slow_phase_s'))}" + (f", {ratio:.1f}× its median" if ratio else "")


def build_report(run: Run) -> dict[str, Any]:
    """Every analysis as one JSON-ready dict (keys starting with ``_`` hold plot data)."""
    s = run.sessions
    rep: dict[str, Any] = {
        "rltrace_report": SCHEMA_VERSION,
        "generated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "logdir": str(run.logdir),
        "options": {"steps": str(run.options.steps), "k": run.options.k, "top": run.options.top,
                    "step_scope": run.options.step_scope, "rollout_scope": run.options.rollout_scope,
                    "train_prefix": run.options.train_prefix},
        "inputs": {
            "session_files": [str(p) for p in run.session_files],
            "trace_files": [str(p) for p in run.trace_files],
            "sessions": s.size, "sessions_outside_steps": run.reader.filtered,
            "trace_events": run.traces.events, "ranks": run.ranks, "steps": run.steps,
            "skipped_lines": run.skipped.count, "skipped": list(run.skipped.messages),
        },
    }
    rep["longtail"] = longtail.analyze(run)
    rep["stragglers"] = stragglers.analyze(run)
    rep["phases"] = phases.analyze(run)
    rep["turns"] = turns.analyze(run)
    rep["status"] = status.analyze(run)
    rep["summary"] = summary.analyze(run)
    rep["findings"] = findings(rep)
    rep["plots"] = {}
    return rep


def findings(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's headline observations, most actionable first."""
    out: list[dict[str, Any]] = []

    def add(kind: str, text: str, **extra: Any) -> None:
        out.append({"kind": kind, "text": text, **extra})

    sg = rep["stragglers"]
    for o in sg["outliers"][:MAX_OUTLIER_FINDINGS]:
        who = "; ".join(f"{session_name(b)} finished at {fmt_s(b.get('completion_s'))} "
                        f"({why_slow(b)})" for b in o["sessions"][:2])
        add("straggler", f"Step {o['step']}: rank {o['rank']} rollout took {fmt_s(o['rollout_s'])} "
            f"(median {fmt_s(o['median_s'])}, +{(o['excess_mads'] or 0):.1f} MAD). "
            f"Last to finish: {who or 'no session records'}.", step=o["step"], rank=o["rank"])
    if len(sg["outliers"]) > MAX_OUTLIER_FINDINGS:
        add("straggler", f"…and {len(sg['outliers']) - MAX_OUTLIER_FINDINGS} more outlier (rank, step) "
            f"rollouts (see Stragglers).")
    n_steps = sum(1 for r in sg["per_step"] if "slowest_rank" in r)
    if len(sg["ranks"]) > 1 and n_steps >= 2:
        worst = max(sg["per_rank"], key=lambda r: r["slowest_in_steps"])
        if worst["slowest_in_steps"] * 2 > n_steps:
            add("straggler", f"Rank {worst['rank']} is the slowest rank in {worst['slowest_in_steps']} of "
                f"{n_steps} steps (median {worst['median_ratio_to_fastest'] or 0:.2f}× the fastest).",
                rank=worst["rank"])
    if sg["barrier_wait_share"] is not None and sg["total_barrier_wait_s"] > 0:
        add("barrier", f"Barrier wait (slowest minus fastest rank's rollout) totals "
            f"{fmt_s(sg['total_barrier_wait_s'])}, {fmt_pct(sg['barrier_wait_share'])} of step time.")
    lt = rep["longtail"]
    ov = lt["overall"]
    if ov["count"]:
        add("longtail", f"Long tail: the last 20% of sessions take {fmt_pct(ov['tail_fraction'])} of "
            f"rollout time; completion after step start P50 {fmt_s(ov['p50_s'])}, P90 "
            f"{fmt_s(ov['p90_s'])}, P99 {fmt_s(ov['p99_s'])}, max {fmt_s(ov['max_s'])}.")
    slow = lt["slowest_sessions"]
    if slow:
        add("session", f"Slowest session: {session_name(slow[0])}, {fmt_s(slow[0]['total_s'])} "
            f"({why_slow(slow[0])}).", slow_phase=slow[0].get("slow_phase"))
        blame = Counter(b.get("slow_phase") for b in slow)
        phase, n = blame.most_common(1)[0]
        if len(slow) > 1 and phase is not None:
            add("session", f"{n} of the {len(slow)} slowest sessions were slow in {phase}.",
                slow_phase=phase)
    ph = rep["phases"]["session"]
    for a in ph["anomalies"][:MAX_OUTLIER_FINDINGS]:
        add("phase", f"Step {a['step']}: {a['phase']} takes {fmt_pct(a['share'])} of session time "
            f"(median over steps {fmt_pct(a['median_share'])}).", step=a["step"], phase=a["phase"])
    if ph["overall"]:
        parts = ", ".join(f"{r['phase']} {fmt_pct(r['share'])}" for r in ph["overall"][:4])
        add("phase", f"Session time by phase: {parts}.")
    tr = rep["phases"]["train"]
    if tr["overall"]:
        parts = ", ".join(f"{r['scope']} {fmt_pct(r['share'])}" for r in tr["overall"][:4])
        add("phase", f"Step time by train-side scope: {parts}.")
    tu = rep["turns"]
    bt = tu["session_time_by_turns"]
    if tu["mean_turns"] is not None and len(bt) > 1 and bt[0]["mean_s"] > 0:
        add("turns", f"Sessions take {tu['mean_turns']:.2f} turns on average; {bt[-1]['turns']}-turn "
            f"sessions take {bt[-1]['mean_s'] / bt[0]['mean_s']:.1f}× as long as "
            f"{bt[0]['turns']}-turn ones.")
    st = rep["status"]
    if st["sessions"]:
        parts = []
        for name, c in st["counts"].items():
            if name == "accepted":
                continue
            top = [r for r in st["reasons"] if r["status"] == name][:1]
            why = f" (mostly {top[0]['reason']}: {fmt_pct(top[0]['share_of_status'])})" if top else ""
            parts.append(f"{name} {fmt_pct(c / st['sessions'])}{why}")
        add("status", f"Acceptance {fmt_pct(st['acceptance_rate'])}" + (f"; {', '.join(parts)}" if parts
                                                                       else "") + ".")
    if rep["inputs"]["skipped_lines"]:
        add("input", f"{rep['inputs']['skipped_lines']} unreadable line(s) skipped: "
            f"{rep['inputs']['skipped'][0]}.")
    return out


def public(obj: Any) -> Any:
    """The report without plot data (keys starting with ``_``), for JSON."""
    if isinstance(obj, dict):
        return {k: public(v) for k, v in obj.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(obj, (list, tuple)):
        return [public(v) for v in obj]
    return obj
