"""An actor's rltrace role and rank, given in its creation options.

:func:`actor_options` is what a user passes to ``ActorClass.options(...)``; after
:func:`rltrace.ray.init` (``label_actors=True``) every actor created without it is labelled
all the same, with its class name as role and the job's next free rank.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from rltrace import runtime
from rltrace.ray.job import current_job
from rltrace.ray.ranks import RANK_ENV, ROLE_ENV, RankAllocator, with_role_rank


def actor_options(role: str, rank: int | None = None, **options: object) -> dict[str, object]:
    """Options for ``ActorClass.options(**...)`` giving the actor its rltrace role and rank.

    Without ``rank`` the actor gets the lowest rank no other actor of the job has (any role;
    the driver is 0; after :func:`rltrace.ray.init`, in the driver and in actors alike, the
    job's registry actor hands it out), so ``rltrace report`` and ``top`` tell every actor
    apart.  Other ``options`` (``name``, ``num_cpus``, a ``runtime_env`` of yours, ...) are kept.
    """
    if not isinstance(role, str) or not role or "/" in role:
        raise ValueError(f"rltrace.ray.actor_options: role must be a non-empty name without "
                         f"'/', got {role!r}")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise ValueError(f"rltrace.ray.actor_options: rank must be an int >= 0, got {rank!r}")
    env = _runtime_env(options.pop("runtime_env", None))
    return {**options, "runtime_env": with_role_rank(env, role, current_job().ranks.take(rank))}


def _runtime_env(env: object) -> Mapping[str, object] | None:
    if env is None or isinstance(env, Mapping):
        return env
    raise TypeError(f"rltrace.ray: runtime_env must be a mapping, got {type(env).__name__}")


def labelled_options(actor_cls: object, options: dict[str, object],
                     ranks: RankAllocator | None = None) -> dict[str, object]:
    """The creation options of a Ray actor class with rltrace's role and rank added when they
    lack them: role = the class name, rank = the next free one (from ``ranks``, default the
    job's; in an async actor, asking the job's registry blocks its event loop for that one
    call).  Options that already name a role or rank (:func:`actor_options`, or
    ``RLTRACE_ROLE``/``RLTRACE_RANK`` in ``runtime_env`` of yours) are returned as they are."""
    from ray.runtime_env import RuntimeEnv

    env = _runtime_env(options.get("runtime_env"))
    env_vars = (env or {}).get("env_vars") or {}
    if isinstance(env_vars, Mapping) and (ROLE_ENV in env_vars or RANK_ENV in env_vars):
        return options
    meta = getattr(actor_cls, "__ray_metadata__", None)
    role = str(getattr(meta, "class_name", None) or "actor")  # a qualified name
    role = role.rsplit(".", 1)[-1].replace("/", "_")
    labelled = with_role_rank(env, role, (ranks or current_job().ranks).take(None))
    return {**options, "runtime_env": RuntimeEnv(**labelled)}


def label_actor_creation() -> None:
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


def unlabel_actor_creation() -> None:
    """Undo :func:`label_actor_creation`."""
    from ray.actor import ActorClass

    original = getattr(ActorClass._remote, "_rltrace_original", None)
    if original is not None:
        ActorClass._remote = original  # type: ignore[method-assign]
