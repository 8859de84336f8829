"""Turning user values (torch, numpy, jax, Python numbers) into partial statistics.

A :class:`Partial` is ``(sum, count, min, max)`` of the masked elements of one ``stat`` call.
Values on the CPU are reduced to Python floats at once (and checked for NaN/inf there);
tensors on an accelerator stay on it as one stacked 4-element tensor and are read back only
at export, so recording a stat never forces a device synchronisation.

Frameworks are recognised by the value's type and imported only when such a value arrives:
rltrace itself never imports torch or jax, and numpy only when a list or array is recorded.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

INF = math.inf

#: a resolved partial statistic: (sum, count, min, max) over the masked elements
Partial = tuple[float, float, float, float]


class StatsTypeError(TypeError, ValueError):
    """A mask or value of the wrong kind (not boolean, not numeric).

    Both a ``TypeError`` and a ``ValueError``: AReaL's ``stats_tracker`` raises ``ValueError``
    for these, so code written against AReaL catches it too.
    """


class StatsShapeError(ValueError, AssertionError):
    """A value whose shape differs from its denominator's mask.

    Both a ``ValueError`` and an ``AssertionError`` (what AReaL's ``stats_tracker`` raises).
    """


class Deferred:
    """A partial still on an accelerator: a stacked ``[sum, count, min, max]`` tensor/array."""

    __slots__ = ("key", "stacked")

    def __init__(self, key: str, stacked: Any) -> None:
        self.key = key
        self.stacked = stacked

    def resolve(self) -> Partial:
        """Read the four numbers back to the host (one transfer)."""
        s = self.stacked
        if not hasattr(s, "tolist"):
            import numpy as np

            s = np.asarray(s)
        values = s.tolist()
        total, count, lo, hi = (float(v) for v in values)
        return total, count, lo, hi


def framework(value: Any) -> str:
    """``"torch"``, ``"jax"`` or ``"numpy"`` (numpy covers Python numbers and lists)."""
    mod = type(value).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith(("jax", "jaxlib")):
        return "jax"
    return "numpy"


def _describe(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    if dtype is not None and shape is not None:
        return f"{kind} of dtype {dtype} and shape {tuple(shape)}"
    return f"{kind} {value!r}"[:120]


def is_bool_mask(mask: Any) -> bool:
    """True when ``mask`` has a boolean dtype (torch, numpy and jax all spell it ``bool``)."""
    dtype = getattr(mask, "dtype", None)
    if dtype is None:
        import numpy as np

        try:
            dtype = np.asarray(mask).dtype
        except Exception:
            return False
    return str(dtype) in ("bool", "torch.bool")


def shape_of(value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        import numpy as np

        shape = np.shape(value)
    return tuple(int(d) for d in shape)


def size_of(value: Any) -> int:
    """The number of elements of a tensor, array, list or number."""
    numel = getattr(value, "numel", None)
    if callable(numel) and framework(value) == "torch":
        return int(numel())
    n = 1
    for d in shape_of(value):
        n *= d
    return n


def check_value(key: str, value: Any) -> int:
    """Raise :class:`StatsTypeError` unless ``value`` is numeric; return its number of elements.

    The checks ``partial`` would make, for a value kept until its mask arrives.
    """
    fw = framework(value)
    if fw == "torch":
        if value.is_complex():
            raise _numeric_error(key, value)
        return int(value.numel())
    import numpy as np

    if fw == "jax":
        _check_not_traced(key, value)
        kind = np.dtype(value.dtype).kind if hasattr(value, "dtype") else "O"
        if kind not in "biuf":
            raise _numeric_error(key, value)
        return int(value.size)
    return int(_numeric_array(key, value).size)


def snapshot(value: Any) -> Any:
    """A copy of ``value`` that later in-place changes of the caller's tensor do not affect.

    torch tensors are cloned on their device, numpy arrays and Python sequences copied into a
    new array; JAX arrays are immutable and kept as they are.
    """
    fw = framework(value)
    if fw == "torch":
        return value.detach().clone()
    if fw == "jax":
        return value
    import numpy as np

    return np.array(value, copy=True)


def mask_count(key: str, mask: Any) -> Partial | Deferred:
    """The denominator's own statistic: the number of true elements (as a count)."""
    import numpy as np

    fw = framework(mask)
    if fw == "torch":
        if mask.device.type != "cpu":
            n = mask.sum().to(_torch_float(mask))
            return Deferred(key, _stack_torch(n, n, n, n))
        n = float(mask.sum().item())
    elif fw == "jax":
        _check_not_traced(key, mask)
        if not _jax_on_cpu(mask):
            import jax.numpy as jnp

            n = mask.sum().astype(jnp.result_type(float))
            return Deferred(key, jnp.stack([n, n, n, n]))
        n = float(np.asarray(mask).sum())
    else:
        n = float(np.asarray(mask).sum())
    return n, n, n, n


def partial(key: str, value: Any, mask: Any | None, denominator: str | None) -> Partial | Deferred:
    """Reduce ``value`` over ``mask`` (None: every element) to a partial statistic.

    Raises ``TypeError`` for a non-numeric value and ``ValueError`` when the shapes differ or a
    masked element is NaN/inf (checked at once on the CPU, at export for accelerator values).
    """
    fw = framework(value)
    if fw == "torch":
        return _torch_partial(key, value, mask, denominator)
    if fw == "jax":
        return _jax_partial(key, value, mask, denominator)
    return _numpy_partial(key, value, mask, denominator)


# ---- shape/finite checks shared by the backends ----------------------------------------------


def _check_shape(key: str, value: Any, mask: Any, denominator: str | None) -> None:
    vs, ms = shape_of(value), shape_of(mask)
    if vs != ms:
        raise StatsShapeError(
            f"stats.stat: {key!r} has shape {vs} but its denominator {denominator!r} has shape {ms}; "
            f"the value and the mask must have the same shape"
        )


def _nonfinite_error(key: str, n: int) -> ValueError:
    return ValueError(
        f"stats.stat: {key!r} has {n} non-finite (NaN or inf) value(s) among its masked elements; "
        f"mask them out with the denominator or fix the computation"
    )


def _numeric_error(key: str, value: Any) -> StatsTypeError:
    return StatsTypeError(
        f"stats.stat: {key!r} must be a numeric tensor, array or number, got {_describe(value)}"
    )


# ---- numpy / Python numbers --------------------------------------------------------------------


def _to_numpy_mask(mask: Any) -> np.ndarray:
    import numpy as np

    fw = framework(mask)
    if fw == "torch":
        out: np.ndarray = mask.detach().cpu().numpy()
        return out
    return np.asarray(mask)


def _numeric_array(key: str, value: Any) -> Any:
    """``value`` as a numpy array of a numeric kind (bool, int, float), else the numeric error."""
    import numpy as np

    try:
        x = np.asarray(value)
    except Exception:
        raise _numeric_error(key, value) from None
    if x.dtype.kind not in "biuf":
        raise _numeric_error(key, value)
    return x


def _numpy_partial(key: str, value: Any, mask: Any | None, denominator: str | None) -> Partial:
    import numpy as np

    x = _numeric_array(key, value).astype(np.float64, copy=False)
    if mask is not None:
        m = _to_numpy_mask(mask)
        _check_shape(key, x, m, denominator)
        x = x[m]
    else:
        x = x.reshape(-1)
    if x.size == 0:
        return 0.0, 0.0, INF, -INF
    finite = np.isfinite(x)
    if not finite.all():
        raise _nonfinite_error(key, int((~finite).sum()))
    return float(x.sum()), float(x.size), float(x.min()), float(x.max())


# ---- torch ------------------------------------------------------------------------------------


def _torch_float(t: Any) -> Any:
    import torch

    # float64 everywhere it exists (MPS has none); sums of many float32 values drift
    return torch.float32 if t.device.type == "mps" else torch.float64


def _stack_torch(*parts: Any) -> Any:
    import torch

    return torch.stack(list(parts))


def _torch_partial(key: str, value: Any, mask: Any | None, denominator: str | None) -> Partial | Deferred:
    import torch

    x = value.detach()
    if x.is_complex():
        raise _numeric_error(key, value)
    x = x.to(_torch_float(x))
    if mask is None:
        m = torch.ones_like(x, dtype=torch.bool)
    else:
        if framework(mask) != "torch":
            m = torch.as_tensor(_to_numpy_mask(mask), device=x.device)
        else:
            m = mask.detach().to(x.device)
        _check_shape(key, x, m, denominator)
    if x.numel() == 0:
        return 0.0, 0.0, INF, -INF
    inf = torch.tensor(INF, dtype=x.dtype, device=x.device)
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum()
    count = m.sum().to(x.dtype)
    lo = torch.where(m, x, inf).min()
    hi = torch.where(m, x, -inf).max()
    if x.device.type != "cpu":
        # checked at export, after the values are read back: no synchronisation here
        return Deferred(key, torch.stack([total, count, lo, hi]))
    bad = int((~torch.isfinite(x) & m).sum().item())
    if bad:
        raise _nonfinite_error(key, bad)
    total_f, count_f, lo_f, hi_f = torch.stack([total, count, lo, hi]).tolist()
    return float(total_f), float(count_f), float(lo_f), float(hi_f)


# ---- jax --------------------------------------------------------------------------------------


def _check_not_traced(key: str, value: Any) -> None:
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"stats: {key!r} is a traced JAX value (inside jax.jit/vmap/grad); return it from the "
            f"transformed function and record it outside"
        )


def _jax_on_cpu(value: Any) -> bool:
    try:
        return all(d.platform == "cpu" for d in value.devices())
    except Exception:
        return True


def _jax_partial(key: str, value: Any, mask: Any | None, denominator: str | None) -> Partial | Deferred:
    _check_not_traced(key, value)
    if mask is not None:
        _check_not_traced(key, mask)
    import jax.numpy as jnp
    import numpy as np

    kind = np.dtype(value.dtype).kind if hasattr(value, "dtype") else "O"
    if kind not in "biuf":
        raise _numeric_error(key, value)
    ftype = jnp.result_type(float)  # float64 under jax_enable_x64, else float32
    x = jnp.asarray(value).astype(ftype)
    if mask is None:
        m = jnp.ones(x.shape, dtype=bool)
    else:
        m = jnp.asarray(_to_numpy_mask(mask) if framework(mask) == "torch" else mask)
        _check_shape(key, x, m, denominator)
    if x.size == 0:
        return 0.0, 0.0, INF, -INF
    total = jnp.where(m, x, 0).sum()
    count = m.sum().astype(ftype)
    lo = jnp.where(m, x, INF).min()
    hi = jnp.where(m, x, -INF).max()
    stacked = jnp.stack([total, count, lo, hi])
    if not _jax_on_cpu(x):
        return Deferred(key, stacked)
    bad = int(np.asarray((~jnp.isfinite(x) & m).sum()))
    if bad:
        raise _nonfinite_error(key, bad)
    total_f, count_f, lo_f, hi_f = (float(v) for v in np.asarray(stacked).tolist())
    return total_f, count_f, lo_f, hi_f


# ---- scalars ----------------------------------------------------------------------------------


def scalar_value(key: str, value: Any, api: str = "stats.scalar") -> float:
    """A Python float from a number, numpy scalar or one-element tensor/array; finite only."""
    if isinstance(value, numbers.Real):
        v = float(value)
    else:
        import numpy as np

        fw = framework(value)
        if fw == "jax":
            _check_not_traced(key, value)
        try:
            size = int(np.prod(shape_of(value)))
        except Exception:
            size = -1
        if size != 1:
            raise StatsTypeError(
                f"{api}: {key!r} must be a number or a one-element tensor/array, got "
                f"{_describe(value)}; use stats.stat(...) for tensors"
            )
        try:
            if fw == "torch":
                if value.is_complex():
                    raise TypeError
                v = float(value.detach().reshape(()).item())
            else:
                arr = np.asarray(value)
                if arr.dtype.kind not in "biuf":
                    raise TypeError
                v = float(arr.reshape(()))
        except (TypeError, ValueError):
            raise StatsTypeError(f"{api}: {key!r} must be numeric, got {_describe(value)}") from None
    if not math.isfinite(v):
        raise ValueError(f"{api}: {key!r} is {v}; only finite values can be recorded")
    return v
