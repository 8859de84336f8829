"""Where committed stats go: the :class:`Sink` interface, the console table and metrics.jsonl.

A sink is two methods, ``write(row, info)`` and ``close()``; :class:`~rltrace.stats.StatsLogger`
calls them on rank 0 only and catches every exception (logged once per sink), so a broken sink
never stops training.  Weights & Biases, TensorBoard and OTel metrics live in their own modules.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from rltrace.logdir.files import GuardedDirs, open_for_append

__all__ = ["CommitInfo", "ConsoleSink", "JsonlSink", "Sink"]


@dataclass(frozen=True)
class CommitInfo:
    """What one logged row belongs to: ``commit``'s arguments and the step it is logged at."""

    epoch: int
    epoch_step: int
    global_step: int
    #: the (strictly increasing) step the row is logged at
    step: int


class Sink(Protocol):
    """A destination for committed stats."""

    name: str

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None: ...

    def close(self) -> None: ...


def format_value(v: float) -> str:
    if math.isfinite(v) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.6g}"


class ConsoleSink:
    """Prints each row as a two-column table (with ``rich`` when installed, else plain text)."""

    name = "console"

    def __init__(self, stream: IO[str] | None = None, use_rich: bool | None = None) -> None:
        self.stream = stream
        if use_rich is None:
            try:
                import rich  # noqa: F401

                use_rich = True
            except ImportError:
                use_rich = False
        self.use_rich = use_rich

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None:
        stream = self.stream if self.stream is not None else sys.stdout
        title = (f"epoch {info.epoch} step {info.epoch_step} global_step {info.global_step}"
                 + (f" (logged at {info.step})" if info.step != info.global_step else ""))
        items = [(k, format_value(row[k])) for k in sorted(row)]
        if self.use_rich:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=title, title_justify="left")
            table.add_column("key")
            table.add_column("value", justify="right")
            for k, v in items:
                table.add_row(k, v)
            Console(file=stream, width=max(80, _width(items) + 8)).print(table)
            return
        stream.write(plain_table(title, items))
        stream.flush()

    def close(self) -> None:
        return None


def _width(items: list[tuple[str, str]]) -> int:
    return max((len(k) + len(v) for k, v in items), default=10) + 7


def plain_table(title: str, items: list[tuple[str, str]]) -> str:
    """A plain-text table: a title, then ``| key | value |`` rows between rules."""
    kw = max([len("key"), *(len(k) for k, _ in items)])
    vw = max([len("value"), *(len(v) for _, v in items)])
    rule = f"+-{'-' * kw}-+-{'-' * vw}-+"
    lines = [title, rule, f"| {'key'.ljust(kw)} | {'value'.rjust(vw)} |", rule]
    lines += [f"| {k.ljust(kw)} | {v.rjust(vw)} |" for k, v in items]
    lines.append(rule)
    return "\n".join(lines) + "\n"


class JsonlSink:
    """Appends one JSON line per row to ``path`` (``{log_dir}/metrics.jsonl``).

    Line: ``{"step", "epoch", "epoch_step", "global_step", "time", "metrics": {key: value}}``;
    flushed per commit, so a crash loses no committed row.  NaN/inf are written as null.  The
    file is opened like every log file (:func:`rltrace.logdir.files.open_for_append`): never
    through a link, nor below a base of ``guard`` through another user's folder.
    """

    name = "jsonl"

    def __init__(self, path: str | Path, *, guard: GuardedDirs | None = None) -> None:
        self.path = Path(path)
        self._fh: Any = open_for_append(self.path, guard=guard)

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None:
        line = {
            "step": info.step, "epoch": info.epoch, "epoch_step": info.epoch_step,
            "global_step": info.global_step, "time": time.time(), "metrics": dict(row),
        }
        self._fh.write(orjson.dumps(line) + b"\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
