"""``rltrace convert``: merge per-rank Chrome-trace JSONL files into one file Perfetto opens.

Streams line by line (memory stays flat however many events), validates each line, renumbers
processes so ranks from different hosts never collide (processes keep their
``process_sort_index`` = rank, so Perfetto lists them by rank), and tolerates a truncated last
line (a crashed writer), which it reports and skips.
"""

from __future__ import annotations

import glob
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

logger = logging.getLogger("rltrace")

TRACE_GLOB = "traces-r*.jsonl"
#: torch.profiler traces written by rltrace.profile_steps
PROFILER_GLOB = "torch_profiler/*.json"
_SESSION_RE = re.compile(r"sessions-r\d+\.jsonl$")
_RANK_RE = re.compile(r"traces-r(\d+)")
_PID_RE = re.compile(rb'^\{"pid":(-?\d+),')


class ConvertError(ValueError):
    """The inputs name no trace file, or the output cannot be written."""


@dataclass
class ConvertResult:
    """What a conversion did: files read, events written, lines skipped and why."""

    output: Path
    files: list[Path] = field(default_factory=list)
    events: int = 0
    processes: int = 0
    skipped: list[str] = field(default_factory=list)


def _rank_key(path: Path) -> tuple[int, str]:
    m = _RANK_RE.search(path.name)
    return (int(m.group(1)) if m else 1 << 30, str(path))


def find_trace_files(inputs: Iterable[str | Path]) -> list[Path]:
    """Expand files, globs and log dirs into trace files, ordered by rank.

    Directories are searched recursively for ``traces-r*.jsonl``; session files
    (``sessions-r*.jsonl``) named explicitly are skipped with a warning.
    """
    found: dict[Path, None] = {}
    for inp in inputs:
        text = str(inp)
        p = Path(text).expanduser()
        if p.is_dir():
            candidates = sorted(p.rglob(TRACE_GLOB)) + sorted(p.rglob(PROFILER_GLOB))
        elif p.is_file():
            candidates = [p]
        elif any(ch in text for ch in "*?["):
            candidates = [Path(x) for x in sorted(glob.glob(text, recursive=True))]
            candidates = [c for c in candidates if c.is_file() or c.is_dir()]
            expanded: list[Path] = []
            for c in candidates:
                expanded.extend(sorted(c.rglob(TRACE_GLOB)) + sorted(c.rglob(PROFILER_GLOB))
                                if c.is_dir() else [c])
            candidates = expanded
        else:
            raise ConvertError(f"rltrace convert: input {text!r} does not exist")
        for c in candidates:
            if _SESSION_RE.search(c.name):
                logger.warning("rltrace convert: skipping session file %s (not a trace file)", c)
                continue
            found[c.resolve()] = None
    files = sorted(found, key=_rank_key)
    if not files:
        raise ConvertError(
            f"rltrace convert: no trace files ({TRACE_GLOB}) found in {', '.join(map(str, inputs))}"
        )
    return files


class _Writer:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.first = True
        self.count = 0

    def write(self, line: bytes) -> None:
        self.fh.write(b"\n" if self.first else b",\n")
        self.fh.write(line)
        self.first = False
        self.count += 1


def _onto_epoch(event: dict[str, Any], base_ns: int) -> None:
    """Shift a Kineto event (``ts``/``dur`` in µs since ``base_ns``) onto the epoch, in whole µs.

    Epoch microseconds as doubles keep only quarter-µs steps, so adding the base in floating
    point moved starts and ends independently and a child could end past its parent (Perfetto
    then drops it: ``slice_drop_overlapping_complete_event``).  Both ends are computed in
    integer ns and floored to the µs: a monotone rounding, so nesting is preserved exactly.
    """
    start_ns = base_ns + round(event["ts"] * 1000)
    event["ts"] = start_ns // 1000
    dur = event.get("dur")
    if isinstance(dur, (int, float)):
        event["dur"] = (start_ns + round(dur * 1000)) // 1000 - event["ts"]


def _events_of_json(path: Path) -> Iterator[dict[str, Any]]:
    """Events of a whole-file JSON trace, on rltrace's epoch-microsecond clock.

    A ``torch.profiler`` (Kineto) trace carries ``baseTimeNanoseconds``: its ``ts`` are
    microseconds since that epoch instant, so they are shifted onto the epoch, and its
    processes are named after the rank in the file name (``[role-]{scope}-step{n}-r{rank}.json``).
    """
    doc = orjson.loads(path.read_bytes())
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ConvertError(f"rltrace convert: {path} holds no traceEvents list")
    base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    shift = isinstance(base, (int, float))
    m = re.search(r"-r(\d+)(?:-|$)", path.stem)  # ``[role-]step{n}-r{rank}[-...]``
    label = f"[Rank {m.group(1)}, torch.profiler]" if m and shift else None
    pids: set[Any] = set()
    for e in events:
        if not isinstance(e, dict):
            continue
        if shift and isinstance(e.get("ts"), (int, float)):
            _onto_epoch(e, int(base))  # type: ignore[arg-type]
        if label is not None and e.get("ph") == "M" and e.get("name") == "process_name":
            e["args"] = {"name": label}
            pids.add(e.get("pid"))
        yield e
    if label is not None:
        for e in events:
            pid = e.get("pid") if isinstance(e, dict) else None
            if isinstance(pid, int) and pid not in pids:
                pids.add(pid)
                yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": label}}


def convert(
    inputs: Iterable[str | Path], output: str | Path, *, progress: bool | None = None
) -> ConvertResult:
    """Merge the trace files found in ``inputs`` into ``output`` (``{"traceEvents": [...]}``).

    ``.json`` inputs (an already merged file, or a ``torch.profiler`` export) are read whole
    and their events appended; ``.jsonl`` inputs are streamed.  ``progress`` shows a progress
    bar (default: only when stderr is a terminal).
    """
    from tqdm import tqdm

    files = find_trace_files(inputs)
    out = Path(output)
    result = ConvertResult(output=out, files=files)
    pids: dict[tuple[int, int], int] = {}

    def new_pid(file_index: int, pid: int) -> int:
        key = (file_index, pid)
        if key not in pids:
            pids[key] = len(pids) + 1
        return pids[key]

    total = sum(f.stat().st_size for f in files)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fh = open(out, "wb")  # noqa: SIM115 - closed in finally
    except OSError as exc:
        raise ConvertError(f"rltrace convert: cannot write {out}: {exc}") from None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="rltrace convert",
               disable=(None if progress is None else not progress), leave=False)
    try:
        fh.write(b'{"traceEvents":[')
        w = _Writer(fh)
        for i, path in enumerate(files):
            if path.suffix == ".json":
                for ev in _events_of_json(path):
                    if "pid" in ev and isinstance(ev["pid"], int):
                        ev["pid"] = new_pid(i, ev["pid"])
                    w.write(orjson.dumps(ev))
                bar.update(path.stat().st_size)
                continue
            with open(path, "rb") as src:
                for lineno, raw in enumerate(src, 1):
                    bar.update(len(raw))
                    line = raw.strip()
                    if not line:
                        continue
                    try:
                        ev = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        what = "truncated last line" if not raw.endswith(b"\n") else "invalid JSON"
                        result.skipped.append(f"{path}:{lineno}: {what}, skipped")
                        continue
                    if not isinstance(ev, dict):
                        result.skipped.append(f"{path}:{lineno}: not a JSON object, skipped")
                        continue
                    m = _PID_RE.match(line)
                    if m is not None:  # our own layout: rewrite the pid, keep the bytes
                        line = b'{"pid":%d,' % new_pid(i, int(m.group(1))) + line[m.end():]
                    elif isinstance(ev.get("pid"), int):
                        ev["pid"] = new_pid(i, ev["pid"])
                        line = orjson.dumps(ev)
                    w.write(line)
        fh.write(b'\n],"displayTimeUnit":"ms"}\n')
    finally:
        bar.close()
        fh.close()
    result.events = w.count
    result.processes = len(pids)
    for msg in result.skipped:
        logger.warning("rltrace convert: %s", msg)
    return result
