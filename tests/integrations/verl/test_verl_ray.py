"""The Ray path: ``instrument()`` in the driver instruments verl in its Ray workers.

One run of ``verl_ray_driver.py`` in its own interpreter (Ray's processes never touch pytest's):
a plain ``ray.init`` (verl's own call) goes through ``rltrace.ray.init``, and verl's
``AgentLoopWorker`` runs as a Ray actor with a scripted server (a stand-in: no inference
server on the CPU here).  The test reads what the actor wrote.

The run takes about a minute on a 2-core machine (Ray's start, then ``import verl`` in the
actor: 8 to 15 s by itself).  The worker-side instrumentation it exercises is also tested
in-process in ``test_verl.py`` (the seam: ``test_instrument_registers_the_worker_setup_with_rltrace_ray``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
pytest.importorskip("verl", reason="verl is not installed (pip install 'rltrace[verl]', after "
                                   "torch==2.13.0)")

DRIVER = Path(__file__).resolve().parent / "verl_ray_driver.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("verl-ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RLTRACE_", "RAY_"))}
    proc = subprocess.run([sys.executable, str(DRIVER), str(out)], capture_output=True, text=True,
                          env=env, cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    logdir = next((out / "logs").rglob("config.yaml")).parent
    result["traces"] = [json.loads(line) for f in logdir.rglob("traces-*.jsonl")
                        for line in f.read_text().splitlines() if line.strip()]
    result["records"] = [json.loads(line) for f in logdir.rglob("sessions-*.jsonl")
                         for line in f.read_text().splitlines() if line.strip()]
    return result


def test_verls_own_ray_init_goes_through_rltrace_ray(run: dict[str, Any]) -> None:
    assert run["through_rltrace_ray"]
    assert run["timing_raw"] == ["gen", "step"]


def test_the_agent_loop_actor_records_a_session_per_sample_under_the_drivers_step(
        run: dict[str, Any]) -> None:
    records = sorted(run["records"], key=lambda r: r["session_id"])
    assert len(records) == run["samples"] == 4
    assert {r["step"] for r in records} == {3}
    assert len({r["task_id"] for r in records}) == 2
    assert [r["turns"] for r in records] == [2, 2, 1, 1]
    pids = {e["pid"] for e in run["traces"] if e.get("name") == "generate"}
    steps = {e["pid"] for e in run["traces"] if e.get("name") == "train.step"}
    assert pids and steps and pids.isdisjoint(steps)  # the sessions ran in the actor's process
