"""``rltrace top`` and ``rltrace convert`` on malformed files (issue 30): a wrong-typed field is
ignored and counted, a file or event that cannot be used is skipped and counted, nothing raises.

The regressions of the adversarial probe: top crashed on one wrong-typed field of a live file
(``"ts": "abc"``, and 20 other sites), convert passed wrong-typed events through into the merged
trace.  The hypothesis fuzz of all three readers is in ``tests/analysis/test_malformed_inputs.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import REPO

import rltrace
from rltrace.cli.convert import convert
from rltrace.runtime import get_pipeline

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", *args], capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    return proc


@pytest.fixture
def live_file(tmp_path: Path) -> Path:
    """A real live file of a rank that finished two sessions and left one open (then closed)."""
    rltrace.configure(fileroot=str(tmp_path), session_tracer__enabled=True, flush_at_exit=False,
                      live_interval_s=0.05, flush_interval_s=0.05, rank=0, world_size=2)
    pipeline = get_pipeline()
    assert pipeline is not None and pipeline.live is not None
    path = pipeline.live.path
    with rltrace.step(5):
        for status in ("accepted", "failed"):
            sid = rltrace.register_session()
            rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
        rltrace.trace_session_event("mark_generate_start", session_id=rltrace.register_session())
        deadline = time.monotonic() + 30
        while not (path.exists() and orjson.loads(path.read_bytes())["open"]["sessions"] == 1):
            assert time.monotonic() < deadline, "the live file was not published"
            time.sleep(0.02)
    rltrace.shutdown()
    return path


def edit(path: Path, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(path.read_bytes())
    doc.update(fields)
    path.write_bytes(orjson.dumps(doc))
    return doc


def test_top_ignores_a_ts_that_is_not_a_number_and_counts_it(live_file: Path) -> None:
    doc = edit(live_file, ts="abc")
    live_file.with_name("live-r1.json").write_bytes(orjson.dumps({**doc, "rank": 1, "ts": doc["started_ts"]}))
    proc = cli("top", str(live_file.parents[1]), "--once")
    assert proc.returncode == 0, proc.stderr
    assert "1 malformed field(s) ignored" in proc.stdout
    assert f"{live_file}: ts: expected a number" in proc.stdout
    assert proc.stdout.count("closed") >= 2  # both ranks are shown


def test_top_ignores_wrong_typed_fields_at_every_level(live_file: Path) -> None:
    doc = orjson.loads(live_file.read_bytes())
    doc["open"]["by_phase"] = {"generate": "many", "toolcall": 1}
    doc["open"]["by_step"] = [{"step": [5], "open": 1},
                              {"step": 5, "open": 1, "age_hist": [[999, 1], [3, -2]]}]
    doc["open"]["listed"] = [7, {"session_id": {"x": 1}, "age_s": "old", "phases": [1], "turn": -1}]
    doc["steps"] = [{"step": 5, "done": 2, "hist": [["a", 1], [4, 2]], "by_status": {"accepted": 1.5},
                     "max_s": 1e300}, "step 4"]
    doc.update(rank="0", world_size=-2, interval_s=[1], closed="yes", step=2**64 - 1, finished=[1])
    live_file.write_bytes(orjson.dumps(doc))
    proc = cli("top", str(live_file.parents[1]), "--once")
    assert proc.returncode == 0, proc.stderr
    assert "19 malformed field(s) ignored" in proc.stdout, proc.stdout


def test_top_skips_and_counts_live_files_it_cannot_use(live_file: Path) -> None:
    live = live_file.parent
    (live / "live-r1.json").write_bytes(live_file.read_bytes()[:40])  # cut
    (live / "live-r2.json").write_bytes(live_file.read_bytes().replace(b"rltrace.live/1", b"rltrace.live/9"))
    with open(live / "live-r3.json", "wb") as fh:  # far beyond what a publisher writes
        fh.write(b'{"format":"rltrace.live/1","pad":"')
        for _ in range(50):
            fh.write(b"x" * (1 << 20))
        fh.write(b'"}')
    proc = cli("top", str(live_file.parents[1]), "--once")
    assert proc.returncode == 0, proc.stderr
    assert "3 live file(s) skipped" in proc.stdout and "closed" in proc.stdout
    for p in (live_file, live / "live-r1.json", live / "live-r2.json"):
        p.unlink()
    proc = cli("top", str(live_file.parents[1]), "--once")
    assert proc.returncode == 0 and "no live files yet" in proc.stdout
    assert f"1 live file(s) skipped (the first: {live / 'live-r3.json'}: over 4194304 bytes)" in proc.stdout


GOOD = b'{"pid":7,"tid":1,"ph":"X","ts":1000,"dur":2.5,"name":"ok","cat":"c","args":{"a":1}}'


def test_convert_skips_events_it_cannot_place_and_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "perf_tracer" / "traces-r0.jsonl"
    path.parent.mkdir()
    bad = [b'{"pid":7,"tid":1,"ph":"X","ts":"1000","dur":2.5,"name":"string ts"}',
           b'{"pid":7,"tid":1,"ph":"X","ts":1000,"name":"no dur"}',
           b'{"pid":7,"tid":1,"ph":"X","ts":1000,"dur":-1,"name":"negative dur"}',
           b'{"pid":"7","tid":1,"ph":"X","ts":1000,"dur":1,"name":"string pid"}',
           b'{"pid":7.5,"tid":1,"ph":"i","ts":1000,"name":"float pid"}',
           b'{"pid":7,"tid":[1],"ph":"i","ts":1000,"name":"list tid"}',
           b'{"pid":7,"tid":1,"ph":"X","dur":1,"name":"no ts"}',
           b'{"pid":7,"tid":1,"ph":"X","ts":1000,"dur":1,"name":["list name"]}',
           b'{"pid":7,"tid":0,"ph":"M","name":"process_name","args":{"name":3}}',
           b'{"pid":7,"tid":1,"ph":"b","ts":1000,"name":"async without id"}']
    fixed = b'{"pid":7,"tid":1,"ph":"X","ts":1001,"dur":1,"name":"list args","args":[1],"cat":null}'
    path.write_bytes(b"\n".join([GOOD, *bad, fixed, GOOD]) + b"\n")
    out = tmp_path / "merged.json"
    res = convert([path], out, progress=False)
    assert (res.skipped_lines, res.skipped_fields, res.events) == (10, 2, 3)
    where = path.resolve()
    assert f"{where}:2: malformed trace event (ts: expected a number of microseconds, got '1000'), skipped" \
        in res.skipped
    assert f"{where}:12: trace event field args: expected an object, got a list of 1, removed" in res.skipped
    events = orjson.loads(out.read_bytes())["traceEvents"]
    assert [e["name"] for e in events] == ["ok", "list args", "ok"]
    assert events[1] == {"pid": 1, "tid": 1, "ph": "X", "ts": 1001, "dur": 1, "name": "list args"}
    assert out.read_bytes().count(GOOD.replace(b'"pid":7', b'"pid":1')) == 2  # valid lines kept as bytes
    proc = cli("convert", str(path), "-o", str(out))
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].endswith(", 10 line(s) skipped, 2 malformed field(s) removed")


def test_convert_skips_a_broken_json_input_and_keeps_kineto_string_pids(tmp_path: Path) -> None:
    broken = tmp_path / "torch_profiler" / "step1-r0.json"
    broken.parent.mkdir()
    broken.write_bytes(b'{"traceEvents": [{"ph": "X"')
    kineto = tmp_path / "torch_profiler" / "step2-r0.json"
    kineto.write_bytes(orjson.dumps({"baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": [
        {"ph": "X", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 10, "dur": 5,
         "name": "PyTorch Profiler (0)"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": "x", "dur": 5, "name": "bad ts"},
        "not an event"]}))
    (tmp_path / "traces-r0.jsonl").write_bytes(GOOD + b"\n")
    out = tmp_path / "merged.json"
    res = convert([tmp_path], out, progress=False)
    assert res.skipped_lines == 3
    assert any("step1-r0.json: not a readable JSON trace" in m for m in res.skipped), res.skipped
    names = [e.get("name") for e in orjson.loads(out.read_bytes())["traceEvents"]]
    assert "PyTorch Profiler (0)" in names and "bad ts" not in names and "ok" in names
