"""rltrace.stats: training statistics, reduced across ranks and logged from rank 0.

AReaL's ``stats_tracker`` API as module-level functions on a default tracker
(``from rltrace import stats``; ``from rltrace import stats_tracker`` is the same module),
AReaL's ``StatsLogger``, timings derived from rltrace spans, and logging setup.

Table of contents
-----------------
recording     scope, scope_func_wrapper, disable_scope, denominator, stat, scalar, record_timing,
              ReduceType; errors StatsTypeError, StatsShapeError
trackers      get, StatsTracker, DEFAULT; AReaL's names DistributedStatsTracker, DEFAULT_TRACKER,
              TRACKERS, LOCK, MOE_AUX_LOSSES
exporting     export, export_all: this process only by default, as in AReaL; pass reduce_group
              (a torch ProcessGroup, "jax", "auto") to reduce across ranks (rltrace.stats.distributed)
logging       StatsLogger, StatsLoggerConfig, WandBConfig, TensorBoardConfig, Sink, CommitInfo
spans         enable_span_timings, disable_span_timings, span_timings, SpanTimings
              (``timeperf/<span name>`` per step, on once a StatsLogger is created)
Python logs   setup_logging, TraceContextFilter

Example::

    from rltrace import stats

    for mb in micro_batches:
        with stats.scope("actor"):
            stats.denominator(n_tokens=mb.loss_mask)                 # a bool mask per micro-batch
            stats.stat(logprob=mb.logprobs, denominator="n_tokens")  # actor/logprob/avg|min|max
            stats.scalar(lr=1e-5)                                    # actor/lr, actor/lr__count
    with stats.record_timing("update_weights"):                      # timeperf/update_weights
        sync()
    # every rank of the group calls export_all (a collective when a group is given)
    logger.commit(epoch, step, global_step, stats.export_all(reduce_group=dist.group.WORLD))

The module is a drop-in for AReaL's ``areal.utils.stats_tracker``: it has every public name of
AReaL's module, pairs denominators with stats as AReaL does (the n-th stat of a key uses the
n-th mask of its denominator), raises AReaL's exception types, and exports integer
``__count`` values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rltrace.stats.bridge import SpanTimings, disable_span_timings, enable_span_timings, span_timings
from rltrace.stats.logger import StatsLogger, StatsLoggerConfig, TensorBoardConfig
from rltrace.stats.logs import TraceContextFilter, setup_logging
from rltrace.stats.partials import StatsShapeError, StatsTypeError
from rltrace.stats.reduce import ReduceType
from rltrace.stats.sinks import CommitInfo, Sink
from rltrace.stats.tracker import StatsTracker, Trackers, default_tracker, export_all, get, trackers
from rltrace.stats.wandb_sink import WandBConfig

#: AReaL's name for the tracker class (the same class)
DistributedStatsTracker = StatsTracker
if TYPE_CHECKING:
    import threading

    #: the tracker behind the module-level functions (:func:`~.tracker.default_tracker`)
    DEFAULT: StatsTracker
    #: AReaL's name for the default tracker (the same object as ``DEFAULT``)
    DEFAULT_TRACKER: StatsTracker
    #: every tracker by name (AReaL's name; ``""`` is the default tracker)
    TRACKERS: dict[str, StatsTracker]
    #: the lock guarding ``TRACKERS`` (AReaL's name)
    LOCK: threading.Lock
    #: in AReaL's module for compatibility; AReaL 1.0.4 does not use it, nor does rltrace
    MOE_AUX_LOSSES: dict[str, object]


def __getattr__(name: str) -> object:
    """AReaL's module attributes (``DEFAULT``/``DEFAULT_TRACKER``, ``TRACKERS``, ``LOCK``,
    ``MOE_AUX_LOSSES``), read from the runtime's :class:`~.tracker.Trackers`."""
    if name in ("DEFAULT", "DEFAULT_TRACKER"):
        return default_tracker()
    if name == "TRACKERS":
        return trackers().by_name
    if name == "LOCK":
        return trackers().lock
    if name == "MOE_AUX_LOSSES":
        return trackers().moe_aux_losses
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "DEFAULT",
    "DEFAULT_TRACKER",
    "LOCK",
    "MOE_AUX_LOSSES",
    "TRACKERS",
    "CommitInfo",
    "DistributedStatsTracker",
    "ReduceType",
    "Sink",
    "SpanTimings",
    "StatsLogger",
    "StatsLoggerConfig",
    "StatsShapeError",
    "StatsTracker",
    "StatsTypeError",
    "TensorBoardConfig",
    "TraceContextFilter",
    "Trackers",
    "WandBConfig",
    "denominator",
    "disable_scope",
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
    return default_tracker().scope(name)


def scope_func_wrapper(name: str) -> Callable[[F], F]:
    """Decorator: every call of the function records under ``scope(name)``."""
    return default_tracker().scope_func_wrapper(name)


def disable_scope() -> Any:
    """Context manager: keys recorded inside get no prefix from the scopes open outside it."""
    return default_tracker().disable_scope()


def denominator(**masks: object) -> None:
    """Append boolean masks (torch/numpy/jax) by name; the n-th ``stat`` of a key uses the n-th."""
    default_tracker().denominator(**masks)


def stat(denominator: str | None = None, reduce_type: ReduceType | str | None = None,
         **values: object) -> None:
    """Record tensors/arrays over a denominator's mask (default: ``key/avg``, ``/min``, ``/max``)."""
    default_tracker().stat(denominator, reduce_type, **values)


def scalar(**values: object) -> None:
    """Record floats: exported as the mean and ``key__count``."""
    default_tracker().scalar(**values)


def record_timing(name: str) -> Any:
    """Time a block as ``timeperf/<name>`` seconds (context manager and decorator)."""
    return default_tracker().record_timing(name)


def export(key: str | None = None, reduce_group: object = None, reset: bool = True) -> dict[str, float]:
    """Export the default tracker (this process only unless ``reduce_group`` is given; see
    :meth:`StatsTracker.export`)."""
    return default_tracker().export(key=key, reduce_group=reduce_group, reset=reset)


def reset() -> None:
    """Drop everything the default tracker holds."""
    default_tracker().reset()

