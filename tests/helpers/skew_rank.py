"""One rank of a multi-rank run whose start time is planted, for tests/analysis/test_rank_skew.py.

Usage: ``python skew_rank.py FILEROOT EXPERIMENT RANK WORLD_SIZE OFFSET_S [SLOW_STEP]``.
Configures rltrace for RANK with an injected clock (``rltrace.configure(clock=...)``) that stands
still until the workload advances it, so every timestamp is deterministic: the rank starts
OFFSET_S seconds after the run's epoch and then runs STEPS steps of rollout (sessions with
generate, toolcall and reward phases, one after another) and a PPO update, with durations that
depend only on (rank, step, sample); with SLOW_STEP, that step's generate phases take three times
as long. The ranks never wait on each other (like ``rltrace demo``'s), so a planted offset must
change no step's length.
"""

from __future__ import annotations

import sys

import rltrace

#: the run's epoch (ns): 2027-01-15
T0_NS = 1_800_000_000_000_000_000
STEPS, SAMPLES = 4, 3
MS = 1_000_000


class ManualClock:
    """Epoch nanoseconds that move only when :meth:`advance` moves them (no wall clock, no sleep)."""

    def __init__(self, start_ns: int) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += round(ms * MS)


def durations(rank: int, step: int, sample: int) -> tuple[float, float, float]:
    """(generate, toolcall, reward) milliseconds of one sample: deterministic, rank 1 slower."""
    k = (rank * 7 + step * 3 + sample) % 5
    return 120.0 + 15.0 * k + 40.0 * rank, 30.0 + 5.0 * k, 10.0 + 2.0 * k


def run(clock: ManualClock, rank: int, slow_step: int | None = None) -> None:
    """STEPS steps: a task of SAMPLES sequential sessions inside ``train.rollout``, then an update."""
    for step in range(STEPS):
        with rltrace.step(step):
            with rltrace.trace_scope("train.rollout", args={"global_step": step}):
                task = rltrace.register_task()
                for i in range(SAMPLES):
                    sid = rltrace.register_session(task)
                    gen, tool, reward = durations(rank, step, i)
                    gen *= 3.0 if step == slow_step else 1.0
                    clock.advance(1.0)
                    with rltrace.trace_session_phase("generate", session_id=sid,
                                                     end_payload={"output_tokens": 20 + i}):
                        clock.advance(gen)
                    with rltrace.trace_session_phase("toolcall", session_id=sid):
                        clock.advance(tool)
                    with rltrace.trace_session_phase("reward", session_id=sid):
                        clock.advance(reward)
                    clock.advance(1.0)
                    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
                clock.advance(2.0)
            with rltrace.trace_scope("train.ppo_update"):
                clock.advance(200.0 + 25.0 * ((step + rank) % 3))
        clock.advance(5.0)


def main(argv: list[str]) -> int:
    fileroot, experiment, rank, world, offset_s, *slow = argv
    clock = ManualClock(T0_NS + round(float(offset_s) * 1e9))
    rltrace.configure(fileroot=fileroot, experiment_name=experiment, trial_name="trial0",
                      rank=int(rank), world_size=int(world), clock=clock,
                      session_tracer={"enabled": True})
    run(clock, int(rank), int(slow[0]) if slow else None)
    rltrace.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
