"""Writing a report: one self-contained HTML page (jinja2, plots as data URIs), Markdown, JSON.

``OUT`` is a file (``report.html``, ``run.md``, ``r.json``) or a directory (``OUT/report.<fmt>``);
the HTML and Markdown reports also write their PNG plots next to the file
(``{stem}-{plot}.png``).  The format is ``fmt``, else the file's suffix, else HTML.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from rltrace.accounting.quantiles import DEFINITION
from rltrace.analysis import units
from rltrace.analysis.load import ReportError
from rltrace.analysis.plots import MANY_RANKS, Plot, write_plots
from rltrace.analysis.report import (
    fmt_pct,
    fmt_s,
    link_name,
    public,
    session_name,
    skipped_text,
    truncated_line,
    why_slow,
    zero_advantage_line,
)
from rltrace.analysis.report_shape import Report
from rltrace.analysis.template import HTML
from rltrace.analysis.units import unit_of
from rltrace.logdir.files import write_atomically

FORMATS = ("html", "md", "json")
MAX_ROWS = 200
TOP_RANK_ROWS, BOTTOM_RANK_ROWS = 20, 5  # the per-rank table past MANY_RANKS ranks


def resolve_output(out: str | Path | None, logdir: Path, fmt: str | None) -> tuple[Path, str]:
    """The file to write and its format."""
    if fmt is not None and fmt not in FORMATS:
        raise ReportError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if out is None:
        f = fmt or "html"
        return logdir / "report" / f"report.{f}", f
    p = Path(out).expanduser()
    suffix = {"markdown": "md", "htm": "html"}.get(p.suffix.lower().lstrip("."), p.suffix.lower().lstrip("."))
    if suffix in FORMATS or (p.suffix and not p.is_dir()):
        if suffix not in FORMATS and fmt is None:
            raise ReportError(f"rltrace report: -o {out}: the suffix {p.suffix!r} names no report "
                              f"format; write .html, .md or .json (or give --format)")
        return _checked(p), fmt or suffix
    f = fmt or "html"
    return _checked(p / f"report.{f}"), f


def _checked(path: Path) -> Path:
    """``path`` when its folder exists or can be made; a :class:`ReportError` naming the part
    of the path that is a file otherwise."""
    for parent in (path.parent, *path.parent.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ReportError(f"rltrace report: cannot write {path}: {parent} is a file, not a "
                                  f"folder; choose another -o")
            break
    return path


def _x(v: float | None) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.2f}×"


def _num(v: object) -> str:
    """A number as the CLI shows it: four significant digits, ``109.9k``/``4.56M``/``1.20G`` from
    ten thousand up (never scientific notation); integers as they are."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        a = abs(v)
        if a < 1e4:
            return f"{v:.4g}" if a >= 1e-3 or a == 0 else f"{v:.2g}"
        for scale, suffix, digits in ((1e9, "G", 2), (1e6, "M", 2), (1e3, "k", 1)):
            if a >= scale:
                return f"{v / scale:.{digits}f}{suffix}"
    return str(v)


def _step(v: object) -> str:
    return "–" if v is None else str(v)


def _ratio_key(r: dict[str, Any]) -> tuple[int, float]:
    v = r["median_ratio_to_fastest"]
    return r["outlier_steps"], (-math.inf if v is None else float(v))


def rank_table(per_rank: list[dict[str, Any]], unit: str | None = None) -> dict[str, Any]:
    """The per-rank stragglers rows to show: all of them up to MANY_RANKS ranks; past that the
    slowest (outlier steps, then median × fastest) and the fastest, with a line for the rest."""
    if len(per_rank) <= MANY_RANKS:
        return {"top": per_rank, "bottom": [], "more": 0, "text": ""}
    order = sorted(per_rank, key=_ratio_key, reverse=True)
    top, bottom = order[:TOP_RANK_ROWS], order[-BOTTOM_RANK_ROWS:]
    mid = order[TOP_RANK_ROWS:-BOTTOM_RANK_ROWS]
    ratios = [r["median_ratio_to_fastest"] for r in mid if r["median_ratio_to_fastest"] is not None]
    means = [r["mean_rollout_s"] for r in mid if r["mean_rollout_s"] is not None]
    text = f"… and {len(mid):,} more ranks"
    if ratios:
        text += f" within {_x(min(ratios))}–{_x(max(ratios))} the fastest"
    if means:
        text += f", mean rollout {fmt_s(min(means), unit)}–{fmt_s(max(means), unit)}"
    text += (f" (the {len(top)} slowest by outlier steps then median × fastest above, the {len(bottom)} "
             f"fastest below; every rank is in the JSON report)")
    return {"top": top, "bottom": bottom, "more": len(mid), "text": text}


def _spread(values: dict[str, float | None], fmt: Callable[[float], str], unit: str = "") -> str:
    """``min 1.2 s (rank 3), median 1.5 s, max 9.1 s (rank 7)`` over ranks (None skipped)."""
    have = sorted((v, r) for r, v in values.items() if v is not None)
    if not have:
        return "–"
    (lo, lo_r), (hi, hi_r) = have[0], have[-1]
    med = have[len(have) // 2][0]
    return (f"min {fmt(lo)}{unit} (rank {lo_r}), median {fmt(med)}{unit}, "
            f"max {fmt(hi)}{unit} (rank {hi_r})")


def many_ranks(rep: Report) -> dict[str, Any]:
    """Per-rank lists of the summary aggregated past MANY_RANKS ranks (empty strings otherwise)."""
    sm = rep["summary"]
    out: dict[str, Any] = {"wall": "", "counters": {}}
    if len(sm["wall_s"]) > MANY_RANKS:
        unit = unit_of(rep, "summary")
        out["wall"] = f"{len(sm['wall_s']):,} ranks: " + _spread(sm["wall_s"], lambda x: fmt_s(x, unit))
    for c in sm["counters"]:
        if len(c["per_rank"]) > MANY_RANKS:
            out["counters"][c["name"]] = (
                f"{len(c['per_rank']):,} ranks; total "
                + _spread({r: v["total"] for r, v in c["per_rank"].items()}, _num)
                + "; rate " + _spread({r: v["rate_per_s"] for r, v in c["per_rank"].items()}, _num, "/s"))
    return out


def render_html(rep: Report, plots: list[Plot]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False)
    env.filters.update(s=fmt_s, t=units.number, pct=fmt_pct, x=_x, num=_num, step=_step, session=session_name,
                       why=why_slow, shares=_shares, skipped=skipped_text, chain=chain_text, link=link_name,
                       waste=waste_lines)
    uris = {p.key: {"title": p.title, "caption": p.caption,
                    "uri": "data:image/png;base64," + base64.b64encode(p.path.read_bytes()).decode("ascii")}
            for p in plots}
    u = {view: unit_of(rep, view) for view in units.VIEWS}
    return env.from_string(HTML).render(rep=rep, plots=uris, max_rows=MAX_ROWS, definition=DEFINITION, u=u,
                                    rank_rows=rank_table(rep["stragglers"]["per_rank"], u["stragglers"]),
                                    many=many_ranks(rep))


def _md_table(headers: list[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n_first {MAX_ROWS} of {len(rows)} rows; all rows are in the JSON report._")
    return [*out, ""]


def _shares(m: dict[str, Any], least: float = 0.01) -> str:
    """``group wait 72%, generate 15%, …``: buckets of 1% or more, the rest summed."""
    parts = sorted(((v or 0.0, k) for k, v in m["shares"].items()), reverse=True)
    big = [f"{k} {fmt_pct(v)}" for v, k in parts if v >= least]
    rest = [v for v, _ in parts if 0 < v < least]
    if rest:
        big.append(f"{len(rest)} more {fmt_pct(sum(rest))}")
    return ", ".join(big)


PCT_HEADERS = ("P50", "P90", "P99", "P99.9", "max")


def _in_unit(headers: tuple[str, ...], unit: str) -> list[str]:
    """Table headers naming the view's time unit: ``P50 (ms)``."""
    return [f"{h} ({unit})" for h in headers]


def _md_groups(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "groups")
    n = functools.partial(units.number, unit=u)
    gr = rep["groups"]
    L = ["## 1. Slow groups", "",
         "A group is the sessions of one task on one rank and step (GRPO samples, finalized together). "
         "The session that finished its own work last held the group; the others' time after their own "
         f"end is group wait. Group wait in all: {fmt_s(gr['total_group_wait_s'], u)} "
         f"({fmt_pct(gr['group_wait_share'])} of session time).", ""]
    if not gr["groups"]:
        return [*L, "No group with two or more sessions.", ""]
    for i, g in enumerate(gr["groups"], 1):
        h = g["holder"]
        L += [f"### rank {g['rank']} step {_step(g['step'])} task {g['task_id']}: {g['sessions']} sessions, "
              f"{fmt_s(g['span_s'], u)}", "", f"Held by session {h['session_id']}: {why_slow(h, u)}.", ""]
        L += [img.get(f"group_{i}", "")]
        L += _md_table(["session", "status", *_in_unit(("own time", "until finalize", "group wait"), u),
                        "slowest segment", "time by bucket (adds up to 100%)"],
                       [[f"**{m['session_id']}** (held it)" if m["held"] else m["session_id"], m["status"],
                         n(m["own_s"]), n(m["total_s"]), n(m["group_wait_s"]), why_slow(m, u),
                         _shares(m)] for m in g["members"]])
    return L


def _md_longtail(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "longtail")
    n = functools.partial(units.number, unit=u)
    lt = rep["longtail"]
    o = lt["overall"]
    L = ["## 2. Long tail", "",
         "Own completion time (last phase's end) since the step's start (rollout scope, else step scope, "
         f"else first submit). Percentiles, in every table of this report: {DEFINITION}; `rltrace top` "
         "computes them the same way from its live files' 19%-wide duration buckets.", ""]
    L += _md_table(["sessions", *_in_unit(PCT_HEADERS, u), "waiting for last 20%"],
                   [[o["count"], n(o["p50_s"]), n(o["p90_s"]), n(o["p99_s"]), n(o["p999_s"]),
                     n(o["max_s"]), fmt_pct(o["tail_fraction"])]])
    L += [img.get("cdf", ""), img.get("step_tail", ""), "### Slowest sessions (by their own time)", ""]
    L += _md_table(["session", "status", *_in_unit(("own time", "until finalize", "completion"), u), "turns",
                    "slowest segment", "time by bucket"],
                   [[session_name(b), b["status"], n(b["own_s"]), n(b["total_s"]),
                     n(b["completion_s"]), b["turns"], why_slow(b, u), _shares(b)]
                    for b in lt["slowest_sessions"]])
    L += ["### Per step", ""]
    L += _md_table(["step", "sessions", *_in_unit(PCT_HEADERS, u), "waiting for last 20%"],
                   [[_step(r["step"]), r["count"], n(r["p50_s"]), n(r["p90_s"]), n(r["p99_s"]),
                     n(r["p999_s"]), n(r["max_s"]), fmt_pct(r["tail_fraction"])]
                    for r in lt["per_step"]])
    return L


def _held(b: dict[str, Any] | None, unit: str | None = None) -> str:
    return "–" if not b else f"{session_name(b)}: {why_slow(b, unit)}"


def _md_stragglers(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "stragglers")
    n = functools.partial(units.number, unit=u)
    sg = rep["stragglers"]
    nz = sg["noise"]
    beyond = "" if nz["excess_limit"] is None else (
        f" and more than {fmt_pct(nz['excess_limit'])} slower than the step's fastest rank (the run's noise: "
        f"median excess {fmt_pct(nz['excess_median'])} + {sg['k']} × spread {fmt_pct(nz['excess_spread'])})")
    L = ["## 3. Stragglers", "",
         f"Outlier: rollout above median {fmt_s(sg['median_s'], u)} + {sg['k']} × MAD "
         f"{fmt_s(sg['mad_s'], u)} = "
         f"{fmt_s(sg['threshold_s'], u)}{beyond}. Total barrier wait {fmt_s(sg['total_barrier_wait_s'], u)} "
         f"({fmt_pct(sg['barrier_wait_share'])} of step time).", ""]
    L += _md_table(["step", "rank", f"rollout ({u})", f"median ({u})", "+MADs",
                    "last sessions to finish (slowest segment)"],
                   [[o["step"], o["rank"], n(o["rollout_s"]), n(o["median_s"]),
                     _num(o["excess_mads"]), "; ".join(_held(b, u) for b in o["sessions"])]
                    for o in sg["outliers"]]) if sg["outliers"] else ["No outlier (rank, step).", ""]
    L += [img.get("stragglers", "")]
    roles = rep["inputs"].get("roles", {})
    rt = rank_table(sg["per_rank"], u)
    L += _md_table(["rank", "role", "steps", f"mean rollout ({u})", "median × fastest", "slowest in steps",
                    "outlier steps"],
                   [[r["rank"], roles.get(str(r["rank"]), "–"), r["steps"], n(r["mean_rollout_s"]),
                     _x(r["median_ratio_to_fastest"]),
                     r["slowest_in_steps"], r["outlier_steps"]] for r in rt["top"] + rt["bottom"]])
    if rt["more"]:
        L[-1:] = [f"_{rt['text']}._", ""]
    L += _md_table(["step", "fastest rank", f"fastest ({u})", "slowest rank",
                    *_in_unit(("slowest", "barrier wait"), u),
                    "held by (slowest rank's last session)"],
                   [[r["step"], r.get("fastest_rank", "–"), n(r.get("fastest_s")),
                     r.get("slowest_rank", "–"), n(r.get("slowest_s")), n(r.get("barrier_wait_s")),
                     _held(r.get("held_by"), u)] for r in sg["per_step"]])
    return L


def _md_phases(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "session_phases")
    n = functools.partial(units.number, unit=u)
    ps, tr = rep["phases"]["session"], rep["phases"]["train"]
    L = ["## 4. Time breakdown", "",
         "### Session time: queue wait, phases, gaps, group wait (adds up to 100%)", ""]
    L += _md_table(["bucket", "kind", f"total ({u})", "share", "sessions",
                    *_in_unit(("mean", "P50", "P99"), u)],
                   [[r["phase"], r["kind"], n(r["total_s"]), fmt_pct(r["share"]), r["sessions"],
                     n(r["mean_s"]), n(r["p50_s"]), n(r["p99_s"])] for r in ps["overall"]])
    if ps["anomalies"]:
        L += _md_table(["step", "bucket", "share", "median share"],
                       [[_step(a["step"]), a["phase"], fmt_pct(a["share"]), fmt_pct(a["median_share"])]
                        for a in ps["anomalies"]])
    L += [img.get("session_phases", "")]
    L += _md_table(["step", *ps["phases"]],
                   [[_step(r["step"]), *(fmt_pct(r["share"][p]) for p in ps["phases"])]
                    for r in ps["per_step"]])
    if tr["overall"]:
        prefix = rep["options"]["train_prefix"]
        ut = unit_of(rep, "train_phases")
        L += ["### Train-side scopes (share of step time)", "",
              f"The `{prefix}*` scopes directly under each step (its `{rep['options']['step_scope']}` scope; "
              f"without one, a step runs from the first `{prefix}*` scope carrying its number to the next "
              f"step's); untracked: step time in no `{prefix}*` scope.", ""]
        L += _md_table(["scope", f"total ({ut})", "share"],
                       [[r["scope"], units.number(r["total_s"], ut), fmt_pct(r["share"])]
                        for r in tr["overall"]])
        L += [img.get("train_phases", "")]
    return L


def _turn_cell(row: dict[str, Any], phase: str, unit: str | None = None) -> str:
    """``12.3 ms ×40``: mean time per execution (in ``unit``) and executions of a phase at one turn index."""
    if phase not in row["mean_s"]:
        return "–"
    return f"{fmt_s(row['mean_s'][phase], unit)} ×{row['executions'][phase]}"


def _md_turns(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "turns")
    n = functools.partial(units.number, unit=u)
    tu = rep["turns"]
    L = ["## 5. Turns, tools and workers", "", f"Mean turns per session: {_num(tu['mean_turns'])}.", ""]
    L += _md_table(["turns", "sessions", "fraction", f"mean own time ({u})"],
                   [[r["turns"], r["sessions"], fmt_pct(d["fraction"]), n(r["mean_s"])]
                    for r, d in zip(tu["session_time_by_turns"], tu["distribution"], strict=True)])
    pbt = tu["phase_by_turn"]
    L += ["### Time by turn index (mean per execution)", ""]
    L += _md_table(["turn index", *pbt["phases"]],
                   [[r["turn"], *(_turn_cell(r, p, u) for p in pbt["phases"])] for r in pbt["rows"]])
    L += [img.get("turns", "")]
    if tu["tools"]:
        L += ["### Tool calls by tool", ""]
        L += _md_table(["tool", "calls", *_in_unit(("total", "mean", "P50", "P99", "max"), u)],
                       [[t["tool"], t["calls"], n(t["total_s"]), n(t["mean_s"]), n(t["p50_s"]),
                         n(t["p99_s"]), n(t["max_s"])] for t in tu["tools"]])
    L += ["### By worker (rank) and step", ""]
    L += _md_table(["rank", "step", "sessions",
                    *_in_unit(("mean own time", "max own time", "mean generate", "group wait"), u)],
                   [[w["rank"], _step(w["step"]), w["sessions"], n(w["mean_own_s"]),
                     n(w["max_own_s"]), n(w["mean_generate_s"]), n(w["group_wait_s"])]
                    for w in tu["workers"]])
    return L


#: what each goodput bucket holds (the Markdown and HTML reports say it the same way)
BUCKETS_EXPLAINED = (
    "Each rank's step time in buckets that add up to 100%, each framework section classified by the waste "
    "taxonomy (rltrace.accounting.goodput; the sections table below shows each one's class): "
    "productive (train compute; "
    "generation, tool and reward time of samples trained on with a gradient), overhead (weight sync, "
    "validation, checkpoints, data loading, mode switches, untraced step time), idle (waiting on the batch "
    "or on weights; rollout time with no session phase running), wasted (phase time of rejected, failed and "
    "dropped samples, and of zero-advantage samples: their group's rewards had zero spread).")


def waste_lines(gp: dict[str, Any]) -> list[str]:
    """The zero-advantage and truncation sentences of the goodput section (none when nothing)."""
    out = []
    for text in (zero_advantage_line(gp), truncated_line(gp)):
        if text is not None:
            out.append(text[0].upper() + text[1:] + ".")
    return out


def _md_goodput(rep: Report, img: dict[str, str]) -> list[str]:
    gp = rep["goodput"]
    L = ["## Goodput: where the step time and the tokens went", "", BUCKETS_EXPLAINED, ""]
    if not gp["by_step"]:
        return [*L, "No step time to account: no rltrace.step scopes and no session records.", ""]
    u = unit_of(rep, "goodput")
    head = ["step", f"wall ({u})", *gp["buckets"], "generated tokens/s", "accepted tokens/s"]
    rows = [["all", "–", *(fmt_pct(gp["share"][b]) for b in gp["buckets"]),
             _num(gp["tokens"]["per_s"]["generated"]), _num(gp["tokens"]["per_s"]["accepted"])]]
    rows += [[_step(r["step"]), units.number(r["wall_s"], u),
              *(fmt_pct(r["share"][b]) for b in gp["buckets"]),
              _num(r["tokens_per_s"]["generated"]), _num(r["tokens_per_s"]["accepted"])]
             for r in gp["by_step"]]
    L += _md_table(head, rows)
    if len(gp["by_role"]) > 1:
        L += _md_table(["role", *gp["buckets"]],
                       [[role, *(fmt_pct(v["share"][b]) for b in gp["buckets"])]
                        for role, v in gp["by_role"].items()])
    if gp.get("sections"):
        L += _md_table(["section", "class", f"own time ({u})"],
                       [[r["section"], r["class"], units.number(r["seconds"], u)]
                        for r in gp["sections"][:30]])
    tok = gp["tokens"]
    L += [f"Tokens: {_num(tok['generated'])} generated, {_num(tok['accepted'])} trained on with a gradient, "
          f"{_num(tok['wasted'])} wasted ({fmt_pct(tok['wasted_share'])}).", ""]
    for line in waste_lines(gp):
        L += [line, ""]
    st = gp["staleness"]
    if st["trained"]:
        L += ["Policy version lag of trained samples: " + ", ".join(f"{k}: {n}" for k, n in st["lag"].items())
              + f" (mean {_num(st['mean_lag'])}, max {st['max_lag']}).", ""]
    if st["thrown_away"]:
        L += _md_table(["wasted", "reason", "sessions", f"phase time ({u})", "tokens"],
                       [[r["status"], r["reason"], r["sessions"], units.number(r["seconds"], u),
                         _num(r["tokens"])]
                        for r in st["thrown_away"][:30]])
    return L


def chain_text(st: dict[str, Any], unit: str | None = None) -> str:
    """A step's critical path as one line: its links in time order, each with what it cost (in
    ``unit``, the critical-path view's)."""
    parts = []
    for link in st["links"]:
        cost = f" (+{fmt_s(link['what_if_s'], unit)})" if link["what_if_s"] > 0 else ""
        where = f"rank {link['rank']} " if link["kind"] == "session" and link.get("crosses_ranks") else ""
        parts.append(f"{where}{link['what']} {fmt_s(link['seconds'], unit)}{cost}")
    return " → ".join(parts)


def _md_critical(rep: Report, img: dict[str, str]) -> list[str]:
    cp = rep["critical_path"]
    L = ["## Critical path", "",
         "Per step, its length (measured within each rank: ranks started apart are no step time) and the "
         "chain that set it on its longest rank (a rollout's link is the "
         "session that finished last, on another rank when the rank only trains); (+x): how much "
         "shorter the step would have been with that link at its median.", ""]
    if not cp["steps"]:
        return [*L, "No rltrace.step scopes: no step to follow.", ""]
    u = unit_of(rep, "critical")
    L += _md_table(["step", f"length ({u})", "set by", "chain", f"what if ({u})"],
                   [[_step(s["step"]), units.number(s["length_s"], u), f"rank {s['ended_by_rank']}",
                     chain_text(s, u), units.number(s["what_if_s"], u)] for s in cp["steps"][:50]])
    if cp["top_links"]:
        L += ["Links that cost most over the run:", ""]
        L += [f"- {link_name(t)}: {fmt_s(t['what_if_s'], u)} over {t['steps']} step(s)"
              for t in cp["top_links"]]
        L += [""]
    return L


def _md_status(rep: Report, img: dict[str, str]) -> list[str]:
    st = rep["status"]
    L = ["## 6. Status and staleness", "", f"Acceptance rate {fmt_pct(st['acceptance_rate'])}.", ""]
    L += _md_table(["status", "sessions"], [[k, v] for k, v in st["counts"].items()])
    L += _md_table(["status", "reason", "sessions", "share of status"],
                   [[r["status"], r["reason"], r["sessions"], fmt_pct(r["share_of_status"])]
                    for r in st["reasons"][:30]])
    L += [img.get("status", "")]
    if st["tasks"].get("tasks"):
        t = st["tasks"]
        L += [f"Tasks: {t['tasks']}, mean acceptance {fmt_pct(t['mean_acceptance_rate'])}, all accepted "
              f"{t['all_accepted']}, none accepted {t['none_accepted']}.", ""]
        L += _md_table(["rank", "task", "sessions", "accepted", "rate"],
                       [[x["rank"], x["task_id"], x["sessions"], x["accepted"], fmt_pct(x["acceptance_rate"])]
                        for x in t["lowest"]])
    return L


def _md_summary(rep: Report, img: dict[str, str]) -> list[str]:
    u = unit_of(rep, "summary")
    n = functools.partial(units.number, unit=u)
    sm = rep["summary"]
    L = ["## 7. Run summary", "", f"Wall time {fmt_s(sm['wall_total_s'], u)} summed over ranks.", ""]
    L += _md_table(["scope", "count", *_in_unit(("total", "mean", "P50", "P99", "max"), u), "wall share"],
                   [[r["name"], r["count"], n(r["total_s"]), n(r["mean_s"]), n(r["p50_s"]),
                     n(r["p99_s"]), n(r["max_s"]), fmt_pct(r["wall_share"])] for r in sm["scopes"]])
    if sm["counters"]:
        L += _md_table(["counter", "total", "per second"],
                       [[c["name"], _num(c["total"]), _num(c["rate_per_s"])] for c in sm["counters"]])
    return [*L, img.get("scopes", "")]


def render_md(rep: Report, plots: list[Plot]) -> str:
    img = {p.key: f"![{p.title}]({p.path.name})\n\n_{p.caption}_\n" for p in plots}
    inp = rep["inputs"]
    L = [f"# rltrace report — `{rep['logdir']}`", "",
         f"{inp['sessions']} sessions · {len(inp['ranks'])} rank(s) · {len(inp['steps'])} step(s) · "
         f"{inp['trace_events']} trace events · steps {rep['options']['steps']} · "
         f"k = {rep['options']['k']} · "
         + (f"{skipped_text(inp)} · " if inp["skipped_lines"] or inp["skipped_fields"] else "")
         + f"generated {rep['generated_at']}", "", "## Findings", ""]
    L += [f"- **{f['kind']}** {f['text']}" for f in rep["findings"]] or ["Nothing to report."]
    L += [""]
    for section in (_md_groups, _md_longtail, _md_stragglers, _md_phases, _md_turns, _md_status,
                    _md_goodput, _md_critical, _md_summary):
        L += section(rep, img)
    if inp["skipped_lines"] or inp["skipped_fields"]:
        L += ["## Inputs", "", f"{skipped_text(inp)}:", ""]
        L += [f"- {m}" for m in inp["skipped"]]
    return "\n".join(L) + "\n"


def render_json(rep: Report) -> bytes:
    return orjson.dumps(public(rep), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                        | orjson.OPT_NON_STR_KEYS) + b"\n"


def write(rep: Report, path: Path, fmt: str) -> list[Path]:
    """Write ``rep`` as ``fmt`` to ``path`` (plus PNGs for html/md); return every file written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        plots: list[Plot] = []
        if fmt in ("html", "md"):
            plots = write_plots(rep, path.parent, path.stem)
            written += [p.path for p in plots]
            rep["plots"] = {p.key: p.path.name for p in plots}
        # to a fresh name renamed over the target: a link planted at its name is replaced,
        # never written through
        if fmt == "html":
            write_atomically(path, render_html(rep, plots).encode())
        elif fmt == "md":
            write_atomically(path, render_md(rep, plots).encode())
        else:
            write_atomically(path, render_json(rep))
    except OSError as exc:
        raise ReportError(f"rltrace report: cannot write {path}: {exc}") from None
    return [path, *written]
