"""The report's plots as a user sees them: drawn by matplotlib's Agg renderer, then measured.

Legends stay out of the data area (no curve, point or annotation under them), P99 stays visible
where it equals the max, status bars keep clear of the axes, and captions count what is drawn.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HELPERS

pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import SynthSpec, write_rollout_run, write_run

from rltrace.analysis import ReportOptions, build_report, load_run, plots, report


def drawn(fig: Any) -> tuple[Any, np.ndarray]:
    """Draw ``fig`` with the Agg renderer (as the report saves it): the renderer and the RGB pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer(), np.asarray(canvas.buffer_rgba())[..., :3] / 255.0


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("plots")
    write_run(root / "run", SynthSpec(ranks=4, steps=8, sessions_per_step=48, slow_reward_factor=200.0,
                                      truth=False))
    return build_report(load_run(root / "run", ReportOptions(progress=False)))


def heavy_tail(rep: dict[str, Any]) -> dict[str, Any]:
    """``rep`` with a long tail whose P90 and P99 lie right of the middle of the CDF's x range,
    where a legend in the lower right corner sat on their labels (and on the step-tail's points)."""
    from rltrace.analysis.descriptive import percentiles, quantile_curve

    lt = dict(rep["longtail"])
    v = np.sort(np.concatenate([np.linspace(1.0, 2.0, 60), np.linspace(14.0, 19.0, 40)]))
    xs, qs = quantile_curve(v)
    lt["overall"] = {**percentiles(v), "tail_fraction": 0.5}
    lt["cdf"] = {"completion_s": xs.tolist(), "fraction": qs.tolist()}
    lt["_curves"] = {0: (xs, qs)}
    lt["per_step"] = [{**r, "p90_s": 18.0, "p99_s": 18.9, "max_s": 19.0} for r in lt["per_step"]]
    return {**rep, "longtail": lt}


def points_of(line: Any) -> np.ndarray:
    """A line's data points in display (pixel) coordinates."""
    pts: np.ndarray = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
    return pts


@pytest.mark.parametrize("data", ["planted", "heavy tail"])
@pytest.mark.parametrize("make", [plots.plot_cdf, plots.plot_step_tail], ids=["cdf", "step_tail"])
def test_legends_cover_no_annotation_point_or_data_area(planted: dict[str, Any], data: str,
                                                       make: Any) -> None:
    rep = planted if data == "planted" else heavy_tail(planted)
    fig = make(rep)
    renderer, _ = drawn(fig)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None
    box = legend.get_window_extent(renderer)
    texts = [t for a in fig.axes for t in a.texts]
    if make is plots.plot_cdf:
        assert [t.get_text().strip() for t in texts] == ["P50", "P90", "P99"]
    for t in texts:
        assert not box.overlaps(t.get_window_extent(renderer)), t.get_text()
    lines = [ln for a in fig.axes for ln in a.lines]
    assert lines
    for ln in lines:
        inside = [p for p in points_of(ln) if box.contains(*p)]
        assert not inside, (ln.get_label(), inside[:3])
    for a in fig.axes:  # nothing of the legend in any data area
        assert not box.overlaps(a.get_window_extent(renderer)), a


def step_tail_rep(p99: list[float], top: list[float]) -> dict[str, Any]:
    rows = [{"step": i, "count": 40, "p50_s": 1.0 + 0.1 * i, "p90_s": 2.0 + 0.1 * i, "p99_s": a,
             "max_s": b, "tail_fraction": 0.3} for i, (a, b) in enumerate(zip(p99, top, strict=True))]
    return {"longtail": {"per_step": rows}}


RED, BLACK = np.array([0xD6, 0x27, 0x28]) / 255.0, np.zeros(3)


def colour_near(img: np.ndarray, xy: np.ndarray, rgb: np.ndarray, r: int = 8, tol: float = 0.08) -> int:
    """Pixels of colour ``rgb`` within ``r`` pixels of the display point ``xy``."""
    x, y = round(float(xy[0])), img.shape[0] - round(float(xy[1]))
    win = img[max(y - r, 0):y + r + 1, max(x - r, 0):x + r + 1]
    return int(np.all(np.abs(win - rgb) < tol, axis=-1).sum())


@pytest.mark.parametrize("case", ["every step", "some steps"])
def test_p99_stays_visible_where_it_equals_the_max(case: str) -> None:
    top = [5.0, 9.0, 4.0, 12.0, 6.0, 7.0]
    p99 = list(top) if case == "every step" else [4.0, 9.0, 3.0, 12.0, 4.5, 7.0]
    fig = plots.plot_step_tail(step_tail_rep(p99, top))
    _, img = drawn(fig)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    same = [i for i, (a, b) in enumerate(zip(p99, top, strict=True)) if a == b]
    if case == "every step":
        assert "P99 = max" in labels
    else:
        assert any(lab.startswith("P99") and "= max" in lab for lab in labels), labels
        assert "max" in labels
    for i in same:  # both the P99 (red) and the max (black) show at the point they share
        xy = ax.transData.transform((i, top[i]))
        assert colour_near(img, xy, RED) >= 4, (case, i)
        assert colour_near(img, xy, BLACK) >= 4, (case, i)


def test_status_bars_keep_clear_of_every_axis(planted: dict[str, Any]) -> None:
    fig = plots.plot_status(planted)
    renderer, _ = drawn(fig)
    ax = fig.axes[0]
    frame = ax.get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for p in ax.patches]
    assert len(bars) == 3 * 8  # accepted, rejected, failed per step
    gap = 3.0  # pixels
    assert min(b.x0 for b in bars) - frame.x0 >= gap
    assert frame.x1 - max(b.x1 for b in bars) >= gap
    assert min(b.y0 for b in bars) - frame.y0 >= gap
    assert frame.y1 - max(b.y1 for b in bars) >= gap


def figcaption(html: str, key: str) -> str:
    m = re.search(rf'data-plot="{key}".*?<figcaption>(.*?)</figcaption>', html, re.S)
    assert m, key
    return re.sub(r"<[^>]+>", "", m.group(1))


@pytest.mark.parametrize("names", [11, 20])
def test_scopes_caption_counts_the_bars_drawn(tmp_path: Path, names: int) -> None:
    extra = tuple(f"user.scope_{i:02d}" for i in range(names - 4))  # + the 4 train.* scopes
    write_rollout_run(tmp_path / "run", np.full((2, 3), 10.0), extra_scopes=extra)
    rep, files = report(tmp_path / "run", tmp_path / "out" / "report.html")
    assert len(rep["summary"]["scopes"]) == names
    bars = len(plots.plot_scopes(rep).axes[0].patches)
    assert bars == min(names, 15)
    caption = figcaption(files[0].read_text(), "scopes")
    if names <= 15:
        assert f"All {bars} scope names" in caption, caption
    else:
        assert f"The {bars} of {names} scope names" in caption, caption
    assert "15" not in caption or bars == 15
