"""The report's plots: matplotlib figures (no pyplot, no GUI backend) saved as PNG files."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.patches import Rectangle
    from matplotlib.typing import ColorType

from rltrace.analysis.report_shape import Report
from rltrace.analysis.units import SCALE, unit_of, with_unit
from rltrace.logdir.files import write_atomically

DPI = 100
MAX_CDF_STEPS = 12
STATUS_COLORS: Mapping[str, str] = MappingProxyType({
    "accepted": "#2ca02c", "rejected": "#ff7f0e", "failed": "#d62728", "dropped": "#9467bd",
    "pending": "#7f7f7f"})


@dataclass
class Plot:
    """One written plot: its key, file, title and what it shows."""

    key: str
    path: Path
    title: str
    caption: str


def _colors(names: list[str]) -> dict[str, ColorType]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    fixed: dict[str, ColorType] = {
        "generate": cmap(0), "toolcall": cmap(1), "reward": cmap(3), "other": "#bbbbbb",
        "untracked": "#bbbbbb", "queue wait": "#c9c9c9", "group wait": "#f2a8a0",
        "before finalize": "#8c8c8c", "no phase recorded": "#dddddd"}
    extra: Sequence[ColorType] = ([cmap(i) for i in (2, 4, 5, 6, 8, 9)]
                                  + [colormaps["tab20b"](i) for i in range(20)])
    out: dict[str, ColorType] = {}
    j = k = 0
    greys = ["#d9d9d9", "#b8b8b8", "#e8e8e8", "#a6a6a6", "#cfcfcf", "#f0f0f0"]
    for n in names:
        if n in fixed:
            out[n] = fixed[n]
        elif n.startswith("after "):  # a gap between phases
            out[n] = greys[k % len(greys)]
            k += 1
        else:
            out[n] = extra[j % len(extra)]
            j += 1
    return out


def _unit(rep: Report, view: str) -> tuple[str, float]:
    """The time unit of ``view`` (:mod:`.units`: the one its tables use) and the seconds in one."""
    unit = unit_of(rep, view)
    return unit, SCALE[unit]


def _in(values: Iterable[float | None], scale: float) -> np.ndarray:
    """Seconds (None: NaN) in a unit of ``scale`` seconds."""
    v: np.ndarray = np.array([np.nan if x is None else x for x in values], dtype=float) / scale
    return v


def _step_labels(steps: Sequence[object]) -> list[str]:
    return ["–" if s is None else str(s) for s in steps]


def _xticks(ax: Axes, n: int, labels: list[str]) -> None:
    every = max(1, n // 25)
    ax.set_xticks(range(0, n, every))
    ax.set_xticklabels(labels[::every], rotation=0 if n <= 25 else 90, fontsize=8)


def plot_cdf(rep: Report) -> Figure | None:
    lt = rep["longtail"]
    curves: dict[Any, tuple[np.ndarray, np.ndarray]] = lt.get("_curves") or {}
    if not lt["overall"]["count"]:
        return None
    unit, scale = _unit(rep, "longtail")
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    keys = [k for k in curves if k is not None]
    if len(keys) > MAX_CDF_STEPS:
        pick = np.linspace(0, len(keys) - 1, MAX_CDF_STEPS).round().astype(int)
        keys = [keys[i] for i in sorted(set(pick.tolist()))]
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    for i, k in enumerate(keys):
        xs, qs = curves[k]
        ax.plot(_in(xs, scale), qs, color=cmap(i / max(1, len(keys) - 1)), lw=1, alpha=0.8, label=f"step {k}")
    cdf = lt["cdf"]
    ax.plot(_in(cdf["completion_s"], scale), cdf["fraction"], color="black", lw=2.2, label="all steps")
    ov = lt["overall"]
    for key, lab in (("p50_s", "P50"), ("p90_s", "P90"), ("p99_s", "P99")):
        ax.axvline(ov[key] / scale, color="#555555", ls="--", lw=0.8)
        ax.text(ov[key] / scale, 0.02, f" {lab}", fontsize=8, color="#333333", rotation=90, va="bottom")
    ax.axhline(0.8, color="#d62728", ls=":", lw=0.8)
    ax.set_xlabel(f"session completion time since step start ({unit})")
    ax.set_ylabel("fraction of sessions finished")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    _legend_above(ax, *ax.get_legend_handles_labels())
    return fig


def _legend_above(ax: Axes, handles: list[Artist], labels: list[str]) -> None:
    """A legend above the axes, outside the data area, so it covers no curve, point or label."""
    ax.legend(handles, labels, fontsize=7, ncol=min(len(labels), 7), loc="lower center",
              bbox_to_anchor=(0.5, 1.02), borderaxespad=0.0, frameon=False)


def plot_step_tail(rep: Report) -> Figure | None:
    rows = [r for r in rep["longtail"]["per_step"] if r["count"]]
    if not rows:
        return None
    unit, scale = _unit(rep, "longtail")
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    p99, top = (_in([r[k] for r in rows], scale) for k in ("p99_s", "max_s"))
    same = _same_pixel(fig, ax, p99, top, [r[k] / scale for r in rows for k in ("p50_s", "max_s")])
    for key, lab, color in (("p50_s", "P50", "#1f77b4"), ("p90_s", "P90", "#ff7f0e")):
        ax.plot(x, _in([r[key] for r in rows], scale), marker="o", ms=3, label=lab, color=color)
    _p99_and_max(ax, x, p99, top, same)
    ax.set_ylabel(f"completion since step start ({unit})")
    ax.set_xlabel("step")
    _xticks(ax, len(rows), _step_labels([r["step"] for r in rows]))
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.bar(x, [r["tail_fraction"] or 0 for r in rows], color="#9467bd", alpha=0.25,
            label="time waiting for last 20%")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("share of rollout waiting for the last 20%")
    ax.set_zorder(ax2.get_zorder() + 1)  # the lines over the bars
    ax.patch.set_visible(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    _legend_above(ax, h1 + h2, l1 + l2)
    return fig


def _same_pixel(fig: Figure, ax: Axes, a: np.ndarray, b: np.ndarray, span: list[float]) -> np.ndarray:
    """Where ``a`` and ``b`` would be drawn within a pixel of each other on ``ax`` (whose y range
    covers ``span``, plus matplotlib's 5% margins; ``fig`` is the figure ``ax`` is on)."""
    px = max(ax.get_position().height * fig.get_figheight() * fig.dpi, 1.0)
    lo, hi = float(np.nanmin(span)), float(np.nanmax(span))
    one_px = (hi - lo) * 1.1 / px if hi > lo else 0.0
    same: np.ndarray = np.abs(a - b) <= one_px
    return same


def _p99_and_max(ax: Axes, x: np.ndarray, p99: np.ndarray, top: np.ndarray, same: np.ndarray) -> None:
    """P99 and max per step, both readable where they coincide: one line "P99 = max" when they do
    in every step, else max as black dots and P99 drawn over it as red rings (a ring around a dot
    where they coincide)."""
    if same.all():
        ax.plot(x, top, marker="o", ms=4, label="P99 = max", color="#d62728", mec="black", mfc="black")
        return
    label = "P99 (ring around the max dot: P99 = max)" if same.any() else "P99"
    ax.plot(x, p99, marker="o", ms=7, mfc="none", mew=1.3, label=label, color="#d62728", zorder=2.2)
    ax.plot(x, top, marker="o", ms=3, label="max", color="#000000", zorder=2.1)


MANY_RANKS = 64  # past this many ranks, per-rank views show the slowest ranks and a distribution
TOP_RANKS = 24  # the slowest ranks drawn one row each when there are more than MANY_RANKS
BANDS = ((0.0, 100.0, 0.25), (10.0, 90.0, 0.45), (25.0, 75.0, 0.7))  # (low q, high q, alpha)


def _ratios(m: np.ndarray) -> np.ndarray:
    """Each rank's rollout time over the fastest rank's of the step (NaN where there is none)."""
    fastest = np.min(np.where(np.isfinite(m), m, np.inf), axis=0, initial=np.inf)
    fastest[~np.isfinite(fastest)] = np.nan  # a step without any rollout time
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio: np.ndarray = m / fastest
    return ratio


def slowest_rows(ratio: np.ndarray, n: int = TOP_RANKS) -> np.ndarray:
    """Row indices of the ``n`` ranks with the highest worst ratio, slowest first."""
    worst = np.nanmax(np.where(np.isfinite(ratio), ratio, -np.inf), axis=1)
    order: np.ndarray = np.argsort(-worst, kind="stable")[:n]
    return order


#: the stragglers plot's caption when no step has two ranks to compare
ONE_RANK_CAPTION = ("Rollout time per step. No step has two ranks with a rollout time (a one-rank run): "
                    "nobody to straggle behind and nothing to wait for, so no straggler is judged and no "
                    "barrier wait is drawn.")


def comparable_steps(m: np.ndarray) -> bool:
    """Whether any step (column of the ranks x steps rollout matrix) has two ranks with a time:
    without one there is no straggler and no barrier wait to draw."""
    return bool(m.size) and bool((np.isfinite(m).sum(axis=0) >= 2).any())


def stragglers_caption(rep: Report, caption: str) -> str:
    """The stragglers plot's caption: ``caption``, what was aggregated past MANY_RANKS ranks, or
    why there is nothing to compare (one rank)."""
    ranks, _, m = rep["stragglers"].get("_matrix", ([], [], np.zeros((0, 0))))
    n = len(ranks)
    if not comparable_steps(m):
        return ONE_RANK_CAPTION
    if n <= MANY_RANKS:
        return caption
    return (f"Rollout time relative to the fastest rank of the step for the {TOP_RANKS} slowest of {n:,} "
            f"ranks (by their worst step; outliers boxed); below, the distribution over all {n:,} ranks per "
            f"step (min–max, P10–P90 and P25–P75 bands, median line), then the barrier wait per step.")


def plot_stragglers(rep: Report) -> Figure | None:
    sg = rep["stragglers"]
    ranks, steps, m = sg.get("_matrix", ([], [], np.zeros((0, 0))))
    if m.size == 0 or not np.isfinite(m).any():
        return None
    if not comparable_steps(m):
        return _plot_one_rank(ranks, steps, m, *_unit(rep, "stragglers"))
    if len(ranks) > MANY_RANKS:
        return _plot_many_stragglers(sg, ranks, steps, m, _unit(rep, "stragglers"))
    fig = Figure(figsize=(8, 2.2 + 0.25 * len(ranks) + 2.2))
    gs = fig.add_gridspec(2, 1, height_ratios=[max(1.0, 0.25 * len(ranks) + 1), 1.6])
    ax = fig.add_subplot(gs[0])
    ratio = _ratios(m)
    im = ax.imshow(ratio, aspect="auto", cmap="magma_r", vmin=1.0,
                   vmax=max(1.5, float(np.nanmax(ratio)) if np.isfinite(ratio).any() else 1.5),
                   interpolation="nearest")
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks], fontsize=8)
    _xticks(ax, len(steps), [str(s) for s in steps])
    ax.set_title("rollout time / fastest rank of the step (outliers boxed)", fontsize=9)
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: j for j, s in enumerate(steps)}
    for o in sg["outliers"]:
        j, i = si[o["step"]], ri[o["rank"]]
        ax.add_patch(_rect(j - 0.5, i - 0.5))
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    _barrier_axes(fig.add_subplot(gs[1]), sg["per_step"], *_unit(rep, "stragglers"))
    return fig


def _plot_one_rank(ranks: Sequence[object], steps: Sequence[object], m: np.ndarray, unit: str,
                   scale: float) -> Figure:
    """No step with two ranks: each rank's rollout time per step, and no barrier-wait axes (a
    ratio to the fastest rank is 1 everywhere and the wait 0, so a heatmap and bars would say
    nothing); the title says why."""
    fig = Figure(figsize=(8, 2.6))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(steps))
    for i, r in enumerate(ranks):
        ax.plot(x, m[i] / scale, marker="o", ms=4, label=f"rank {r}")
    _xticks(ax, len(steps), [str(s) for s in steps])
    ax.set_ylabel(f"rollout ({unit})")
    ax.set_ylim(bottom=0)
    ax.set_title("rollout time per step; one rank per step: no straggler or barrier wait to compare",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


def _plot_many_stragglers(sg: dict[str, Any], ranks: Sequence[object], steps: Sequence[object], m: np.ndarray,
                          unit: tuple[str, float]) -> Figure:
    """More than MANY_RANKS ranks: a heatmap of the TOP_RANKS slowest, the distribution of all
    ranks per step as quantile bands, and the barrier wait; the height does not grow with ranks."""
    ratio = _ratios(m)
    rows = slowest_rows(ratio)
    top = ratio[rows]
    fig = Figure(figsize=(8, 2.2 + 0.25 * TOP_RANKS + 2.6 + 2.2))
    gs = fig.add_gridspec(3, 1, height_ratios=[0.25 * TOP_RANKS + 1, 2.2, 1.6])
    ax = fig.add_subplot(gs[0])
    vmax = max(1.5, float(np.nanmax(ratio)) if np.isfinite(ratio).any() else 1.5)
    im = ax.imshow(top, aspect="auto", cmap="magma_r", vmin=1.0, vmax=vmax, interpolation="nearest")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {ranks[int(i)]}" for i in rows], fontsize=8)
    _xticks(ax, len(steps), [str(s) for s in steps])
    ax.set_title(f"rollout time / fastest rank of the step: the {len(rows)} slowest of {len(ranks):,} ranks "
                 f"(outliers boxed)", fontsize=9)
    pos = {int(i): y for y, i in enumerate(rows)}
    ri = {r: i for i, r in enumerate(ranks)}
    si = {s: j for j, s in enumerate(steps)}
    for o in sg["outliers"]:
        y = pos.get(ri[o["rank"]])
        if y is not None:
            ax.add_patch(_rect(si[o["step"]] - 0.5, y - 0.5))
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    ab = fig.add_subplot(gs[1])
    x = np.arange(len(steps))
    finite = np.isfinite(ratio)
    have = finite.any(axis=0)
    with np.errstate(invalid="ignore"):
        filled = np.where(finite, ratio, np.nan)
        qs = {q: np.full(len(steps), np.nan) for q in (0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 100.0)}
        if have.any():
            for q in qs:
                qs[q][have] = np.nanpercentile(filled[:, have], q, axis=0)
    for lo, hi, alpha in BANDS:
        ab.bar(x, np.nan_to_num(qs[hi] - qs[lo]), bottom=np.nan_to_num(qs[lo], nan=1.0), width=0.8,
               color="#7b3294", alpha=alpha, linewidth=0, label=f"P{lo:g}–P{hi:g}" if lo else "min–max")
    ab.scatter(x, qs[50.0], marker="_", s=120, color="black", label="median", zorder=3)
    ab.set_xlim(-0.5, len(steps) - 0.5)
    _xticks(ab, len(steps), [str(s) for s in steps])
    ab.set_ylabel("× fastest")
    ab.set_title(f"all {len(ranks):,} ranks per step", fontsize=9)
    ab.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ab.grid(alpha=0.3, axis="y")
    _barrier_axes(fig.add_subplot(gs[2]), sg["per_step"], *unit)
    return fig


def _barrier_axes(ax2: Axes, rows: list[dict[str, Any]], unit: str, scale: float) -> None:
    ax2.bar(range(len(rows)), [r.get("barrier_wait_s", 0.0) / scale for r in rows], color="#d62728",
            alpha=0.7, label="barrier wait (slowest − fastest)")
    ax2.set_ylabel(f"barrier wait ({unit})")
    ax2.set_xlabel("step")
    _xticks(ax2, len(rows), [str(r["step"]) for r in rows])
    ax2.set_xlim(-0.5, len(rows) - 0.5)
    ax2.legend(fontsize=7, loc="upper left")
    ax2.grid(alpha=0.3, axis="y")


def _rect(x: float, y: float) -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 1, fill=False, edgecolor="#00bfff", lw=2)


def _stacked(ax: Axes, steps: Sequence[object], names: list[str], values: dict[str, list[float]]) -> None:
    colors = _colors(names)
    x = np.arange(len(steps))
    bottom = np.zeros(len(steps))
    for n in names:
        v = np.nan_to_num(np.asarray(values[n], dtype=float))
        ax.bar(x, v, bottom=bottom, color=colors[n], label=n, width=0.85)
        bottom += v
    _xticks(ax, len(steps), _step_labels(steps))
    ax.set_xlabel("step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(alpha=0.3, axis="y")


def plot_session_phases(rep: Report) -> Figure | None:
    ph = rep["phases"]["session"]
    if not ph["per_step"]:
        return None
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    names = ph["phases"]
    _stacked(ax, [r["step"] for r in ph["per_step"]], names,
             {n: [r["share"][n] or 0.0 for r in ph["per_step"]] for n in names})
    ax.set_ylabel("share of session time")
    return fig


def plot_train_phases(rep: Report) -> Figure | None:
    tr = rep["phases"]["train"]
    if not tr["per_step"]:
        return None
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    names = tr["scopes"]
    unit, scale = _unit(rep, "train_phases")
    _stacked(ax, [r["step"] for r in tr["per_step"]], names,
             {n: [r["mean_s"][n] / scale for r in tr["per_step"]] for n in names})
    ax.set_ylabel(f"time per step ({unit}, mean over ranks)")
    return fig


def plot_turns(rep: Report) -> Figure | None:
    tu = rep["turns"]
    if not tu["distribution"]:
        return None
    fig = Figure(figsize=(11, 3.4))
    a1, a2, a3 = fig.subplots(1, 3)
    d = tu["distribution"]
    a1.bar([r["turns"] for r in d], [r["fraction"] for r in d], color="#1f77b4")
    a1.set_xlabel("turns per session")
    a1.set_ylabel("fraction of sessions")
    unit, scale = _unit(rep, "turns")
    g = tu["generate_by_turn"]
    a2.bar([r["turn"] for r in g], [r["mean_s"] / scale for r in g], color="#ff7f0e")
    a2.set_xlabel("turn index")
    a2.set_ylabel(f"mean generate time ({unit})")
    b = tu["session_time_by_turns"]
    a3.bar([r["turns"] for r in b], [r["mean_s"] / scale for r in b], color="#2ca02c")
    a3.set_xlabel("turns per session")
    a3.set_ylabel(f"mean session time ({unit})")
    for a, xs in ((a1, [r["turns"] for r in d]), (a2, [r["turn"] for r in g]), (a3, [r["turns"] for r in b])):
        a.grid(alpha=0.3, axis="y")
        _integer_ticks(a, xs)
    fig.tight_layout()
    return fig


def _integer_ticks(ax: Axes, xs: list[int]) -> None:
    """Whole-number x ticks: at each value when there are few (one-turn sessions get one tick at
    1, not 0.6 0.8 1.0 1.2 1.4), else wherever matplotlib puts integer ticks."""
    from matplotlib.ticker import MaxNLocator

    values = sorted(set(xs))
    if 0 < len(values) <= 12:
        ax.set_xticks(values)
        ax.set_xlim(values[0] - 0.75, values[-1] + 0.75)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_status(rep: Report) -> Figure | None:
    st = rep["status"]
    if not st["per_step"]:
        return None
    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    names = list(st["counts"])
    rows = st["per_step"]
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for n in names:
        v = np.array([r["counts"].get(n, 0) for r in rows], dtype=float)
        ax.bar(x, v, bottom=bottom, label=n, color=STATUS_COLORS.get(n), width=0.85)
        bottom += v
    ax.set_ylabel("sessions")
    ax.set_xlabel("step")
    _xticks(ax, len(rows), _step_labels([r["step"] for r in rows]))
    _pad_bars(ax, len(rows), float(bottom.max()) if rows else 0.0)
    ax2 = ax.twinx()
    ax2.plot(x, [r["acceptance_rate"] for r in rows], color="black", marker="o", ms=3,
             label="acceptance rate")
    ax2.set_ylim(-BAR_PAD_Y, 1.0 + BAR_PAD_Y * 2)  # 0 and 1 level with the sessions axis' 0 and top
    ax2.set_ylabel("acceptance rate")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    return fig


#: fraction of the tallest bar left free below the bars and above them, so no bar touches an axis
BAR_PAD_Y = 0.04
#: free space left and right of the outer bars, in bar slots
BAR_PAD_X = 0.35


def _pad_bars(ax: Axes, n: int, tallest: float) -> None:
    """Limits that keep bars at 0..n-1 (width < 1) and 0..tallest clear of the axes on every side."""
    ax.set_xlim(-0.5 - BAR_PAD_X, n - 0.5 + BAR_PAD_X)
    top = tallest if tallest > 0 else 1.0
    ax.set_ylim(-BAR_PAD_Y * top, top * (1.0 + BAR_PAD_Y * 2))


MAX_SCOPE_BARS = 15


def scopes_caption(rep: Report, caption: str) -> str:
    """The scopes plot's caption, counting the bars it draws (``caption`` is not used)."""
    n = len(rep["summary"]["scopes"])
    shown = min(n, MAX_SCOPE_BARS)
    if n <= MAX_SCOPE_BARS:
        return f"All {n} scope name{'s' if n != 1 else ''}, by total time."
    return f"The {shown} of {n:,} scope names with the most total time."


def plot_scopes(rep: Report) -> Figure | None:
    rows = rep["summary"]["scopes"][:MAX_SCOPE_BARS]
    if not rows:
        return None
    fig = Figure(figsize=(8, 0.9 + 0.3 * len(rows)))
    ax = fig.add_subplot()
    unit, scale = _unit(rep, "summary")
    y = np.arange(len(rows))[::-1]
    ax.barh(y, [r["total_s"] / scale for r in rows], color="#1f77b4")
    ax.set_yticks(y)
    ax.set_yticklabels([r["name"][:40] for r in rows], fontsize=8)
    for yi, r in zip(y, rows, strict=True):
        share = r["wall_share"]
        label = f" {share * 100:.1f}%" if share is not None else ""
        ax.text(r["total_s"] / scale, yi, label, va="center", fontsize=7)
    ax.set_xlabel(f"total time over all ranks ({unit}); label: share of wall time")
    ax.grid(alpha=0.3, axis="x")
    return fig


PLOTS: tuple[tuple[str, str, str, Callable[[Report], Figure | None]], ...] = (
    ("cdf", "Session completion CDF",
     "Fraction of sessions finished by time since their step's start: every step (black) and a "
     "sample of single steps; the red line marks 80% of sessions.", plot_cdf),
    ("step_tail", "Completion percentiles per step",
     "P50/P90/P99/max completion time per step; bars: share of the step's rollout spent waiting "
     "for the last 20% of sessions.", plot_step_tail),
    ("stragglers", "Stragglers",
     "Rollout time of each rank relative to the fastest rank of the step (outliers boxed) and "
     "the barrier wait per step.", plot_stragglers),
    ("session_phases", "Session time by phase and wait, per step",
     "Share of session time in queue wait, each phase, gaps between phases, group wait (done, waiting "
     "for the slowest sibling) and before finalize; each bar adds up to 100%.", plot_session_phases),
    ("train_phases", "Step time by train-side scope, per step",
     "Time per step in each train.* scope directly under the step (its train.step scope, else "
     "from its first train.* scope to the next step's), mean over ranks; untracked: step time in no "
     "train.* scope.",
     plot_train_phases),
    ("turns", "Turns",
     "Turns per session; mean generate time by turn index; mean session time by number of turns.",
     plot_turns),
    ("status", "Sessions by status, per step", "Session counts by status and the acceptance rate.",
     plot_status),
    ("scopes", "Scopes by total time", "", plot_scopes),
)
#: captions that depend on the report (what was drawn): key -> (report, static caption) -> caption
CAPTIONS: Mapping[str, Callable[[Report, str], str]] = MappingProxyType({
    "stragglers": stragglers_caption, "scopes": scopes_caption})


MAX_TIMELINES = 3
MAX_TIMELINE_ROWS = 16
WAIT_STYLE: Mapping[str, tuple[str, str, str]] = MappingProxyType({  # kind -> (colour, hatch, label)
    "queue": ("#c9c9c9", "//", "queue wait"),
    "gap": ("#e3e3e3", "", "between phases"),
    "group": ("#f2a8a0", "xx", "group wait (for the holder)"),
    "finalize": ("#8c8c8c", "", "before finalize"),
    "none": ("#dddddd", "..", "no phase recorded"),
})


def _timeline_rows(g: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = g["members"][:MAX_TIMELINE_ROWS]
    return rows


def _segment_style(seg: dict[str, Any], colors: dict[str, ColorType]) -> tuple[ColorType, str, str]:
    if seg["kind"] == "phase":
        return colors[seg["label"]], "", seg["label"]
    return WAIT_STYLE.get(seg["kind"], WAIT_STYLE["gap"])


def plot_group_timeline(g: dict[str, Any], unit: str = "s") -> Figure:
    """One slow group: a row per session, its phases (with turn numbers) and waits on one time axis
    (in ``unit``, the groups view's)."""
    scale = SCALE[unit]
    rows = _timeline_rows(g)
    phases = sorted({seg["label"] for m in rows for seg in m["segments"] if seg["kind"] == "phase"})
    colors = _colors(phases)
    fig = Figure(figsize=(10, 1.3 + 0.42 * len(rows)))
    ax = fig.add_subplot()
    span = (max((seg["end_s"] for m in rows for seg in m["segments"]), default=1.0) or 1.0) / scale
    seen: dict[str, Artist] = {}
    for y, m in enumerate(rows):
        for seg in m["segments"]:
            color, hatch, label = _segment_style(seg, colors)
            x0, w = seg["start_s"] / scale, (seg["end_s"] - seg["start_s"]) / scale
            bars = ax.broken_barh([(x0, w)], (y - 0.36, 0.72), facecolors=color, hatch=hatch,
                                  edgecolor="white" if not hatch else "#7a7a7a", linewidth=0.5)
            seen.setdefault(label, bars)
            if seg["kind"] == "phase" and seg["turn"] is not None and w > span * 0.035:
                ax.text(x0 + w / 2, y, f"t{seg['turn']}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"session {m['session_id']}" + (" — held the group" if m["held"] else "")
                        for m in rows], fontsize=8)
    for tick, m in zip(ax.get_yticklabels(), rows, strict=True):
        if m["held"]:
            tick.set_fontweight("bold")
            tick.set_color("#c8372d")
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel(f"time since the group's first submit ({unit}; t<n>: turn index)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(list(seen.values()), list(seen), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _timeline_text(g: dict[str, Any], unit: str = "s") -> tuple[str, str]:
    h = g["holder"]
    step = "–" if g["step"] is None else g["step"]
    title = f"Slow group: rank {g['rank']} step {step} task {g['task_id']}"
    turn = h.get("slow_turn")
    turn = f" turn {turn}" if h.get("slow_kind") == "phase" and turn is not None else ""
    share = h.get("slow_share")
    span, slow = with_unit(g["span_s"], unit), with_unit(h["slow_phase_s"] or 0, unit)
    caption = (f"{g['sessions']} sessions over {span}. Session {h['session_id']} held the group: "
               f"{h['slow_phase']}{turn} took {slow}"
               + (f" ({share * 100:.0f}% of its own time)" if share is not None else "")
               + "; every other row's hatched red tail is time spent waiting for it (group wait).")
    return title, caption


def write_plots(rep: Report, directory: Path, stem: str) -> list[Plot]:
    """Render every plot that has data to ``directory/{stem}-{key}.png``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for key, title, caption, fn in PLOTS:
        fig = fn(rep)
        if fig is None:
            continue
        if key in CAPTIONS:
            caption = CAPTIONS[key](rep, caption)
        out.append(_save(fig, directory, stem, key, title, caption))
    for i, g in enumerate(rep.get("groups", {}).get("groups", [])[:MAX_TIMELINES], 1):
        unit = unit_of(rep, "groups")
        title, caption = _timeline_text(g, unit)
        out.append(_save(plot_group_timeline(g, unit), directory, stem, f"group_{i}", title, caption))
    return out


def _save(fig: Figure, directory: Path, stem: str, key: str, title: str, caption: str) -> Plot:
    path = directory / f"{stem}-{key}.png"
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight")
    write_atomically(path, png.getvalue())  # never through a link planted at its name
    return Plot(key, path, title, caption)
