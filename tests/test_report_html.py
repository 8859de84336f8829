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

pytest.importorskip("matplotlib", reason="rltrace report needs the analysis extra")
pytest.importorskip("jinja2", reason="rltrace report needs the analysis extra")

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from synth_run import SynthSpec, write_run

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
    assert len(rep["plots"]) == 8
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
    for section in ("findings", "longtail", "stragglers", "phases", "turns", "status", "summary"):
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
