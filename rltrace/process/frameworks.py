"""What the user's program has put in use of torch and JAX, asked without changing it.

rltrace never imports torch or jax, and never initialises either: a framework only imported
(by a library, say) is left as it is.  Asking JAX its device list or its process index
initialises its backend, which on a GPU preallocates most of the GPU's memory under a torch
job; so JAX is consulted only once it has a backend or a distributed client of its own.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["jax_in_use", "jax_process", "torch_cuda", "torch_dist"]


def torch_cuda() -> ModuleType | None:
    """torch, when it has initialised CUDA in this process (else no CUDA work can be queued)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if torch.cuda.is_initialized() else None
    except Exception:
        return None


def torch_dist() -> tuple[int, int] | None:
    """(rank, world size) of an initialised torch.distributed default group, else None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:
        return None
    return None


def jax_in_use() -> ModuleType | None:
    """jax, when it has initialised a backend in this process (else no JAX work is queued).

    Where jax does not say (the check is private to it), it counts as in use.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    check = getattr(sys.modules.get("jax._src.xla_bridge"), "backends_are_initialized", None)
    try:
        return jax if check is None or check() else None
    except Exception:
        return jax


def jax_process() -> tuple[int, int] | None:
    """(process index, process count) of a JAX in use: from ``jax.distributed``'s client when
    it was initialised, else from the backend once JAX has one; None otherwise."""
    if sys.modules.get("jax") is None:
        return None
    state = getattr(sys.modules.get("jax._src.distributed"), "global_state", None)
    try:
        if state is not None and getattr(state, "client", None) is not None:
            return int(state.process_id), int(state.num_processes)
        jax = jax_in_use()
        if jax is not None:
            return int(jax.process_index()), int(jax.process_count())
    except Exception:
        return None
    return None
