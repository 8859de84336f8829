"""Disk faults (issue 8, item 5): the log dir becoming unwritable, a full disk (a small tmpfs, and a
file-size limit for machines where mounting is not allowed) and files deleted during the run.

What must hold: one clear warning per file, the training loop and tracing go on, lines that
could not be written are held in memory (bounded) and written once the fault clears, so nothing
within the cap is lost and every line on disk parses.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, clean_env

import rltrace
from rltrace import runtime
from rltrace.pipeline import loop as pipeline
from rltrace.testing import read_jsonl

HELPER = HELPERS / "exit_workload.py"


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)


def _configure(root: Path) -> pipeline.Pipeline:
    rltrace.configure(fileroot=str(root), rank=0, world_size=1, flush_at_exit=False, flush_interval_s=3600,
                      session_tracer={"enabled": True, "flush_threshold": 1})
    p = runtime.get_pipeline()
    assert p is not None and p.chrome_path is not None and p.sessions_path is not None
    return p


def _step(tag: str, n: int = 20, pad: int = 100) -> Any:
    """One training step: ``n`` scopes and one finished session; returns the session id."""
    for i in range(n):
        with rltrace.trace_scope(f"{tag}.{i}", args={"pad": "z" * pad}):
            pass
    sid = rltrace.register_session()
    with rltrace.trace_session_phase("generate", session_id=sid):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    rltrace.flush()
    return sid


#: every line of a JSONL file; each one (blank ones too) must parse
_lines = functools.partial(read_jsonl, strict=True)


def _names(path: Path) -> Counter[str]:
    return Counter(e["name"] for e in _lines(path) if e.get("ph") == "X")


def _session_ids(path: Path) -> Counter[Any]:
    return Counter(r["session_id"] for r in _lines(path))


def _warnings_about(caplog: pytest.LogCaptureFixture, path: Path, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "rltrace" and str(path) in r.getMessage() and text in r.getMessage()]


def _break_dir(d: Path) -> None:
    """Make ``d`` unwritable even for root: remove it and put a regular file in its place."""
    shutil.rmtree(d)
    d.write_text("not a directory")


def _unbreak_dir(d: Path) -> None:
    d.unlink()


def test_unwritable_log_dir_warns_once_per_file_and_writes_the_held_lines_once_it_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _configure(tmp_path)
    _step("before")
    traces, sessions_file = p.chrome_path, p.sessions_path
    assert traces is not None and sessions_file is not None
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        _break_dir(traces.parent)
        _break_dir(sessions_file.parent)
        held = [_step(f"during{s}") for s in range(10)]  # the loop goes on; nothing raises
        assert rltrace.is_configured()
        for path in (traces, sessions_file):
            (msg,) = _warnings_about(caplog, path, "cannot write")  # once, however many batches
            assert "training continues" in msg
        _unbreak_dir(traces.parent)
        _unbreak_dir(sessions_file.parent)
        after = _step("after")
    names = _names(traces)
    for s in range(10):
        assert all(names[f"during{s}.{i}"] == 1 for i in range(20)), f"step {s} lost or duplicated"
    assert all(names[f"after.{i}"] == 1 for i in range(20))
    first = _lines(traces)[0]
    assert first["ph"] == "M" and first["name"] == "process_name"  # metadata again in the new file
    ids = _session_ids(sessions_file)
    assert all(ids[s] == 1 for s in [*held, after])
    assert rltrace.diagnostics()["sessions"]["failed"] == 0


def test_flush_after_the_disk_recovers_writes_the_held_chrome_lines_without_a_new_span(
    tmp_path: Path,
) -> None:
    p = _configure(tmp_path)
    _step("before")
    assert p.chrome_path is not None
    _break_dir(p.chrome_path.parent)
    _step("during")
    _unbreak_dir(p.chrome_path.parent)
    rltrace.flush()  # nothing new recorded: only the held lines are pending
    assert p.chrome_path.exists()
    names = _names(p.chrome_path)
    assert all(names[f"during.{i}"] == 1 for i in range(20))


def test_diagnostics_after_a_disk_fault_count_only_what_was_really_lost(tmp_path: Path) -> None:
    p = _configure(tmp_path)
    assert p.chrome is not None and p.chrome_path is not None
    _step("before")
    _break_dir(p.chrome_path.parent)
    _step("during")
    _unbreak_dir(p.chrome_path.parent)
    _step("after")
    assert rltrace.diagnostics()["ChromeTraceExporter"]["failed"] == 0  # all of it is on disk now
    p.chrome.file.pending_cap = 4096
    _break_dir(p.chrome_path.parent)
    for s in range(5):
        _step(f"overflow{s}", n=50)
    diag = rltrace.diagnostics()["ChromeTraceExporter"]
    assert diag.get("dropped", 0) + diag.get("lost", 0) > 0, diag


def test_lines_held_during_a_long_fault_stay_within_the_cap_and_the_newest_are_kept(tmp_path: Path) -> None:
    p = _configure(tmp_path)
    assert p.chrome is not None and p.chrome_path is not None
    _step("before")
    cap = 64 * 1024
    p.chrome.file.pending_cap = cap
    _break_dir(p.chrome_path.parent)
    for s in range(40):  # ~40 x 20 x 170 bytes = 136 KiB, twice the cap
        _step(f"long{s}")
        assert p.chrome.file.pending_bytes <= cap  # bounded, however long the fault lasts
    assert p.chrome.file.lost_bytes > 0
    _unbreak_dir(p.chrome_path.parent)
    _step("after")
    names = _names(p.chrome_path)  # every line parses: no half line from a dropped chunk
    assert all(names[f"long39.{i}"] == 1 for i in range(20))  # the newest held lines survive
    assert all(names[f"after.{i}"] == 1 for i in range(20))
    assert not names["long0.0"]  # the oldest went first


def test_file_deleted_during_the_run_is_recreated_with_metadata_and_later_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _configure(tmp_path)
    first = _step("before")
    traces, sessions_file = p.chrome_path, p.sessions_path
    assert traces is not None and sessions_file is not None
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        traces.unlink()
        sessions_file.unlink()
        later = [_step(f"later{s}") for s in range(3)]
    assert _warnings_about(caplog, traces, "deleted")
    events = _lines(traces)
    meta = [e["name"] for e in events[:3]]
    assert meta == ["process_name", "process_labels", "process_sort_index"]
    first_x = next(i for i, e in enumerate(events) if e.get("ph") == "X")
    assert any(e["name"] == "thread_name" for e in events[:first_x])  # tracks named before use
    names = _names(traces)
    assert all(names[f"later{s}.{i}"] == 1 for s in range(3) for i in range(20))
    assert "before.0" not in names
    ids = _session_ids(sessions_file)
    assert all(ids[s] == 1 for s in later) and first not in ids


# ---- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs mount rights: root or CAP_SYS_ADMIN)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip()}); "
                    "the RLIMIT_FSIZE test covers a full disk")
    try:
        yield mnt
    finally:
        rltrace.shutdown()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(disk: Path) -> Path:
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_full_disk_holds_lines_and_completes_them_without_duplicates_once_space_returns(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    p = _configure(small_disk)
    _step("before")
    with caplog.at_level(logging.WARNING, logger="rltrace"):
        filler = _fill(small_disk)
        held = [_step(f"full{s}", pad=300) for s in range(8)]  # writes fail part-way: ENOSPC
        assert p.chrome_path is not None and p.sessions_path is not None
        (msg,) = _warnings_about(caplog, p.chrome_path, "cannot write")
        assert "No space left" in msg
        filler.unlink()
        after = _step("after")
    names = _names(p.chrome_path)  # a line cut by ENOSPC was completed, never repeated
    assert all(names[f"{tag}.{i}"] == 1 for tag in ["before", *(f"full{s}" for s in range(8)), "after"]
               for i in range(20))
    ids = _session_ids(p.sessions_path)
    assert all(ids[s] == 1 for s in [*held, after])


def test_file_size_limit_acts_like_a_full_disk_and_nothing_is_lost_when_lifted(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.run([sys.executable, str(HELPER), str(tmp_path), "fsize"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["steps"] == 20  # the training loop went on through the fault
    assert out["during"]["sessions"]["failed"] > 0  # held in memory while writes failed
    assert out["after"]["sessions"] == {**out["after"]["sessions"], "failed": 0,
                                        "written": out["after"]["sessions"]["finalized"]}
    assert proc.stderr.count("File too large") == 2  # one warning per file
    log_dir = Path(out["log_dir"])
    names = _names(log_dir / "perf_tracer" / "traces-r0.jsonl")
    assert all(names[f"full.{s}.{i}"] == 1 for s in range(20) for i in range(25))
    assert names["after.fault"] == 1
    assert len(_lines(log_dir / "session_tracer" / "sessions-r0.jsonl")) == 25


def test_a_full_disk_past_the_pending_cap_keeps_every_line_whole_and_the_counts_exact(
    small_disk: Path,
) -> None:
    """ENOSPC cuts a line on disk while more is held than the cap allows: the oldest held lines
    are dropped (counted), but the rest of the cut line is kept and completed once space
    returns, so no later line is appended onto a fragment; ``written`` is what is on disk."""
    from rltrace.exporters.session_records import SessionRecordWriter

    writer = SessionRecordWriter(small_disk / "sessions-r0.jsonl", flush_threshold=1)
    writer.file.pending_cap = 16 * 1024
    for i in range(20):
        writer.add({"session_id": i, "pad": "x" * 200})
    filler = _fill(small_disk)
    for i in range(20, 400):  # the disk is full: cut lines, held lines, the cap overflows
        writer.add({"session_id": i, "pad": "x" * 200})
    assert writer.file.lost_lines > 0 and writer.failed > 0
    filler.unlink()
    for i in range(400, 420):
        writer.add({"session_id": i, "pad": "x" * 200})
    writer.flush()
    lines = (small_disk / "sessions-r0.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]  # every line whole: none joined to a fragment
    ids = [r["session_id"] for r in records]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert writer.written == len(records) and writer.failed == 0
    assert writer.written + writer.file.lost_lines == 420
    assert set(range(20)) <= set(ids) and set(range(400, 420)) <= set(ids)
    writer.close()
