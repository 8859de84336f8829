"""rltrace.stats: training statistics, reduced across ranks and logged from rank 0.

AReaL's ``stats_tracker`` API as module-level functions on a default tracker
(``from rltrace import stats``; ``from rltrace import stats_tracker`` is the same module),
AReaL's ``StatsLogger``, timings derived from rltrace spans, and logging setup.

Table of contents
-----------------
recording     scope, scope_func_wrapper, denominator, stat, scalar, record_timing, ReduceType
trackers      get, StatsTracker, DEFAULT
exporting     export, export_all (torch.distributed / JAX reduction; see rltrace.stats.distributed)
logging       StatsLogger, StatsLoggerConfig, WandBConfig, TensorBoardConfig, Sink, CommitInfo
spans         enable_span_timings, disable_span_timings, span_timings, SpanTimings
              (``timeperf/<span name>`` per step, on by default)
Python logs   setup_logging, TraceContextFilter

Example::

    from rltrace import stats

    with stats.scope("actor"):
        stats.denominator(n_tokens=loss_mask)                  # a bool mask
        stats.stat(logprob=logprobs, denominator="n_tokens")   # actor/logprob/avg|min|max
        stats.scalar(lr=1e-5)                                  # actor/lr, actor/lr__count
    with stats.record_timing("update_weights"):                # timeperf/update_weights
        sync()
    logger.commit(epoch, step, global_step, stats.export_all())  # every rank calls export_all
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .bridge import SpanTimings, disable_span_timings, enable_span_timings, span_timings
from .logger import StatsLogger, StatsLoggerConfig, TensorBoardConfig
from .logs import TraceContextFilter, setup_logging
from .reduce import ReduceType
from .sinks import CommitInfo, Sink
from .tracker import DEFAULT, StatsTracker, export_all, get
from .wandb_sink import WandBConfig

__all__ = [
    "DEFAULT",
    "CommitInfo",
    "ReduceType",
    "Sink",
    "SpanTimings",
    "StatsLogger",
    "StatsLoggerConfig",
    "StatsTracker",
    "TensorBoardConfig",
    "TraceContextFilter",
    "WandBConfig",
    "denominator",
    "disable_span_timings",
    "enable_span_timings",
    "export",
    "export_all",
    "get",
    "record_timing",
    "reset",
    "scalar",
    "scope",
    "scope_func_wrapper",
    "setup_logging",
    "span_timings",
    "stat",
]

F = TypeVar("F", bound=Callable[..., Any])


def scope(name: str) -> Any:
    """Prefix keys recorded inside with ``name/`` (context manager and decorator)."""
    return DEFAULT.scope(name)


def scope_func_wrapper(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function records under ``scope(name)``."""
    return DEFAULT.scope_func_wrapper(name)


def denominator(**masks: Any) -> None:
    """Register boolean masks (torch/numpy/jax) by name for ``stat(denominator=name)``."""
    DEFAULT.denominator(**masks)


def stat(denominator: str | None = None, reduce_type: ReduceType | str | None = None,
         **values: Any) -> None:
    """Record tensors/arrays over a denominator's mask (default: ``key/avg``, ``/min``, ``/max``)."""
    DEFAULT.stat(denominator=denominator, reduce_type=reduce_type, **values)


def scalar(**values: Any) -> None:
    """Record floats: exported as the mean and ``key__count``."""
    DEFAULT.scalar(**values)


def record_timing(name: str) -> Any:
    """Time a block as ``timeperf/<name>`` seconds (context manager and decorator)."""
    return DEFAULT.record_timing(name)


def export(key: str | None = None, reduce_group: Any = None, reset: bool = True) -> dict[str, float]:
    """Export the default tracker (reduced across ranks; see :meth:`StatsTracker.export`)."""
    return DEFAULT.export(key=key, reduce_group=reduce_group, reset=reset)


def reset() -> None:
    """Drop everything the default tracker holds."""
    DEFAULT.reset()

