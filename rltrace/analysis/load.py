"""Finding a log dir's files and streaming them line by line, with a progress bar.

A truncated last line (a crashed writer) or a broken line is skipped and reported; nothing is
kept per line.  What is kept is decided by the readers: :mod:`.sessions` and :mod:`.traces`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

SESSION_GLOB = "sessions-r*.jsonl"
TRACE_GLOB = "traces-r*.jsonl"
_RANK_RE = re.compile(r"-r(\d+)\.jsonl$")
MAX_SKIPPED_MESSAGES = 50
OTHER = "(other)"


class ReportError(ValueError):
    """Nothing to report on, or an invalid option (the message names the fix)."""


@dataclass(frozen=True)
class StepRange:
    """Steps ``start <= step < stop`` (Python slice semantics); both ends optional."""

    start: int | None = None
    stop: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> StepRange:
        """``"A:B"``, ``"A:"``, ``":B"`` or ``"N"`` (just step N); None or ``":"`` is every step."""
        if text is None:
            return cls()
        t = text.strip()
        try:
            if ":" not in t:
                n = int(t)
                return cls(n, n + 1)
            a, b = t.split(":", 1)
            return cls(int(a) if a.strip() else None, int(b) if b.strip() else None)
        except ValueError:
            raise ReportError(f"--steps {text!r}: expected A:B (steps A..B-1), A:, :B or N") from None

    @property
    def everything(self) -> bool:
        return self.start is None and self.stop is None

    def __contains__(self, step: object) -> bool:
        if step is None:
            return self.everything
        s = int(step)  # type: ignore[call-overload]
        return (self.start is None or s >= self.start) and (self.stop is None or s < self.stop)

    def __str__(self) -> str:
        if self.everything:
            return "all"
        return f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"


def file_rank(path: Path, default: int) -> int:
    m = _RANK_RE.search(path.name)
    return int(m.group(1)) if m else default


def find_files(logdir: Path) -> tuple[list[Path], list[Path]]:
    """Session files and trace files under ``logdir`` (recursively), ordered by rank."""
    if not logdir.is_dir():
        raise ReportError(f"rltrace report: {logdir} is not a directory (give a log dir "
                          f"{{fileroot}}/logs/{{user}}/{{experiment}}/{{trial}})")
    key = lambda p: (file_rank(p, 1 << 30), str(p))  # noqa: E731
    sessions = sorted(logdir.rglob(SESSION_GLOB), key=key)
    traces = sorted(logdir.rglob(TRACE_GLOB), key=key)
    if not sessions and not traces:
        raise ReportError(f"rltrace report: no {SESSION_GLOB} or {TRACE_GLOB} files under {logdir}")
    return sessions, traces


class Progress:
    """A byte-count progress bar over every file read (updated in ~1 MB steps)."""

    def __init__(self, total: int, enabled: bool | None, desc: str = "rltrace report") -> None:
        self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False,
                        disable=(None if enabled is None else not enabled))
        self.pending = 0

    def add(self, n: int) -> None:
        self.pending += n
        if self.pending >= 1 << 20:
            self.bar.update(self.pending)
            self.pending = 0

    def close(self) -> None:
        self.bar.update(self.pending)
        self.bar.close()


@dataclass
class Skipped:
    """Lines that could not be read: a count and the first messages."""

    count: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, msg: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_SKIPPED_MESSAGES:
            self.messages.append(msg)


def iter_objects(path: Path, skipped: Skipped, progress: Progress,
                 want: Callable[[bytes], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of a JSONL file; broken lines are skipped into ``skipped``."""
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    add = progress.add
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            add(len(raw))
            if want is not None and not want(raw):
                continue
            try:
                obj = loads(raw)
            except decode_error:
                if not raw.strip():
                    continue
                what = "truncated last line" if not raw.endswith(b"\n") else "invalid JSON line"
                skipped.add(f"{path}:{lineno}: {what}, skipped")
                continue
            if type(obj) is not dict:
                skipped.add(f"{path}:{lineno}: not a JSON object, skipped")
                continue
            yield lineno, obj
