"""Rank and world-size detection: explicit value, ``RANK``/``WORLD_SIZE``, torch.distributed, JAX.

Frameworks are only consulted once the user's program has put them in use
(:mod:`rltrace.process.frameworks`): rltrace never imports or initialises torch or jax itself.
"""

from __future__ import annotations

import os

from rltrace.process.frameworks import jax_process, torch_dist


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def detect_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Return ``(rank, world_size)``: explicit values win, then env, torch.distributed, JAX, 0/1."""
    env_rank, env_world = _env_int("RANK"), _env_int("WORLD_SIZE")
    fw = None
    if (rank is None and env_rank is None) or (world_size is None and env_world is None):
        fw = torch_dist() or jax_process()
    if rank is None:
        rank = env_rank if env_rank is not None else (fw[0] if fw else 0)
    if world_size is None:
        world_size = env_world if env_world is not None else (fw[1] if fw else 1)
    return rank, max(world_size, rank + 1)
