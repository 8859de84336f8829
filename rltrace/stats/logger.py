"""``StatsLogger``: rank 0 commits exported stats to the console, metrics.jsonl, W&B, TensorBoard
and OTel metrics.

``commit(epoch, step, global_step, data)`` follows AReaL's ``StatsLogger``: ``data`` is a dict or
a list of dicts (logged at ``global_step``, ``global_step + 1``, ...), keys ending in
``__count`` are left out, and only rank 0 writes anything.  Logged steps strictly increase: a
commit whose step is not above the last one is skipped with a warning, never an exception.
Every sink failure is caught and logged once per sink.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rltrace import runtime
from rltrace.config import TracerConfig, log_dir, redacted
from rltrace.process.ranks import detect_rank
from rltrace.stats.bridge import enable_span_timings, span_timings
from rltrace.stats.sinks import CommitInfo, ConsoleSink, JsonlSink, Sink
from rltrace.stats.wandb_sink import WandBConfig

__all__ = ["StatsLogger", "StatsLoggerConfig", "TensorBoardConfig", "WandBConfig"]

logger = logging.getLogger("rltrace.stats")

METRICS_FILE = "metrics.jsonl"


@dataclass
class TensorBoardConfig:
    """AReaL's key: ``path`` set turns TensorBoard on (``True`` on the logger: ``{log_dir}/tensorboard``)."""

    path: str | None = None


@dataclass
class StatsLoggerConfig:
    """AReaL's ``StatsLoggerConfig`` keys plus rltrace's sink switches.

    ``experiment_name``/``trial_name``/``fileroot`` default to rltrace's configuration (then
    ``default``/``trial0``/``./rltrace-logs``); the log dir is
    ``{fileroot}/logs/{user}/{experiment_name}/{trial_name}``.
    """

    experiment_name: str | None = None
    trial_name: str | None = None
    fileroot: str | None = None
    wandb: WandBConfig = field(default_factory=WandBConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    #: print a table per commit
    console: bool = True
    #: append rows to ``{log_dir}/metrics.jsonl``
    jsonl: bool = True
    #: record rows as OTel gauges/histograms through the pipeline's MeterProvider
    otel: bool = True


_IGNORED_KEYS = frozenset({"swanlab"})  # AReaL keys for backends rltrace does not ship


def _as_dict(obj: object) -> dict[str, Any]:
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_container"):
        return dict(obj.to_container(resolve=True))
    raise TypeError(f"StatsLogger: config must be a StatsLoggerConfig, a dataclass or a mapping, "
                    f"got {type(obj).__name__}")


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - _IGNORED_KEYS)
    if unknown:
        raise TypeError(f"StatsLogger: unknown {where} key(s) {', '.join(map(repr, unknown))}; "
                        f"known: {', '.join(sorted(names))}")
    return cls(**{k: v for k, v in data.items() if k in names})


def load_config(config: object) -> StatsLoggerConfig:
    """A :class:`StatsLoggerConfig` from one, a mapping, or any dataclass with its keys (AReaL's)."""
    if isinstance(config, StatsLoggerConfig):
        return dataclasses.replace(config)
    data = _as_dict(config)
    for key, cls in (("wandb", WandBConfig), ("tensorboard", TensorBoardConfig)):
        if key in data and not isinstance(data[key], cls):
            data[key] = _build(cls, _as_dict(data[key]), key)
    built: StatsLoggerConfig = _build(StatsLoggerConfig, data, "stats logger config")
    return built


def _wandb_arg(value: object) -> WandBConfig:
    if isinstance(value, WandBConfig):
        return value
    if value is True:
        return WandBConfig(mode=os.environ.get("WANDB_MODE") or "online")
    if value is False:
        return WandBConfig(mode="disabled")
    if isinstance(value, str):
        return WandBConfig(mode=value)
    built: WandBConfig = _build(WandBConfig, _as_dict(value), "wandb")
    return built


def _tensorboard_arg(value: object, logdir: Path) -> TensorBoardConfig:
    if isinstance(value, TensorBoardConfig):
        return value
    if value is True:
        return TensorBoardConfig(path=str(logdir / "tensorboard"))
    if value is False:
        return TensorBoardConfig(path=None)
    if isinstance(value, (str, os.PathLike)):
        return TensorBoardConfig(path=os.fspath(value))
    built: TensorBoardConfig = _build(TensorBoardConfig, _as_dict(value), "tensorboard")
    return built


def _number(value: Any) -> float | None:
    if isinstance(value, numbers.Real):
        return float(value)
    try:
        size = getattr(value, "size", None)
        numel = value.numel() if hasattr(value, "numel") else size
        if numel == 1:
            return float(value.item() if hasattr(value, "item") else value)
    except Exception:
        return None
    return None


class StatsLogger:
    """Rank 0's writer of committed stats (see the module docstring).

    Sinks are chosen by ``config`` (a :class:`StatsLoggerConfig`, AReaL's dataclass or a
    mapping) and the keyword arguments, which win: ``console``, ``jsonl``, ``otel`` (bools),
    ``wandb`` (a :class:`WandBConfig`, a dict, a mode string such as ``"offline"``, or a bool),
    ``tensorboard`` (a path, a dict, or ``True`` for ``{log_dir}/tensorboard``), and
    ``sinks`` (extra objects with ``write(row, info)``/``close()``).  ``exp_config`` is the full
    experiment config stored in the W&B run.  ``rank`` defaults to rltrace's, torch.distributed's
    or JAX's; on other ranks the logger creates nothing and ``commit`` returns at once.
    """

    def __init__(
        self,
        config: object = None,
        *,
        exp_config: object = None,
        log_dir: str | os.PathLike[str] | None = None,
        rank: int | None = None,
        console: bool | None = None,
        jsonl: bool | None = None,
        otel: bool | None = None,
        wandb: object = None,
        tensorboard: object = None,
        sinks: Sequence[Sink] = (),
        stream: IO[str] | None = None,
    ) -> None:
        self.config = cfg = load_config(config)
        tracer = runtime.get_config()
        p = runtime.get_pipeline()
        self.experiment_name = cfg.experiment_name or (tracer.experiment_name if tracer else "default")
        self.trial_name = cfg.trial_name or (tracer.trial_name if tracer else "trial0")
        self.log_dir = Path(log_dir) if log_dir is not None else self._log_dir(cfg, tracer, p)
        if rank is None:
            rank = p.rank if p is not None else detect_rank()[0]
        self.rank = rank
        if span_timings() is None:  # timings from spans feed the commits from now on
            enable_span_timings()
        self._last_step: int | None = None
        self._warned: set[str] = set()
        self.sinks: list[Sink] = []
        if rank != 0:
            return
        self._apply_arguments(console=console, jsonl=jsonl, otel=otel, wandb=wandb, tensorboard=tensorboard)
        self._open_sinks(exp_config, stream)
        self.sinks.extend(sinks)

    def _apply_arguments(self, *, console: bool | None, jsonl: bool | None, otel: bool | None,
                         wandb: object, tensorboard: object) -> None:
        """Let the keyword arguments given (not None) override the config's sink switches."""
        cfg = self.config
        if console is not None:
            cfg.console = console
        if jsonl is not None:
            cfg.jsonl = jsonl
        if otel is not None:
            cfg.otel = otel
        if wandb is not None:
            cfg.wandb = _wandb_arg(wandb)
        if tensorboard is not None:
            cfg.tensorboard = _tensorboard_arg(tensorboard, self.log_dir)

    def _open_sinks(self, exp_config: object, stream: IO[str] | None) -> None:
        """Start the sinks the config turns on, in order: console, jsonl, W&B, TensorBoard, OTel."""
        cfg = self.config
        if cfg.console:
            self._open("console", lambda: ConsoleSink(stream))
        if cfg.jsonl:
            self._open("jsonl", lambda: JsonlSink(self.log_dir / METRICS_FILE,
                                                  guard=runtime.RUNTIME.guarded))
        if cfg.wandb.mode and cfg.wandb.mode != "disabled":
            self._open("wandb", lambda: self._wandb(exp_config))
        if cfg.tensorboard.path:
            self._open("tensorboard", self._tensorboard)
        if cfg.otel:
            from rltrace.stats.otel_sink import OTelMetricsSink

            self._open("otel", OTelMetricsSink)

    @staticmethod
    def _log_dir(cfg: StatsLoggerConfig, tracer: TracerConfig | None, p: Any) -> Path:
        if p is not None and not (cfg.experiment_name or cfg.trial_name or cfg.fileroot):
            return Path(p.log_dir)
        base = tracer or TracerConfig()
        return log_dir(dataclasses.replace(
            base,
            experiment_name=cfg.experiment_name or base.experiment_name,
            trial_name=cfg.trial_name or base.trial_name,
            fileroot=cfg.fileroot or base.fileroot,
        ))

    def _wandb(self, exp_config: object) -> Sink:
        from rltrace.stats.wandb_sink import WandBSink

        tracer = runtime.get_config()
        return WandBSink(self.config.wandb, experiment_name=self.experiment_name,
                         trial_name=self.trial_name, log_dir=self.log_dir, exp_config=exp_config,
                         tracer_config=redacted(tracer) if tracer is not None else None,
                         guard=runtime.RUNTIME.guarded)

    def _tensorboard(self) -> Sink:
        from rltrace.stats.tensorboard_sink import TensorBoardSink

        return TensorBoardSink(self.config.tensorboard.path,  # type: ignore[arg-type]
                               guard=runtime.RUNTIME.guarded)

    def _open(self, name: str, factory: Any) -> None:
        try:
            self.sinks.append(factory())
        except Exception as exc:
            logger.warning("rltrace.stats: the %s sink could not start and is off for this run: %r",
                           name, exc, exc_info=exc)

    def _once(self, key: str, msg: str, *args: object, exc: BaseException | None = None) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args, exc_info=exc)

    @staticmethod
    def get_log_path(config: object = None) -> Path:
        """The log dir a logger with ``config`` writes to (AReaL's ``get_log_path``)."""
        return StatsLogger._log_dir(load_config(config), runtime.get_config(), runtime.get_pipeline())

    # -- commit ---------------------------------------------------------------------------------
    def commit(self, epoch: int, step: int, global_step: int,
               data: Mapping[str, object] | Sequence[Mapping[str, object]]) -> None:
        """Write ``data`` (dict, or list of dicts at consecutive steps) from ``global_step`` on.

        Rank 0 only.  A ``global_step`` not above the last logged step is skipped with a
        warning; values that are not numbers (or one-element tensors) are left out.
        """
        if self.rank != 0:
            return
        if isinstance(global_step, bool) or not isinstance(global_step, numbers.Integral):
            raise TypeError(f"StatsLogger.commit: global_step must be an int, got {global_step!r}")
        global_step = int(global_step)
        items = [data] if isinstance(data, Mapping) else list(data)
        if not items:
            return
        last = self._last_step
        if last is not None and global_step <= last:
            logger.warning(
                "rltrace.stats: commit at global_step %d skipped: steps must increase and %d was "
                "already logged", global_step, last)
            return
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TypeError(f"StatsLogger.commit: data must be a dict or a list of dicts, got a "
                                f"list holding {type(item).__name__}")
            info = CommitInfo(int(epoch), int(step), global_step, global_step + i)
            self._write(self._row(item), info)
        self._last_step = global_step + len(items) - 1

    def _row(self, item: Mapping[str, object]) -> dict[str, float]:
        row: dict[str, float] = {}
        for key, value in item.items():
            key = str(key)
            if key.endswith("__count"):
                continue
            v = _number(value)
            if v is None:
                self._once(f"value:{key}", "rltrace.stats: %r is not a number (%s); not logged", key,
                           type(value).__name__)
                continue
            if not math.isfinite(v):
                self._once(f"finite:{key}", "rltrace.stats: %r is %s", key, v)
            row[key] = v
        return row

    def _write(self, row: dict[str, float], info: CommitInfo) -> None:
        for sink in self.sinks:
            try:
                sink.write(row, info)
            except Exception as exc:
                self._once(f"sink:{getattr(sink, 'name', sink)}",
                           "rltrace.stats: the %s sink failed (training continues; further "
                           "failures are not logged): %r", getattr(sink, "name", sink), exc, exc=exc)

    @property
    def last_step(self) -> int | None:
        """The last step a row was logged at (None before the first commit)."""
        return self._last_step

    def close(self) -> None:
        """Close every sink (finishes the W&B run, closes event and JSONL files)."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as exc:
                self._once(f"close:{getattr(sink, 'name', sink)}",
                           "rltrace.stats: closing the %s sink failed: %r",
                           getattr(sink, "name", sink), exc, exc=exc)

    def __enter__(self) -> StatsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
