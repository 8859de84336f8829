"""The README's API, written as a user with ``mypy --strict`` would: checked by ``.ci/typecheck``.

Not a pytest module (it is never run): it fails CI when a public signature stops accepting what the
README shows, when a decorator stops preserving the decorated function's type, or when a keyword
the API does not take stops being rejected (the ``type: ignore`` lines below are errors once they
are unused: ``warn_unused_ignores`` is part of ``--strict``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from opentelemetry.trace import Span

import rltrace
from rltrace import Category, perf_tracer, stats
from rltrace.perf_tracer import atrace_session_phase, session_context, trace_perf, trace_session


def quickstart(step: int) -> None:
    rltrace.configure(experiment_name="grpo", trial_name="t0", fileroot="/shared/exp")
    with rltrace.trace_scope("train.rollout", Category.COMPUTE, {"global_step": step}) as span:
        own: Span = span
        own.set_attribute("rl.batch", 8)
    with rltrace.trace_scope("actor.forward", "compute", device_sync=True):
        pass
    with rltrace.trace_scope("allreduce", "comm", device_timing="events", annotate=True):
        pass
    rltrace.instant("step.done", args={"global_step": step})
    with rltrace.step(step) as step_span:
        step_span.add_event("weights.synced")
    rltrace.save(step=step)
    rltrace.shutdown()


@rltrace.trace_perf("fsdp_engine.train_batch", category=Category.COMPUTE)
def train_batch(n: int) -> float:
    return n / 2


@rltrace.trace_perf("jax.update", device_sync=True)
def jax_update(x: float) -> float:
    return x


@rltrace.trace_perf("allreduce", "comm", device_timing="events", annotate=False)
async def allreduce(x: int) -> int:
    return x


@rltrace.trace_perf
def bare(x: str) -> str:
    return x


# decorators keep the function's type
_train: Callable[[int], float] = train_batch
_update: Callable[[float], float] = jax_update
_reduce: Callable[[int], Awaitable[int]] = allreduce
_bare: Callable[[str], str] = bare


@rltrace.trace_perf("x", device_synk=True)  # type: ignore[call-overload, untyped-decorator]
def misspelled() -> None: ...


class Workflow:
    @trace_perf("rlvr_workflow.arun_episode", category="compute")
    async def arun_episode(self, prompt: str) -> list[tuple[object, float]]:
        return await asyncio.gather(*[self._collect_samples(prompt) for _ in range(4)])

    @session_context()
    async def _collect_samples(self, prompt: str) -> tuple[object, float]:
        async with atrace_session_phase("generate", start_payload={"model": "qwen-7b"}) as ph:
            ph.set_end_payload(output_tokens=len(prompt))
        reward = await self._compute_rewards(prompt)
        return perf_tracer.get_session_id(), reward

    @trace_session("reward")
    async def _compute_rewards(self, resp: str) -> float:
        return float(len(resp))


async def orchestrate(wf: Workflow) -> None:
    task_id = perf_tracer.register_task()
    perf_tracer.set_task_id(task_id)
    for session_id, _reward in await wf.arun_episode("2+2"):
        perf_tracer.trace_session_event("mark_finalized", session_id=session_id,
                                        status="rejected", reason="stale_weight")
    handle = rltrace.trace_session_event("mark_generate_start", session_id=1)
    rltrace.trace_session_event("mark_generate_end", session_id=1, handle=handle)
    with rltrace.trace_session_phase("reward", turn=1) as phase:
        phase.end()  # OTel's Span.end(end_time=None)
        phase.end(end_time=1, payload={"score": 1.0})


def metrics(lr: float) -> None:
    with stats.scope("actor"):
        stats.scalar(lr=lr)
    with stats.record_timing("update_weights"):
        pass
    stats.get("rollout").scalar(reward=1.0)
