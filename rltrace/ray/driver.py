"""The driver of a traced Ray job: :func:`init` starts Ray with rltrace in every worker process,
and :func:`shutdown` (or ``ray.shutdown()``, wrapped by :func:`init`) flushes the job's workers
before Ray ends them."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from rltrace import runtime
from rltrace.config import ConfigError, dataclass_to_dict
from rltrace.ray import links
from rltrace.ray.flush import flush_all
from rltrace.ray.job import REGISTRY_NAME, RayJob, current_job, registry_class
from rltrace.ray.labels import label_actor_creation, unlabel_actor_creation
from rltrace.ray.propagation import install_propagator
from rltrace.ray.ranks import DEFAULT_ROLE
from rltrace.ray.worker import setup_worker, worker_setups

#: what a pooled worker flushes when a remote function returns (see :func:`init`)
FLUSH_TASKS = ("all", "files", "cycle")


def init(*args: Any, runtime_env: Mapping[str, object] | None = None,
         label_actors: bool = True, flush_tasks: str = "all", **kwargs: Any) -> Any:
    """``ray.init(...)`` with rltrace configured in every worker process of the job.

    Call after :func:`rltrace.configure` in the driver; arguments are ``ray.init``'s, except
    ``label_actors`` (rltrace's): an actor created without :func:`actor_options`, by the
    driver or by another actor, gets its class name as role and the job's next free rank, as
    if created with ``actor_options(ClassName)`` (its own worker process, like any actor with
    its own environment variables).  ``label_actors=False`` leaves such actors in the shared
    ``ray-worker`` role, in the pooled workers' rank band.  ``flush_tasks`` (rltrace's): what a
    pooled worker does when a remote function returns, before Ray hands its result to the
    caller: ``"all"`` writes its files and sends its spans over OTLP (while the collector
    answers), so ``ray.shutdown()`` loses nothing of it; ``"files"`` writes the files and
    leaves the OTLP send to the sender's thread (cheaper; a ``ray.shutdown()`` right after the
    call may cut that send); ``"cycle"`` leaves both to the export cycle (the cheapest;
    ``ray.shutdown()`` loses what the worker recorded since its last cycle).  (A generator
    task's span ends when Ray has the generator: what it records while yielding goes with
    the worker's next call or cycle.)  Actors are flushed by handle instead.  A
    ``worker_process_setup_hook`` of yours in ``runtime_env`` still runs (after rltrace's).
    """
    import ray

    if flush_tasks not in FLUSH_TASKS:
        raise ValueError(f"rltrace.ray.init: flush_tasks must be one of {', '.join(FLUSH_TASKS)}, "
                         f"got {flush_tasks!r}")
    cfg = runtime.get_config()
    if cfg is None:
        raise ConfigError("rltrace.ray.init: rltrace is not configured in this driver; call "
                          "rltrace.configure(...) first, then rltrace.ray.init(...)")
    payload = dataclass_to_dict(cfg)  # OTLP headers included: they travel inside the hook
    payload.update(role=cfg.role or DEFAULT_ROLE, per_process_files=True)
    payload["session_tracer"] = {**payload["session_tracer"], "flush_threshold": 1}
    payload.pop("rank", None)
    env = dict(runtime_env or {})
    user_hook = env.get("worker_process_setup_hook")
    if not (user_hook is None or isinstance(user_hook, str) or callable(user_hook)):
        raise TypeError(f"rltrace.ray.init: worker_process_setup_hook must be a callable or its "
                        f"'package.module.function' name, got {user_hook!r}")

    setups = tuple(worker_setups().targets)  # integrations' worker-side setup (on_worker_setup)

    def rltrace_worker_setup() -> None:  # pickled by Ray with the payload into its GCS
        setup_worker(payload, user_hook, label_actors, flush_tasks, setups)

    env["worker_process_setup_hook"] = rltrace_worker_setup
    kwargs.setdefault("_tracing_startup_hook", "rltrace.ray.propagation:tracing_hook")
    install_propagator()
    context = ray.init(*args, runtime_env=env, **kwargs)
    _start_job(ray, current_job(), label_actors)
    return context

def _start_job(ray: ModuleType, job: RayJob, label_actors: bool = True) -> None:
    """In the driver, once Ray runs: the job's registry actor, actor labelling, ``ray.get``'s
    links, and ``ray.shutdown`` wrapped to flush the job's workers first."""
    unlabel_actor_creation()  # the registry is no actor of the user's
    job.registry = registry_class(ray).options(
        name=REGISTRY_NAME, get_if_exists=True, num_cpus=0,
        runtime_env={"env_vars": {"RLTRACE_ENABLED": "false",  # it traces nothing itself
                                  "RLTRACE_SESSION_TRACER_ENABLED": "false"}},
    ).remote(sorted(job.ranks.used))  # ranks given out before init stay taken
    if label_actors:
        label_actor_creation()
    p = runtime.get_pipeline()
    if p is not None and job.submissions_on is not p:
        p.processor.add_span_processor(job.submissions)
        job.submissions_on = p
    links.install(job.submissions)
    if job.original_shutdown is None:
        job.original_shutdown = original = ray.shutdown

        @functools.wraps(original)
        def shutdown(*args: object, **kwargs: object) -> object:  # ray.shutdown: flush actors first
            flush_all(job)
            _end_job(job)
            return original(*args, **kwargs)

        ray.shutdown = shutdown  # type: ignore[attr-defined]
    job.losses = {}


def _end_job(job: RayJob) -> None:
    unlabel_actor_creation()
    links.uninstall()
    job.registry = None  # gone with the cluster: ranks are this process's again


def shutdown(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in these actors (default: every actor of the job), then shut Ray down;
    returns how many flushed.

    Ray's own ``ray.shutdown()`` ends worker processes without running their exit handlers;
    after :func:`init` it is wrapped to flush every announced actor first, so this is the same
    with handles to limit the flush.  (A graceful actor exit, ``ray.actor.exit_actor()``, and
    driver exit, which ends actors gracefully, flush by themselves.)
    """
    import ray

    job = current_job()
    confirmed = flush_all(job, *actors, timeout_s=timeout_s)
    _end_job(job)
    original = job.original_shutdown or ray.shutdown
    original()
    return confirmed
