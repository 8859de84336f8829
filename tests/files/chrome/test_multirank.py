"""Two real rank processes write their own trace files; ``convert`` merges them on one clock."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS, need, perfetto_check

from rltrace.cli.convert import convert
from rltrace.config import TracerConfig, current_user, log_dir
from rltrace.testing import read_jsonl

WORKER = HELPERS / "rank_worker.py"
WORLD = 2
EXPERIMENT, TRIAL = "multirank", "trial0"
PROCESS_NAMES = "select name from process where pid is not null and pid != 0 order by name"
AFTER_BARRIER = "select count(*) as n from slice where name = 'after_barrier' and dur = 0"


def _run_ranks(fileroot: Path) -> tuple[int, int]:
    """Run WORLD rank processes through a barrier; return epoch ns before spawning and after joining."""
    before = time.time_ns()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(fileroot), EXPERIMENT, TRIAL, str(rank), str(WORLD)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in range(WORLD)
    ]
    try:
        for p in procs:  # blocks until the rank is inside before_barrier (EOF if it died)
            line = p.stdout.readline()
            assert line.strip() == "ready", f"rank did not get ready: {line!r} {p.stderr.read()}"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        for rank, p in enumerate(procs):
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, f"rank {rank} exited {p.returncode}: {err}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return before, time.time_ns()


def _events_by_rank(merged: Path) -> tuple[dict[int, int], dict[int, list[dict[str, Any]]], dict]:
    doc = orjson.loads(merged.read_bytes())
    rank_of_pid: dict[int, int] = {}
    sort_index: dict[int, int] = {}
    events: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == "process_name":
            m = re.match(r"\[Rank (\d+), Process \d+\]", ev["args"]["name"])  # AReaL's name
            assert m, ev
            rank_of_pid[ev["pid"]] = int(m.group(1))
        elif ev["ph"] == "M" and ev["name"] == "process_sort_index":
            sort_index[ev["pid"]] = ev["args"]["sort_index"]
        elif ev["ph"] != "M":
            events[ev["pid"]].append(ev)
    by_rank = {rank_of_pid[pid]: evs for pid, evs in events.items()}
    return rank_of_pid, by_rank, sort_index


def test_ranks_merge_into_one_process_each_on_the_epoch_clock(tmp_path: Path) -> None:
    before_ns, after_ns = _run_ranks(tmp_path)
    logdir = log_dir(TracerConfig(fileroot=str(tmp_path), experiment_name=EXPERIMENT, trial_name=TRIAL))
    for rank in range(WORLD):
        assert (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").is_file()

    merged = tmp_path / "trace.json"
    res = convert([logdir], merged, progress=False)
    assert res.processes == WORLD
    assert res.skipped == []

    rank_of_pid, by_rank, sort_index = _events_by_rank(merged)
    assert sorted(rank_of_pid.values()) == list(range(WORLD))
    assert len(set(rank_of_pid)) == WORLD  # one distinct process per rank
    assert sort_index == rank_of_pid  # Perfetto lists the processes by rank

    after: dict[int, int] = {}
    started: dict[int, int] = {}
    for rank, evs in by_rank.items():
        (inst,) = [e for e in evs if e["name"] == "after_barrier"]
        (scope,) = [e for e in evs if e["name"] == "before_barrier"]
        assert inst["ph"] == "i" and inst["args"] == {"rank": rank}
        after[rank], started[rank] = inst["ts"], scope["ts"]

    lo, hi = before_ns // 1000, after_ns // 1000
    for rank in range(WORLD):
        # epoch microseconds, not a per-process clock: inside the window this test measured
        assert lo <= started[rank] <= after[rank] <= hi, (lo, started, after, hi)
        # every rank passed the barrier after every rank had reached it
        assert after[rank] >= max(started.values())
    assert abs(after[0] - after[1]) < 1_000_000


@pytest.mark.perfetto
def test_merged_ranks_load_in_perfetto_as_two_processes(tmp_path: Path) -> None:
    _run_ranks(tmp_path)
    merged = tmp_path / "trace.json"
    convert([tmp_path], merged, progress=False)
    report = perfetto_check(merged, PROCESS_NAMES, AFTER_BARRIER)
    assert report["load_error"] is None
    assert report["import_errors"] == []
    assert report["ok"] is True
    assert report["processes"] == WORLD
    names = [r["name"] for r in report["queries"][PROCESS_NAMES]]
    assert [re.match(r"\[Rank (\d+), Process \d+\]", n).group(1) for n in names] == ["0", "1"], names
    assert report["queries"][AFTER_BARRIER][0]["n"] == WORLD


def test_rank_and_world_size_come_from_an_initialised_torch_distributed_group(tmp_path: Path) -> None:
    """Two real gloo ranks; rltrace.configure() gets no rank and RANK/WORLD_SIZE are unset."""
    need("torch", "torch is not installed (pip install torch==2.13.0)")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    worker = HELPERS / "dist_worker.py"
    procs = [subprocess.Popen([sys.executable, str(worker), str(tmp_path), str(port), str(r), "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "sum=3.0" in out  # the all_reduce really ran across both processes
    logdir = tmp_path / "logs" / current_user() / "dist" / "t0"
    for rank in range(2):
        events = read_jsonl(logdir / "perf_tracer" / f"traces-r{rank}.jsonl")
        labels = [e["args"]["labels"] for e in events if e.get("name") == "process_labels"]
        assert labels and f"rank={rank}" in labels[0] and "world_size=2" in labels[0]
        assert [e["name"] for e in events if e.get("ph") == "X"] == ["allreduce"]
    assert (logdir / "config.yaml").is_file()  # written by rank 0 only
