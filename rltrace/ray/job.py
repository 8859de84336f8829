"""The traced Ray job as this process sees it: the job's registry actor and the state around it.

One registry actor per job (named :data:`REGISTRY_NAME`) hands out the job's actor ranks and
holds a handle to every actor that has announced itself (at its first call), so the driver can
flush them all at ``ray.shutdown()``.  :class:`RayJob` is this process's side of the job, held by
the runtime (:func:`current_job`): the registry's handle, the job's ranks, the spans of recent
remote calls for ``ray.get``'s links, and what the flushes found lost.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, TypedDict

from rltrace import runtime
from rltrace.ray import links
from rltrace.ray.ranks import RankAllocator
from rltrace.runtime import RUNTIME

#: the registry actor's name (one per job namespace)
REGISTRY_NAME = "rltrace-actors"


class _WorkerInfoBase(TypedDict):
    role: str | None
    rank: int
    pid: int


class WorkerInfo(_WorkerInfoBase, total=False):
    """What a worker process of the job announces (an actor, to the registry) or publishes (a
    pooled worker, in Ray's key-value store): its role, rank, pid and session tally file."""

    tally: str


class Loss(TypedDict):
    """One actor or pooled worker a flush found not flushed (see :func:`rltrace.ray.losses`):
    who it is, and its session counts from its tally (None where none could be read)."""

    actor_id: str | None
    role: str | None
    rank: int | None
    pid: int | None
    registered: int | None
    finalized: int | None
    written: int | None
    unwritten: int | None
    exited: bool


class RayJob:
    """This process's side of one traced Ray job (a part of the runtime: :func:`current_job`).

    In the driver, :func:`rltrace.ray.init` starts the registry actor and keeps its handle; in a
    worker process of the job the handle is looked up by name at first use."""

    def __init__(self) -> None:
        self.registry: Any = None
        #: a worker process of a traced job (its registry is looked up by name)
        self.in_worker = False
        #: ``ray.shutdown`` as it was before :func:`rltrace.ray.init` wrapped it
        self.original_shutdown: Callable[..., object] | None = None
        #: the span of each recent remote call, for ``ray.get``'s links (:mod:`.links`)
        self.submissions = links.Submissions()
        self.submissions_on: object = None  # the pipeline it was added to
        #: the job's actor ranks (:func:`rltrace.ray.actor_options` without ``rank``, labelled
        #: actors), handed out by the registry actor after init, in the driver and in actors alike
        self.ranks = RankAllocator(registry=self.registry_handle)
        #: what the flushes found lost (see :func:`rltrace.ray.losses`), by actor id or tally
        #: file: a later flush that finds the same one again replaces its entry
        self.losses: dict[str, Loss] = {}

    def registry_handle(self) -> Any:
        """The job's registry actor: the driver's handle, or (in a worker) looked up by name
        once; None before :func:`rltrace.ray.init` or outside a traced job."""
        if self.registry is None and self.in_worker:
            try:
                import ray

                self.registry = ray.get_actor(REGISTRY_NAME)
            except Exception as exc:
                runtime.logger.debug("rltrace.ray: no actor registry: %s", exc)
                self.in_worker = False  # not asked again
        return self.registry

    def entries(self, timeout_s: float = 10.0) -> dict[str, tuple[Any, WorkerInfo]]:
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


def current_job() -> RayJob:
    """This process's side of its traced Ray job (held by the runtime)."""
    return RUNTIME.part(RayJob)


def registry_class(ray: Any) -> Any:
    """The registry actor's class, made a Ray actor class by ``ray``."""
    class ActorRegistry:
        """Handles of the job's actors, keyed by actor id (a restarted actor replaces its
        entry), and the job's ranks (0 is the driver's)."""

        def __init__(self, used: list[int]) -> None:
            self.handles: dict[str, tuple[object, WorkerInfo]] = {}
            self.used = {0, *used}

        def take(self, rank: int | None) -> tuple[int, bool]:
            """A rank for a new actor: ``rank`` as given, or the lowest free one; and whether
            it was held already."""
            if rank is None:
                rank = next(r for r in itertools.count(1) if r not in self.used)
            held = rank in self.used
            self.used.add(rank)
            return rank, held

        def add(self, actor_id: str, handle: object, info: WorkerInfo) -> None:
            self.handles[actor_id] = (handle, info)

        def entries(self) -> dict[str, tuple[object, WorkerInfo]]:
            return dict(self.handles)

    return ray.remote(ActorRegistry)
