"""TensorBoard sink: ``add_scalar(key, value, step)`` per committed key into event files.

The writer is ``torch.utils.tensorboard.SummaryWriter`` when torch is installed, else
``tensorboardX.SummaryWriter``, else TensorBoard's own framework-free ``tensorboard.summary.Writer``.
Events are flushed per commit, so TensorBoard shows a running job's rows.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rltrace.logdir.files import GuardedDirs, make_folders
from rltrace.stats.sinks import CommitInfo

__all__ = ["TensorBoardSink", "open_writer"]


def open_writer(path: str | Path) -> Any:
    """A summary writer with ``add_scalar``, ``flush`` and ``close`` writing under ``path``."""
    path = str(path)
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        try:
            from torch.utils.tensorboard import SummaryWriter

            return SummaryWriter(log_dir=path)
        except ImportError:  # torch without the tensorboard package it needs
            pass
    if importlib.util.find_spec("tensorboardX") is not None:
        from tensorboardX import SummaryWriter as XWriter

        return XWriter(logdir=path)
    from tensorboard.summary import Writer  # raises ImportError: install tensorboard

    return Writer(path)


class TensorBoardSink:
    """Writes each row's values as TensorBoard scalars at the row's step."""

    name = "tensorboard"

    def __init__(self, path: str | Path, *, guard: GuardedDirs | None = None) -> None:
        self.path = Path(path)
        make_folders(self.path, guard=guard)  # never another user's folder or link
        self.writer = open_writer(self.path)

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None:
        add = self.writer.add_scalar
        for key, value in row.items():
            add(key, value, info.step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
