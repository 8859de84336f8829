"""Ray: rltrace in every worker process of a Ray job, configured once in the driver.

verl, OpenRLHF and AReaL's Ray launcher run rollout workers, reward models and trainers as Ray
actors.  In the driver, after :func:`rltrace.configure`::

    import rltrace, rltrace.ray
    rltrace.configure(fileroot="/shared/logs", session_tracer={"enabled": True})
    rltrace.ray.init(num_cpus=8)                       # instead of ray.init(...)
    rollouts = [Rollout.options(**rltrace.ray.actor_options("rollout")).remote()
                for i in range(2)]                     # ranks 1, 2 (or rank=... of yours)
    trainer = Trainer.options(**rltrace.ray.actor_options("trainer")).remote()      # rank 3

What it does:

* **Configure once.**  Every worker process of the job configures rltrace from the driver's
  configuration at start (Ray's ``worker_process_setup_hook``).  The configuration travels
  inside that hook, which Ray keeps in its control store (GCS): OTLP headers never enter an
  environment variable or a file.  Workers write their own files (``-p{pid}``: a restarted
  actor gets new files), under their role's folder.
* **Rank and role per actor.**  :func:`actor_options` gives an actor its role and rank (as
  ``RLTRACE_ROLE``/``RLTRACE_RANK`` in the actor's runtime environment: Ray starts such an
  actor in a worker process of its own).  An actor created without it gets its class name as
  role and the next free rank (``init(label_actors=False)`` turns that off).  Ranks are the
  job's, handed out by its registry actor: actors created by other actors (verl's workers are
  created by its ``TaskRunner`` actor) get ranks no other actor of the job has, with or
  without :func:`actor_options`.  Pooled workers, which run remote functions (tasks), are
  role ``ray-worker`` with ranks of their own from :data:`WORKER_RANK_BASE` up.
  Each actor is then a named process in merged traces (``[rollout] Rank 1, Process …``), a
  rank/role in ``rltrace report`` and ``rltrace top``.
* **Context across ``.remote()``.**  Ray's own trace propagation is switched on
  (``_tracing_startup_hook``): every remote function and actor-method call (sync or async
  actors, through an ``ActorPool`` as well) carries the caller's trace context, and runs
  under a Ray span of that trace in the worker, so what an actor records is in the driver's
  trace.  rltrace adds the current step (``rltrace.step(n)``, or AReaL's
  ``args={"global_step": n}``): spans, tasks and sessions recorded in the actor carry it; and
  the current task (``set_task_id``): a session the actor registers without a task joins the
  driver's task, as a child of its ``rl.task`` span in the driver's trace, with its task id.
* **Results back.**  ``ray.get`` links the current span to the remote calls whose results it
  returned, when they were made under another trace (:mod:`rltrace.ray.links`).
* **Lifecycle.**  Each actor announces itself to a registry actor at its first call.
  ``ray.shutdown()`` (wrapped by :func:`init`: Ray itself ends workers without their exit
  handlers) and :func:`shutdown` flush every announced actor first; at driver exit Ray ends
  the actors gracefully and each flushes at its own exit, as a graceful
  ``ray.actor.exit_actor()`` or an actor whose handles went out of scope does (its tally
  records that it did, so the flush counts it as ended, not lost).  Session records are
  written every export cycle in workers (``flush_threshold`` 1), so ``ray.kill`` (SIGKILL)
  or a lost node loses at most what the actor recorded in its last ``flush_interval_s``.
  A pooled worker flushes when each remote function returns (``init(flush_tasks=...)``).
  Each worker counts its sessions
  (registered, finalized, written) in a small shared-memory file (:mod:`rltrace.tally`) whose
  stores survive a SIGKILL: the flush names each actor that did not answer with the exact
  number of its sessions that never reached its files (:func:`losses`); for an actor lost
  with its node the count is unknown.

A task whose sessions run in actors ends where it was registered: finalize it there
(``trace_session_event("mark_finalized", task_id=...)``) once its sessions are done.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import threading
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
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from .. import runtime, sessions, steps
from ..config import _BOOLS, ConfigError
from ..tally import EXITED, SessionTally, read_tally
from . import links

__all__ = [
    "actor_options", "announced_actors", "flush_actors", "init", "labelled_options", "losses",
    "on_worker_setup", "shutdown",
]

ROLE_ENV, RANK_ENV = "RLTRACE_ROLE", "RLTRACE_RANK"
#: the role of worker processes started without :func:`actor_options`
DEFAULT_ROLE = "ray-worker"
#: pooled worker processes (those that run remote functions) get ranks from here up, a band of
#: their own: Ray starts them when it likes, so taking actors' ranks would make those vary
WORKER_RANK_BASE = 100_000
#: what a pooled worker flushes when a remote function returns (see :func:`init`)
FLUSH_TASKS = ("all", "files", "cycle")
_STEP_HEADER = "rltrace-step"


def init(*args: Any, runtime_env: Mapping[str, Any] | None = None,
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
    from ..config import dataclass_to_dict

    payload = dataclass_to_dict(cfg)  # OTLP headers included: they travel inside the hook
    payload.update(role=cfg.role or DEFAULT_ROLE, per_process_files=True)
    payload["session_tracer"] = {**payload["session_tracer"], "flush_threshold": 1}
    payload.pop("rank", None)
    env = dict(runtime_env or {})
    user_hook = env.get("worker_process_setup_hook")

    setups = tuple(_WORKER_SETUPS)  # integrations' worker-side setup (on_worker_setup)

    def rltrace_worker_setup() -> None:  # pickled by Ray with the payload into its GCS
        _setup_worker(payload, user_hook, label_actors, flush_tasks, setups)

    env["worker_process_setup_hook"] = rltrace_worker_setup
    kwargs.setdefault("_tracing_startup_hook", f"{__name__}:_tracing_hook")
    install_propagator()
    context = ray.init(*args, runtime_env=env, **kwargs)
    _JOB.start(ray, label_actors)
    return context


class RankAllocator:
    """Ranks for actors, unique across roles in one job (rank 0 is the driver): an explicit
    rank is taken as given (and not handed out again); otherwise the lowest free one from 1.

    With ``registry`` (a callable returning the job's registry actor, or None) the ranks are
    the job's: the registry actor hands them out, so actors created by the driver and by other
    actors never share one; without it (or while no registry can be reached: before
    :func:`init`) they are this process's."""

    def __init__(self, registry: Any = None) -> None:
        self.used: set[int] = {0}
        self._lock = threading.Lock()
        self._registry = registry

    def take(self, rank: int | None) -> int:
        handle = self._registry() if self._registry is not None else None
        if handle is not None:
            import ray

            try:
                rank, held = ray.get(handle.take.remote(rank), timeout=30)
            except Exception as exc:  # the registry is gone: this process's ranks
                runtime.logger.warning("rltrace.ray: the job's rank registry is unreachable "
                                        "(%s); ranks are handed out by this process alone", exc)
            else:
                with self._lock:
                    self.used.add(rank)
                if held:
                    self._warn_held(rank)
                return int(rank)
        with self._lock:
            if rank is None:
                rank = next(r for r in itertools.count(1) if r not in self.used)
            elif rank in self.used:
                self._warn_held(rank)
            self.used.add(rank)
            return rank

    @staticmethod
    def _warn_held(rank: int) -> None:
        runtime.logger.warning(
            "rltrace.ray: rank %d is already held by %s: rltrace report will merge "
            "the two in its per-rank tables; give each actor its own rank, or leave "
            "rank out to get a free one", rank,
            "the driver" if rank == 0 else "another actor of this job")


def _job_registry() -> Any:
    """The job's registry actor: the driver's handle, or (in a worker) looked up by name once;
    None before :func:`init` or outside a traced job."""
    if _JOB.registry is None and _JOB.in_worker:
        try:
            import ray

            _JOB.registry = ray.get_actor(REGISTRY_NAME)
        except Exception as exc:
            runtime.logger.debug("rltrace.ray: no actor registry: %s", exc)
            _JOB.in_worker = False  # not asked again
    return _JOB.registry


#: the job's actor ranks (:func:`actor_options` without ``rank``, labelled actors), handed out
#: by the job's registry actor after :func:`init`, in the driver and in actors alike
RANKS = RankAllocator(registry=_job_registry)


def actor_options(role: str, rank: int | None = None, **options: Any) -> dict[str, Any]:
    """Options for ``ActorClass.options(**...)`` giving the actor its rltrace role and rank.

    Without ``rank`` the actor gets the lowest rank no other actor of the job has (any role;
    the driver is 0; after :func:`init`, in the driver and in actors alike, the job's registry
    actor hands it out), so ``rltrace report`` and ``top`` tell every actor apart.  Other
    ``options`` (``name``, ``num_cpus``, a ``runtime_env`` of yours, ...) are kept.
    """
    if not isinstance(role, str) or not role or "/" in role:
        raise ValueError(f"rltrace.ray.actor_options: role must be a non-empty name without "
                         f"'/', got {role!r}")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise ValueError(f"rltrace.ray.actor_options: rank must be an int >= 0, got {rank!r}")
    env = _with_role_rank(options.pop("runtime_env", None), role, RANKS.take(rank))
    return {**options, "runtime_env": env}


def _with_role_rank(env: Mapping[str, Any] | None, role: str, rank: int) -> dict[str, Any]:
    """A copy of a runtime environment with the rltrace role and rank among its ``env_vars``."""
    out = dict(env or {})
    out["env_vars"] = {**(out.get("env_vars") or {}), ROLE_ENV: role, RANK_ENV: str(rank)}
    return out


def labelled_options(actor_cls: Any, options: dict[str, Any],
                     ranks: RankAllocator | None = None) -> dict[str, Any]:
    """The creation options of a Ray actor class with rltrace's role and rank added when they
    lack them: role = the class name, rank = the next free one (from ``ranks``, default the
    job's :data:`RANKS`; in an async actor, asking the job's registry blocks its event loop
    for that one call).  Options that
    already name a role or rank (:func:`actor_options`, or ``RLTRACE_ROLE``/``RLTRACE_RANK`` in
    ``runtime_env`` of yours) are returned as they are."""
    from ray.runtime_env import RuntimeEnv

    env = options.get("runtime_env")
    env_vars = (env or {}).get("env_vars") or {}
    if ROLE_ENV in env_vars or RANK_ENV in env_vars:
        return options
    meta = getattr(actor_cls, "__ray_metadata__", None)
    role = str(getattr(meta, "class_name", None) or "actor")  # a qualified name
    role = role.rsplit(".", 1)[-1].replace("/", "_")
    labelled = _with_role_rank(env, role, (ranks or RANKS).take(None))
    return {**options, "runtime_env": RuntimeEnv(**labelled)}


def _label_actor_creation() -> None:
    """Every actor this process creates goes through ``ActorClass._remote`` (``.remote()`` and
    ``.options(...).remote()`` alike): wrapped to add :func:`labelled_options`.  Ray has no
    public hook for actor creation options; ``tests/integrations/ray/test_ray.py`` fails on a
    Ray release where this stops working (a plain ``Reward.remote()`` actor must get its own
    role and rank)."""
    from ray.actor import ActorClass

    original = ActorClass._remote
    if getattr(original, "_rltrace_original", None) is not None:
        return

    @functools.wraps(original)
    def _remote(actor_cls: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        try:
            options = labelled_options(actor_cls, options)
        except Exception as exc:  # never in the way of creating the actor
            runtime.logger.debug("rltrace.ray: actor not labelled: %s", exc)
        return original(actor_cls, args, kwargs, **options)

    _remote._rltrace_original = original  # type: ignore[attr-defined]
    ActorClass._remote = _remote  # type: ignore[method-assign]


def _unlabel_actor_creation() -> None:
    from ray.actor import ActorClass

    original = getattr(ActorClass._remote, "_rltrace_original", None)
    if original is not None:
        ActorClass._remote = original  # type: ignore[method-assign]


class _Job:
    """The driver's side of one traced Ray job: the registry actors announce themselves to, and
    ``ray.shutdown`` wrapped to flush them first.  (At driver exit Ray ends the job's actors
    gracefully: each flushes at its own exit, tested in ``tests/integrations/ray/test_ray.py``.)"""

    def __init__(self) -> None:
        self.registry: Any = None
        #: a worker process of a traced job (its registry is looked up by name)
        self.in_worker = False
        self._original_shutdown: Any = None
        #: the span of each recent remote call, for ``ray.get``'s links (:mod:`.links`)
        self.submissions = links.Submissions()
        self._submissions_on: Any = None  # the pipeline it was added to

    def start(self, ray: Any, label_actors: bool = True) -> None:
        _unlabel_actor_creation()  # the registry is no actor of the user's
        self.registry = _registry_class(ray).options(
            name=REGISTRY_NAME, get_if_exists=True, num_cpus=0,
            runtime_env={"env_vars": {"RLTRACE_ENABLED": "false",  # it traces nothing itself
                                      "RLTRACE_SESSION_TRACER_ENABLED": "false"}},
        ).remote(sorted(RANKS.used))  # ranks given out before init stay taken
        if label_actors:
            _label_actor_creation()
        p = runtime.get_pipeline()
        if p is not None and self._submissions_on is not p:
            p.processor.add_span_processor(self.submissions)
            self._submissions_on = p
        links.install(self.submissions)
        if self._original_shutdown is None:
            self._original_shutdown = ray.shutdown
            original = ray.shutdown

            @functools.wraps(original)
            def shutdown(*args: Any, **kwargs: Any) -> Any:  # ray.shutdown: flush actors first
                self.flush_all()
                _unlabel_actor_creation()
                links.uninstall()
                self.registry = None  # gone with the cluster: ranks are this process's again
                return original(*args, **kwargs)

            ray.shutdown = shutdown

        #: what the flushes found lost (see :func:`losses`), by actor id or tally file: a
        #: later flush that finds the same one again replaces its entry
        self.losses: dict[str, dict[str, Any]] = {}

    def entries(self, timeout_s: float = 10.0) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Actor id -> (handle, what it announced) for every actor of this job that has
        announced itself (ran a method)."""
        import ray

        if self.registry is None or not ray.is_initialized():
            return {}
        try:
            return dict(ray.get(self.registry.entries.remote(), timeout=timeout_s))
        except Exception as exc:  # the registry is gone (Ray shutting down): nothing to reach
            runtime.logger.debug("rltrace.ray: actor registry unreachable: %s", exc)
            return {}

    def actors(self, timeout_s: float = 10.0) -> list[Any]:
        """Handles of every actor of this job that has announced itself (ran a method)."""
        return [handle for handle, _ in self.entries(timeout_s).values()]

    def flush_all(self, *actors: Any, timeout_s: float = 30.0) -> int:
        """At shutdown: flush these actors (default: every announced one), then count what
        the job's pooled workers hold unwritten (``ray.shutdown()`` ends them next)."""
        import ray

        if not ray.is_initialized():
            return 0
        confirmed = flush_actors(*actors, timeout_s=timeout_s)
        _count_pooled_losses()
        return confirmed


_JOB = _Job()
#: this worker's session tally (kept: its memory map is what a SIGKILL leaves behind)
_WORKER_TALLY: list[SessionTally] = []
#: the registry actor's name (one per job namespace)
REGISTRY_NAME = "rltrace-actors"


def _registry_class(ray: Any) -> Any:
    class ActorRegistry:
        """Handles of the job's actors, keyed by actor id (a restarted actor replaces its
        entry), and the job's ranks (0 is the driver's)."""

        def __init__(self, used: list[int]) -> None:
            self.handles: dict[str, tuple[Any, dict[str, Any]]] = {}
            self.used = {0, *used}

        def take(self, rank: int | None) -> tuple[int, bool]:
            """A rank for a new actor: ``rank`` as given, or the lowest free one; and whether
            it was held already."""
            if rank is None:
                rank = next(r for r in itertools.count(1) if r not in self.used)
            held = rank in self.used
            self.used.add(rank)
            return rank, held

        def add(self, actor_id: str, handle: Any, info: dict[str, Any]) -> None:
            self.handles[actor_id] = (handle, info)

        def entries(self) -> dict[str, tuple[Any, dict[str, Any]]]:
            return dict(self.handles)

    return ray.remote(ActorRegistry)


def announced_actors() -> list[Any]:
    """Handles of the job's actors that have announced themselves (each does at its first
    call): what :func:`flush_actors` and ``ray.shutdown()`` flush."""
    return _JOB.actors()


def flush_actors(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in each of these actors now (sync or async); returns how many confirmed.

    With no actors given: every actor of the job that has run a method.  An actor that is dead
    or does not answer within ``timeout_s`` is skipped, and counted in :func:`losses`.
    """
    import ray

    entries = _JOB.entries()
    if not actors:
        actors = tuple(handle for handle, _ in entries.values())
    infos = {aid: info for aid, (_, info) in entries.items()}
    refs = [a.__ray_call__.remote(_flush_here) for a in actors]
    if not refs:
        return 0
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    answered = _answered(ready)
    silent = [_loss(a, infos.get(_actor_id(a) or "")) for a, ref in zip(actors, refs, strict=True)
              if ref not in answered]
    _report_silent(silent, len(actors), timeout_s)
    return len(answered)


def _answered(ready: list[Any]) -> set[Any]:
    """The flush calls among ``ready`` that returned (an actor that died meanwhile: nothing to
    flush there)."""
    import ray

    answered = set()
    for ref in ready:
        try:
            ray.get(ref)
            answered.add(ref)
        except Exception:
            pass
    return answered


def _report_silent(silent: list[dict[str, Any]], asked: int, timeout_s: float) -> None:
    """Actors that did not answer a flush: those that ended gracefully (their handles out of
    scope, ``exit_actor``) flushed at their exit; the others are counted in :func:`losses` and
    named in one warning."""
    ended = [x for x in silent if x["exited"] and x["unwritten"] == 0]
    lost = [x for x in silent if not (x["exited"] and x["unwritten"] == 0)]
    if ended:
        runtime.logger.debug("rltrace.ray: %d actors had ended and flushed at their exit: %s",
                             len(ended), ", ".join(f"rank {x['rank']} ({x['role']})"
                                                   for x in ended))
    if lost:
        _JOB.losses.update((x["actor_id"] or f"#{len(_JOB.losses)}", x) for x in lost)
        runtime.logger.warning(
            "rltrace.ray: %d of %d actors did not answer the flush (killed, lost with their node, "
            "or still busy after %.0f s); what each recorded since its last export cycle (at "
            "most flush_interval_s) is not in its files: %s", len(lost), asked,
            timeout_s, "; ".join(map(_describe_loss, lost)))


def _count_pooled_losses() -> None:
    """At shutdown: pooled workers have no handle to flush them by.  Each flushes when a remote
    function returns (``flush_tasks``) and published its tally file in Ray's key-value store
    at start; what one holds unwritten (a call killed or still running, or the export cycle's
    share under ``flush_tasks="cycle"``) is lost when ``ray.shutdown()`` ends it, and counted
    here.  A tally that cannot be read here (another node, no shared file system) is not
    counted: nothing says that worker lost anything.  A pooled worker that hosts an actor is
    the actor's (flushed by handle)."""
    actor_pids = {info.get("pid") for _, info in _JOB.entries().values()}
    lost = []
    for info in _pooled_workers():
        if info.get("pid") in actor_pids or not info.get("tally"):
            continue
        out = _loss(None, info)  # (no handle: actor_id None)
        if not out["unwritten"]:  # nothing unwritten, or no count readable here
            continue
        lost.append(out)
        _JOB.losses[info["tally"]] = out
    if lost:
        runtime.logger.warning(
            "rltrace.ray: %d pooled worker processes hold sessions not in their files (a remote "
            "function killed midway or still running, or left to the export cycle): %s",
            len(lost), "; ".join(map(_describe_loss, lost)))


def _kv_prefix() -> str:
    import ray

    return f"rltrace/{ray.get_runtime_context().get_job_id()}"


def _publish_pooled_worker(info: dict[str, Any]) -> None:
    """In a pooled worker at start: its role, rank, pid and tally file, for the driver."""
    from ray.experimental.internal_kv import _internal_kv_put

    try:
        _internal_kv_put(f"{_kv_prefix()}/worker-info/{info['rank']}".encode(),
                         json.dumps(info).encode(), overwrite=True)
    except Exception as exc:
        runtime.logger.debug("rltrace.ray: pooled worker not published: %s", exc)


def _pooled_workers() -> list[dict[str, Any]]:
    """What the job's pooled workers published at start (read in the driver)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    try:
        prefix = f"{_kv_prefix()}/worker-info/".encode()
        out = []
        for key in _internal_kv_list(prefix):
            value = _internal_kv_get(key)
            if value:
                out.append(json.loads(value))
        return out
    except Exception as exc:
        runtime.logger.debug("rltrace.ray: pooled workers not read: %s", exc)
        return []


def losses() -> list[dict[str, Any]]:
    """What the flushes of this driver found not flushed: one dict per actor that did not answer
    and per pooled worker that held sessions unwritten at shutdown (``role``, ``rank``,
    ``pid``; ``registered``, ``finalized``, ``written`` sessions and ``unwritten``, those whose
    record never reached its files, read from the worker's :mod:`rltrace.tally` file; None
    where no count could be read: an actor lost with its node, or one that never announced
    itself).  An actor that had ended gracefully (it flushed at its exit and wrote every
    session) is not among them."""
    return [dict(x) for x in _JOB.losses.values()]


def _actor_id(handle: Any) -> str | None:
    try:
        return str(handle._actor_id.hex())
    except Exception:
        return None


def _loss(handle: Any, info: dict[str, Any] | None) -> dict[str, Any]:
    info = info or {}
    out: dict[str, Any] = {"actor_id": _actor_id(handle), "role": info.get("role"),
                           "rank": info.get("rank"), "pid": info.get("pid")}
    counts = read_tally(info["tally"]) if info.get("tally") else None
    for key in ("registered", "finalized", "written", "unwritten", "exited"):
        out[key] = counts[key] if counts is not None else None
    out["exited"] = bool(out["exited"])
    return out


def _describe_loss(x: dict[str, Any]) -> str:
    who = f"rank {x['rank']} ({x['role']}, pid {x['pid']})" if x["pid"] else f"actor {x['actor_id']}"
    if x["unwritten"] is None:
        return f"{who}: session count unknown"
    return (f"{who}: {x['unwritten']} of its {x['registered']} sessions not written "
            f"({x['registered'] - x['finalized']} open)")


def shutdown(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in these actors (default: every actor of the job), then shut Ray down;
    returns how many flushed.

    Ray's own ``ray.shutdown()`` ends worker processes without running their exit handlers;
    after :func:`init` it is wrapped to flush every announced actor first, so this is the same
    with handles to limit the flush.  (A graceful actor exit, ``ray.actor.exit_actor()``, and
    driver exit, which ends actors gracefully, flush by themselves.)
    """
    import ray

    confirmed = _JOB.flush_all(*actors, timeout_s=timeout_s)
    _unlabel_actor_creation()
    links.uninstall()
    _JOB.registry = None
    original = _JOB._original_shutdown or ray.shutdown
    original()
    return confirmed


def _flush_here(_actor: Any) -> int:
    p = runtime.get_pipeline()
    timeout = p.cfg.otlp.timeout_s if p is not None and p.cfg.otlp.timeout_s is not None else 5.0
    runtime.flush(wait_s=timeout)  # files, session records, and what the OTLP sender holds
    return os.getpid()


#: ``"package.module:function"`` names each worker process of a job started by :func:`init`
#: calls at start, once rltrace is configured there (:func:`on_worker_setup`)
_WORKER_SETUPS: list[str] = []


def on_worker_setup(target: str) -> None:
    """Have every worker process of the Ray jobs :func:`init` starts from now on call ``target``
    (``"package.module:function"``, no arguments) at start, right after rltrace is configured
    there: how an integration (``rltrace.integrations.verl``) instruments framework code that
    runs in Ray actors.  Idempotent; a failing target is logged in the worker, never raised."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"rltrace.ray.on_worker_setup: target must be 'package.module:function', "
                         f"got {target!r}")
    if target not in _WORKER_SETUPS:
        _WORKER_SETUPS.append(target)


def _run_worker_setups(setups: tuple[str, ...]) -> None:
    import importlib

    for target in setups:
        module, _, attr = target.partition(":")
        try:
            getattr(importlib.import_module(module), attr)()
        except Exception as exc:  # an integration's setup must not stop the worker
            runtime.logger.warning("rltrace.ray: worker setup %s failed: %s", target, exc)


def _setup_worker(payload: dict[str, Any], user_hook: Any = None,
                  label_actors: bool = False, flush_tasks: str = "all",
                  setups: tuple[str, ...] = ()) -> None:
    """Runs in every worker process at start (Ray's ``worker_process_setup_hook``)."""
    install_propagator()
    _JOB.in_worker = True  # ranks of actors created here come from the job's registry
    if label_actors:
        _label_actor_creation()
    # registered before configure's own exit handler, so it runs after that flush (LIFO)
    atexit.register(_mark_exited)
    runtime.RUNTIME.sessions.offset_ids(os.getpid())  # task/session ids of its own never equal the driver's
    data = dict(payload)
    if os.environ.get(RANK_ENV) is None:  # a pooled worker (remote functions, plain actors)
        data["rank"] = _pooled_worker_rank() if _enabled_here(data) else 0
    runtime.configure(data)  # RLTRACE_ROLE / RLTRACE_RANK of the actor's env win over data
    p = runtime.get_pipeline()
    if p is not None:  # on the provider only: Ray's spans get it, rltrace's records need not
        info: dict[str, Any] = {"role": p.cfg.role, "rank": p.rank, "pid": os.getpid()}
        try:
            tally = SessionTally(p.log_dir / "ray" / f"tally-r{p.rank}-p{os.getpid()}.bin")
        except OSError as exc:
            runtime.logger.warning("rltrace.ray: no session tally in this worker (%s): a "
                                    "ray.kill of it cannot be counted", exc)
        else:
            sp = p.session_processor
            if sp is not None:
                runtime.RUNTIME.sessions.tally = sp.writer.tally = tally.view
            info["tally"] = str(tally.path)
            _WORKER_TALLY.append(tally)  # the map lives as long as the process
        if os.environ.get(RANK_ENV) is None and p.rank >= WORKER_RANK_BASE:
            _publish_pooled_worker(info)
        p.processor.add_span_processor(_StepFromCaller(info, flush_tasks))
        p.processor.add_span_processor(_JOB.submissions)
        links.install(_JOB.submissions)
    _run_worker_setups(setups)
    if user_hook is not None:
        if isinstance(user_hook, str):
            module, _, attr = user_hook.rpartition(".")
            import importlib

            user_hook = getattr(importlib.import_module(module), attr)
        user_hook()


def _enabled_here(data: Mapping[str, Any]) -> bool:
    """Whether rltrace will be on in this worker (``RLTRACE_ENABLED`` of its environment wins,
    as in ``configure``; the registry actor has it off)."""
    env = _BOOLS.get(os.environ.get("RLTRACE_ENABLED", "").strip().lower())
    return bool(data.get("enabled", True)) if env is None else env


def _pooled_worker_rank() -> int:
    """This pooled worker's rank: the lowest of the band from :data:`WORKER_RANK_BASE` no
    other worker of the job has claimed, claimed in Ray's key-value store (GCS) with a
    put-if-absent per rank.  (Not from the registry actor: a call to an actor from the setup
    hook crashes Ray 2.60's worker.)  0, as the driver, when the store does not answer."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    try:
        prefix = f"{_kv_prefix()}/worker-rank"
        hint = _internal_kv_get(f"{prefix}/next".encode())  # a hint: the claims decide
        rank = max(WORKER_RANK_BASE, int(hint) if hint else 0)
        while _internal_kv_put(f"{prefix}/{rank}".encode(), b"", overwrite=False):
            rank += 1  # claimed by another worker
        _internal_kv_put(f"{prefix}/next".encode(), str(rank + 1).encode(), overwrite=True)
        return rank
    except Exception as exc:
        runtime.logger.warning("rltrace.ray: no rank for this worker process from Ray's "
                                "key-value store (%s); it is rank 0, as the driver is", exc)
        return 0


def _mark_exited() -> None:
    """At this worker's exit, after rltrace's exit flush: the tally says it ended gracefully."""
    for tally in _WORKER_TALLY:
        tally.view[EXITED] = 1


def _tracing_hook() -> None:
    """Ray's tracing startup hook: the tracer provider is rltrace's (set by ``configure``)."""
    install_propagator()


# ---- the step and task across .remote() -----------------------------------------------------

_STEP_KEY = steps.CALLER_STEP_KEY
_TASK_HEADER = "rltrace-task"


class CallerContextPropagator(TextMapPropagator):
    """Carries the caller's step (``rltrace.step(n)`` or AReaL's ``global_step`` arg) and task
    (``set_task_id``: its id and its ``rl.task`` span) beside ``traceparent``, in
    ``rltrace-step`` and ``rltrace-task`` fields; extracted into the callee's context, where
    sessions registered without a task join the caller's task (in the caller's trace) and
    spans, tasks and sessions carry the step."""

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
        task = _task_field()
        if task is not None:
            setter.set(carrier, _TASK_HEADER, task)

    def extract(self, carrier: CarrierT, context: Any = None,
                getter: Getter[CarrierT] = default_getter) -> Any:
        if context is None:
            context = otel_context.get_current()
        values = getter.get(carrier, _STEP_HEADER)
        if values:
            try:
                context = otel_context.set_value(_STEP_KEY, int(values[0]), context)
            except ValueError:
                pass
        values = getter.get(carrier, _TASK_HEADER)
        if values:
            caller = _parse_task_field(values[0])
            if caller is not None:
                context = otel_context.set_value(sessions.CALLER_TASK_KEY, caller, context)
        return context

    @property
    def fields(self) -> set[str]:
        return {_STEP_HEADER, _TASK_HEADER}


def _task_field() -> str | None:
    """``[task_id, trace_id, span_id, flags]`` of the current task's span, as JSON (None when
    there is no current task, its id is not an int or str, or its span is unknown here)."""
    task_id = sessions.get_task_id()
    if task_id is None or type(task_id) not in (int, str):
        return None
    sc = runtime.RUNTIME.sessions.task_span_context(task_id, spread=True)
    if sc is None:
        caller = sessions.caller_task()  # a task this process runs for its own caller
        if caller is None or caller[0] != task_id:
            return None
        sc = caller[1]
    return json.dumps([task_id, f"{sc.trace_id:032x}", f"{sc.span_id:016x}", int(sc.trace_flags)])


def _parse_task_field(value: str) -> tuple[Any, SpanContext] | None:
    try:
        task_id, trace_id, span_id, flags = json.loads(value)
        sc = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                         trace_flags=TraceFlags(int(flags)))
    except (ValueError, TypeError):
        return None
    return (task_id, sc) if sc.is_valid and type(task_id) in (int, str) else None


def install_propagator() -> None:
    """Add :class:`CallerContextPropagator` to the global propagator (once)."""
    current = propagate.get_global_textmap()
    props = getattr(current, "_propagators", [current])
    if any(isinstance(p, CallerContextPropagator) for p in props):
        return
    propagate.set_global_textmap(CompositePropagator([current, CallerContextPropagator()]))


class _StepFromCaller(SpanProcessor):
    """Puts the caller's step on the span Ray starts for a remote call (``rl.step``), so the
    spans recorded under it carry the step; at an actor's first call, announces the actor
    to the job's registry (so the driver can flush it at ``ray.shutdown()`` and exit); and at
    the end of each remote function (a task, not an actor method) flushes this worker, before
    Ray hands the result to the caller: pooled workers have no handle to flush them by, and
    ``ray.shutdown()`` ends them without their exit handlers."""

    def __init__(self, info: dict[str, Any], flush_tasks: str = "all") -> None:
        self.announced = False
        self.info = info  # announced with the handle: role, rank, pid, tally file
        self.flush_tasks = flush_tasks

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if hasattr(span, "slot_attrs"):  # rltrace's own records: nothing to do
            return
        step = otel_context.get_value(_STEP_KEY, parent_context)
        if type(step) is int and hasattr(span, "set_attribute"):
            span.set_attribute("rl.step", step)
        if not self.announced:
            self.announced = True  # the registry call's own span comes back here: skipped
            self.announced = _announce_actor(self.info)

    def on_end(self, span: Any) -> None:
        if (self.flush_tasks == "cycle" or getattr(span, "kind", None) is not SpanKind.CONSUMER
                or not span.name.endswith(" ray.remote_worker")):
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


def _announce_actor(info: dict[str, Any]) -> bool:
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
