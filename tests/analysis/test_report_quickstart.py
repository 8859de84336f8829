"""The README's 30-second quick start, run for real, then reported: step time by train-side scope.

Its loop marks steps only with ``trace_scope("train.rollout", args={"global_step": step})`` and
calls ``train_batch(batch)`` (``@trace_perf("fsdp_engine.train_batch")``) beside it, with no
``rltrace.step``: the report must not say the rollout took 100% of the step.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("numpy", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("matplotlib", reason="needs pip install 'rltrace[analysis]'")
pytest.importorskip("jinja2", reason="needs pip install 'rltrace[analysis]'")

from rltrace.analysis import report

STEPS = 4


def quick_start(fileroot: Path) -> str:
    """The README's quick-start block as a script: its fileroot, a loader of STEPS batches, and
    bodies for its ``...`` (the rollout sleeps 10 ms, train_batch 30 ms: work, not waiting)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## 30-second quick start"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "no python block in the README's quick start"
    src = code.group(1)
    for needle in ('fileroot="/shared/exp"', "def train_batch(batch): ...", "enumerate(loader)",
                   'trace_scope("train.rollout"', "    train_batch(batch)\n"):
        assert needle in src, needle
    src = src.replace('fileroot="/shared/exp"', f"fileroot={str(fileroot)!r}")
    src = src.replace("def train_batch(batch): ...", "def train_batch(batch):\n    time.sleep(0.03)")
    head = (f"import time\nloader = range({STEPS})\n\n"
            "def prepare_batch():\n    time.sleep(0.01)\n    return []\n\n")
    return head + src


def test_quick_start_loop_report_shares_step_time_with_train_batch(tmp_path: Path) -> None:
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start(tmp_path / "exp"))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (logdir,) = {p.parent for p in (tmp_path / "exp").rglob("perf_tracer")}
    rep, _ = report(logdir, tmp_path / "out" / "report.md")
    assert rep["inputs"]["steps"] == list(range(STEPS))
    tr = {r["scope"]: r for r in rep["phases"]["train"]["overall"]}
    assert set(tr) == {"train.rollout", "untracked"}
    scopes = {r["name"]: r for r in rep["summary"]["scopes"]}
    batch = scopes["fsdp_engine.train_batch"]
    assert batch["count"] == STEPS
    # every train_batch call lies in a step (between two rollout scopes, or after the last one) and
    # in no train.* scope: the step time outside train.* scopes holds all of it
    assert tr["untracked"]["total_s"] >= batch["total_s"] * 0.999
    assert tr["train.rollout"]["total_s"] == pytest.approx(scopes["train.rollout"]["total_s"])
    step_s = rep["phases"]["train"]["total_step_s"]
    assert step_s >= tr["train.rollout"]["total_s"] + batch["total_s"] * 0.999
    assert tr["train.rollout"]["share"] < 1.0
    assert sum(r["share"] for r in tr.values()) == pytest.approx(1.0)
    finding = next(f["text"] for f in rep["findings"] if f["text"].startswith("Step time by train-side"))
    assert "train.rollout 100.0%" not in finding
    assert "untracked (in no train.* scope)" in finding
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| train.rollout | " in md and "| untracked | " in md
