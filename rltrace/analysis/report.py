"""The report: every analysis of a :class:`~.run.Run`, plus findings in plain words."""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from rltrace.analysis import (
    critical,
    goodput,
    groups,
    longtail,
    phases,
    status,
    stragglers,
    summary,
    turns,
    units,
)
from rltrace.analysis.load import skip_summary
from rltrace.analysis.report_shape import Report
from rltrace.analysis.run import Run

SCHEMA_VERSION = 1
MAX_OUTLIER_FINDINGS = 5
MAX_GROUP_FINDINGS = 3


def fmt_s(x: float | None, unit: str | None = None) -> str:
    """Seconds for people: ``850 µs``, ``12.3 ms``, ``4.56 s``; in ``unit`` when given (a view's,
    :mod:`.units`)."""
    if unit is not None:
        return units.with_unit(x, unit)
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


def rank_name(rank: object, role: str | None = None) -> str:
    """``rank 3``, or ``rank 3 (rollout)`` when its records name a role (a Ray actor's)."""
    return f"rank {rank} ({role})" if role else f"rank {rank}"


def session_name(b: dict[str, Any]) -> str:
    step = "–" if b.get("step") is None else b["step"]
    return (f"{rank_name(b['rank'], b.get('role'))} step {step} task {b.get('task_id')} "
            f"session {b.get('session_id')}")


def segment_name(b: dict[str, Any]) -> str:
    """The slow segment of a described session: ``generate turn 1``, ``queue wait``, a gap."""
    p = b.get("slow_phase")
    if p is None:
        return "no phase recorded"
    turn = b.get("slow_turn")
    return f"{p} turn {turn}" if b.get("slow_kind") == "phase" and turn is not None else str(p)


def why_slow(b: dict[str, Any], unit: str | None = None) -> str:
    """``generate turn 1 0.90 s (75% of its own time, 9.0× the median)`` (times in ``unit``)."""
    if b.get("slow_phase") is None:
        return "no phase recorded"
    parts = []
    if b.get("slow_share") is not None:
        parts.append(f"{fmt_pct(b['slow_share'])} of its own time")
    if b.get("slow_phase_x_median"):
        parts.append(f"{b['slow_phase_x_median']:.1f}× the median")
    why = f" ({', '.join(parts)})" if parts else ""
    return f"{segment_name(b)} {fmt_s(b.get('slow_phase_s'), unit)}{why}"


def build_report(run: Run) -> Report:
    """Every analysis as one JSON-ready dict (keys starting with ``_`` hold plot data)."""
    s = run.sessions
    rep: Report = {
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
            "sessions_step_from_scopes": run.reader.resolved,
            "trace_events": run.traces.events, "ranks": run.ranks, "steps": run.steps,
            "roles": {str(r): role for r, role in sorted(run.reader.roles.items())},
            "skipped_lines": run.skipped.count, "skipped_fields": run.skipped.fields,
            "skipped": list(run.skipped.messages),
        },
    }
    rep["groups"] = groups.analyze(run)
    rep["longtail"] = longtail.analyze(run)
    rep["stragglers"] = stragglers.analyze(run)
    rep["phases"] = phases.analyze(run)
    rep["turns"] = turns.analyze(run)
    rep["status"] = status.analyze(run)
    rep["summary"] = summary.analyze(run)
    rep["goodput"] = goodput.build(run)
    rep["critical_path"] = critical.analyze(run)
    rep["findings"] = findings(rep)
    rep["plots"] = {}
    rep["_units"] = units.view_units(rep)
    return rep


Add = Callable[..., None]


def findings(rep: Report) -> list[dict[str, Any]]:
    """The report's headline observations, most actionable first."""
    out: list[dict[str, Any]] = []

    def add(kind: str, text: str, **extra: object) -> None:
        out.append({"kind": kind, "text": text, **extra})

    for section in (_group_findings, _straggler_findings, _critical_findings, _goodput_findings,
                    _longtail_findings, _session_findings, _breakdown_findings, _turn_findings,
                    _tool_findings, _status_findings, _input_findings):
        section(rep, add)
    return out


def _group_findings(rep: Report, add: Add) -> None:
    for i, g in enumerate(rep["groups"]["groups"][:MAX_GROUP_FINDINGS]):
        h = g["holder"]
        head = "Slowest group" if i == 0 else "Group"
        text = (f"{head}: {_rank(rep, g['rank'])} step {_step(g['step'])} task {g['task_id']} "
                f"({g['sessions']} sessions) took {fmt_s(g['span_s'])}; session {h['session_id']} held it: "
                f"{why_slow(h)}.")
        sib = g["siblings_own_s"]
        if sib:
            lo, hi = fmt_s(min(sib)), fmt_s(max(sib))
            rng = lo if lo == hi else f"{lo}–{hi}"
            text += (f" Its {len(sib)} sibling(s) finished their own work in {rng}, then waited: group wait "
                     f"{fmt_s(g['group_wait_s'])}, "
                     f"{fmt_pct(g['group_wait_share'])} of the group's session time.")
        add("group", text, rank=g["rank"], step=g["step"], task_id=g["task_id"], session_id=h["session_id"],
            phase=h["slow_phase"], turn=h["slow_turn"])
    gw = rep["groups"]
    if gw["total_group_wait_s"] > 0:
        add("group", f"Group wait (samples done, waiting for the slowest sibling of their group) totals "
            f"{fmt_s(gw['total_group_wait_s'])}, {fmt_pct(gw['group_wait_share'])} of session time.")


def _rank(rep: Report, rank: object) -> str:
    return rank_name(rank, rep["inputs"].get("roles", {}).get(str(rank)))


def _held(b: dict[str, Any] | None) -> str:
    if not b:
        return "no session records"
    return (f"held by {session_name(b)}, done at {fmt_s(b.get('completion_s'))} after the step start: "
            f"{why_slow(b)}")


def _straggler_findings(rep: Report, add: Add) -> None:
    sg = rep["stragglers"]
    held = {r["step"]: r.get("held_by") for r in sg["per_step"]}
    for o in sg["outliers"][:MAX_OUTLIER_FINDINGS]:
        add("straggler", f"Step {o['step']}: {_rank(rep, o['rank'])} rollout took {fmt_s(o['rollout_s'])} "
            f"(median {fmt_s(o['median_s'])}, +{(o['excess_mads'] or 0):.1f} MAD); "
            f"{_held(o['sessions'][0] if o['sessions'] else None)}.", step=o["step"], rank=o["rank"])
    if len(sg["outliers"]) > MAX_OUTLIER_FINDINGS:
        add("straggler", f"…and {len(sg['outliers']) - MAX_OUTLIER_FINDINGS} more outlier (rank, step) "
            f"rollouts (see Stragglers).")
    _slowest_rank_finding(rep, add)
    if sg["barrier_wait_share"] is not None and sg["total_barrier_wait_s"] > 0:
        top = max((r for r in sg["per_step"] if r.get("barrier_wait_s")), key=lambda r: r["barrier_wait_s"])
        add("barrier", f"Barrier wait (slowest minus fastest rank's rollout) totals "
            f"{fmt_s(sg['total_barrier_wait_s'])}, {fmt_pct(sg['barrier_wait_share'])} of step time; the "
            f"longest, step {top['step']} ({fmt_s(top['barrier_wait_s'])}): the other ranks waited for "
            f"{_rank(rep, top['slowest_rank'])}, {_held(held.get(top['step']))}.", step=top["step"],
            rank=top["slowest_rank"])


def _slowest_rank_finding(rep: Report, add: Add) -> None:
    """A rank that is the slowest in most steps, when it is slower beyond the run's noise: its
    median excess over the step's fastest rank passes the stragglers' noise limit."""
    sg = rep["stragglers"]
    n_steps = sum(1 for r in sg["per_step"] if "slowest_rank" in r)
    if len(sg["ranks"]) < 2 or n_steps < 2:
        return
    worst = max(sg["per_rank"], key=lambda r: r["slowest_in_steps"])
    ratio, limit = worst["median_ratio_to_fastest"], sg["noise"]["excess_limit"]
    if worst["slowest_in_steps"] * 2 <= n_steps or ratio is None:
        return
    if limit is not None and ratio - 1 <= limit:  # slowest by less than the run's noise
        return
    who = _rank(rep, worst["rank"])
    add("straggler", f"{who[0].upper()}{who[1:]} is the slowest rank in {worst['slowest_in_steps']} of "
        f"{n_steps} steps (median {ratio:.2f}× the fastest, beyond the run's noise: "
        f"+{fmt_pct(limit)}).", rank=worst["rank"])


def _longtail_findings(rep: Report, add: Add) -> None:
    ov = rep["longtail"]["overall"]
    if ov["count"]:
        add("longtail", f"Long tail: the last 20% of sessions take {fmt_pct(ov['tail_fraction'])} of "
            f"rollout time; own completion after step start P50 {fmt_s(ov['p50_s'])}, P90 "
            f"{fmt_s(ov['p90_s'])}, P99 {fmt_s(ov['p99_s'])}, max {fmt_s(ov['max_s'])}.")


def _session_findings(rep: Report, add: Add) -> None:
    slow = rep["longtail"]["slowest_sessions"]
    if not slow:
        return
    b = slow[0]
    add("session", f"Slowest session by its own time: {session_name(b)}, {fmt_s(b['own_s'])} of "
        f"{fmt_s(b['total_s'])} until finalize ({why_slow(b)}).", slow_phase=b.get("slow_phase"),
        turn=b.get("slow_turn"))
    blame = Counter(b.get("slow_phase") for b in slow)
    phase, n = blame.most_common(1)[0]
    if len(slow) > 1 and phase is not None:
        add("session", f"{n} of the {len(slow)} slowest sessions were slow in {phase}.", slow_phase=phase)


def _breakdown_findings(rep: Report, add: Add) -> None:
    ph = rep["phases"]["session"]
    for a in ph["anomalies"][:MAX_OUTLIER_FINDINGS]:
        add("phase", f"Step {_step(a['step'])}: {a['phase']} takes {fmt_pct(a['share'])} of session time "
            f"(median over steps {fmt_pct(a['median_share'])}).", step=a["step"], phase=a["phase"])
    if ph["overall"]:
        parts = ", ".join(f"{r['phase']} {fmt_pct(r['share'])}" for r in ph["overall"][:5])
        add("phase", f"Session time: {parts}.")
    tr = rep["phases"]["train"]
    if tr["overall"]:
        prefix = rep["options"]["train_prefix"]
        parts = ", ".join(f"{r['scope']}{f' (in no {prefix}* scope)' if r['scope'] == 'untracked' else ''} "
                          f"{fmt_pct(r['share'])}" for r in tr["overall"][:4])
        add("phase", f"Step time by train-side scope: {parts}.")


def _turn_findings(rep: Report, add: Add) -> None:
    tu = rep["turns"]
    bt = tu["session_time_by_turns"]
    if tu["mean_turns"] is not None and len(bt) > 1 and bt[0]["mean_s"] > 0:
        add("turns", f"Sessions take {tu['mean_turns']:.2f} turns on average; {bt[-1]['turns']}-turn "
            f"sessions take {bt[-1]['mean_s'] / bt[0]['mean_s']:.1f}× as long (own time) as "
            f"{bt[0]['turns']}-turn ones.")


def _tool_findings(rep: Report, add: Add) -> None:
    tools = rep["turns"]["tools"]
    if tools:
        parts = "; ".join(f"{t['tool']}: {t['calls']} calls, P50 {fmt_s(t['p50_s'])}, "
                          f"P99 {fmt_s(t['p99_s'])}, max {fmt_s(t['max_s'])}" for t in tools[:3])
        add("tools", f"Tool calls by tool: {parts}.")


def goodput_line(gp: dict[str, Any]) -> str | None:
    """``productive 61.2%, overhead 12.0%, idle 20.1%, wasted 6.7%`` (None: no step time)."""
    share = gp["share"]
    if all(v is None for v in share.values()):
        return None
    return ", ".join(f"{k} {fmt_pct(share[k])}" for k in gp["buckets"])


def tokens_line(gp: dict[str, Any]) -> str | None:
    """``generated 12.3k tokens/s, accepted 10.9k/s; 8.1% of generated tokens thrown away``."""
    tok = gp["tokens"]
    if not tok["generated"]:
        return None
    per = tok["per_s"]
    return (f"generated {fmt_count(per['generated'])} tokens/s, accepted (trained) "
            f"{fmt_count(per['accepted'])}/s; {fmt_pct(tok['wasted_share'])} of generated tokens "
            f"thrown away (rejected, failed, dropped and zero-advantage samples)")


def zero_advantage_line(gp: dict[str, Any]) -> str | None:
    """``3 of 8 groups had zero reward spread: 4.20 s of generation and reward wasted (12
    samples, 1.5k tokens)`` (None: no zero-advantage sample)."""
    za = gp.get("zero_advantage") or {}
    if not za.get("sessions"):
        return None
    groups = (f"{za['groups']} of {za['groups_total']} groups" if za.get("groups_total")
              else "some groups")
    return (f"{groups} had zero reward spread (no GRPO gradient): {fmt_s(za['seconds'])} of "
            f"generation and reward wasted ({za['sessions']} samples, {fmt_count(za['tokens'])} "
            f"tokens)")


def truncated_line(gp: dict[str, Any]) -> str | None:
    """``5 of 40 completions (12.5%) were truncated at the length limit (2.0k tokens)``."""
    tr = gp.get("truncated") or {}
    if not tr.get("sessions"):
        return None
    return (f"{tr['sessions']} of {tr['of_sessions']} completions ({fmt_pct(tr['share'])}) were "
            f"truncated at the length limit ({fmt_count(tr['tokens'])} tokens)")


def staleness_line(gp: dict[str, Any]) -> str | None:
    """``trained samples' version lag: 0 for 88%, 1 for 12% (mean 0.12)``."""
    st = gp["staleness"]
    if not st["trained"]:
        return None
    parts = ", ".join(f"{lag} for {fmt_pct(n / st['trained'])}" for lag, n in st["lag"].items())
    return f"trained samples' policy version lag: {parts} (mean {st['mean_lag']:.2f})"


def fmt_count(x: float | None) -> str:
    """``950``, ``12.3k``, ``4.56M``."""
    if x is None:
        return "–"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def _goodput_findings(rep: Report, add: Add) -> None:
    gp = rep["goodput"]
    line = goodput_line(gp)
    if line is not None:
        add("goodput", f"Where the ranks' step time went: {line}.")
    for text in (tokens_line(gp), zero_advantage_line(gp), truncated_line(gp), staleness_line(gp)):
        if text is not None:
            add("goodput", text[0].upper() + text[1:] + ".")
    for o in gp["section_outliers"][:MAX_OUTLIER_FINDINGS]:
        head = (f"Step {_step(o['step'])}: {o['section']} ({o['class']}) took {fmt_s(o['seconds'])} "
                f"on {_rank(rep, o['rank'])}")
        usual = (f", {o['seconds'] / o['median_s']:.1f}× its median over steps ({fmt_s(o['median_s'])})"
                 if o["median_s"] > 0 else "")
        add("section", f"{head}{usual}: {fmt_pct(o['seconds'] / o['step_s'])} of the step.",
            step=o["step"], section=o["section"])


def link_name(link: dict[str, Any]) -> str:
    """``rank 1 train.ppo_update`` or ``rank 0 step 3 session 42: generate turn 2``."""
    if link["kind"] == "scope":
        return f"rank {link['rank']} {link['what']}"
    return f"rank {link['rank']} step {_step(link.get('step'))} {link['what']}"


def _critical_findings(rep: Report, add: Add) -> None:
    cp = rep["critical_path"]
    top = cp["top_links"]
    if not top:
        return
    parts = [f"{link_name(t)} ({fmt_s(t['what_if_s'])} over {t['steps']} step(s))" for t in top[:3]]
    add("critical path", "Links of the steps' critical paths that cost most over their medians (what "
        "the steps would have saved at the median): " + "; ".join(parts) + ".")


def _status_findings(rep: Report, add: Add) -> None:
    st = rep["status"]
    if not st["sessions"]:
        return
    parts = []
    for name, c in st["counts"].items():
        if name == "accepted":
            continue
        top = [r for r in st["reasons"] if r["status"] == name][:1]
        why = f" (mostly {top[0]['reason']}: {fmt_pct(top[0]['share_of_status'])})" if top else ""
        parts.append(f"{name} {fmt_pct(c / st['sessions'])}{why}")
    add("status", f"Acceptance {fmt_pct(st['acceptance_rate'])}" + (f"; {', '.join(parts)}" if parts
                                                                   else "") + ".")


def _input_findings(rep: Report, add: Add) -> None:
    inp = rep["inputs"]
    if inp["skipped_lines"] or inp["skipped_fields"]:
        add("input", f"{skipped_text(inp)}: {inp['skipped'][0]}.")
    if inp["sessions_step_from_scopes"]:
        add("input", f"{inp['sessions_step_from_scopes']} session record(s) had no step: each took the "
            f"step of the trace scope on its rank whose args carry it (global_step).")


def skipped_text(inp: dict[str, Any]) -> str:
    """What the report's inputs skipped, in words (:func:`~.load.skip_summary`; "" when nothing)."""
    return skip_summary(inp["skipped_lines"], inp["skipped_fields"])


def _step(v: object) -> str:
    return "–" if v is None else str(v)


def public(obj: object) -> object:
    """The report without plot data (keys starting with ``_``), for JSON."""
    if isinstance(obj, dict):
        return {k: public(v) for k, v in obj.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(obj, (list, tuple)):
        return [public(v) for v in obj]
    return obj
