"""The pipeline's default sinks: rltrace's own Chrome trace and session-record writers.

The core builds no exporter itself; whoever composes a pipeline hands it a
:class:`rltrace.seams.Sinks`, and these are the ones ``rltrace.configure`` uses.
"""

from __future__ import annotations

from pathlib import Path

from rltrace.exporters.chrome import ChromeTraceExporter
from rltrace.exporters.session_records import SessionRecordWriter
from rltrace.logdir.files import GuardedDirs
from rltrace.seams import ChromeSink, SessionRecordSink, Sinks


def _chrome(path: Path, *, rank: int, world_size: int, role: str | None, host: str,
            experiment: str, trial: str, guard: GuardedDirs | None) -> ChromeSink:
    return ChromeTraceExporter(path, rank=rank, world_size=world_size, role=role, host=host,
                               experiment=experiment, trial=trial, guard=guard)


def _session_records(path: Path, flush_threshold: int, guard: GuardedDirs | None) -> SessionRecordSink:
    return SessionRecordWriter(path, flush_threshold, guard=guard)


def default_sinks() -> Sinks:
    """The Chrome trace file and the session-record file, as ``rltrace.configure`` writes them."""
    return Sinks(chrome=_chrome, session_records=_session_records)
