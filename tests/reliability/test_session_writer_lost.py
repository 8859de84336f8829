"""Disk pressure past the in-memory cap: the session records the writer drops are counted in
``diagnostics()["sessions"]["lost"]``, so finalized = written + held + lost always adds up."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from conftest import clean_env

import rltrace
from rltrace import runtime
from rltrace.testing import read_jsonl


def _finalize(n: int) -> None:
    for _ in range(n):
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("generate", session_id=sid):
            pass
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.flush()


def test_records_dropped_under_disk_pressure_are_counted_as_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    rltrace.configure(fileroot=str(tmp_path), rank=0, world_size=1, flush_at_exit=False,
                      flush_interval_s=3600, session_tracer={"enabled": True, "flush_threshold": 1})
    p = runtime.get_pipeline()
    assert p is not None and p.sessions_path is not None and p.session_processor is not None
    _finalize(5)
    folder = p.sessions_path.parent
    p.session_processor.writer.file.pending_cap = 2048  # a few records held, then the oldest go
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        shutil.rmtree(folder)
        folder.write_text("not a folder")  # unwritable even for root: the disk refuses every write
        _finalize(60)
        during = rltrace.diagnostics()["sessions"]
        folder.unlink()  # the fault clears: what is held is written
        _finalize(1)
    after = rltrace.diagnostics()["sessions"]
    rltrace.shutdown()
    assert "dropping the oldest lines" in caplog.text
    assert during["lost"] > 0 and during["failed"] > 0
    assert during["written"] + during["failed"] + during["lost"] == during["finalized"] == 65
    # the first 5 went with the removed folder; the file made anew holds what came after
    on_disk = len(read_jsonl(p.sessions_path, strict=True))
    assert after["failed"] == 0 and after["written"] == 5 + on_disk
    assert after["written"] + after["lost"] == after["finalized"] == 66
