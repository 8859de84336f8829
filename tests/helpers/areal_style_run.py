"""A run instrumented exactly as AReaL's perf_tracer guide shows: steps only in scope args.

``python areal_style_run.py FILEROOT``: 4 steps of ``trace_scope("train.rollout",
args={"global_step": n, "epoch_step": n})`` then ``trace_scope("train.ppo_update",
args={"global_step": n})`` and ``perf_tracer.save(step=n)``; ``rltrace.step`` is never called.
Per step 4 tasks of 3 samples (``session_context``, ``atrace_session_phase("generate")`` twice
with a ``toolcall`` between, ``@trace_session("reward")``), finalized per task.  Tasks 0-1 run
in the rollout scope's own context (``asyncio.run`` inside it), tasks 2-3 in a long-lived
executor thread with its own event loop (AReaL's WorkflowExecutor), where no scope is open.
Planted: in step 2, task 1's sample 2 generates slowly in its second turn (turn 1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from rltrace import perf_tracer
from rltrace.perf_tracer import Category

STEPS, TASKS, SAMPLES = 4, 4, 3
GEN_S, TOOL_S, REWARD_S, SLOW_S = 0.01, 0.004, 0.002, 0.25
SLOW = (2, 1, 2)  # step, task, sample


class Workflow:
    def __init__(self, step: int) -> None:
        self.step = step

    async def arun_episode(self, task: int) -> None:
        perf_tracer.set_task_id(perf_tracer.register_task())
        await asyncio.gather(*(self._collect_samples(task, j) for j in range(SAMPLES)))
        perf_tracer.trace_session_event("mark_finalized", task_id=perf_tracer.get_task_id(),
                                        status="accepted")

    @perf_tracer.session_context()
    async def _collect_samples(self, task: int, sample: int) -> float:
        for turn in range(2):
            slow = (self.step, task, sample) == SLOW and turn == 1
            async with perf_tracer.atrace_session_phase("generate"):
                await asyncio.sleep(SLOW_S if slow else GEN_S)
            if turn == 0:
                async with perf_tracer.atrace_session_phase("toolcall",
                                                            start_payload={"tool_name": "python"}):
                    await asyncio.sleep(TOOL_S)
        return await self._compute_rewards()

    @perf_tracer.trace_session("reward")
    async def _compute_rewards(self) -> float:
        await asyncio.sleep(REWARD_S)
        return 1.0


class Executor:
    """A background thread with its own event loop fed from a queue, like AReaL's WorkflowExecutor.

    Work starts in a fresh context (as from a queue): no scope of the submitting thread is open there.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def submit(self, factory: Callable[[], Coroutine[Any, Any, None]]) -> concurrent.futures.Future[None]:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def start() -> None:
            task = self.loop.create_task(factory())
            task.add_done_callback(lambda t: done.set_exception(t.exception()) if t.exception()
                                   else done.set_result(None))

        self.loop.call_soon_threadsafe(start, context=contextvars.Context())
        return done

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def _local(wf: Workflow) -> None:
    await asyncio.gather(*(wf.arun_episode(t) for t in range(TASKS // 2)))


async def _remote(wf: Workflow) -> None:
    await asyncio.gather(*(wf.arun_episode(t) for t in range(TASKS // 2, TASKS)))


def main(fileroot: str) -> None:
    perf_tracer.configure(perf_tracer.PerfTracerConfig(
        enabled=True, experiment_name="areal", trial_name="t0", fileroot=fileroot, save_interval=1,
        session_tracer=perf_tracer.SessionTracerConfig(enabled=True, flush_threshold=100)), rank=0)
    executor = Executor()
    for global_step in range(STEPS):
        with perf_tracer.trace_scope("train.rollout", category=Category.COMPUTE,
                                     args={"global_step": global_step, "epoch_step": global_step}):
            wf = Workflow(global_step)
            remote = executor.submit(functools.partial(_remote, wf))  # no scope there: the report finds it
            asyncio.run(_local(wf))  # in the scope's context: the record carries the step
            remote.result()
        with perf_tracer.trace_scope("train.ppo_update", category=Category.COMPUTE,
                                     args={"global_step": global_step}):
            sum(i * i for i in range(20000))
        perf_tracer.save(step=global_step)
    executor.stop()
    perf_tracer.save(force=True)


if __name__ == "__main__":
    main(sys.argv[1])
