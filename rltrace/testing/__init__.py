"""Testing support for rltrace users and rltrace's own tests.

* :class:`CapturedSpans` / :func:`capture_spans` - configure rltrace into a temporary log dir
  with an in-memory OTel exporter attached, and read back finished ``ReadableSpan``s.
* :class:`IncrementingClock` and :class:`SequentialIds` with :func:`deterministic` - fixed
  timestamps and ids so output can be compared exactly.
* the pytest fixture ``rltrace_capture``, in the opt-in plugin :mod:`rltrace.testing.pytest_plugin`
  (``pytest -p rltrace.testing.pytest_plugin``, or ``pytest_plugins = ["rltrace.testing.pytest_plugin"]``
  in a ``conftest.py``): installing rltrace changes no other project's test sessions.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

from rltrace import runtime
from rltrace.recording import recorder

__all__ = [
    "CapturedSpans",
    "IncrementingClock",
    "SequentialIdGenerator",
    "SequentialIds",
    "capture_spans",
    "deterministic",
    "read_jsonl",
]


class IncrementingClock:
    """A clock returning ``start_ns``, ``start_ns + step_ns``, ... (epoch nanoseconds)."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000, step_ns: int = 1_000) -> None:
        self.now = start_ns
        self.step = step_ns

    def __call__(self) -> int:
        t = self.now
        self.now += self.step
        return t


class SequentialIds:
    """A ``getrandbits`` stand-in returning 1, 2, 3, ... (masked to the requested width)."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def __call__(self, bits: int) -> int:
        v = self.next
        self.next += 1
        return v & ((1 << bits) - 1)


class SequentialIdGenerator(IdGenerator):
    """An OTel ``IdGenerator`` returning trace ids 1, 2, ... and span ids 1, 2, ... (for
    ``configure(id_generator=...)``); it remembers what it handed out."""

    def __init__(self) -> None:
        self.trace_ids: list[int] = []
        self.span_ids: list[int] = []

    def generate_trace_id(self) -> int:
        self.trace_ids.append(len(self.trace_ids) + 1)
        return self.trace_ids[-1]

    def generate_span_id(self) -> int:
        self.span_ids.append(len(self.span_ids) + 1)
        return self.span_ids[-1]


@contextlib.contextmanager
def deterministic(
    clock: Callable[[], int] | None = None, ids: Callable[[int], int] | None = None
) -> Iterator[tuple[Callable[[], int], Callable[[int], int]]]:
    """Use a deterministic clock and id source inside the block (restored afterwards)."""
    clock = clock or IncrementingClock()
    ids = ids or SequentialIds()
    state = recorder.STATE
    old_clock, old_ids = state.now_ns, state.rand_bits
    state.now_ns, state.rand_bits = clock, ids
    try:
        yield clock, ids
    finally:
        state.now_ns, state.rand_bits = old_clock, old_ids


class CapturedSpans:
    """Finished spans of a configured rltrace pipeline, collected in memory."""

    def __init__(self, log_root: Path) -> None:
        self.log_root = log_root
        self.exporter = InMemorySpanExporter()
        self.processor = SimpleSpanProcessor(self.exporter)

    @property
    def log_dir(self) -> Path:
        p = runtime.get_pipeline()
        if p is None:
            raise RuntimeError("rltrace is not configured")
        return p.log_dir

    def spans(self) -> list[ReadableSpan]:
        """Flush rltrace and return every span finished so far, in end order."""
        runtime.flush()
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.by_name(name)
        if len(found) != 1:
            raise AssertionError(f"expected one span named {name!r}, found {len(found)}")
        return found[0]

    def parent_of(self, span: ReadableSpan) -> ReadableSpan | None:
        if span.parent is None:
            return None
        for s in self.spans():
            if s.context.span_id == span.parent.span_id:
                return s
        return None

    def clear(self) -> None:
        self.exporter.clear()


@contextlib.contextmanager
def capture_spans(log_root: str | Path | None = None, **config: Any) -> Iterator[CapturedSpans]:
    """Configure rltrace (into ``log_root`` or a temp dir) and capture its spans in memory.

    Extra keyword arguments are config overrides.  rltrace is shut down afterwards.
    """
    with contextlib.ExitStack() as stack:
        if log_root is None:
            log_root = stack.enter_context(tempfile.TemporaryDirectory(prefix="rltrace-test-"))
        cap = CapturedSpans(Path(log_root))
        config.setdefault("fileroot", str(log_root))
        config.setdefault("flush_at_exit", False)
        runtime.configure(**config)
        runtime.add_span_processor(cap.processor)
        try:
            yield cap
        finally:
            runtime.shutdown()
            runtime.remove_span_processor(cap.processor)


def read_jsonl(path: str | Path, *, strict: bool = False) -> list[dict[str, Any]]:
    """Parse a JSON-lines file written by rltrace; a bad line raises naming ``file:line``.

    ``strict`` also rejects blank lines (rltrace never writes one).
    """
    import orjson

    out = []
    for n, raw in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not strict and not raw.strip():
            continue
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError as exc:
            raise AssertionError(f"{path}:{n} is not valid JSON: {raw[:200]!r}") from exc
    return out

