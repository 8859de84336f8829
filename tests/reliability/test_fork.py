"""Fork and multiprocessing (issue 8, item 3): forked children trace into their own ``-p{pid}``
files or are cleanly disabled, never re-export the parent's buffered events, never deadlock on
inherited locks; spawned children re-configure from the parent's config; ``rltrace convert``
keeps every process apart.

Each scenario runs ``tests/helpers/fork_workload.py`` in a fresh interpreter (forking the pytest
process itself would copy unrelated threads and sockets into the children).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS

from rltrace.cli.convert import convert
from rltrace.testing import read_jsonl

HELPER = HELPERS / "fork_workload.py"
PARENT_SPANS = 40


def _run(tmp_path: Path, mode: str, timeout: float = 120) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, str(HELPER), str(tmp_path), mode], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: every line of a JSONL file; each one (blank ones too) must parse
_lines = functools.partial(read_jsonl, strict=True)


def _span_names(path: Path) -> Counter[str]:
    return Counter(e["name"] for e in _lines(path) if e.get("ph") == "X")


def _check_parent(log_dir: Path, info: dict[str, Any]) -> None:
    """The parent's own files: its spans once each, its sessions once each, nothing from children."""
    names = _span_names(log_dir / "perf_tracer" / "traces-r3.jsonl")
    for i in range(PARENT_SPANS):
        assert names[f"parent.before_fork.{i}"] == 1
    assert names["parent.after_fork"] == 1
    assert not [n for n in names if n.startswith(("child.", "pool."))]
    records = _lines(log_dir / "session_tracer" / "sessions-r3.jsonl")
    parent = {r["session_id"]: r for r in records if r["session_id"] in info["parent_sessions"]}
    assert sorted(parent) == sorted(info["parent_sessions"])
    assert Counter(r["session_id"] for r in records if r["session_id"] in parent) == Counter(
        {s: 1 for s in parent})
    open_one = parent[info["parent_sessions"][-1]]  # open across the fork, finalized by the parent
    assert open_one["status"] == "dropped" and open_one["phases"]["generate"][0]["interrupted"] is True


def _check_child(log_dir: Path, pid: int, tag: str, info: dict[str, Any], forked: bool = True) -> None:
    traces = log_dir / "perf_tracer" / f"traces-r3-p{pid}.jsonl"
    events = _lines(traces)
    names = Counter(e["name"] for e in events if e.get("ph") == "X")
    assert {n for n in names if n.startswith("child.")} == {f"child.{tag}.{i}" for i in range(20)}
    assert all(names[f"child.{tag}.{i}"] == 1 for i in range(20))
    assert not [n for n in names if n.startswith(("parent.", "hammer."))], "parent events re-exported"
    assert {e["pid"] for e in events} == {pid}
    labels = next(e for e in events if e.get("name") == "process_labels")["args"]["labels"]
    assert "rank=3" in labels
    records = _lines(log_dir / "session_tracer" / f"sessions-r3-p{pid}.jsonl")
    assert len(records) == 3 and {r["status"] for r in records} == {"accepted"}
    if forked:  # the parent's sessions (open or buffered at the fork) are not the child's
        assert not set(info["parent_sessions"]) & {r["session_id"] for r in records}


def test_multiprocessing_fork_child_writes_its_own_pid_files_without_the_parents_buffered_events(
    tmp_path: Path,
) -> None:
    info = _run(tmp_path, "process")
    assert info["exitcodes"] == [0]
    log_dir = Path(info["log_dir"])
    (child,) = info["children"]
    _check_child(log_dir, child, "worker", info)
    _check_parent(log_dir, info)
    res = convert([log_dir], tmp_path / "merged.json", progress=False)
    assert res.processes == 2 and not res.skipped
    merged = orjson.loads((tmp_path / "merged.json").read_bytes())["traceEvents"]
    pid_of = {e["name"]: e["pid"] for e in merged if e.get("ph") == "X"}
    assert pid_of["child.worker.0"] != pid_of["parent.before_fork.0"]
    assert {e["pid"] for e in merged if e.get("name", "").startswith("child.")} == {pid_of["child.worker.0"]}


@pytest.mark.parametrize("mode", ["process_noflush", "pool"])
def test_multiprocessing_fork_children_flush_at_exit_without_an_explicit_flush(
    tmp_path: Path, mode: str
) -> None:
    info = _run(tmp_path, mode)
    log_dir = Path(info["log_dir"])
    names: Counter[str] = Counter()
    for pid in info["children"]:
        path = log_dir / "perf_tracer" / f"traces-r3-p{pid}.jsonl"
        if path.exists():
            names += _span_names(path)
    if mode == "pool":
        assert all(names[f"pool.item.{i}"] == 1 for i in range(8)), names
    else:
        assert all(names[f"child.worker.{i}"] == 1 for i in range(20)), names
    _check_parent(log_dir, info)


def test_forking_while_another_thread_hammers_the_tracer_never_deadlocks_or_duplicates(
    tmp_path: Path,
) -> None:
    info = _run(tmp_path, "hammer")
    assert info["exitcodes"] == [0] * 20, info["exitcodes"]  # None would mean killed after 20 s
    assert not info["hammer_alive"] and info["hammered"] > 0
    log_dir = Path(info["log_dir"])
    for k in range(10):
        _check_child(log_dir, info["children"][2 * k], f"mp{k}", info)
        _check_child(log_dir, info["children"][2 * k + 1], f"raw{k}", info)
    _check_parent(log_dir, info)
    parent_names = _span_names(log_dir / "perf_tracer" / "traces-r3.jsonl")
    assert parent_names["hammer.span"] == info["hammered"]  # none lost to a fork, none doubled
    records = _lines(log_dir / "session_tracer" / "sessions-r3.jsonl")
    assert len(records) == info["hammered"] + len(info["parent_sessions"])
    assert len({r["session_id"] for r in records}) == len(records)


def test_fork_mode_disable_leaves_the_child_untraced_and_the_parent_intact(tmp_path: Path) -> None:
    info = _run(tmp_path, "disable")
    assert info["exitcodes"] == [0]
    assert info["child"]["configured"] is False
    log_dir = Path(info["log_dir"])
    assert sorted(p.name for p in log_dir.rglob("*.jsonl")) == ["sessions-r3.jsonl", "traces-r3.jsonl"]
    _check_parent(log_dir, info)


def test_spawn_child_configure_child_writes_under_the_parents_log_dir_with_its_rank_and_pid(
    tmp_path: Path,
) -> None:
    info = _run(tmp_path, "spawn")
    assert info["exitcodes"] == [0]
    child = info["child"]
    assert child["rank"] == 3 and child["fileroot"] == str(tmp_path)
    log_dir = Path(info["log_dir"])
    _check_child(log_dir, child["pid"], "spawned", info, forked=False)  # written at interpreter exit
    _check_parent(log_dir, info)
    res = convert([log_dir], tmp_path / "merged.json", progress=False)
    assert res.processes == 2 and len(res.files) == 2


def test_session_ids_of_a_child_never_collide_with_the_parents_under_the_same_rank(tmp_path: Path) -> None:
    info = _run(tmp_path, "spawn")
    keys = Counter((r["rank"], r["session_id"]) for f in Path(info["log_dir"]).rglob("sessions-*.jsonl")
                   for r in _lines(f))
    assert [k for k, n in keys.items() if n > 1] == []
