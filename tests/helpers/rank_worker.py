"""One rank of a multi-process run, for tests/files/chrome/test_multirank.py.

Usage: ``python rank_worker.py FILEROOT EXPERIMENT TRIAL RANK WORLD_SIZE``.  Configures rltrace
for RANK, records a ``before_barrier`` scope around a pipe handshake (prints ``ready``, then
blocks until the parent writes a line to stdin: the parent answers only once every rank is
ready, so this is a cross-process barrier), then an ``after_barrier`` instant, and shuts down.
"""

from __future__ import annotations

import sys

import rltrace


def main(argv: list[str]) -> int:
    fileroot, experiment, trial, rank, world = argv
    rltrace.configure(fileroot=fileroot, experiment_name=experiment, trial_name=trial,
                      rank=int(rank), world_size=int(world), flush_at_exit=False)
    with rltrace.trace_scope("before_barrier", rltrace.Category.SYNC):
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 3
    rltrace.instant("after_barrier", rltrace.Category.SYNC, {"rank": int(rank)})
    rltrace.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
