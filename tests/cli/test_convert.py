"""``rltrace convert``: inputs, merging, pid renumbering, damaged files, CLI, streaming."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

import rltrace
from rltrace.cli.convert import ConvertError, convert


def _x(pid: int, tid: int, ts: int, name: str) -> bytes:
    return orjson.dumps({"pid": pid, "tid": tid, "ph": "X", "ts": ts, "dur": 1.5, "name": name,
                         "cat": "misc", "args": {}}) + b"\n"


def _meta(pid: int, rank: int) -> bytes:
    return (b'{"pid":%d,"tid":0,"ph":"M","name":"process_name","args":{"name":"rank %d"}}\n'
            % (pid, rank))


def _rank_file(logdir: Path, rank: int, pid: int, n: int) -> Path:
    """A trace file in the exporter's layout: process metadata and ``n`` X events named r{rank}.e{i}."""
    path = logdir / "perf_tracer" / f"traces-r{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_meta(pid, rank) + b"".join(_x(pid, 1, 1000 + i, f"r{rank}.e{i}") for i in range(n)))
    return path


def _events(merged: Path) -> list[dict[str, Any]]:
    doc = orjson.loads(merged.read_bytes())
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc["traceEvents"]


def _names(merged: Path) -> Counter[str]:
    return Counter(e["name"] for e in _events(merged) if e["ph"] != "M")


@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    logdir = tmp_path / "logs" / "u" / "exp" / "trial0"
    _rank_file(logdir, 0, 100, 3)
    _rank_file(logdir, 1, 200, 2)
    sessions = logdir / "session_tracer" / "sessions-r0.jsonl"
    sessions.parent.mkdir(parents=True)
    sessions.write_bytes(b'{"task_id":1,"session_id":"s","rank":0,"status":"accepted"}\n')
    return logdir


EXPECTED = Counter({"r0.e0": 1, "r0.e1": 1, "r0.e2": 1, "r1.e0": 1, "r1.e1": 1})


def test_convert_of_a_log_dir_merges_every_rank_file_and_ignores_session_files(
    two_ranks: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out" / "trace.json"
    res = convert([two_ranks.parents[2]], out, progress=False)
    assert [p.name for p in res.files] == ["traces-r0.jsonl", "traces-r1.jsonl"]
    assert _names(out) == EXPECTED
    assert res.events == len(_events(out)) == 7
    assert res.processes == 2


def test_convert_of_a_glob_skips_matching_session_files(two_ranks: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    res = convert([str(two_ranks / "*" / "*-r0.jsonl")], out, progress=False)
    assert [p.name for p in res.files] == ["traces-r0.jsonl"]
    assert _names(out) == Counter({"r0.e0": 1, "r0.e1": 1, "r0.e2": 1})


def test_convert_of_explicit_files_merges_them_once_each(two_ranks: Path, tmp_path: Path) -> None:
    r0, r1 = (two_ranks / "perf_tracer" / f"traces-r{r}.jsonl" for r in (0, 1))
    sessions = two_ranks / "session_tracer" / "sessions-r0.jsonl"
    out = tmp_path / "trace.json"
    res = convert([r1, sessions, r0, two_ranks], out, progress=False)  # r0/r1 also found in the dir
    assert res.files == [r0.resolve(), r1.resolve()]
    assert _names(out) == EXPECTED


def test_convert_orders_files_by_numeric_rank(tmp_path: Path) -> None:
    for rank in (10, 2, 0, 1):
        _rank_file(tmp_path, rank, 1000 + rank, 1)
    res = convert([tmp_path], tmp_path / "trace.json", progress=False)
    assert [p.name for p in res.files] == [f"traces-r{r}.jsonl" for r in (0, 1, 2, 10)]


def test_same_os_pid_in_two_rank_files_becomes_two_processes(tmp_path: Path) -> None:
    # two containers/hosts: both rank processes had pid 7
    _rank_file(tmp_path, 0, 7, 2)
    _rank_file(tmp_path, 1, 7, 2)
    out = tmp_path / "trace.json"
    res = convert([tmp_path], out, progress=False)
    assert res.processes == 2
    pids_of: dict[str, set[int]] = {}
    for ev in _events(out):
        # metadata names the rank ("rank 0"), events are named "r0.e1"
        key = ev["args"]["name"] if ev["ph"] == "M" else f"rank {ev['name'][1]}"
        pids_of.setdefault(key, set()).add(ev["pid"])
    assert set(pids_of) == {"rank 0", "rank 1"}
    assert all(len(p) == 1 for p in pids_of.values())  # metadata and events of a rank agree
    assert pids_of["rank 0"] != pids_of["rank 1"]


def test_real_rank_files_from_one_os_process_merge_into_distinct_processes(tmp_path: Path) -> None:
    for rank in (0, 1):
        rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t", rank=rank,
                          world_size=2, flush_at_exit=False)
        with rltrace.trace_scope("step", args={"rank": rank}):
            rltrace.instant("mark")
        rltrace.shutdown()
    out = tmp_path / "trace.json"
    res = convert([tmp_path / "logs"], out, progress=False)
    assert res.processes == 2
    evs = _events(out)
    names = {e["pid"]: e["args"]["name"] for e in evs if e["name"] == "process_name"}
    steps = {e["args"]["rank"]: e["pid"] for e in evs if e["name"] == "step"}
    assert len(names) == 2
    for rank, pid in steps.items():
        assert names[pid].startswith(f"[Rank {rank}, Process ")  # AReaL's process names
    assert sorted(e["name"] for e in evs if e["ph"] == "i") == ["mark", "mark"]


def test_truncated_last_line_is_skipped_and_reported_while_complete_lines_are_kept(
    tmp_path: Path,
) -> None:
    path = _rank_file(tmp_path, 0, 5, 4)
    with open(path, "ab") as f:
        f.write(_x(5, 1, 9999, "cut")[:30])  # the writer crashed mid-line
    out = tmp_path / "trace.json"
    res = convert([path], out, progress=False)
    assert _names(out) == Counter({f"r0.e{i}": 1 for i in range(4)})
    assert res.events == 5
    assert len(res.skipped) == 1
    assert f"{path.resolve()}:6" in res.skipped[0] and "truncated" in res.skipped[0]


def test_invalid_line_in_the_middle_is_skipped_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "traces-r0.jsonl"
    path.write_bytes(_x(5, 1, 1, "a") + b"{not json\n" + _x(5, 1, 2, "b"))
    res = convert([path], tmp_path / "trace.json", progress=False)
    assert _names(tmp_path / "trace.json") == Counter({"a": 1, "b": 1})
    assert len(res.skipped) == 1 and ":2:" in res.skipped[0] and "invalid JSON" in res.skipped[0]


def test_nonexistent_input_raises_convert_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "traces-r0.jsonl"
    with pytest.raises(ConvertError, match="does not exist") as info:
        convert([missing], tmp_path / "trace.json", progress=False)
    assert str(missing) in str(info.value)


def test_directory_without_trace_files_raises_convert_error(tmp_path: Path) -> None:
    (tmp_path / "sessions-r0.jsonl").write_bytes(b"{}\n")
    with pytest.raises(ConvertError, match="no trace files"):
        convert([tmp_path], tmp_path / "trace.json", progress=False)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_cli_convert_writes_the_merged_file_and_prints_its_path(two_ranks: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.json"
    proc = _cli("convert", str(two_ranks), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    assert _names(out) == EXPECTED


def test_cli_convert_of_a_missing_input_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing-dir"
    proc = _cli("convert", str(missing), "-o", str(tmp_path / "out.json"))
    assert proc.returncode == 2
    assert str(missing) in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_convert_streams_a_large_rank_file_in_bounded_memory(tmp_path: Path) -> None:
    n = 300_000
    path = tmp_path / "perf_tracer" / "traces-r0.jsonl"
    path.parent.mkdir()
    line = (b'{"pid":4242,"tid":%d,"ph":"X","ts":%d,"dur":12.345,"name":"rollout.generate",'
            b'"cat":"compute","args":{"task_id":%d,"sample":3}}\n')
    with open(path, "wb") as f:
        f.write(_meta(4242, 0))
        for start in range(0, n, 10_000):
            f.write(b"".join(line % (i % 8, 1_700_000_000_000_000 + i, i)
                             for i in range(start, start + 10_000)))
    size = path.stat().st_size
    out = tmp_path / "trace.json"

    tracemalloc.start()
    try:
        res = convert([tmp_path], out, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert res.events == n + 1
    assert res.skipped == []
    assert peak < size / 4, f"peak {peak} B while converting a {size} B file"
    with open(out, "rb") as f:  # every event was written and the document is closed
        f.seek(-300, 2)
        tail = f.read()
    assert b'"task_id":%d,' % (n - 1) in tail and tail.rstrip().endswith(b"}")



def test_rank_restarted_after_a_crash_mid_line_keeps_its_process_name(tmp_path: Path) -> None:
    path = _rank_file(tmp_path / "logs" / "u" / "e" / "t", 0, 1, 1)
    with open(path, "ab") as f:
        f.write(_x(1, 1, 9999, "cut")[:30])  # the previous run died mid-write
    rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t", rank=0, user="u",
                      flush_at_exit=False)
    with rltrace.trace_scope("after.restart"):
        pass
    rltrace.shutdown()
    out = tmp_path / "trace.json"
    res = convert([path], out, progress=False)
    evs = _events(out)
    (new,) = [e for e in evs if e["name"] == "after.restart"]
    names = [e["args"]["name"] for e in evs if e["name"] == "process_name" and e["pid"] == new["pid"]]
    assert names == [f"[Rank 0, Process {os.getpid()}] · {socket.gethostname()}"]  # AReaL's name + host
    assert len(res.skipped) == 1  # only the fragment


def test_explicit_file_whose_path_contains_glob_characters_is_converted(tmp_path: Path) -> None:
    path = _rank_file(tmp_path / "run[1]", 0, 5, 2)
    res = convert([path], tmp_path / "trace.json", progress=False)
    assert _names(tmp_path / "trace.json") == Counter({"r0.e0": 1, "r0.e1": 1})
    assert res.files == [path.resolve()]


def test_kineto_events_shifted_onto_the_epoch_keep_their_nesting_exactly(tmp_path: Path) -> None:
    """Epoch microseconds as doubles have quarter-µs steps: shifting Kineto's ``ts`` in floating
    point once let a child that ends with its parent end 0.1 µs after it, and Perfetto dropped
    it (``slice_drop_overlapping_complete_event``, seen as a flaky torch.profiler test)."""
    import orjson

    from rltrace.cli.convert import convert

    base = 1_795_469_024_000_000_000
    parent = {"ph": "X", "name": "parent", "pid": 1, "tid": 1, "ts": 943236.087, "dur": 10.0}
    child = {"ph": "X", "name": "child", "pid": 1, "tid": 1, "ts": 943236.126, "dur": 9.961}
    trace = tmp_path / "step1-r0.json"
    trace.write_bytes(orjson.dumps({"baseTimeNanoseconds": base, "traceEvents": [parent, child]}))
    out = tmp_path / "merged.json"
    convert([trace], out)
    events = {e["name"]: e for e in orjson.loads(out.read_bytes())["traceEvents"] if e.get("ph") == "X"}
    p, c = events["parent"], events["child"]
    assert all(type(e[k]) is int for e in (p, c) for k in ("ts", "dur"))
    assert p["ts"] <= c["ts"] and c["ts"] + c["dur"] <= p["ts"] + p["dur"]
    assert p["ts"] == (base + 943_236_087) // 1000  # on the epoch, to the µs
