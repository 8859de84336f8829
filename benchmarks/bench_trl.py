"""What ``rltrace.integrations.trl.instrument`` adds to a TRL GRPO step (JSON).

The same seeded ``GRPOTrainer`` run (``tests/integrations/trl/tiny_grpo.py``: a Qwen2 built from a
config, ``--size small`` by default: 4 layers of width 256, 8 completions of up to 48 tokens per
step in 2 groups; ``--size tiny`` is the tests' toy; a word-level tokenizer; two reward functions;
``--device cuda`` on a GPU) trains ``--steps`` steps in a fresh interpreter per run, once untraced and
once with ``instrument`` (files and session records on), rounds interleaving the two.  Each
step's time is taken by a ``TrainerCallback`` (a step's begin to the next one's, so callbacks and
logging count); the first step of each
run (compilation, allocator warm-up) is left out.  Printed: the median step time (wall) and
step CPU time (the process's, all threads: what the run pays even on a machine shared with
other work) of each contender over all rounds, the ratios traced / untraced, the median of the
per-round wall ratios, and whether the logged losses were identical in every pair.  Torch runs
one intra-op thread in both (``--threads``), which keeps step times steady.

Run: ``python benchmarks/bench_trl.py [--rounds R] [--steps N] [--size S] [--device D]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "integrations" / "trl" / "tiny_grpo.py"
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def _run(traced: bool, ns: argparse.Namespace, tmp: Path, tag: str) -> dict[str, Any]:
    out = tmp / f"{tag}.json"
    cmd = [sys.executable, str(RUN), str(out), "--workdir", str(tmp / tag), "--steps", str(ns.steps),
           "--size", ns.size, "--device", ns.device, "--threads", str(ns.threads)]
    if traced:
        cmd.append("--instrument")
    subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _losses(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k not in TIMING_KEYS} for h in history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--size", choices=["tiny", "small"], default="small",
                    help="the model's shape (tiny: the tests' toy, a step of tens of ms on a CPU)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ns = ap.parse_args()
    steps: dict[str, list[float]] = {"untraced": [], "traced": []}
    cpu: dict[str, list[float]] = {"untraced": [], "traced": []}
    ratios: list[float] = []
    identical = True
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(ns.rounds):
            order = ("untraced", "traced") if r % 2 == 0 else ("traced", "untraced")
            got: dict[str, dict[str, Any]] = {}
            for who in order:
                got[who] = _run(who == "traced", ns, tmp, f"{who}-{r}")
                steps[who] += got[who]["step_s"][1:]
                cpu[who] += got[who]["step_cpu_s"][1:]
            ratios.append(statistics.median(got["traced"]["step_s"][1:]) /
                          statistics.median(got["untraced"]["step_s"][1:]))
            identical &= _losses(got["traced"]["log_history"]) == _losses(got["untraced"]["log_history"])
    med = {k: statistics.median(v) for k, v in steps.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    print(json.dumps({
        "benchmark": "trl_grpo_step", "rounds": ns.rounds, "steps_per_run": ns.steps,
        "size": ns.size, "device": ns.device, "threads": ns.threads,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "platform": platform.platform()},
        "median_step_s": med, "ratio_traced_to_untraced": med["traced"] / med["untraced"],
        "median_step_cpu_s": med_cpu, "cpu_ratio_traced_to_untraced": med_cpu["traced"] / med_cpu["untraced"],
        "median_of_round_ratios": statistics.median(ratios), "round_ratios": ratios,
        "identical_logged_losses": identical, "target": "traced within 1% of untraced at the median",
    }, indent=2))


if __name__ == "__main__":
    main()
