"""One rank of a real torch.distributed (gloo) job, for tests/files/chrome/test_multirank.py.

Usage: ``python dist_worker.py FILEROOT PORT RANK WORLD``.  Initialises the process group over
TCP on 127.0.0.1 (rank/world given to torch only: RANK/WORLD_SIZE are not set), configures
rltrace *without* a rank so it must take it from torch.distributed, records an all_reduce
scope, and shuts down.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import rltrace


def main(argv: list[str]) -> int:
    fileroot, port, rank, world = argv
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=int(rank), world_size=int(world))
    rltrace.configure(fileroot=fileroot, experiment_name="dist", trial_name="t0")
    t = torch.ones(4) * (int(rank) + 1)
    with rltrace.trace_scope("allreduce", rltrace.Category.COMM, {"numel": t.numel()}):
        dist.all_reduce(t)
    print(f"sum={t[0].item()}", flush=True)
    rltrace.shutdown()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
