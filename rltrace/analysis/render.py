"""Writing a report: one self-contained HTML page (jinja2, plots as data URIs), Markdown, JSON.

``OUT`` is a file (``report.html``, ``run.md``, ``r.json``) or a directory (``OUT/report.<fmt>``);
the HTML and Markdown reports also write their PNG plots next to the file
(``{stem}-{plot}.png``).  The format is ``fmt``, else the file's suffix, else HTML.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

import orjson

from .load import ReportError
from .plots import Plot, write_plots
from .report import fmt_pct, fmt_s, public, session_name
from .template import HTML

FORMATS = ("html", "md", "json")
MAX_ROWS = 200


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
        return p, fmt or (suffix if suffix in FORMATS else "html")
    f = fmt or "html"
    return p / f"report.{f}", f


def _x(v: Any) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.2f}×"


def _num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
    return str(v)


def _step(v: Any) -> str:
    return "–" if v is None else str(v)


def render_html(rep: dict[str, Any], plots: list[Plot]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False)
    env.filters.update(s=fmt_s, pct=fmt_pct, x=_x, num=_num, step=_step, session=session_name)
    uris = {p.key: {"title": p.title, "caption": p.caption,
                    "uri": "data:image/png;base64," + base64.b64encode(p.path.read_bytes()).decode("ascii")}
            for p in plots}
    return env.from_string(HTML).render(rep=rep, plots=uris, max_rows=MAX_ROWS)


def _md_table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        out.append(f"\n_first {MAX_ROWS} of {len(rows)} rows; all rows are in the JSON report._")
    return [*out, ""]


def render_md(rep: dict[str, Any], plots: list[Plot]) -> str:
    img = {p.key: f"![{p.title}]({p.path.name})\n\n_{p.caption}_\n" for p in plots}
    inp = rep["inputs"]
    L = [f"# rltrace report — `{rep['logdir']}`", "",
         f"{inp['sessions']} sessions · {len(inp['ranks'])} rank(s) · {len(inp['steps'])} step(s) · "
         f"{inp['trace_events']} trace events · steps {rep['options']['steps']} · "
         f"k = {rep['options']['k']} · "
         f"generated {rep['generated_at']}", "", "## Findings", ""]
    L += [f"- **{f['kind']}** {f['text']}" for f in rep["findings"]] or ["Nothing to report."]
    lt = rep["longtail"]
    o = lt["overall"]
    L += ["", "## 1. Long tail", "",
          "Completion time since the step's start (rollout scope, else step scope, else first submit).", ""]
    L += _md_table(["sessions", "P50", "P90", "P99", "P99.9", "max", "waiting for last 20%"],
                   [[o["count"], fmt_s(o["p50_s"]), fmt_s(o["p90_s"]), fmt_s(o["p99_s"]), fmt_s(o["p999_s"]),
                     fmt_s(o["max_s"]), fmt_pct(o["tail_fraction"])]])
    L += [img.get("cdf", ""), img.get("step_tail", ""), "### Slowest sessions", ""]
    L += _md_table(["session", "status", "total", "completion", "turns", "phases", "slow phase", "× median"],
                   [[session_name(b), b["status"], fmt_s(b["total_s"]), fmt_s(b["completion_s"]), b["turns"],
                     ", ".join(f"{p} {fmt_s(v)}" for p, v in b["phases_s"].items()),
                     f"{b['slow_phase']} {fmt_s(b.get('slow_phase_s'))}", _x(b.get("slow_phase_x_median"))]
                    for b in lt["slowest_sessions"]])
    L += ["### Per step", ""]
    L += _md_table(["step", "sessions", "P50", "P90", "P99", "P99.9", "max", "waiting for last 20%"],
                   [[_step(r["step"]), r["count"], fmt_s(r["p50_s"]), fmt_s(r["p90_s"]), fmt_s(r["p99_s"]),
                     fmt_s(r["p999_s"]), fmt_s(r["max_s"]), fmt_pct(r["tail_fraction"])]
                    for r in lt["per_step"]])
    sg = rep["stragglers"]
    L += ["## 2. Stragglers", "",
          f"Outlier: rollout above median {fmt_s(sg['median_s'])} + {sg['k']} × MAD {fmt_s(sg['mad_s'])} = "
          f"{fmt_s(sg['threshold_s'])}. Total barrier wait {fmt_s(sg['total_barrier_wait_s'])} "
          f"({fmt_pct(sg['barrier_wait_share'])} of step time).", ""]
    L += _md_table(["step", "rank", "rollout", "median", "+MADs", "last sessions to finish (slow phase)"],
                   [[o["step"], o["rank"], fmt_s(o["rollout_s"]), fmt_s(o["median_s"]),
                     _num(o["excess_mads"]),
                     "; ".join(f"{session_name(b)}: {b['slow_phase']} {fmt_s(b.get('slow_phase_s'))} "
                               f"({_x(b.get('slow_phase_x_median'))} median)" for b in o["sessions"])]
                    for o in sg["outliers"]]) if sg["outliers"] else ["No outlier (rank, step).", ""]
    L += [img.get("stragglers", "")]
    L += _md_table(["rank", "steps", "mean rollout", "median × fastest", "slowest in steps", "outlier steps"],
                   [[r["rank"], r["steps"], fmt_s(r["mean_rollout_s"]), _x(r["median_ratio_to_fastest"]),
                     r["slowest_in_steps"], r["outlier_steps"]] for r in sg["per_rank"]])
    L += _md_table(["step", "fastest rank", "fastest", "slowest rank", "slowest", "barrier wait"],
                   [[r["step"], r.get("fastest_rank", "–"), fmt_s(r.get("fastest_s")),
                     r.get("slowest_rank", "–"),
                     fmt_s(r.get("slowest_s")), fmt_s(r.get("barrier_wait_s"))] for r in sg["per_step"]])
    ps, tr = rep["phases"]["session"], rep["phases"]["train"]
    L += ["## 3. Phase breakdown", "", "### Session phases (share of session time)", ""]
    L += _md_table(["phase", "total", "share", "sessions", "mean", "P50", "P99"],
                   [[r["phase"], fmt_s(r["total_s"]), fmt_pct(r["share"]), r["sessions"], fmt_s(r["mean_s"]),
                     fmt_s(r["p50_s"]), fmt_s(r["p99_s"])] for r in ps["overall"]])
    if ps["anomalies"]:
        L += _md_table(["step", "phase", "share", "median share"],
                       [[_step(a["step"]), a["phase"], fmt_pct(a["share"]), fmt_pct(a["median_share"])]
                        for a in ps["anomalies"]])
    L += [img.get("session_phases", "")]
    L += _md_table(["step", *ps["phases"]],
                   [[_step(r["step"]), *(fmt_pct(r["share"][p]) for p in ps["phases"])]
                    for r in ps["per_step"]])
    if tr["overall"]:
        L += ["### Train-side scopes (share of step time)", ""]
        L += _md_table(["scope", "total", "share"],
                       [[r["scope"], fmt_s(r["total_s"]), fmt_pct(r["share"])] for r in tr["overall"]])
        L += [img.get("train_phases", "")]
    tu = rep["turns"]
    L += ["## 4. Turns", "", f"Mean turns per session: {_num(tu['mean_turns'])}.", ""]
    L += _md_table(["turns", "sessions", "fraction", "mean session time"],
                   [[r["turns"], r["sessions"], fmt_pct(d["fraction"]), fmt_s(r["mean_s"])]
                    for r, d in zip(tu["session_time_by_turns"], tu["distribution"], strict=True)])
    L += _md_table(["turn index", "generate executions", "mean generate time"],
                   [[r["turn"], r["executions"], fmt_s(r["mean_s"])] for r in tu["generate_by_turn"]])
    L += [img.get("turns", "")]
    st = rep["status"]
    L += ["## 5. Status and staleness", "", f"Acceptance rate {fmt_pct(st['acceptance_rate'])}.", ""]
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
    sm = rep["summary"]
    L += ["## 6. Run summary", "", f"Wall time {fmt_s(sm['wall_total_s'])} summed over ranks.", ""]
    L += _md_table(["scope", "count", "total", "mean", "P50", "P99", "max", "wall share"],
                   [[r["name"], r["count"], fmt_s(r["total_s"]), fmt_s(r["mean_s"]), fmt_s(r["p50_s"]),
                     fmt_s(r["p99_s"]), fmt_s(r["max_s"]), fmt_pct(r["wall_share"])] for r in sm["scopes"]])
    if sm["counters"]:
        L += _md_table(["counter", "total", "per second"],
                       [[c["name"], _num(c["total"]), _num(c["rate_per_s"])] for c in sm["counters"]])
    L += [img.get("scopes", "")]
    if inp["skipped_lines"]:
        L += ["## Inputs", "", f"{inp['skipped_lines']} unreadable line(s) skipped:", ""]
        L += [f"- {m}" for m in inp["skipped"]]
    return "\n".join(L) + "\n"


def render_json(rep: dict[str, Any]) -> bytes:
    return orjson.dumps(public(rep), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                        | orjson.OPT_NON_STR_KEYS) + b"\n"


def write(rep: dict[str, Any], path: Path, fmt: str) -> list[Path]:
    """Write ``rep`` as ``fmt`` to ``path`` (plus PNGs for html/md); return every file written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        plots: list[Plot] = []
        if fmt in ("html", "md"):
            plots = write_plots(rep, path.parent, path.stem)
            written += [p.path for p in plots]
            rep["plots"] = {p.key: p.path.name for p in plots}
        if fmt == "html":
            path.write_text(render_html(rep, plots), encoding="utf-8")
        elif fmt == "md":
            path.write_text(render_md(rep, plots), encoding="utf-8")
        else:
            path.write_bytes(render_json(rep))
    except OSError as exc:
        raise ReportError(f"rltrace report: cannot write {path}: {exc}") from None
    return [path, *written]
