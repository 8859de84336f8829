"""A worker process of a traced Ray job: configured from the driver's configuration at start.

:func:`setup_worker` is what Ray's ``worker_process_setup_hook`` runs in every worker process of
a job :func:`rltrace.ray.init` started: it configures rltrace there (with the actor's role and
rank, or a pooled worker's rank), gives the worker a session tally that survives a SIGKILL,
adds the span processor that carries the caller's step, announces the actor and flushes pooled
workers after each remote function, and runs the integrations' worker setups
(:func:`on_worker_setup`).
"""

from __future__ import annotations

import atexit
import importlib
import os
from collections.abc import Callable, Mapping

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import Span, SpanKind

from rltrace import runtime
from rltrace.config import _BOOLS
from rltrace.ray import links
from rltrace.ray.flush import publish_pooled_worker
from rltrace.ray.job import REGISTRY_NAME, WorkerInfo, current_job
from rltrace.ray.labels import label_actor_creation
from rltrace.ray.propagation import STEP_KEY, install_propagator
from rltrace.ray.ranks import RANK_ENV, WORKER_RANK_BASE, pooled_worker_rank
from rltrace.runtime import RUNTIME
from rltrace.sessions.shared_counts import EXITED, SessionTally


class WorkerSetups:
    """What the worker processes of the Ray jobs started from this process run at start, and
    this worker's own session tally (a part of the runtime: :func:`worker_setups`)."""

    def __init__(self) -> None:
        #: ``"package.module:function"`` names each worker process of a job started by
        #: :func:`rltrace.ray.init` calls at start, once rltrace is configured there
        self.targets: list[str] = []
        #: this worker's session tally (kept: its memory map is what a SIGKILL leaves behind)
        self.tallies: list[SessionTally] = []


def worker_setups() -> WorkerSetups:
    """The runtime's :class:`WorkerSetups`."""
    return RUNTIME.part(WorkerSetups)


def on_worker_setup(target: str) -> None:
    """Have every worker process of the Ray jobs :func:`rltrace.ray.init` starts from now on call
    ``target`` (``"package.module:function"``, no arguments) at start, right after rltrace is
    configured there: how an integration (``rltrace.integrations.verl``) instruments framework
    code that runs in Ray actors.  Idempotent; a failing target is logged in the worker, never
    raised."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"rltrace.ray.on_worker_setup: target must be 'package.module:function', "
                         f"got {target!r}")
    targets = worker_setups().targets
    if target not in targets:
        targets.append(target)


def run_worker_setups(setups: tuple[str, ...]) -> None:
    """Call each ``"package.module:function"`` of ``setups``; a failing one is logged."""
    for target in setups:
        module, _, attr = target.partition(":")
        try:
            getattr(importlib.import_module(module), attr)()
        except Exception as exc:  # an integration's setup must not stop the worker
            runtime.logger.warning("rltrace.ray: worker setup %s failed: %s", target, exc)


def setup_worker(payload: Mapping[str, object], user_hook: str | Callable[[], object] | None = None,
                 label_actors: bool = False, flush_tasks: str = "all",
                 setups: tuple[str, ...] = ()) -> None:
    """Runs in every worker process at start (Ray's ``worker_process_setup_hook``)."""
    install_propagator()
    job = current_job()
    job.in_worker = True  # ranks of actors created here come from the job's registry
    if label_actors:
        label_actor_creation()
    # registered before configure's own exit handler, so it runs after that flush (LIFO)
    atexit.register(_mark_exited)
    RUNTIME.sessions.offset_ids(os.getpid())  # task/session ids of its own never equal the driver's
    data = dict(payload)
    if os.environ.get(RANK_ENV) is None:  # a pooled worker (remote functions, plain actors)
        data["rank"] = pooled_worker_rank() if _enabled_here(data) else 0
    runtime.configure(data)  # RLTRACE_ROLE / RLTRACE_RANK of the actor's env win over data
    p = runtime.get_pipeline()
    if p is not None:  # on the provider only: Ray's spans get it, rltrace's records need not
        info = WorkerInfo(role=p.cfg.role, rank=p.rank, pid=os.getpid())
        try:
            tally = SessionTally(p.log_dir / "ray" / f"tally-r{p.rank}-p{os.getpid()}.bin",
                                 RUNTIME.guarded)
        except OSError as exc:
            runtime.logger.warning("rltrace.ray: no session tally in this worker (%s): a "
                                    "ray.kill of it cannot be counted", exc)
        else:
            sp = p.session_processor
            if sp is not None:
                RUNTIME.sessions.tally = sp.writer.tally = tally.view
            info["tally"] = str(tally.path)
            worker_setups().tallies.append(tally)  # the map lives as long as the process
        if os.environ.get(RANK_ENV) is None and p.rank >= WORKER_RANK_BASE:
            publish_pooled_worker(info)
        p.processor.add_span_processor(StepFromCaller(info, flush_tasks))
        p.processor.add_span_processor(job.submissions)
        links.install(job.submissions)
    run_worker_setups(setups)
    _run_user_hook(user_hook)


def _run_user_hook(user_hook: str | Callable[[], object] | None) -> None:
    """The ``worker_process_setup_hook`` of the user's ``runtime_env`` (a callable, or its
    ``"package.module.function"`` name)."""
    if isinstance(user_hook, str):
        module, _, attr = user_hook.rpartition(".")
        getattr(importlib.import_module(module), attr)()
    elif user_hook is not None:
        user_hook()


def _enabled_here(data: Mapping[str, object]) -> bool:
    """Whether rltrace will be on in this worker (``RLTRACE_ENABLED`` of its environment wins,
    as in ``configure``; the registry actor has it off)."""
    env = _BOOLS.get(os.environ.get("RLTRACE_ENABLED", "").strip().lower())
    return bool(data.get("enabled", True)) if env is None else env


def _mark_exited() -> None:
    """At this worker's exit, after rltrace's exit flush: the tally says it ended gracefully."""
    for tally in worker_setups().tallies:
        tally.view[EXITED] = 1


class StepFromCaller(SpanProcessor):
    """Puts the caller's step on the span Ray starts for a remote call (``rl.step``), so the
    spans recorded under it carry the step; at an actor's first call, announces the actor
    to the job's registry (so the driver can flush it at ``ray.shutdown()`` and exit); and at
    the end of each remote function (a task, not an actor method) flushes this worker, before
    Ray hands the result to the caller: pooled workers have no handle to flush them by, and
    ``ray.shutdown()`` ends them without their exit handlers."""

    def __init__(self, info: WorkerInfo, flush_tasks: str = "all") -> None:
        self.announced = False
        self.info = info  # announced with the handle: role, rank, pid, tally file
        self.flush_tasks = flush_tasks

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        if hasattr(span, "slot_attrs"):  # rltrace's own records: nothing to do
            return
        step = otel_context.get_value(STEP_KEY, parent_context)
        if type(step) is int and isinstance(span, Span):
            span.set_attribute("rl.step", step)
        if not self.announced:
            self.announced = True  # the registry call's own span comes back here: skipped
            self.announced = announce_actor(self.info)

    def on_end(self, span: object) -> None:
        if (self.flush_tasks == "cycle" or getattr(span, "kind", None) is not SpanKind.CONSUMER
                or not str(getattr(span, "name", "")).endswith(" ray.remote_worker")):
            return
        import ray

        try:
            if ray.get_runtime_context().get_actor_id() is not None:
                return  # an actor method: the actor is flushed by handle, at exit, each cycle
        except Exception:
            return
        p = runtime.get_pipeline()
        if p is None:
            return
        p.flush()  # the files and session records written, spans handed to the OTLP sender
        if p.otlp is not None and self.flush_tasks == "all":  # sent, while the collector answers
            p.otlp.send_now(p.otlp.shutdown_timeout_s)  # (the configured OTLP timeout)


def announce_actor(info: WorkerInfo) -> bool:
    """Add this actor's handle to the job's registry; False while this worker runs tasks, not an
    actor (a pooled worker may host an actor later: asked again at its next span)."""
    import ray

    try:
        ctx = ray.get_runtime_context()
        actor_id = ctx.get_actor_id()
        if actor_id is None:
            return False  # a remote function: its worker published itself at start
        registry = ray.get_actor(REGISTRY_NAME)
        registry.add.remote(actor_id, ctx.current_actor, info)
    except Exception as exc:  # no registry (ray.init not through rltrace.ray): flush by handle
        runtime.logger.debug("rltrace.ray: actor not announced: %s", exc)
    return True
