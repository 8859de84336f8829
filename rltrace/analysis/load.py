"""Finding a log dir's files and streaming them line by line, with a progress bar.

A truncated last line (a crashed writer), a broken line or one longer than
:data:`~rltrace.readers.LINE_CAP` (discarded in chunks, never held whole) is skipped and
reported; each record is checked by its kind's check in :mod:`rltrace.readers` before a reader
sees it (:func:`iter_records`): a malformed record is skipped, a malformed field ignored, both
counted in :class:`Skipped`.  What is kept is decided by the readers: :mod:`.sessions` and
:mod:`.traces`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

from rltrace.readers import Oversize, iter_lines
from rltrace.readers import lines as line_reader

SESSION_GLOB = "sessions-r*.jsonl"
TRACE_GLOB = "traces-r*.jsonl"
_RANK_RE = re.compile(r"-r(\d{1,9})\.jsonl$")
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


def file_size(path: Path) -> int:
    """``path``'s size in bytes (0 when it cannot be read: it is then skipped and reported)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


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
    """What could not be read: lines (records) skipped, fields of kept records ignored, and the
    first messages about either."""

    count: int = 0
    fields: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, msg: str) -> None:
        """A line or record skipped."""
        self.count += 1
        if len(self.messages) < MAX_SKIPPED_MESSAGES:
            self.messages.append(msg)

    def add_field(self, msg: str) -> None:
        """A malformed field (or list item) of a kept record, ignored."""
        self.fields += 1
        if len(self.messages) < MAX_SKIPPED_MESSAGES:
            self.messages.append(msg)

    def summary(self) -> str:
        return skip_summary(self.count, self.fields)


def skip_summary(lines: int, fields: int) -> str:
    """``3 unreadable line(s) skipped, 2 malformed field(s) ignored`` (the parts that are not
    zero; "" when both are)."""
    parts = [f"{lines} unreadable line(s) skipped"] if lines else []
    if fields:
        parts.append(f"{fields} malformed field(s) ignored")
    return ", ".join(parts)


def iter_objects(path: Path, skipped: Skipped, progress: Progress,
                 want: Callable[[bytes], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, JSON object) of a JSONL file; broken and over-long lines are skipped into
    ``skipped``."""
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    add = progress.add
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        skipped.add(f"{path}: cannot be read ({exc.strerror or exc}), skipped")
        return
    with fh:
        for lineno, raw in enumerate(iter_lines(fh), 1):
            if isinstance(raw, Oversize):
                add(raw)
                skipped.add(f"{path}:{lineno}: line of {int(raw)} bytes, over the {line_reader.LINE_CAP} "
                            "byte cap, skipped")
                continue
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


#: a record kind's check (:mod:`rltrace.readers`): None when usable, else why not; notes fields dropped
RecordCheck = Callable[[dict[str, Any], Callable[[str], None]], "str | None"]


def iter_records(path: Path, skipped: Skipped, progress: Progress, check: RecordCheck, kind: str,
                 want: Callable[[bytes], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of the records of a JSONL file that pass ``check`` (fixed in place);
    the others are skipped into ``skipped``, and their malformed fields counted there."""
    notes: list[str] = []
    note = notes.append
    for lineno, obj in iter_objects(path, skipped, progress, want):
        why = check(obj, note)
        if why is None and not notes:
            yield lineno, obj
            continue
        if why is not None:
            skipped.add(f"{path}:{lineno}: malformed {kind} ({why}), skipped")
        else:
            for msg in notes:
                skipped.add_field(f"{path}:{lineno}: {kind} field {msg}, ignored")
        notes.clear()
        if why is None:
            yield lineno, obj
