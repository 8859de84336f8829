"""Ranks and roles of a Ray job's worker processes.

Rank 0 is the driver.  Actors get ranks from 1 up, unique across roles in the job (handed out
by the job's registry actor once :func:`rltrace.ray.init` has started it, by this process
before); pooled workers, which run remote functions, claim ranks of their own from
:data:`WORKER_RANK_BASE` up in Ray's key-value store.  An actor's role and rank travel to its
worker process as ``RLTRACE_ROLE``/``RLTRACE_RANK`` in its runtime environment.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rltrace import runtime

ROLE_ENV, RANK_ENV = "RLTRACE_ROLE", "RLTRACE_RANK"
#: the role of worker processes started without :func:`rltrace.ray.actor_options`
DEFAULT_ROLE = "ray-worker"
#: pooled worker processes (those that run remote functions) get ranks from here up, a band of
#: their own: Ray starts them when it likes, so taking actors' ranks would make those vary
WORKER_RANK_BASE = 100_000


class RankAllocator:
    """Ranks for actors, unique across roles in one job (rank 0 is the driver): an explicit
    rank is taken as given (and not handed out again); otherwise the lowest free one from 1.

    With ``registry`` (a callable returning the job's registry actor, or None) the ranks are
    the job's: the registry actor hands them out, so actors created by the driver and by other
    actors never share one; without it (or while no registry can be reached: before
    :func:`rltrace.ray.init`) they are this process's."""

    def __init__(self, registry: Callable[[], Any] | None = None) -> None:
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
                    self.used.add(int(rank))
                if held:
                    self._warn_held(int(rank))
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


def with_role_rank(env: Mapping[str, object] | None, role: str, rank: int) -> dict[str, Any]:
    """A copy of a runtime environment with the rltrace role and rank among its ``env_vars``
    (a Ray runtime environment: values of the kinds Ray's ``RuntimeEnv`` takes per key)."""
    out: dict[str, Any] = dict(env or {})
    env_vars = out.get("env_vars")
    out["env_vars"] = {**(env_vars if isinstance(env_vars, Mapping) else {}),
                       ROLE_ENV: role, RANK_ENV: str(rank)}
    return out


def kv_prefix() -> str:
    """This job's prefix of keys in Ray's key-value store (GCS)."""
    import ray

    return f"rltrace/{ray.get_runtime_context().get_job_id()}"


def pooled_worker_rank() -> int:
    """This pooled worker's rank: the lowest of the band from :data:`WORKER_RANK_BASE` no
    other worker of the job has claimed, claimed in Ray's key-value store (GCS) with a
    put-if-absent per rank.  (Not from the registry actor: a call to an actor from the setup
    hook crashes Ray 2.60's worker.)  0, as the driver, when the store does not answer."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

    try:
        prefix = f"{kv_prefix()}/worker-rank"
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
