"""A two-rank RL loop under torchrun (gloo): rank 0 rolls out, rank 1 trains on what it made.

Usage (under ``torchrun --nproc-per-node 2``): ``torchrun_rl_worker.py FILEROOT``.  Per step,
rank 0 (role ``rollout``) runs ``TASKS`` tasks of ``SAMPLES`` sessions inside a scope carrying
``global_step`` (so its sessions carry the step; it has no ``rltrace.step`` of its own), one
session in each task rejected; then both ranks meet at a gloo barrier and rank 1 (role
``trainer``) runs ``rltrace.step(step)`` with a real matmul, step 1 under
``rltrace.profile_steps``.  Each rank exits after a final barrier, flushing at exit.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import rltrace

STEPS, TASKS, SAMPLES, PROFILED = 3, 2, 3, 1


def rollout(step: int) -> None:
    with rltrace.trace_scope("rollout.generate_batch", "compute", {"global_step": step}):
        for _ in range(TASKS):
            task = rltrace.register_task()
            sessions = [rltrace.register_session(task) for _ in range(SAMPLES)]
            for turn in range(2):
                for sid in sessions:
                    with rltrace.trace_session_phase("generate", {"input_tokens": 8},
                                                     session_id=sid) as ph:
                        torch.ones(64, 64).sum()
                        ph.set_end_payload(output_tokens=10 + turn)
            for i, sid in enumerate(sessions):
                status = "rejected" if i == 0 else "accepted"
                rltrace.trace_session_event("mark_finalized", session_id=sid, status=status,
                                            reason="stale_weight" if i == 0 else None)


def main(fileroot: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rltrace.configure(fileroot=fileroot, experiment_name="rl-torchrun", trial_name="t0",
                      role="rollout" if rank == 0 else "trainer",
                      session_tracer={"enabled": True})
    prof = rltrace.profile_steps([PROFILED])
    w = torch.randn(128, 128)
    for step in range(STEPS):
        if rank == 0:
            rollout(step)
        dist.barrier()  # the trainer starts on a step's samples once they are made
        if rank == 1:
            with rltrace.step(step), prof.step(step):
                for _ in range(3):
                    w = torch.tanh(w @ w)
    dist.barrier()
    dist.destroy_process_group()
    rltrace.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
