"""rltrace's pytest plugin is opt-in: a project that merely has rltrace installed runs its tests
untouched (nothing of rltrace is imported into its pytest session), and one that opts in with
``-p rltrace.testing.pytest_plugin`` gets the ``rltrace_capture`` fixture.

Each case runs a real pytest session in a fresh interpreter, in a project folder of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

UNTOUCHED = '''
import sys

def test_rltrace_is_not_in_this_session():
    assert "rltrace" not in sys.modules, sorted(m for m in sys.modules if m.startswith("rltrace"))
'''

OPTED_IN = '''
def test_the_fixture_captures_a_span(rltrace_capture):
    import rltrace
    with rltrace.trace_scope("train.step", args={"global_step": 2}):
        pass
    rltrace.flush()
    assert rltrace_capture.one("train.step").attributes["args.global_step"] == 2
'''


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "RLTRACE_", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)


def test_a_project_that_does_not_opt_in_runs_without_rltrace(tmp_path: Path) -> None:
    (tmp_path / "test_other_project.py").write_text(UNTOUCHED)
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout


def test_opting_in_with_dash_p_gives_the_capture_fixture(tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(OPTED_IN)
    proc = _pytest(tmp_path, "-p", "rltrace.testing.pytest_plugin")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    without = _pytest(tmp_path)  # the same test without the opt-in: no such fixture
    assert without.returncode != 0 and "fixture 'rltrace_capture' not found" in without.stdout
