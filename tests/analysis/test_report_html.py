"""The HTML report in a real headless Chromium: every plot decoded, no console errors, a screenshot.

Needs the Debian package ``chromium`` (``apt-get install -y chromium``); skipped without it.
Chromium runs with name resolution mapped to nothing, so the page must open offline.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")

sys.path.insert(0, str(HELPERS))
from synth_run import GrpoSpec, SynthSpec, grpo_ids, write_grpo_run, write_rollout_run, write_run

from rltrace.analysis import report

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium not found (Debian: apt-get install -y chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0"]
CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")
IMG = re.compile(r"<img\b[^>]*>")


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    return [m.group(1) for m in map(CONSOLE.search, stderr.splitlines()) if m]


def plot_images(dom: str) -> dict[str, str]:
    """data-plot key -> the <img> tag, for every plot image in the DOM."""
    out = {}
    for tag in IMG.findall(dom):
        m = re.search(r'data-plot="([^"]+)"', tag)
        if m:
            out[m.group(1)] = tag
    return out


@pytest.fixture(scope="module")
def html_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("html")
    write_run(root / "run", SynthSpec(ranks=4, steps=8, sessions_per_step=48, slow_reward_factor=200.0))
    rep, files = report(root / "run", root / "out" / "report.html")
    return files[0], rep


def test_html_report_is_one_self_contained_file(html_report: Any) -> None:
    page, rep = html_report
    html = page.read_text()
    assert len(rep["plots"]) == 11  # 8 + a timeline for each of the 3 slowest groups
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert all(r.startswith(("data:image/png;base64,", "#")) for r in refs), refs
    assert "<link" not in html and "<script src" not in html and "@import" not in html


def test_every_plot_is_present_and_decoded_in_chromium_without_console_errors(html_report: Any,
                                                                              tmp_path: Path) -> None:
    page, rep = html_report
    proc = chromium(tmp_path, page, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    imgs = plot_images(proc.stdout)
    assert set(imgs) == set(rep["plots"])
    for key, tag in imgs.items():
        assert 'data-decoded="1"' in tag, f"plot {key} not decoded: {tag[:120]}"
    n = len(rep["plots"])
    assert f'data-plots-decoded="{n}/{n}"' in proc.stdout
    for section in ("findings", "groups", "longtail", "stragglers", "phases", "turns", "status", "summary"):
        assert f'<section id="{section}">' in proc.stdout
    assert "Step 3: rank 2 rollout took" in proc.stdout


def test_the_console_check_catches_errors_and_broken_plots(tmp_path: Path) -> None:
    from rltrace.analysis.template import HTML

    script = HTML[HTML.index("<script>"):HTML.index("</script>") + len("</script>")]
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body>"
                    '<img class="plot" data-plot="bad" src="data:image/png;base64,AAAA">'
                    f"{script}<script>throw new Error('boom');</script></body></html>")
    proc = chromium(tmp_path, page, "--dump-dom")
    messages = console_messages(proc.stderr)
    assert any("Uncaught Error: boom" in m for m in messages), proc.stderr[-2000:]
    assert any("plot did not load: bad" in m for m in messages), messages
    assert 'data-decoded="1"' not in plot_images(proc.stdout)["bad"]
    assert 'data-plots-decoded="0/1"' in proc.stdout


def test_screenshot_of_the_html_report(html_report: Any, tmp_path: Path) -> None:
    from matplotlib.image import imread

    page, _ = html_report
    shot = page.with_name("screenshot.png")  # kept next to the report for people to look at
    proc = chromium(tmp_path, page, "--hide-scrollbars", "--window-size=1300,4200", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    img = imread(shot)
    assert img.shape[:2] == (4200, 1300)
    assert img[..., :3].std() > 0.1  # not a blank page
    header = img[5:60, 5:600, :3]  # the dark page header rendered
    assert header.mean() < 0.3


# ---- the slow-group timeline: what a user looks at first ------------------------------------------

GROUP_WAIT_RGB = (0xF2, 0xA8, 0xA0)  # plots.WAIT_STYLE["group"]
GENERATE_RGB = (0x1F, 0x77, 0xB4)  # tab10 blue


def colour_rows(img: Any, rgb: tuple[int, int, int], tol: float = 0.03) -> Any:
    """Row indices of the screenshot holding pixels of colour ``rgb`` (within ``tol``)."""
    import numpy as np

    want = np.array(rgb) / 255.0
    hit = np.all(np.abs(img[..., :3] - want) < tol, axis=-1)
    return np.flatnonzero(hit.any(axis=1))


def test_screenshot_of_the_slow_group_timeline(tmp_path_factory: pytest.TempPathFactory) -> None:
    from matplotlib.image import imread

    root = tmp_path_factory.mktemp("timeline")
    spec = GrpoSpec()
    write_grpo_run(root / "run", spec)
    rep, files = report(root / "run", root / "out" / "report.html")
    page = files[0]
    _, sid = grpo_ids(spec, spec.slow_generate[0])  # type: ignore[index]
    tmp = root / "chromium"
    tmp.mkdir()
    proc = chromium(tmp, page, "--dump-dom")
    assert console_messages(proc.stderr) == []
    imgs = plot_images(proc.stdout)
    assert {"group_1", "group_2", "group_3"} <= set(imgs)
    assert 'data-decoded="1"' in imgs["group_1"]
    dom = proc.stdout
    assert dom.index('<section id="groups">') < dom.index('<section id="longtail">')
    assert f"held by session {sid}: generate turn 1 6.00 s" in dom
    shot = page.with_name("timeline-screenshot.png")  # kept next to the report for people to look at
    proc = chromium(tmp, page, "--hide-scrollbars", "--window-size=1300,1800", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    img = imread(shot)
    # the first timeline is on the first screen, below the findings: group wait (hatched red) on the
    # siblings' rows and generate (blue) on every row
    wait_rows, gen_rows = colour_rows(img, GROUP_WAIT_RGB), colour_rows(img, GENERATE_RGB)
    assert wait_rows.size > 40 and gen_rows.size > 40, (wait_rows.size, gen_rows.size)
    first = img[int(gen_rows.min()):int(gen_rows.max()) + 1]
    assert first.shape[0] < 1800
    g = rep["groups"]["groups"][0]
    assert g["holder"]["session_id"] == sid and g["sessions"] == spec.samples


# ---- layout: nothing clipped at a laptop's width; a run with traces but no sessions ---------------

#: appended to a copy of the page: opens every <details>, then lists every element whose right edge
#: passes the viewport and every scroll container whose content is wider than it (hidden, clipped)
LAYOUT_PROBE = """<script>
window.addEventListener("load", function () {
  var ds = document.querySelectorAll("details");
  for (var i = 0; i < ds.length; i++) { ds[i].open = true; }
  var vw = document.documentElement.clientWidth, out = [], all = document.querySelectorAll("main *");
  for (var i = 0; i < all.length; i++) {
    var e = all[i], r = e.getBoundingClientRect(), where = (e.closest("section") || {}).id;
    var text = (e.textContent || "").slice(0, 40);
    if (r.width > 0 && r.right > vw + 0.5) {
      out.push(where + ": " + e.tagName + " ends at " + r.right + ": " + text);
    }
    if (getComputedStyle(e).overflowX !== "visible" && e.scrollWidth > e.clientWidth + 1) {
      out.push(where + ": " + e.tagName + " hides " + (e.scrollWidth - e.clientWidth) + " px: " + text);
    }
  }
  var pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.setAttribute("data-viewport", vw);
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""
PROBE = re.compile(r'<pre id="layout-probe" data-viewport="(\d+)">(.*?)</pre>', re.S)


def clipped(tmp_path: Path, page: Path, width: int) -> tuple[int, list[str]]:
    """The viewport width Chromium laid ``page`` out at, and what passed its right edge."""
    import html
    import json

    probe = tmp_path / f"probe-{page.name}"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    proc = chromium(tmp_path, probe, "--hide-scrollbars", f"--window-size={width},1000", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    m = PROBE.search(proc.stdout)
    assert m, proc.stdout[-2000:]
    return int(m.group(1)), json.loads(html.unescape(m.group(2)))


def test_no_table_is_clipped_at_1300_px(html_report: Any, tmp_path: Path) -> None:
    page, rep = html_report
    assert len(rep["longtail"]["slowest_sessions"]) == 10
    assert "<code>" in page.read_text()  # the slowest sessions' trace ids, the widest cells
    viewport, over = clipped(tmp_path, page, 1300)
    assert viewport == 1300
    assert over == []


def test_a_run_with_steps_and_scopes_but_no_sessions_renders_every_section(tmp_path: Path) -> None:
    """Only trace files (3 ranks, no session_tracer/); step 2 has no rollout scope on any rank and
    step 3 none on rank 1: every section and plot renders, the stragglers rows without rollout
    data included, as in the Markdown and JSON reports."""
    import numpy as np

    m = np.array([[20.0, 21.0, np.nan, 20.0], [20.5, 20.0, np.nan, np.nan], [21.0, 80.0, np.nan, 22.0]])
    write_rollout_run(tmp_path / "run", m)
    for fmt in ("json", "md"):
        report(tmp_path / "run", tmp_path / "out" / f"report.{fmt}")
    rep, files = report(tmp_path / "run", tmp_path / "out" / "report.html")
    assert rep["inputs"]["sessions"] == 0 and rep["inputs"]["ranks"] == [0, 1, 2]
    per_step = rep["stragglers"]["per_step"]
    assert "fastest_rank" not in per_step[2] and per_step[3]["fastest_rank"] == 0
    proc = chromium(tmp_path, files[0], "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_messages(proc.stderr) == []
    dom = proc.stdout
    for section in ("findings", "groups", "longtail", "stragglers", "phases", "turns", "status", "summary",
                    "inputs"):
        assert f'<section id="{section}">' in dom, section
    n = len(rep["plots"])
    assert n >= 3 and f'data-plots-decoded="{n}/{n}"' in dom
    assert "no rollout time on any rank" in dom
    assert "Step 1: rank 2 rollout took" in dom  # the planted straggler, with no session to blame
    assert dom.rstrip().endswith("</html>")
