"""Process groups for :func:`rltrace.stats.reduce.allreduce`: torch.distributed and JAX.

``reduce_group`` as accepted by ``export``/``export_all``:

* ``None`` (default, as in AReaL): no reduction, this process's values only; nothing waits
  for other ranks;
* a torch ``ProcessGroup`` (e.g. ``torch.distributed.group.WORLD``): that group (gloo on the
  CPU, NCCL on CUDA tensors); every rank of the group must export (it is a collective);
* ``"jax"``: all JAX processes (``jax.experimental.multihost_utils.process_allgather``);
* ``"auto"``: the default torch.distributed group when one is initialised with more than one
  rank, else all JAX processes when a JAX in use has more than one (its distributed client or
  its backend says; a JAX only imported is not initialised to ask), else no reduction;
* ``False``: no reduction (the same as ``None``);
* any object with ``all_gather_object(obj) -> list`` and ``all_reduce(vec, op) -> vec``.

torch and jax are only used when the program has already put them in use
(:mod:`rltrace.process.frameworks`).
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from rltrace.process.frameworks import jax_process, torch_dist
from rltrace.stats.reduce import Reducer

if TYPE_CHECKING:
    import numpy as np

__all__ = ["JaxReducer", "TorchReducer", "resolve_reducer"]


class TorchReducer:
    """A torch.distributed group: ``all_gather_object`` for keys, ``all_reduce`` for values."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.group = group
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        self.device: Any = "cpu"
        if backend == "nccl":  # NCCL reduces CUDA tensors only
            import torch

            self.device = torch.device("cuda", torch.cuda.current_device())

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def all_reduce(self, vec: np.ndarray, op: str) -> np.ndarray:
        import numpy as np
        import torch

        dist = self.dist
        ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
        t = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float64)).to(self.device)
        dist.all_reduce(t, op=ops[op], group=self.group)
        return t.cpu().numpy()


class JaxReducer:
    """All JAX processes, through ``multihost_utils.process_allgather`` of host arrays.

    float64 vectors travel as their uint32 bit patterns, so no precision is lost when
    ``jax_enable_x64`` is off; the reduction itself is done on the host with numpy.
    """

    def __init__(self) -> None:
        from jax.experimental import multihost_utils

        self._gather = multihost_utils.process_allgather

    def _allgather(self, arr: np.ndarray) -> np.ndarray:
        import numpy as np

        return np.asarray(self._gather(arr, tiled=False))

    def all_gather_object(self, obj: Any) -> list[Any]:
        import numpy as np

        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        lengths = self._allgather(np.array([data.size], dtype=np.int32)).reshape(-1)
        padded = np.zeros(int(lengths.max()), dtype=np.uint8)
        padded[: data.size] = data
        rows = self._allgather(padded)
        return [pickle.loads(rows[i, : int(n)].tobytes()) for i, n in enumerate(lengths)]

    def all_reduce(self, vec: np.ndarray, op: str) -> np.ndarray:
        import numpy as np

        bits = np.ascontiguousarray(vec, dtype=np.float64).view(np.uint32)
        rows = self._allgather(bits)
        values = np.ascontiguousarray(rows).view(np.float64).reshape(rows.shape[0], -1)
        folded: np.ndarray = getattr(values, op)(axis=0)  # ndarray.sum / .min / .max
        return folded


def resolve_reducer(reduce_group: Any = None) -> Reducer | None:
    """The reducer for ``reduce_group`` (see the module docstring); None: no reduction."""
    if reduce_group is None or reduce_group is False:
        return None
    if isinstance(reduce_group, str):
        if reduce_group == "jax":
            return JaxReducer()
        if reduce_group == "auto":
            if (torch_dist() or (0, 1))[1] > 1:
                return TorchReducer(None)
            if (jax_process() or (0, 1))[1] > 1:
                return JaxReducer()
            return None
        raise ValueError(
            f"stats.export: reduce_group={reduce_group!r} is not understood; pass a torch "
            f"ProcessGroup, 'jax', 'auto' (torch.distributed or JAX when there are several "
            f"processes) or None (this process only)"
        )
    if hasattr(reduce_group, "all_gather_object") and hasattr(reduce_group, "all_reduce"):
        custom: Reducer = reduce_group  # a custom Reducer
        return custom
    return TorchReducer(reduce_group)
