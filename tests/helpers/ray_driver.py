"""A small async RL job on a real local Ray cluster, traced with ``rltrace.ray``
(tests/integrations/ray/test_ray.py).

Run as ``python ray_driver.py OUT_DIR``: a driver with two rollout actors (one sync, one
async; rank 2 planted slow: every generate takes 30 ms more; the sync one called through an
``ActorPool``) running the sessions of the task the driver registers for each step, a
trainer actor, a third rollout actor that is killed with ``ray.kill``, a reward actor
created without ``actor_options`` (labelled by its class), a rollout actor that crashes
once and is restarted by Ray, two actors the trainer creates (one plain, one with
``actor_options``), and a remote function (run by pooled workers) submitted in each step and
consumed (``ray.get``) in the next.  OTLP goes to an in-process receiver with a secret
header.  Writes ``OUT_DIR/result.json`` (the spans the receiver decoded, pids, what the
killed actor had flushed) and leaves rltrace's files under ``OUT_DIR/logs``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.util import ActorPool

import rltrace
import rltrace.ray
from rltrace.testing.otlp_receiver import OTLPReceiver

STEPS = 3
SESSIONS = 4  # per rollout actor per step
SECRET = "ray-secret-7f3a"


def _session(delay: float, own_task: bool = True) -> Any:
    """One session; ``own_task=False``: under the caller's task (the driver's, propagated)."""
    sid = rltrace.register_session(rltrace.register_task() if own_task else None)
    with rltrace.trace_session_phase("generate", session_id=sid):
        time.sleep(delay)
    with rltrace.trace_session_phase("reward", session_id=sid):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    return sid


@ray.remote
def score(step: int) -> dict[str, int]:
    """A remote function (run by a pooled worker): one session of a task of its own."""
    sid = rltrace.register_session(rltrace.register_task())
    with rltrace.trace_session_phase("reward", session_id=sid):
        time.sleep(0.002)
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    return {"pid": os.getpid(), "submitted_in": step, "session": sid}


@ray.remote
def meet(folder: str, n: int) -> dict[str, int]:
    """Runs until ``n`` calls of it run at once (so each in a pooled worker of its own)."""
    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.01)  # a rendezvous of processes, bounded
    with rltrace.trace_scope("meet"):
        pass
    return {"pid": os.getpid(), "met": len(os.listdir(folder))}


@ray.remote(max_retries=0)
def die_midway() -> None:
    """Two sessions, one finalized, then the worker is killed (as an OOM kill would): no
    flush at the call's end, none at exit."""
    first = rltrace.register_session(rltrace.register_task())
    rltrace.register_session(rltrace.register_task())
    rltrace.trace_session_event("mark_finalized", session_id=first, status="accepted")
    os.kill(os.getpid(), signal.SIGKILL)


@ray.remote
class Rollout:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def rollout(self, n: int) -> list[Any]:
        with rltrace.trace_scope("rollout.batch"):
            return [_session(self.delay, own_task=False) for _ in range(n)]

    def record_then_flush(self, flushed: int, unflushed: int) -> int:
        for _ in range(flushed):
            _session(0.0)
        rltrace.flush(wait_s=10)  # an export cycle, and OTLP sent (before the kill, surely)
        for _ in range(unflushed):
            _session(0.0)
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()

    def crash_once(self, marker: str) -> int:
        """The first call ends the process uncleanly (as an OOM kill would): Ray restarts the
        actor and retries the call in the new process, which returns its pid."""
        if not os.path.exists(marker):
            Path(marker).touch()
            os._exit(1)
        return os.getpid()


@ray.remote
class AsyncRollout:
    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def rollout(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            sid = rltrace.register_session()  # the driver's task
            async with rltrace.atrace_session_phase("generate", session_id=sid):
                await asyncio.sleep(self.delay)
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
            out.append(sid)
        return out


@ray.remote
class Trainer:
    def environ_has(self, text: str) -> bool:
        return text in json.dumps(dict(os.environ))

    def train(self, step: int) -> int:
        with rltrace.trace_scope("train.update", args={"global_step": step}):
            time.sleep(0.005)
        return os.getpid()

    def spawn(self) -> dict[str, int]:
        """Actors created by an actor (as verl's workers are, by its TaskRunner actor): a plain
        ``Judge.remote()``, labelled by its class, kept (flushed by ``ray.shutdown()``), and
        one given ``actor_options``, let go when this returns (Ray ends it gracefully: it
        flushes at its exit); their ranks are the job's next free ones."""
        judge = Judge.remote()
        self.kept = judge
        nested = Reward.options(**rltrace.ray.actor_options("nested")).remote()
        return {"judge": ray.get(judge.score.remote(1)), "nested": ray.get(nested.score.remote(1))}


class _Scorer:
    def score(self, n: int) -> int:
        for _ in range(n):
            with rltrace.trace_scope("reward.score"):
                pass
        return os.getpid()


@ray.remote
class Reward(_Scorer):
    """Created with a plain ``Reward.remote()``: rltrace labels it (role ``Reward``, a rank)."""


@ray.remote
class Judge(_Scorer):
    """Created by the trainer actor with a plain ``Judge.remote()``."""


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait until process ``pid`` (not a child of ours) has ended; False on timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(out: Path) -> None:
    result: dict[str, Any] = {}
    warnings = _Warnings()
    logging.getLogger("rltrace").addHandler(warnings)
    with OTLPReceiver() as rx:
        rltrace.configure(fileroot=str(out), experiment_name="ray", trial_name="t",
                          session_tracer={"enabled": True}, flush_interval_s=3600,
                          otlp={"endpoint": rx.grpc_endpoint, "metrics": False,
                                "headers": {"x-ray-secret": SECRET}})
        t0 = time.monotonic()
        rltrace.ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                         object_store_memory=96 * 1024 * 1024)
        fast = Rollout.options(**rltrace.ray.actor_options("rollout", rank=1)).remote(0.001)
        slow = AsyncRollout.options(**rltrace.ray.actor_options("rollout", rank=2)).remote(0.031)
        trainer = Trainer.options(**rltrace.ray.actor_options("trainer", rank=3)).remote()
        doomed = Rollout.options(**rltrace.ray.actor_options("doomed", rank=4)).remote(0.0)
        pids: dict[str, Any] = {}
        scored: list[dict[str, Any]] = []
        pending_score = pending_ping = None

        def take_score() -> None:
            got = ray.get(pending_score)
            # flush_tasks="all": the call's spans reached the collector before its result came
            sent = {s.attributes.get("rl.session.id") for s in rx.spans() if s.name == "rl.session"}
            scored.append({**got, "sent_before_result": got["session"] in sent})

        for step in range(STEPS):
            with rltrace.step(step):
                if pending_score is not None:  # submitted in the step before: ray.get links
                    take_score()
                    ray.get(pending_ping)  # an actor method's result, likewise
                pending_score = score.remote(step)
                pending_ping = fast.ping.remote()
                task = rltrace.register_task()  # one task per step: its sessions run in actors
                rltrace.set_task_id(task)
                pending = slow.rollout.remote(SESSIONS)  # the sync actor through an ActorPool
                list(ActorPool([fast]).map(lambda actor, n: actor.rollout.remote(n), [SESSIONS]))
                ray.get(pending)
                rltrace.trace_session_event("mark_finalized", task_id=task, status="accepted")
                pids["trainer"] = ray.get(trainer.train.remote(step))
        take_score()  # outside any step: no link
        result["scored"] = scored
        (out / "meet").mkdir()
        result["met"] = ray.get([meet.remote(str(out / "meet"), 2) for _ in range(2)])
        try:
            ray.get(die_midway.remote())
        except ray.exceptions.WorkerCrashedError:
            result["died_midway"] = True
        pids["doomed"] = ray.get(doomed.record_then_flush.remote(3, 5))
        reward = Reward.remote()  # no actor_options: role Reward, rank 5
        pids["reward"] = ray.get(reward.score.remote(2))
        # restarted by Ray after a crash: rank 6 (the next free one) in both processes
        phoenix = Rollout.options(**rltrace.ray.actor_options("restarted"), max_restarts=1,
                                  max_task_retries=-1).remote(0.0)
        first = ray.get(phoenix.record_then_flush.remote(2, 0))  # exported before the crash
        second = ray.get(phoenix.crash_once.remote(str(out / "crashed")))
        ray.get(phoenix.record_then_flush.remote(0, 2))  # left to ray.shutdown's flush
        pids["restarted"] = [first, second]
        pids.update(ray.get(trainer.spawn.remote()))  # ranks 7 (Judge) and 8 (nested)
        result["nested_exited"] = _wait_exit(pids["nested"], timeout_s=60)
        result["worker_environ_has_secret"] = ray.get(trainer.environ_has.remote(SECRET))
        ray.kill(doomed)
        result["announced_actors"] = len(rltrace.ray.announced_actors())
        ray.shutdown()  # plain: rltrace.ray.init wrapped it to flush every actor first
        result["ray_s"] = round(time.monotonic() - t0, 2)
        result["warnings"] = [m for m in warnings.messages if "did not answer the flush" in m]
        result["pooled_warnings"] = [m for m in warnings.messages if "pooled worker" in m]
        result["losses"] = rltrace.ray.losses()
        rltrace.shutdown()
        spans = rx.spans()
        result["spans"] = [{"name": s.name, "trace_id": s.trace_id, "span_id": s.span_id,
                            "parent": s.parent_span_id, "links": s.links,
                            "attributes": {k: v for k, v in s.attributes.items()
                                           if k.startswith(("rl.", "args."))},
                            "resource": {k: v for k, v in s.resource_attributes.items()
                                         if k in ("rl.role", "rl.rank", "process.pid")}}
                           for s in spans]
        result["secret_headers"] = sorted({r.headers.get("x-ray-secret", "")
                                           for r in rx.requests})
    result["pids"] = pids
    result["environ_has_secret"] = SECRET in json.dumps(dict(os.environ))
    (out / "result.json").write_text(json.dumps(result))


def exit_without_shutdown(out: Path) -> None:
    """A driver that just ends: its exit must flush the actor (``flush_interval_s`` is an hour,
    so without that flush the actor's sessions never reach its files)."""
    rltrace.configure(fileroot=str(out), experiment_name="ray", trial_name="exit",
                      session_tracer={"enabled": True}, flush_interval_s=3600)
    rltrace.ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                     object_store_memory=96 * 1024 * 1024)
    actor = Rollout.options(**rltrace.ray.actor_options("rollout")).remote(0.0)
    ray.get(actor.record_then_flush.remote(0, SESSIONS))  # nothing flushed by the actor itself
    (out / "result.json").write_text(json.dumps({"pid": os.getpid()}))


if __name__ == "__main__":
    # the defaults, whatever the test process inherited (set here: a preexec_fn in a parent
    # that runs JAX threads is unsafe)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.argv[2:] == ["--exit-without-shutdown"]:
        exit_without_shutdown(Path(sys.argv[1]))
    else:
        main(Path(sys.argv[1]))
