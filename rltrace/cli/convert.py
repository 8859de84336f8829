"""``rltrace convert``: merge per-rank Chrome-trace JSONL files into one file Perfetto opens.

Streams line by line (memory stays flat however many events, and however long a line: one over
:data:`~rltrace.readers.LINE_CAP` is discarded in chunks), checks each event
(:func:`rltrace.readers.check_trace_event`: an event that cannot be placed on the timeline is
skipped, a malformed optional field removed, both counted), renumbers processes so ranks from
different hosts never collide (processes keep their ``process_sort_index`` = rank, so Perfetto
lists them by rank), and tolerates a truncated last line (a crashed writer), which it reports
and skips.  Valid lines are copied byte for byte (only the pid is rewritten).
"""

from __future__ import annotations

import glob
import io
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

import orjson

from rltrace.logdir.files import open_fresh
from rltrace.readers import Oversize, check_trace_event, iter_lines
from rltrace.readers import lines as line_reader
from rltrace.readers.fields import MAX_SECONDS, is_number
from rltrace.readers.trace_event import plain_ids
from rltrace.timeline.arrows import Window, line_ts_ns

if TYPE_CHECKING:
    from rltrace.timeline.arrows import Plan
    from rltrace.timeline.chrome_tracks import ChromeTracks


class _Progress(Protocol):
    """The progress bar a conversion advances (tqdm's), by bytes read."""

    def update(self, n: float | None = 1) -> bool | None: ...

logger = logging.getLogger("rltrace")

TRACE_GLOB = "traces-r*.jsonl"
#: torch.profiler traces written by rltrace.profile_steps
PROFILER_GLOB = "torch_profiler/*.json"
_SESSION_RE = re.compile(r"sessions-r\d+\.jsonl$")
_RANK_RE = re.compile(r"traces-r(\d+)")
_PROFILER_RANK_RE = re.compile(r"-r(\d+)(?:-|$)")
_HEAD_RE = re.compile(rb'^\{"pid":(-?\d+),"tid":(-?\d+),')
#: messages kept about what was skipped (the counts are exact)
MAX_MESSAGES = 50
FORMATS = ("json", "perfetto")
#: output suffixes that choose Perfetto's native format
NATIVE_SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto")


class ConvertError(ValueError):
    """The inputs name no trace file, or the output cannot be written."""


@dataclass
class Part:
    """One output file: its path, the time range and steps it holds, its events."""

    path: Path
    window: Window
    events: int


@dataclass
class ConvertResult:
    """What a conversion did: files read, events written, lines (events) skipped, malformed fields
    removed, and the first ``MAX_MESSAGES`` messages saying where and why."""

    output: Path
    files: list[Path] = field(default_factory=list)
    events: int = 0
    processes: int = 0
    skipped: list[str] = field(default_factory=list)
    skipped_lines: int = 0
    skipped_fields: int = 0
    #: sessions drawn on their own tracks (native format), arrows to the train steps that
    #: consumed them
    sessions: int = 0
    flows: int = 0
    #: the files written: one, or (past ``max_events``) one per range of steps
    parts: list[Part] = field(default_factory=list)

    def skip_line(self, msg: str) -> None:
        self.skipped_lines += 1
        if len(self.skipped) < MAX_MESSAGES:
            self.skipped.append(msg)

    def skip_field(self, msg: str) -> None:
        self.skipped_fields += 1
        if len(self.skipped) < MAX_MESSAGES:
            self.skipped.append(msg)

    def summary(self) -> str:
        """``, 3 line(s) skipped, 1 malformed field(s) removed`` ("" when nothing was)."""
        out = f", {self.skipped_lines} line(s) skipped" if self.skipped_lines else ""
        return out + (f", {self.skipped_fields} malformed field(s) removed" if self.skipped_fields else "")


def _rank_key(path: Path) -> tuple[int, str]:
    m = _RANK_RE.search(path.name)
    return (int(m.group(1)) if m else 1 << 30, str(path))


def find_trace_files(inputs: Iterable[str | Path]) -> list[Path]:
    """Expand files, globs and log dirs into trace files, ordered by rank.

    Directories are searched recursively for ``traces-r*.jsonl``; session files
    (``sessions-r*.jsonl``) named explicitly are skipped with a warning; a rank's native trace
    (``traces-r*.pftrace``, ``exporters.native``) stands for the JSONL beside it, whose lines it
    was drawn from.
    """
    found: dict[Path, None] = {}
    for inp in inputs:
        text = str(inp)
        p = Path(text).expanduser()
        if p.is_dir():
            candidates = sorted(p.rglob(TRACE_GLOB)) + sorted(p.rglob(PROFILER_GLOB))
        elif p.is_file():
            if p.suffix.lower() not in NATIVE_SUFFIXES:  # a native trace stands for its JSONL twin
                _check_trace_like(p)
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
            if c.suffix.lower() in NATIVE_SUFFIXES:  # a rank's native trace (exporters.native)
                twin = c.with_suffix(".jsonl")
                if not twin.is_file():
                    raise ConvertError(f"rltrace convert: {c} is a native trace, and the JSONL it "
                                       f"was drawn from ({twin.name}) is not beside it: convert "
                                       "merges the per-rank JSONL files (pass the log dir)")
                c = twin  # the same events: the merge (and its arrows across ranks) reads these
            found[c.resolve()] = None
    files = sorted(found, key=_rank_key)
    if not files:
        raise ConvertError(
            f"rltrace convert: no trace files ({TRACE_GLOB}) found in {', '.join(map(str, inputs))}"
        )
    return files


def _check_trace_like(path: Path) -> None:
    """Refuse a file named as an input that is not a trace: its first bytes (after blanks) must
    open a JSON object or array, as Chrome JSON and JSONL traces do (an empty file is a rank
    that recorded nothing).  Raises :class:`ConvertError` naming the file and what to give."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip()
    except OSError as exc:
        raise ConvertError(f"rltrace convert: cannot read {path}: {exc.strerror or exc}") from None
    if head and head[:1] not in (b"{", b"["):
        raise ConvertError(f"rltrace convert: {path} is not a trace file (Chrome JSON or rltrace's "
                           f"traces-r*.jsonl); give a run's log dir or its trace files")


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


def _load_json(path: Path, result: ConvertResult) -> tuple[list[Any], int | None] | None:
    """A whole-file JSON trace's events and ``baseTimeNanoseconds`` (None: the file is skipped)."""
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        result.skip_line(f"{path}: not a readable JSON trace ({exc}), skipped")
        return None
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        result.skip_line(f"{path}: holds no traceEvents list, skipped")
        return None
    base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    return events, (int(base) if is_number(base) and abs(base) <= MAX_SECONDS * 1e9 else None)


def profiler_rank(path: Path) -> int | None:
    """The rank in a ``torch.profiler`` trace's name (``[role-]step{n}-r{rank}[-...].json``)."""
    m = _PROFILER_RANK_RE.search(path.stem)
    return int(m.group(1)) if m else None


def _events_of_json(path: Path, merge: _Merge) -> Iterator[dict[str, Any]]:
    """Checked events of a whole-file JSON trace, on rltrace's epoch-microsecond clock.

    A ``torch.profiler`` (Kineto) trace carries ``baseTimeNanoseconds``: its ``ts`` are
    microseconds since that epoch instant, so they are shifted onto the epoch, and its
    processes are named after the rank in the file name (``[role-]{scope}-step{n}-r{rank}.json``).
    """
    loaded = _load_json(path, merge.result)
    if loaded is None:
        return
    events, base = loaded
    rank = profiler_rank(path)
    label = f"[Rank {rank}, torch.profiler]" if rank is not None and base is not None else None
    pids: set[object] = set()
    for i, e in enumerate(events):
        if merge.check(e, f"{path}: event {i}", text_pid=True) is None:
            continue
        if base is not None and e.get("ts") is not None:
            _onto_epoch(e, base)
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


class _Merge:
    """One conversion: the writer, the pid map (per input file) and the result's counts."""

    def __init__(self, fh: BinaryIO, result: ConvertResult, bar: _Progress, window: Window) -> None:
        self.writer = _Writer(fh)
        #: the time range written (:class:`rltrace.timeline.arrows.Window`): a slice goes to the
        #: file of its start; metadata to every file
        self.window = window
        self.result = result
        self.bar = bar
        self.pids: dict[tuple[int, int], int] = {}
        self._notes: list[str] = []
        #: the named task/session tracks and arrows added to the JSON (None: lines as they are)
        self.tracks: ChromeTracks | None = None

    def new_pid(self, file_index: int, pid: int) -> int:
        key = (file_index, pid)
        if key not in self.pids:
            self.pids[key] = len(self.pids) + 1
        return self.pids[key]

    def check(self, ev: object, where: str, text_pid: bool = False) -> bool | None:
        """Check one event (:func:`check_trace_event`): None when it is skipped, else whether a
        malformed field was removed from it (it must then be written anew)."""
        if not isinstance(ev, dict):
            self.result.skip_line(f"{where}: not a JSON object, skipped")
            return None
        notes = self._notes
        why = check_trace_event(ev, notes.append, None, text_pid)
        if why is None:
            plain_ids(ev, notes.append)  # ids that key tracks and arrows: hashable values
        if why is not None:
            self.result.skip_line(f"{where}: malformed trace event ({why}), skipped")
        for msg in notes if why is None else ():
            self.result.skip_field(f"{where}: trace event field {msg}, removed")
        changed = bool(notes)
        notes.clear()
        return None if why is not None else changed

    def in_window(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The events that start in this file's time range (and all metadata)."""
        for ev in events:
            ts = ev.get("ts")
            if self.window.whole or not is_number(ts) or self.window.holds(round(ts * 1000)):
                yield ev

    def json_file(self, fi: int, path: Path) -> None:
        """Append the events of a whole-file JSON trace, re-encoded."""
        for ev in self.in_window(_events_of_json(path, self)):
            if isinstance(ev.get("pid"), int):
                ev["pid"] = self.new_pid(fi, ev["pid"])
            line = _encode(ev)
            if line is None:
                self.result.skip_line(f"{path}: an event nested too deeply to write, skipped")
            else:
                self.writer.write(line)
        self.bar.update(_size(path))

    def lines(self, path: Path) -> Iterator[tuple[int, bytes]]:
        """(line number, bytes) of a JSONL trace file's lines within the cap (the others, and a
        file that cannot be read, are reported and skipped)."""
        try:
            src = open(path, "rb")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            self.result.skip_line(f"{path}: cannot be read ({exc.strerror or exc}), skipped")
            return
        whole, holds = self.window.whole, self.window.holds
        with src:
            for lineno, raw in enumerate(iter_lines(src), 1):
                if isinstance(raw, Oversize):
                    self.bar.update(raw)
                    self.result.skip_line(f"{path}:{lineno}: line of {int(raw)} bytes, over the "
                                          f"{line_reader.LINE_CAP} byte cap, skipped")
                    continue
                self.bar.update(len(raw))
                if not whole:
                    ns = line_ts_ns(raw)
                    if ns is not None and not holds(ns):
                        continue
                yield lineno, raw

    def jsonl_file(self, fi: int, path: Path) -> None:
        """Append the events of a JSONL trace file, line by line."""
        for lineno, raw in self.lines(path):
            self.line(fi, path, lineno, raw)

    def parse(self, path: Path, lineno: int, raw: bytes) -> tuple[dict[str, Any], bool] | None:
        """One line's checked event and whether a malformed field was removed from it (None: the
        line is skipped, and counted)."""
        line = raw.strip()
        if not line:
            return None
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError:
            what = "truncated last line" if not raw.endswith(b"\n") else "invalid JSON"
            self.result.skip_line(f"{path}:{lineno}: {what}, skipped")
            return None
        changed = self.check(ev, f"{path}:{lineno}")
        return None if changed is None else (ev, changed)

    def events(self, path: Path) -> Iterator[dict[str, Any]]:
        """The checked events of a JSONL trace file."""
        for lineno, raw in self.lines(path):
            parsed = self.parse(path, lineno, raw)
            if parsed is not None:
                yield parsed[0]

    def line(self, fi: int, path: Path, lineno: int, raw: bytes) -> None:
        """Append one line's event: its bytes with the pid (and tid, when it moves to a task's or
        session's track) rewritten, or re-encoded if it changed; then the lines that go with it
        (:mod:`rltrace.timeline.chrome_tracks`)."""
        parsed = self.parse(path, lineno, raw)
        if parsed is None:
            return
        ev, changed = parsed
        line = raw.strip()
        pid = ev.get("pid")
        new_pid = self.new_pid(fi, pid) if isinstance(pid, int) else None
        extra: list[bytes] = []
        tid = None
        if self.tracks is not None and new_pid is not None:
            tid = self.tracks.place(fi, new_pid, ev, extra)
        m = _HEAD_RE.match(line)
        if m is not None and not changed and new_pid is not None and int(m.group(1)) == pid \
                and int(m.group(2)) == ev.get("tid"):  # our own layout: keep the bytes
            line = b'{"pid":%d,"tid":%d,' % (new_pid, ev["tid"] if tid is None else tid) + line[m.end():]
        elif changed or new_pid is not None:
            if new_pid is not None:
                ev["pid"] = new_pid
            if tid is not None:
                ev["tid"] = tid
            encoded = _encode(ev)
            if encoded is None:
                self.result.skip_line(f"{path}:{lineno}: nested too deeply to write, skipped")
            line = encoded or b""
        if line:
            self.writer.write(line)
        for x in extra:
            self.writer.write(x)


def _encode(ev: dict[str, Any]) -> bytes | None:
    """``ev`` as JSON, or None when it cannot be written (orjson's depth limit is below the one
    it reads with: a damaged line nested ~300 deep parses, but does not encode)."""
    try:
        return orjson.dumps(ev)
    except TypeError:
        return None


def _jsonl(files: list[Path]) -> list[tuple[int, Path]]:
    """(index, path) of the streamed (JSONL) files among ``files``."""
    return [(i, p) for i, p in enumerate(files) if p.suffix != ".json"]


def _need_perfetto() -> None:
    try:
        import perfetto.protos.perfetto.trace.perfetto_trace_pb2  # noqa: F401
    except ImportError:
        raise ConvertError("rltrace convert: the native Perfetto format needs the perfetto package: "
                           "pip install 'rltrace[perfetto]' (the README's install, '.[dev]', has it), "
                           "or write JSON (-o trace.json)") from None


def _write_native(files: list[Path], merge: _Merge, fh: BinaryIO, result: ConvertResult, plan: Plan) -> None:
    """The native trace: the arrows that cross files planned (a first pass over the task,
    session and step lines), then each file's events onto the trace's tracks
    (:mod:`rltrace.timeline.native`)."""
    from rltrace.timeline.native import NativeTrace
    from rltrace.timeline.packets import PacketWriter

    out = PacketWriter(fh)
    trace = NativeTrace(out, plan, result, merge.window)
    for i, path in enumerate(files):
        if path.suffix == ".json":
            events = sorted(merge.in_window(_events_of_json(path, merge)), key=lambda e: e.get("ph") != "M")
            trace.file(i, events, onto_rank=profiler_rank(path))
            merge.bar.update(_size(path))
        else:
            m = _RANK_RE.search(path.name)
            trace.file(i, merge.events(path), rank_hint=int(m.group(1)) if m else None)
    out.flush()
    result.events += out.events
    result.processes = max(result.processes, trace.processes)
    result.sessions += trace.sessions
    result.flows += trace.flows


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def output_format(output: str | Path, fmt: str | None = None) -> str:
    """``"perfetto"`` (native protobuf) or ``"json"``: ``fmt`` if given, else by the suffix."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ConvertError(f"rltrace convert: unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
        return fmt
    return "perfetto" if Path(output).suffix.lower() in NATIVE_SUFFIXES else "json"


def convert(
    inputs: Iterable[str | Path], output: str | Path, *, progress: bool | None = None,
    fmt: str | None = None, max_events: int | None = None,
) -> ConvertResult:
    """Merge the trace files found in ``inputs`` into ``output``.

    The format is ``fmt`` (``"json"`` or ``"perfetto"``), else chosen by the output's suffix
    (``.pftrace``: Perfetto's native protobuf, see :mod:`rltrace.timeline.native`; anything else:
    ``{"traceEvents": [...]}``).  ``.json`` inputs (an already merged file, or a
    ``torch.profiler`` export) are read whole; ``.jsonl`` inputs are streamed.  ``progress``
    shows a progress bar (default: only when stderr is a terminal).

    ``max_events``: a run of more events is written as several files, each of whole steps
    (``<name>.steps-A-B<suffix>``; :func:`rltrace.timeline.arrows.split_windows`), listed in
    the result's ``parts``; a slice goes to the file of its start, and an arrow whose ends fall
    in two files is not drawn.
    """
    from tqdm import tqdm

    from rltrace.timeline.arrows import plan_arrows, split_windows

    native = output_format(output, fmt) == "perfetto"
    if native:
        _need_perfetto()
    files = find_trace_files(inputs)
    out = Path(output)
    result = ConvertResult(output=out, files=files)
    jsonl = _jsonl(files)
    plan = plan_arrows(jsonl)
    windows = split_windows(plan, jsonl, max_events) if max_events else [Window()]
    total = sum(map(_size, files)) * len(windows)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="rltrace convert",
               disable=(None if progress is None else not progress), leave=False)
    try:
        for k, window in enumerate(windows):
            path = out if len(windows) == 1 else _part_path(out, k, window)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # never through a link planted at its name; locked, so a second writer of
                # the same file (a rank's native trace being written) is refused, not mixed in
                fh = io.BufferedWriter(open_fresh(path), 1 << 20)
            except OSError as exc:
                raise ConvertError(f"rltrace convert: cannot write {path}: {exc}") from None
            merge = _Merge(fh, result, bar, window)
            events = result.events
            try:
                if native:
                    _write_native(files, merge, fh, result, plan)
                else:
                    _write_json(files, merge, fh, result, plan)
            finally:
                fh.close()
            result.parts.append(Part(path, window, result.events - events))
    finally:
        bar.close()
    result.output = result.parts[0].path
    for msg in result.skipped:
        logger.warning("rltrace convert: %s", msg)
    return result


def _part_path(out: Path, k: int, window: Window) -> Path:
    """``trace.steps-0-41.pftrace`` (``trace.part-3.pftrace`` for a run without steps)."""
    if window.first_step is not None:
        last = "" if window.last_step is None else f"-{window.last_step}"
        tag = f"steps-{window.first_step}{last}"
    else:
        tag = f"part-{k + 1}"
    return out.with_name(f"{out.stem}.{tag}{out.suffix}")


def _write_json(files: list[Path], merge: _Merge, fh: BinaryIO, result: ConvertResult, plan: Plan) -> None:
    """The merged Chrome JSON (with the tracks and arrows of
    :mod:`rltrace.timeline.chrome_tracks`)."""
    from rltrace.timeline.chrome_tracks import ChromeTracks

    merge.tracks = ChromeTracks(plan, merge.window)
    fh.write(b'{"traceEvents":[')
    for i, path in enumerate(files):
        (merge.json_file if path.suffix == ".json" else merge.jsonl_file)(i, path)
    fh.write(b'\n],"displayTimeUnit":"ms"}\n')
    result.events += merge.writer.count
    result.processes = max(result.processes, len(merge.pids))
    result.flows += merge.tracks.flows
