"""One time unit per view: a view's plot axes, table headers and times in words say the same unit.

A GRPO run whose sessions last milliseconds (5 ms generate, 1 ms tool calls) beside 5 s PPO
updates: the session views are in ms, the train-side scopes, goodput and critical path (steps of
~6 s) in s, and each view's plots agree with its tables.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
from conftest import HELPERS

pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import GrpoSpec, write_grpo_run

from rltrace.analysis import ReportOptions, build_report, load_run, plots, units
from rltrace.analysis.render import render_html, render_md

FAST = GrpoSpec(gen_s=0.005, tool_s=0.001, reward_s=0.0005, gap_s=0.0001, finalize_s=0.0002,
                slow_generate_s=0.06, queue_s=0.03, slow_tool_s=0.04)
UNIT = r"(µs|ms|s)"


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, str]:
    root = tmp_path_factory.mktemp("units")
    write_grpo_run(root / "run", FAST)
    rep = build_report(load_run(root / "run", ReportOptions(progress=False)))
    return rep, render_html(rep, []), render_md(rep, [])


def axis_units(fig: Any) -> set[str]:
    """The time units named on a figure's axis labels (``… (ms)``, ``(ms, mean over ranks)``)."""
    labels = [a.get_xlabel() for a in fig.axes] + [a.get_ylabel() for a in fig.axes]
    return {m.group(1) for lab in labels for m in re.finditer(rf"\({UNIT}[,;)]", lab)}


def region(html: str, view: str) -> str:
    """The part of the HTML report that shows ``view``."""
    def section(name: str) -> str:
        return html[html.index(f'<section id="{name}">'):].split("</section>", 1)[0]

    if view in ("session_phases", "train_phases"):
        phases = section("phases")
        cut = phases.index("<h3>Train-side scopes</h3>")
        end = phases.index("<details>", cut)
        return phases[cut:end] if view == "train_phases" else phases[:cut] + phases[end:]
    return section(view)


def header_units(html: str) -> set[str]:
    return set(re.findall(rf"<th[^>]*>[^<]*\({UNIT}\)</th>", html))


def worded_units(html: str) -> set[str]:
    """Units of times written with a number in the text and cells (``12.3 ms``)."""
    return set(re.findall(rf"\d {UNIT}\b", re.sub(r"<[^>]+>", " ", html)))


#: view -> its plots (figures drawn from the report) with a time axis
FIGURES = {
    "longtail": [plots.plot_cdf, plots.plot_step_tail],
    "groups": [lambda rep: plots.plot_group_timeline(rep["groups"]["groups"][0],
                                                     units.unit_of(rep, "groups"))],
    "stragglers": [plots.plot_stragglers],
    "train_phases": [plots.plot_train_phases],
    "turns": [plots.plot_turns],
    "summary": [plots.plot_scopes],
}
WANT = {"goodput": "s", "critical": "s", "longtail": "ms", "groups": "ms", "stragglers": "ms", "turns": "ms",
        "session_phases": "ms", "train_phases": "s", "summary": "ms"}


@pytest.mark.parametrize("view", list(WANT))
def test_a_views_plots_and_tables_use_one_time_unit(fast: Any, view: str) -> None:
    rep, html, _ = fast
    unit = units.unit_of(rep, view)
    assert unit == WANT[view]
    part = region(html, view)
    assert header_units(part) == {unit}, part[:400]
    assert worded_units(part) <= {unit}
    for make in FIGURES.get(view, []):
        assert axis_units(make(rep)) == {unit}, view


def test_markdown_tables_name_the_views_unit(fast: Any) -> None:
    _, _, md = fast
    assert "| sessions | P50 (ms) | P90 (ms) | P99 (ms) | P99.9 (ms) | max (ms) |" in md
    assert "| scope | total (s) | share |" in md
    assert re.search(r"\| scope \| count \| total \(ms\) \| mean \(ms\) \| P50 \(ms\)", md)


@pytest.mark.parametrize(("seconds", "unit", "text"), [
    (12.345, "s", "12.3"), (0.0123, "s", "0.0123"), (0.0123, "ms", "12.3"), (1234.5, "s", "1,234"),
    (4.567e-6, "µs", "4.57"), (0.0, "ms", "0"), (None, "s", "–"), (2e-9, "s", "<0.000001"),
])
def test_numbers_in_a_views_unit(seconds: float | None, unit: str, text: str) -> None:
    assert units.number(seconds, unit) == text


def test_a_views_unit_is_the_largest_its_median_time_fills() -> None:
    assert units.pick([0.002, 19.0, 1.5, None]) == "s"
    assert units.pick([0.002, 0.4, 30.0]) == "ms"
    assert units.pick([3e-6, 0.0]) == "µs"
    assert units.pick([]) == "s"
