"""One rank of a real multi-process stats reduction, for tests/stats/test_stats_distributed.py.

Usage: ``python stats_dist_worker.py torch|jax FILEROOT PORT RANK WORLD``.  Each rank records
its own data (:func:`rank_data`; some keys and a named tracker exist on some ranks only),
exports with ``export_all(reduce_group=...)`` (a collective over the torch.distributed world
or all JAX processes; ``reduce_group=None`` would export each rank's own values), commits
through a ``StatsLogger`` whose log dir is ``FILEROOT/rank{RANK}`` (only rank 0 may write),
and prints one JSON line per round:
``{"round": i, "stats": {...}}`` (a JAX rank first prints the rank rltrace detected and whether
JAX's backend was initialised by then: ``{"configured": {...}}``).  The test recomputes the
expected values from the concatenated data with :func:`rank_data`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np


def rank_data(rank: int, round_: int) -> dict[str, Any]:
    """Deterministic data of one rank for one round (numpy; the worker converts per framework)."""
    rng = np.random.default_rng(1000 * round_ + rank)
    n = 5 + 3 * rank  # ranks hold different amounts of data: means must be count-weighted
    values = rng.normal(size=n).round(3)
    mask = rng.random(n) < 0.6
    mask[rank % n] = True  # never empty
    out: dict[str, Any] = {
        "values": values, "mask": mask,
        "losses": [float(x) for x in rng.normal(size=rank + 1).round(3)],  # scalars, rank+1 calls
        "tokens": rng.integers(1, 50, size=n),
    }
    return out


def record(stats: Any, to_array: Any, rank: int, round_: int) -> None:
    d = rank_data(rank, round_)
    with stats.scope("actor"):
        stats.denominator(valid=to_array(d["mask"]))
        stats.stat(logp=to_array(d["values"]), denominator="valid")
        stats.stat(tokens=to_array(d["tokens"]), denominator="valid", reduce_type="sum")
        stats.stat(lowest=to_array(d["values"]), denominator="valid", reduce_type="min")
        for loss in d["losses"]:
            stats.scalar(loss=loss)
    stats.scalar(**{f"only_rank{rank}": float(rank + round_)})  # a key on one rank only
    if rank == 1:
        stats.get("rollout").scalar(reward=0.5 + round_)  # a named tracker on rank 1 only
    if round_ == 1 and rank == 0:
        stats.stat(highest=to_array(d["values"]), reduce_type="max")  # min/max on one rank only


def main(argv: list[str]) -> int:
    backend, fileroot, port, rank_s, world_s = argv
    rank, world = int(rank_s), int(world_s)
    if backend == "torch":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        group: Any = dist.group.WORLD

        def to_array(x: Any) -> Any:
            return torch.as_tensor(x)
    else:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world,
                                   process_id=rank)
        group = "jax"

        def to_array(x: Any) -> Any:
            return jnp.asarray(x)

    import rltrace
    from rltrace import stats

    rltrace.configure(fileroot=fileroot, experiment_name="stats", trial_name=f"r{rank}",
                      flush_at_exit=False)
    if backend == "jax":  # the rank came from jax.distributed's client, JAX's backend untouched
        from jax._src import xla_bridge

        print(json.dumps({"configured": {"rank": rltrace.runtime.RUNTIME.pipeline.rank,
                                         "backend_initialised": xla_bridge.backends_are_initialized()}}),
              flush=True)
    logger = stats.StatsLogger(log_dir=f"{fileroot}/rank{rank}", console=False, otel=False)
    for round_ in range(2):
        with rltrace.step(round_):
            with rltrace.trace_scope("work"):
                record(stats, to_array, rank, round_)
        exported = stats.export_all(reduce_group=group)  # every rank: torch WORLD or all JAX processes
        logger.commit(0, round_, round_, exported)
        print(json.dumps({"round": round_, "stats": exported}), flush=True)
    logger.close()
    rltrace.shutdown()
    if backend == "torch":
        dist.destroy_process_group()
    else:
        jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
