"""One training step with session tracing, for tests that run it in-process and in a child."""

from __future__ import annotations

import rltrace


def loop(step: int) -> None:
    """One step: a task of four sessions (one rejected), two phases each, and a train scope."""
    with rltrace.step(step):
        with rltrace.trace_scope("train.rollout"):
            task = rltrace.register_task()
            for i in range(4):
                sid = rltrace.register_session(task)
                with rltrace.trace_session_phase("generate", session_id=sid,
                                                 end_payload={"output_tokens": 5}):
                    pass
                with rltrace.trace_session_phase("reward", session_id=sid):
                    pass
                rltrace.trace_session_event("mark_finalized", session_id=sid,
                                            status="rejected" if i == 3 else "accepted",
                                            reason="stale_weight" if i == 3 else None)
        with rltrace.trace_scope("train.ppo_update"):
            pass
