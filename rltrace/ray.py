"""Ray: rltrace in every worker process of a Ray job, configured once in the driver.

verl, OpenRLHF and AReaL's Ray launcher run rollout workers, reward models and trainers as Ray
actors.  In the driver, after :func:`rltrace.configure`::

    import rltrace, rltrace.ray
    rltrace.configure(fileroot="/shared/logs", session_tracer={"enabled": True})
    rltrace.ray.init(num_cpus=8)                       # instead of ray.init(...)
    rollouts = [Rollout.options(**rltrace.ray.actor_options("rollout", rank=1 + i)).remote()
                for i in range(2)]
    trainer = Trainer.options(**rltrace.ray.actor_options("trainer", rank=3)).remote()

What it does:

* **Configure once.**  Every worker process of the job configures rltrace from the driver's
  configuration at start (Ray's ``worker_process_setup_hook``).  The configuration travels
  inside that hook, which Ray keeps in its control store (GCS): OTLP headers never enter an
  environment variable or a file.  Workers write their own files (``-p{pid}``: a restarted
  actor gets new files), under their role's folder.
* **Rank and role per actor.**  :func:`actor_options` gives an actor its role and rank (as
  ``RLTRACE_ROLE``/``RLTRACE_RANK`` in the actor's runtime environment: Ray starts such an
  actor in a worker process of its own).  Workers started without it are role ``ray-worker``.
  Each actor is then a named process in merged traces (``[rollout] Rank 1, Process …``), a
  rank/role in ``rltrace report`` and ``rltrace top``.
* **Context across ``.remote()``.**  Ray's own trace propagation is switched on
  (``_tracing_startup_hook``): every remote function and actor-method call (sync or async
  actors, through an ``ActorPool`` as well) carries the caller's trace context, and runs
  under a Ray span of that trace in the worker, so what an actor records is in the driver's
  trace.  rltrace adds the current step (``rltrace.step(n)``, or AReaL's
  ``args={"global_step": n}``): spans, tasks and sessions recorded in the actor carry it.
* **Lifecycle.**  A graceful actor exit (``ray.actor.exit_actor()``) flushes.  ``ray.shutdown()``
  ends worker processes without their exit handlers: call :func:`shutdown` with your actor
  handles instead (it flushes each, then shuts Ray down).  Session records are written every
  export cycle in workers (``flush_threshold`` 1), so ``ray.kill`` (SIGKILL) or a lost node
  loses at most what the actor recorded in its last ``flush_interval_s`` (the process is gone:
  that loss cannot be counted).

Not done: a task registered in the driver cannot have sessions registered in an actor (each
process keeps its own task registry); register tasks where their sessions run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.trace import SpanProcessor

from . import pipeline, steps
from .config import ConfigError

__all__ = ["actor_options", "flush_actors", "init", "shutdown"]

ROLE_ENV, RANK_ENV = "RLTRACE_ROLE", "RLTRACE_RANK"
#: the role of worker processes started without :func:`actor_options`
DEFAULT_ROLE = "ray-worker"
_STEP_HEADER = "rltrace-step"


def init(*args: Any, runtime_env: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """``ray.init(...)`` with rltrace configured in every worker process of the job.

    Call after :func:`rltrace.configure` in the driver; arguments are ``ray.init``'s.  A
    ``worker_process_setup_hook`` of yours in ``runtime_env`` still runs (after rltrace's).
    """
    import ray

    cfg = pipeline.get_config()
    if cfg is None:
        raise ConfigError("rltrace.ray.init: rltrace is not configured in this driver; call "
                          "rltrace.configure(...) first, then rltrace.ray.init(...)")
    from .config import _dataclass_to_dict

    payload = _dataclass_to_dict(cfg)  # OTLP headers included: they travel inside the hook
    payload.update(role=cfg.role or DEFAULT_ROLE, per_process_files=True)
    payload["session_tracer"] = {**payload["session_tracer"], "flush_threshold": 1}
    payload.pop("rank", None)
    env = dict(runtime_env or {})
    user_hook = env.get("worker_process_setup_hook")

    def rltrace_worker_setup() -> None:  # pickled by Ray with the payload into its GCS
        _setup_worker(payload, user_hook)

    env["worker_process_setup_hook"] = rltrace_worker_setup
    kwargs.setdefault("_tracing_startup_hook", f"{__name__}:_tracing_hook")
    install_step_propagator()
    return ray.init(*args, runtime_env=env, **kwargs)


def actor_options(role: str, rank: int | None = None, **options: Any) -> dict[str, Any]:
    """Options for ``ActorClass.options(**...)`` giving the actor its rltrace role and rank.

    Other ``options`` (``name``, ``num_cpus``, a ``runtime_env`` of yours, ...) are kept.
    """
    if not isinstance(role, str) or not role or "/" in role:
        raise ValueError(f"rltrace.ray.actor_options: role must be a non-empty name without "
                         f"'/', got {role!r}")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise ValueError(f"rltrace.ray.actor_options: rank must be an int >= 0, got {rank!r}")
    env = dict(options.pop("runtime_env", None) or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars[ROLE_ENV] = role
    if rank is not None:
        env_vars[RANK_ENV] = str(rank)
    env["env_vars"] = env_vars
    return {**options, "runtime_env": env}


def flush_actors(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in each of these actors now (sync or async); returns how many confirmed.

    An actor that is dead or does not answer within ``timeout_s`` is skipped.
    """
    import ray

    refs = [a.__ray_call__.remote(_flush_here) for a in actors]
    if not refs:
        return 0
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    confirmed = 0
    for ref in ready:
        try:
            ray.get(ref)
            confirmed += 1
        except Exception:  # an actor that died meanwhile: nothing to flush there
            pass
    return confirmed


def shutdown(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in these actors, then ``ray.shutdown()``; returns how many flushed.

    ``ray.shutdown()`` ends worker processes without running their exit handlers, so records
    an actor finished since its last export cycle would be lost without this.  (A graceful
    actor exit, ``ray.actor.exit_actor()``, flushes by itself.)
    """
    import ray

    confirmed = flush_actors(*actors, timeout_s=timeout_s) if ray.is_initialized() else 0
    ray.shutdown()
    return confirmed


def _flush_here(_actor: Any) -> int:
    pipeline.flush()  # files and session records
    p = pipeline.get_pipeline()
    if p is not None and p.otlp is not None:  # and what waits for the OTLP sender
        timeout = p.cfg.otlp.timeout_s if p.cfg.otlp.timeout_s is not None else 5.0
        p.otlp.force_flush(int(timeout * 1000))
    return os.getpid()


def _setup_worker(payload: dict[str, Any], user_hook: Any = None) -> None:
    """Runs in every worker process at start (Ray's ``worker_process_setup_hook``)."""
    install_step_propagator()
    data = dict(payload)
    if os.environ.get(RANK_ENV) is None:
        data["rank"] = 0
    pipeline.configure(data)  # RLTRACE_ROLE / RLTRACE_RANK of the actor's env win over data
    p = pipeline.get_pipeline()
    if p is not None:  # on the provider only: Ray's spans get it, rltrace's records need not
        p.processor.add_span_processor(_StepFromCaller())
    if user_hook is not None:
        if isinstance(user_hook, str):
            module, _, attr = user_hook.rpartition(".")
            import importlib

            user_hook = getattr(importlib.import_module(module), attr)
        user_hook()


def _tracing_hook() -> None:
    """Ray's tracing startup hook: the tracer provider is rltrace's (set by ``configure``)."""
    install_step_propagator()


# ---- the step across .remote() -------------------------------------------------------------------

_STEP_KEY = steps.CALLER_STEP_KEY


class StepPropagator(TextMapPropagator):
    """Carries the caller's step (``rltrace.step(n)`` or AReaL's ``global_step`` arg) in a
    ``rltrace-step`` field beside ``traceparent``; extracted into the callee's context."""

    def inject(self, carrier: CarrierT, context: Any = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        step: Any = steps.current_step()
        if step is None:
            step = steps.scope_arg_step()
        if step is None and context is not None:
            step = context.get(_STEP_KEY)
        if step is None:
            step = otel_context.get_value(_STEP_KEY)
        if step is not None:
            setter.set(carrier, _STEP_HEADER, str(step))

    def extract(self, carrier: CarrierT, context: Any = None,
                getter: Getter[CarrierT] = default_getter) -> Any:
        if context is None:
            context = otel_context.get_current()
        values = getter.get(carrier, _STEP_HEADER)
        if values:
            try:
                return otel_context.set_value(_STEP_KEY, int(values[0]), context)
            except ValueError:
                pass
        return context

    @property
    def fields(self) -> set[str]:
        return {_STEP_HEADER}


def install_step_propagator() -> None:
    """Add :class:`StepPropagator` to the global propagator (once)."""
    current = propagate.get_global_textmap()
    props = getattr(current, "_propagators", [current])
    if any(isinstance(p, StepPropagator) for p in props):
        return
    propagate.set_global_textmap(CompositePropagator([current, StepPropagator()]))


class _StepFromCaller(SpanProcessor):
    """Puts the caller's step on the span Ray starts for a remote call (``rl.step``), so the
    spans recorded under it carry the step."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        step = otel_context.get_value(_STEP_KEY, parent_context)
        if type(step) is int and hasattr(span, "set_attribute") and not hasattr(span, "slot_attrs"):
            span.set_attribute("rl.step", step)

