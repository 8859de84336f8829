"""Stats reduced across real processes: torch.distributed gloo ranks and JAX CPU processes.

Each rank records different data (different sizes, keys and trackers on some ranks only); the
exported values must equal the values computed on the concatenated data, on every rank, and
only rank 0's StatsLogger may write files.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HELPERS, need

from rltrace import stats
from rltrace.stats.reduce import Aggregate, allreduce
from rltrace.testing import read_jsonl

WORKER = HELPERS / "stats_dist_worker.py"
sys.path.insert(0, str(HELPERS))
from stats_dist_worker import rank_data  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(backend: str, fileroot: Path, world: int,
         configured: list[Any] | None = None) -> list[list[dict[str, Any]]]:
    """Run ``world`` worker processes; return each rank's printed rounds (and, into
    ``configured``, what each rank printed after ``configure``, or None)."""
    configured = [] if configured is None else configured
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), backend, str(fileroot), str(port), str(r), str(world)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(world)
    ]
    outs = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err[-3000:]}"
            outs.append([json.loads(line) for line in out.splitlines() if line.startswith("{")])
            configured.append(next((o["configured"] for o in outs[-1] if "configured" in o), None))
            outs[-1] = [o for o in outs[-1] if "round" in o]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _expected(world: int, round_: int) -> dict[str, float]:
    """What export_all must return, computed on the concatenated data of every rank."""
    data = [rank_data(r, round_) for r in range(world)]
    values = np.concatenate([d["values"] for d in data])
    mask = np.concatenate([d["mask"] for d in data])
    tokens = np.concatenate([d["tokens"] for d in data])
    losses = [x for d in data for x in d["losses"]]
    sel = values[mask]
    exp = {
        "actor/valid": float(mask.sum()),
        "actor/logp/avg": float(sel.mean()), "actor/logp/min": float(sel.min()),
        "actor/logp/max": float(sel.max()),
        "actor/tokens": float(tokens[mask].sum()),
        "actor/lowest": float(sel.min()),
        "actor/loss": float(np.mean(losses)), "actor/loss__count": float(len(losses)),
        "rollout/reward": 0.5 + round_, "rollout/reward__count": 1.0,
    }
    for r in range(world):
        exp[f"only_rank{r}"] = float(r + round_)
        exp[f"only_rank{r}__count"] = 1.0
    if round_ == 1:
        exp["highest"] = float(data[0]["values"].max())
    return exp


def _check(outs: list[list[dict[str, Any]]], world: int, rel: float) -> None:
    for round_ in range(2):
        expected = _expected(world, round_)
        for rank, rounds in enumerate(outs):
            got = rounds[round_]["stats"]
            assert rounds[round_]["round"] == round_
            timing = {k: v for k, v in got.items() if k.startswith("timeperf/")}
            plain = {k: v for k, v in got.items() if not k.startswith("timeperf/")}
            assert plain == pytest.approx(expected, rel=rel, abs=rel), f"rank {rank} round {round_}"
            # the span bridge: one 'work' scalar per rank per step, averaged across ranks
            assert timing["timeperf/work__count"] == world
            assert timing["timeperf/work"] > 0


def test_torch_gloo_ranks_export_the_statistics_of_the_concatenated_data(tmp_path: Path) -> None:
    need("torch", "torch.distributed is needed for the gloo ranks")
    world = 3
    outs = _run("torch", tmp_path, world)
    _check(outs, world, rel=1e-9)
    rows = read_jsonl(tmp_path / "rank0" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["metrics"]["actor/logp/avg"] == pytest.approx(_expected(world, 1)["actor/logp/avg"])
    assert not any(k.endswith("__count") for k in rows[0]["metrics"])
    for rank in range(1, world):
        assert not (tmp_path / f"rank{rank}").exists(), f"rank {rank} wrote files"


def test_jax_cpu_processes_export_the_statistics_of_the_concatenated_data(tmp_path: Path) -> None:
    need("jax", "jax is needed for the multi-process JAX reduction")
    world = 2
    configured: list[Any] = []
    outs = _run("jax", tmp_path, world, configured)
    _check(outs, world, rel=1e-5)  # jax computes in float32 unless jax_enable_x64 is set
    # each rank's rank came from jax.distributed's client; asking the backend would have
    # initialised it in configure (on a GPU: preallocating most of its memory)
    assert configured == [{"rank": r, "backend_initialised": False} for r in range(world)]
    assert (tmp_path / "rank0" / "metrics.jsonl").exists()
    assert not (tmp_path / "rank1").exists()


def test_jax_single_process_reduction_equals_the_local_export() -> None:
    jnp = need("jax.numpy", "jax is needed for the JAX reduction path")
    t = stats.StatsTracker()
    t.denominator(m=jnp.array([True, False, True]))
    t.stat(x=jnp.array([1.0, 5.0, 2.0]), denominator="m")
    t.scalar(s=2.0)
    local = t.export(reduce_group=False, reset=False)
    assert t.export(reduce_group="jax") == local
    assert local == {"m": 2.0, "s": 2.0, "s__count": 1.0, "x/avg": 1.5, "x/max": 2.0, "x/min": 1.0}


class _ThreadGroup:
    """An in-process reducer for ``world`` threads (a barrier per collective), to test allreduce."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world
        self.local = threading.local()

    def _exchange(self, obj: Any) -> list[Any]:
        self.slots[self.local.rank] = obj
        self.barrier.wait(timeout=10)
        out = list(self.slots)
        self.barrier.wait(timeout=10)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        return self._exchange(obj)

    def all_reduce(self, vec: np.ndarray, op: str) -> np.ndarray:
        rows = np.stack(self._exchange(vec))
        return {"sum": rows.sum(0), "min": rows.min(0), "max": rows.max(0)}[op]


def test_a_reduce_type_conflict_between_ranks_raises_on_every_rank_without_hanging() -> None:
    group = _ThreadGroup(2)
    errors: list[str] = []

    def rank(r: int) -> None:
        group.local.rank = r
        kind = "scalar" if r == 0 else "sum"
        try:
            allreduce({"x": Aggregate(kind, 1.0, 1.0, 1.0, 1.0)}, group)
        except ValueError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(errors) == 2 and all("'x'" in e and "different ranks" in e for e in errors)


def test_a_custom_reducer_object_is_accepted_as_reduce_group() -> None:
    group = _ThreadGroup(2)
    results: dict[int, dict[str, float]] = {}

    def rank(r: int) -> None:
        group.local.rank = r
        t = stats.StatsTracker()
        t.scalar(**{"a": 1.0 + r})
        if r == 1:
            t.stat(v=np.array([4.0, -1.0]), reduce_type="min")
        results[r] = t.export(reduce_group=group)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results[0] == results[1] == {"a": 1.5, "a__count": 2.0, "v": -1.0}
