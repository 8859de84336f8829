"""``rltrace top LOGDIR``: a live terminal view of a run in progress, across ranks.

It reads the small live-state files every rank's exporter thread publishes
(``{log_dir}/live/[{role}/]live-r{rank}[-p{pid}].json``, see :mod:`rltrace.pipeline.live_state`), so a refresh
costs the same whatever the number of sessions, also on a shared file system, and renders
them with ``rich``: the current step and sessions in flight by phase per rank, ranks falling
behind, the long tail forming (the duration CDF of the current step against the previous
steps, and its sessions in flight already older than their P90), the oldest sessions in
flight, acceptance and failure rates.  Files older than a few publish intervals are shown as
the last state of a run that is not live.

Each file is read up to ``LIVE_MAX_BYTES`` and checked by
:func:`rltrace.readers.check_live_state`: a file that is not a live state is skipped, a
malformed field ignored, and the footer counts both (:class:`Unread`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from rltrace.accounting.goodput import BUCKETS
from rltrace.accounting.quantiles import DEFINITION, hist_quantile
from rltrace.pipeline.live_state import EDGES, LIVE_DIR, bucket_upper
from rltrace.readers import check_live_state

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

__all__ = ["RankState", "TopView", "Unread", "find_live_files", "read_states", "render", "run_top", "watch"]

#: a file is live while younger than ``max(STALE_INTERVALS × its interval, STALE_MIN_S)``
STALE_INTERVALS = 3
STALE_MIN_S = 5.0
#: steps shown in the long-tail table, and sessions in the oldest-in-flight table
STEPS_SHOWN = 6
OLDEST_SHOWN = 8
#: characters of the per-step CDF (share of the step's sessions done within log-spaced durations)
CDF_WIDTH = 16
_FIRST_PHASES = ("generate", "toolcall", "reward")
#: a live file is a few KB (7 KB with 100k sessions open); a larger one is skipped unread
LIVE_MAX_BYTES = 4 << 20
_SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class RankState:
    """One live file as read now: its document, its age, and whether it is live."""

    path: Path
    doc: dict[str, Any]
    age_s: float
    #: ``live``, ``stale`` (not updated for a few intervals) or ``closed`` (the rank shut down)
    state: str

    @property
    def rank(self) -> int:
        """The file's rank (-1 when absent)."""
        r = self.doc.get("rank")
        return r if isinstance(r, int) else -1


def find_live_files(logdir: Path) -> list[Path]:
    """Every ``live-r*.json`` under ``logdir``'s ``live`` folders (``logdir`` itself a log dir
    or any folder above log dirs)."""
    logdir = Path(logdir)
    top = logdir / LIVE_DIR
    roots = [top] if top.is_dir() else [d for d in logdir.rglob(LIVE_DIR) if d.is_dir()]
    if logdir.name == LIVE_DIR:
        roots.append(logdir)
    return sorted({f for r in roots for f in r.rglob("live-r*.json")})


@dataclass
class Unread:
    """What one read of the live files could not use: files skipped, fields ignored, the first why."""

    files: int = 0
    fields: int = 0
    first: str | None = None

    def file(self, msg: str) -> None:
        self.files += 1
        self.first = self.first or msg

    def field(self, msg: str) -> None:
        self.fields += 1
        self.first = self.first or msg

    def text(self) -> str:
        """``1 live file(s) skipped, 2 malformed field(s) ignored (the first: ...)``; "" when none."""
        parts = [f"{self.files} live file(s) skipped"] if self.files else []
        if self.fields:
            parts.append(f"{self.fields} malformed field(s) ignored")
        return f"{', '.join(parts)} (the first: {self.first})" if parts else ""


def read_states(files: Iterable[Path], now: float | None = None,
                unread: Unread | None = None) -> list[RankState]:
    """Read live files, ordered by rank, role, pid; malformed files and fields are skipped and
    counted in ``unread`` (a file removed meanwhile is just not there)."""
    now = time.time() if now is None else now
    unread = Unread() if unread is None else unread
    out = []
    for f in files:
        doc = _read_doc(f, unread)
        if doc is None:
            continue
        age = max(0.0, now - float(doc.get("ts") or 0.0))
        limit = max(STALE_INTERVALS * float(doc.get("interval_s") or 1.0), STALE_MIN_S)
        state = "closed" if doc.get("closed") else ("live" if age <= limit else "stale")
        out.append(RankState(f, doc, age, state))
    out.sort(key=lambda s: (s.rank, str(s.doc.get("role") or ""), s.doc.get("pid") or 0))
    return out


def _read_doc(f: Path, unread: Unread) -> dict[str, Any] | None:
    """One live file's checked document (None: removed meanwhile, or skipped into ``unread``)."""
    try:
        with open(f, "rb") as fh:
            data = fh.read(LIVE_MAX_BYTES + 1)
    except OSError:
        return None  # removed meanwhile
    if len(data) > LIVE_MAX_BYTES:
        unread.file(f"{f}: over {LIVE_MAX_BYTES} bytes")
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        unread.file(f"{f}: not JSON ({exc})")
        return None
    notes: list[str] = []
    why = check_live_state(doc, notes.append)
    if why is not None:
        unread.file(f"{f}: {why}")
        return None
    for msg in notes:
        unread.field(f"{f}: {msg}")
    return doc  # type: ignore[no-any-return]  # checked: a dict


# ---- figures ---------------------------------------------------------------------------------


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def bucket_bounds(i: int) -> tuple[float, float]:
    """(lower, upper) edges in seconds of live histogram bucket ``i`` (bucket 0 starts at 0)."""
    return (EDGES[i - 1] if i > 0 else 0.0), bucket_upper(i)


def _quantile(hist: Counter[int], q: float, high: float = math.inf) -> float | None:
    """Quantile ``q`` (0..1) of a live histogram by the report's definition
    (:func:`rltrace.accounting.quantiles.hist_quantile`: values placed evenly within their 19%-wide
    buckets), at most ``high`` (the step's longest duration, where known)."""
    return hist_quantile(hist, q, bucket_bounds, high=high)


@dataclass
class _Step:
    step: Any
    done: int = 0
    open: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    hist: Counter[int] = field(default_factory=Counter)
    age_hist: Counter[int] = field(default_factory=Counter)
    max_s: float = 0.0
    oldest_s: float | None = None


def _merge_steps(states: list[RankState]) -> list[_Step]:
    """The last ``STEPS_SHOWN`` steps' figures summed over all ranks, oldest step first."""
    steps: dict[Any, _Step] = {}
    for st in states:
        open_ = st.doc.get("open") or {}
        _add_finished(steps, st.doc.get("steps") or ())
        _add_in_flight(steps, open_.get("by_step") or ())
        _add_listed_ages(steps, open_.get("listed") or ())
    for s in steps.values():
        if s.oldest_s is None and s.age_hist:
            s.oldest_s = bucket_upper(max(s.age_hist))
    ordered = sorted(steps.values(), key=lambda s: s.step if isinstance(s.step, int) else -math.inf)
    return ordered[-STEPS_SHOWN:]


def _add_finished(steps: dict[Any, _Step], entries: Iterable[dict[str, Any]]) -> None:
    """Add one rank's finished sessions per step (counts, statuses, duration histogram, max)."""
    for e in entries:
        s = steps.setdefault(e.get("step"), _Step(e.get("step")))
        s.done += int(e.get("done") or 0)
        s.by_status.update(e.get("by_status") or {})
        for b, c in e.get("hist") or ():
            s.hist[int(b)] += int(c)
        s.max_s = max(s.max_s, float(e.get("max_s") or 0.0))


def _add_in_flight(steps: dict[Any, _Step], entries: Iterable[dict[str, Any]]) -> None:
    """Add one rank's sessions in flight per step (count and age histogram); ``older`` is skipped."""
    for e in entries:
        if e.get("step") == "older":
            continue
        s = steps.setdefault(e.get("step"), _Step(e.get("step")))
        s.open += int(e.get("open") or 0)
        for b, c in e.get("age_hist") or ():
            s.age_hist[int(b)] += int(c)


def _add_listed_ages(steps: dict[Any, _Step], listed: Iterable[dict[str, Any]]) -> None:
    """Raise each known step's oldest age to its listed sessions' exact ages (unknown steps ignored)."""
    for item in listed:
        s = steps.get(item.get("step"))
        if s is not None:
            age = float(item.get("age_s") or 0.0)
            s.oldest_s = age if s.oldest_s is None else max(s.oldest_s, age)


def _spark(s: _Step, points: list[float]) -> str:
    """Share of the step's sessions (done and in flight) finished within each duration."""
    total = s.done + s.open
    if not total:
        return " " * len(points)
    cum, chars, buckets = 0, [], sorted(s.hist)
    i = 0
    for t in points:
        while i < len(buckets) and bucket_upper(buckets[i]) <= t:
            cum += s.hist[buckets[i]]
            i += 1
        frac = cum / total
        chars.append(" " if frac <= 0 else _SPARK[min(len(_SPARK) - 1, int(frac * (len(_SPARK) - 1) + 0.5))])
    return "".join(chars)


# ---- rendering -------------------------------------------------------------------------------


def render(states: list[RankState], logdir: Path | str, *, interval_s: float = 1.0,
           unread: Unread | None = None) -> RenderableType:
    """The frame for ``states`` as a ``rich`` renderable (a group of tables); ``unread``: what the
    read that gave ``states`` skipped (shown in the footer)."""
    from rich.console import Group
    from rich.text import Text

    title = Text.assemble(("rltrace top", "bold"), f"  {logdir}  ")
    if not states:
        title.append("no live files yet", style="yellow")
        hint = Text(f"waiting for {LIVE_DIR}/live-r*.json (written by ranks with session tracing on "
                    "and live_interval_s > 0)")
        skipped = unread.text() if unread is not None else ""
        return Group(title, hint, *([Text(skipped, style="yellow")] if skipped else []))
    live = [s for s in states if s.state == "live"]
    status, style = _run_status(states, live)
    title.append(status, style=style)
    doc0 = states[0].doc
    title.append(f"  experiment {doc0.get('experiment')} / {doc0.get('trial')}")
    parts: list[RenderableType] = [title, _ranks_table(states, live), _tail_table(_merge_steps(states))]
    items = _oldest_in_flight(live or states)
    if items:
        parts.append(_oldest_table(items))
    for line in (step_split_line(states), goodput_line(states)):
        if line is not None:
            parts.append(Text(line))
    parts.append(_footer(states, interval_s, unread))
    return Group(*parts)


def goodput_line(states: list[RankState]) -> str | None:
    """What finished sessions generated and what was thrown away, over all ranks since they
    started, wasted as the waste taxonomy says (:func:`rltrace.accounting.goodput.session_fate`):
    ``goodput: thrown away 8.1% of phase time, 9.2% of tokens (zero-advantage 3.0% of phase
    time); truncated 4 of 120 completions; generated 12.3k tokens/s, accepted 10.9k/s; policy
    version lag at finalize: 0 for 95.0%, 1 for 5.0%`` (None: no finished session)."""
    tokens: Counter[str] = Counter()
    phase_s: Counter[str] = Counter()
    lag: Counter[int] = Counter()
    elapsed = 0.0
    truncated = finished = 0
    for s in states:
        fin = s.doc.get("finished") or {}
        tokens.update(fin.get("tokens") or {})
        phase_s.update(fin.get("phase_s") or {})
        lag.update(dict(fin.get("lag") or ()))
        truncated += fin.get("truncated") or 0
        finished += fin.get("total") or 0
        ts, started = s.doc.get("ts"), s.doc.get("started_ts")
        if isinstance(ts, (int, float)) and isinstance(started, (int, float)):
            elapsed = max(elapsed, ts - started)
    if not phase_s.get("generated"):
        return None
    parts = [f"goodput: thrown away {_pct(phase_s['wasted'], phase_s['generated'])} of phase time"]
    if tokens.get("generated"):
        parts[0] += f", {_pct(tokens['wasted'], tokens['generated'])} of tokens"
    if phase_s.get("zero_advantage"):
        parts[0] += f" (zero-advantage {_pct(phase_s['zero_advantage'], phase_s['generated'])} of phase time)"
    if truncated:
        parts.append(f"truncated {truncated} of {finished} completions")
    if tokens.get("generated") and elapsed > 0:
        parts.append(f"generated {_count(tokens['generated'] / elapsed)} tokens/s, accepted "
                     f"{_count(tokens['accepted'] / elapsed)}/s since start")
    if lag:
        n = lag.total()
        parts.append("policy version lag at finalize: "
                     + ", ".join(f"{k} for {_pct(v, n)}" for k, v in sorted(lag.items())))
    return "; ".join(parts)


def step_split_line(states: list[RankState]) -> str | None:
    """Where the ranks' step time went (:mod:`rltrace.accounting.goodput`, the report's split), for the
    newest step every rank that reports one has finished, and over the steps the ranks keep:
    ``step time, step 7 (2 ranks): productive 61.0% · overhead 8.0% · idle 25.0% · wasted 6.0%;
    last 8 steps: ...``, then the same per role when the ranks have several (None: no step
    split yet)."""
    by_step: dict[int, Counter[str]] = {}
    ranks: Counter[int] = Counter()
    by_role: dict[str, Counter[str]] = {}
    reporting = 0
    for s in states:
        entries = [e for e in s.doc.get("goodput") or () if type(e.get("step")) is int]
        reporting += bool(entries)
        role = by_role.setdefault(str(s.doc.get("role") or "-"), Counter())
        for e in entries:
            sec = {k: e["seconds"].get(k, 0.0) for k in BUCKETS} if "seconds" in e else {}
            by_step.setdefault(e["step"], Counter()).update(sec)
            ranks[e["step"]] += 1
            role.update(sec)
    if not by_step:
        return None
    done = [n for n in by_step if ranks[n] >= reporting]
    newest = max(done or by_step)
    total: Counter[str] = Counter()
    for sec in by_step.values():
        total.update(sec)
    line = (f"step time, step {newest} ({ranks[newest]} rank{'s' * (ranks[newest] != 1)}): "
            f"{_split(by_step[newest])}; last {len(by_step)} steps: {_split(total)}")
    roles = {r: sec for r, sec in by_role.items() if sec.total() > 0}
    if len(roles) > 1:
        line += "\n  by role, last steps: " + "; ".join(
            f"{r} {_split(sec)}" for r, sec in sorted(roles.items()))
    return line


def _split(sec: Counter[str]) -> str:
    whole = sec.total()
    return " · ".join(f"{k} {_pct(sec[k], whole)}" for k in BUCKETS)


def _count(x: float) -> str:
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def _table(title: str) -> Table:
    """An empty table in the view's style: a rule under the header, the title on the left, tight padding."""
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False,
                 collapse_padding=True)


def _run_status(states: list[RankState], live: list[RankState]) -> tuple[str, str]:
    """The title's word on the run and its style: live, finished, or stopped/stuck since when."""
    newest = min(s.age_s for s in states)
    if live:
        return f"{len(live)}/{len(states)} rank file(s) live", "bold green"
    if all(s.state == "closed" for s in states):
        return f"run finished: not live (last update {_fmt_s(newest)} ago)", "bold yellow"
    return f"not live: last update {_fmt_s(newest)} ago (the run stopped or is stuck)", "bold red"


def _phases(states: list[RankState]) -> list[str]:
    """The phase columns: the usual first phases where any rank has them, then the others by name."""
    phases: list[str] = [p for p in _FIRST_PHASES if any(p in (s.doc.get("open") or {}).get("by_phase", {})
                                                          for s in states)]
    extra = sorted({p for s in states for p in (s.doc.get("open") or {}).get("by_phase", {})} - set(phases))
    return phases + extra


def _who_columns(states: list[RankState]) -> list[str]:
    """Of role, host and pid, those that tell ranks apart (a narrow terminal keeps the figures)."""
    shown = {"role": any(s.doc.get("role") for s in states),
             "host": len({s.doc.get("host") for s in states}) > 1,
             "pid": len({(s.rank, s.doc.get("role")) for s in states}) < len(states)}
    return [k for k, on in shown.items() if on]


def _newest_step(states: list[RankState]) -> int | None:
    """The highest integer step among ``states`` (``None`` when none has one)."""
    steps_now: list[int] = [s.doc["step"] for s in states if isinstance(s.doc.get("step"), int)]
    return max(steps_now) if steps_now else None


def _ranks_table(states: list[RankState], live: list[RankState]) -> Table:
    """One row per rank file: step and lag behind the newest live step, sessions in flight by phase,
    finished sessions and their rates, the file's age and state."""
    max_step = _newest_step(live or states)
    phases = _phases(states)
    who = _who_columns(states)
    ranks = _table("ranks")
    cols = ["rank", *who, "step", "lag", "flight", *phases, "idle", "oldest", "done",
            "acc%", "fail%", "upd", "state"]
    for name in cols:
        ranks.add_column(name, justify="left" if name in ("role", "host", "state") else "right",
                         no_wrap=True)
    for s in states:
        cells, style = _rank_row(s, max_step, phases, who)
        ranks.add_row(*cells, style=style)
    return ranks


def _rank_row(s: RankState, max_step: int | None, phases: list[str],
              who: list[str]) -> tuple[list[str], str | None]:
    """The ranks table's cells for one rank file, and the row's style (``~``: counts from a sample)."""
    d = s.doc
    open_ = d.get("open") or {}
    fin = d.get("finished") or {}
    by_status = Counter(fin.get("by_status") or {})
    done = int(fin.get("total") or 0)
    step = d.get("step")
    behind = max_step - step if isinstance(step, int) and max_step is not None else None
    approx = "~" if (open_.get("sampled_every") or 1) > 1 else ""
    by_phase = open_.get("by_phase") or {}
    state, style = _rank_state(s.state, behind)
    cells = [
        str(s.rank), *(str(d.get(k) or "-") for k in who),
        str(step) if step is not None else "-", str(behind) if behind is not None else "-",
        str(open_.get("sessions", 0)), *(f"{approx}{by_phase.get(p, 0)}" for p in phases),
        f"{approx}{open_.get('between_phases', 0)}", _fmt_s(open_.get("oldest_age_s")), str(done),
        _pct(by_status.get("accepted", 0), by_status.total()),
        _pct(by_status.get("failed", 0), by_status.total()),
        _fmt_s(s.age_s), state,
    ]
    return cells, style


def _rank_state(state: str, behind: int | None) -> tuple[str, str | None]:
    """A rank's state cell and row style: a live rank behind the newest step shows as ``behind``."""
    if state == "live" and behind:
        return "behind", "yellow"
    return state, {"stale": "red", "closed": "dim"}.get(state)


def _cdf_range(merged: list[_Step]) -> tuple[float, float]:
    """The durations the CDF column spans: from the shortest bucket seen to the longest, at least 2x."""
    top_edge = max([bucket_upper(max(s.hist)) for s in merged if s.hist]
                   + [bucket_upper(max(s.age_hist)) for s in merged if s.age_hist] + [EDGES[0]])
    lows = [min(h) for s in merged for h in (s.hist, s.age_hist) if h]
    lo = max(EDGES[0], EDGES[min(lows) - 1] if lows and min(lows) > 0 else EDGES[0])
    return lo, max(top_edge, lo * 2)


def _tail_table(merged: list[_Step]) -> Table:
    """The long tail: per step, duration quantiles, the oldest in flight, how many in flight are
    already older than the previous steps' P90, and the duration CDF (the current step in bold)."""
    lo, top_edge = _cdf_range(merged)
    points = [lo * (top_edge / lo) ** (i / (CDF_WIDTH - 1)) for i in range(CDF_WIDTH)]
    tail = _table(f"long tail: session duration by step (submit to finalize); p50/p90/p99: {DEFINITION}, "
                  f"as rltrace report, over 19%-wide buckets")
    for name in ("step", "done", "flight", "p50", "p90", "p99", "max", "oldest", ">p90prev"):
        tail.add_column(name, justify="right", no_wrap=True)
    tail.add_column(f"CDF {_fmt_s(lo)}..{_fmt_s(top_edge)}", no_wrap=True)
    prev = Counter[int]()  # the durations of the steps above the row
    for i, row in enumerate(merged):
        current = i == len(merged) - 1 and row.open > 0
        tail.add_row(*_tail_cells(row, _quantile(prev, 0.9), points), style="bold" if current else None)
        prev.update(row.hist)
    return tail


def _tail_cells(row: _Step, p90_prev: float | None, points: list[float]) -> list[str]:
    """The long-tail table's cells for one step (quantiles capped at the step's longest duration)."""
    over = _older_than(row, p90_prev)
    return [
        str(row.step) if row.step is not None else "-", str(row.done), str(row.open),
        *(_fmt_s(q) if q is not None else "-"
          for q in (_quantile(row.hist, x, row.max_s) for x in (0.5, 0.9, 0.99))),
        _fmt_s(row.max_s) if row.done else "-", _fmt_s(row.oldest_s) if row.open else "-",
        str(over) if over is not None else "-", _spark(row, points),
    ]


def _older_than(row: _Step, p90_prev: float | None) -> int | None:
    """Sessions of the step in flight whose age bucket starts at or above ``p90_prev`` (``None``
    when there is no previous P90 or nothing in flight)."""
    if p90_prev is None or not row.open:
        return None
    return sum(c for b, c in row.age_hist.items() if (EDGES[b - 1] if b > 0 else 0.0) >= p90_prev)


def _oldest_in_flight(states: list[RankState]) -> list[tuple[RankState, dict[str, Any]]]:
    """The sessions in flight the rank files list, with their rank, oldest first."""
    items = [(s, it) for s in states for it in (s.doc.get("open") or {}).get("listed") or ()]
    items.sort(key=lambda x: -float(x[1].get("age_s") or 0.0))
    return items


def _oldest_table(items: list[tuple[RankState, dict[str, Any]]]) -> Table:
    """The first ``OLDEST_SHOWN`` of ``items``: session, task, step, age, open phases and turn."""
    oldest = _table("oldest sessions in flight")
    for name in ("rank", "session", "task", "step", "age", "open phases", "phase age", "turn"):
        oldest.add_column(name, justify="left" if name == "open phases" else "right", no_wrap=True)
    for s, it in items[:OLDEST_SHOWN]:
        oldest.add_row(str(s.rank), str(it.get("session_id")), str(it.get("task_id")),
                       str(it.get("step")), _fmt_s(it.get("age_s")), ",".join(it.get("phases") or ()) or "-",
                       _fmt_s(it.get("phase_age_s")), str(it.get("turn")))
    return oldest


def _finished_totals(states: list[RankState]) -> tuple[int, Counter[str], int]:
    """Finished sessions over all rank files: the count, the count by status, and those missed
    (in bursts, so in neither the rates nor the step figures)."""
    done, by_status, missed = 0, Counter[str](), 0
    for s in states:
        fin = s.doc.get("finished") or {}
        by_status.update(Counter(fin.get("by_status") or {}))
        done += int(fin.get("total") or 0)
        missed += int(fin.get("missed") or 0)
    return done, by_status, missed


def _footer(states: list[RankState], interval_s: float, unread: Unread | None = None) -> Text:
    """The last line: finished sessions and their acceptance, rejection and failure rates, and
    what could not be read (malformed files and fields)."""
    from rich.text import Text

    done, by_status, missed = _finished_totals(states)
    rated = by_status.total()
    line = Text(f"finished {done} sessions: accepted {_pct(by_status.get('accepted', 0), rated)}, "
                f"rejected {_pct(by_status.get('rejected', 0), rated)}, "
                f"failed {_pct(by_status.get('failed', 0), rated)}"
                + (f" ({missed} in bursts not in the rates and step figures)" if missed else "")
                + (f"   refresh {interval_s:g}s, Ctrl-C quits" if interval_s > 0 else ""), style="dim")
    skipped = unread.text() if unread is not None else ""
    if skipped:
        line.append(f"   {skipped}", style="yellow")
    return line


class TopView:
    """Reads a log dir's live files and renders frames; the file list is re-scanned every
    ``rescan_s`` (a run's ranks appear as they start)."""

    def __init__(self, logdir: Path | str, *, interval_s: float = 1.0, rescan_s: float = 5.0) -> None:
        self.logdir = Path(logdir)
        self.interval_s = interval_s
        self.rescan_s = rescan_s
        self._files: list[Path] = []
        self._scanned = -math.inf
        self._missing = True
        #: what the last read skipped
        self.unread = Unread()

    def states(self) -> list[RankState]:
        """The live files as read now (re-scanned sooner while ranks are missing)."""
        now = time.monotonic()
        if now - self._scanned >= self.rescan_s or self._missing:
            self._files = find_live_files(self.logdir)
            self._scanned = now
        self.unread = Unread()
        states = read_states(self._files, unread=self.unread)
        world = max((s.doc.get("world_size") or 0 for s in states), default=0)
        self._missing = not states or len({s.rank for s in states}) < world
        return states

    def frame(self) -> RenderableType:
        """One frame as a ``rich`` renderable."""
        states = self.states()
        return render(states, self.logdir, interval_s=self.interval_s, unread=self.unread)


def _console() -> Console:
    """A console for the view: off a terminal (a pipe, a file) 200 columns, not rich's 80."""
    from rltrace.cli.console import CliConsole

    console = CliConsole()
    return console if console.is_terminal else CliConsole(width=200)


def watch(logdir: Path | str, *, interval_s: float = 1.0, until: Callable[[], bool] | None = None,
          console: Console | None = None, screen: bool = False) -> None:
    """Render the live view, refreshed every ``interval_s``, until ``until()`` is true or Ctrl-C."""
    from rich.live import Live

    view = TopView(logdir, interval_s=interval_s)
    console = console or _console()
    if not console.is_terminal:  # a pipe or a file: rich's Live would print nothing until the end
        _print_frames(view, console, interval_s, until)
        return
    with Live(view.frame(), console=console, auto_refresh=False, screen=screen) as live:
        while until is None or not until():
            deadline = time.monotonic() + interval_s
            while time.monotonic() < deadline and (until is None or not until()):
                time.sleep(min(0.1, interval_s))  # the refresh cadence, not a synchronisation
            live.update(view.frame(), refresh=True)
    if not console.is_terminal:
        console.line()  # the last frame ends without a newline off a terminal


def _print_frames(view: TopView, console: Console, interval_s: float,
                  until: Callable[[], bool] | None) -> None:
    """Off a terminal: every ``interval_s`` one frame as plain text, then a blank line, flushed
    (a pipe or a log file sees each as it comes), until ``until()`` is true or Ctrl-C."""
    while True:
        console.print(view.frame())
        console.line()
        console.file.flush()
        deadline = time.monotonic() + interval_s
        while time.monotonic() < deadline:
            if until is not None and until():
                console.print(view.frame())  # the run's last state
                return
            time.sleep(min(0.1, interval_s))  # the refresh cadence, not a synchronisation


def run_top(logdir: Path | str, *, interval_s: float = 1.0, once: bool = False,
            console: Console | None = None) -> int:
    """``rltrace top``: print one frame (``once``) or refresh until Ctrl-C; returns an exit code."""
    console = console or _console()
    if once:  # one frame: no refresh to announce
        console.print(TopView(logdir, interval_s=0).frame())
        return 0
    try:
        watch(logdir, interval_s=interval_s, console=console, screen=console.is_terminal)
    except KeyboardInterrupt:
        pass
    return 0
