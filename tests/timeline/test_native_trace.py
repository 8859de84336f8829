"""The native Perfetto trace (``trace.pftrace``) of real runs, loaded into Perfetto's real trace
processor and checked with SQL: the track tree (rank process -> task -> session -> turn ->
phase), the arrows (task -> session, accepted session -> the train step that consumed it), the
counters against the session records, and the OTel ids against the spans an OTLP receiver got.

Runs: ``rltrace demo`` (2 ranks, multi-turn sessions, OTLP to the in-process receiver) and a
two-rank torchrun job (gloo) with a rollout rank and a trainer rank that profiles a step with
``torch.profiler``.  The Ray run is checked in ``tests/integrations/ray/test_ray.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS, need, perfetto_check

from rltrace.config import current_user
from rltrace.testing.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.perfetto


def arg(name: str, alias: str | None = None, of: str = "s") -> str:
    """SQL for a debug arg of slice ``of`` (Perfetto writes an arg's dots as underscores)."""
    key = name.replace(".", "_")
    return f"extract_arg({of}.arg_set_id, 'debug.{key}') as {alias or key}"


#: the instant a scored phase leaves on its session (OTel GenAI's evaluation event): it carries
#: its phase and turn, but is no phase execution
EVALUATION = "gen_ai.evaluation.result"
PHASES = f"""select s.id, s.name, {arg('rl.session.id', 'sid')}, {arg('rl.turn', 'turn')}, {arg('rank')},
    p.category as pcat, {arg('rl.session.id', 'psid', 'p')}, {arg('rl.turn', 'pturn', 'p')},
    g.category as gcat, {arg('rl.session.id', 'gsid', 'g')}
  from slice s left join slice p on s.parent_id = p.id left join slice g on p.parent_id = g.id
  where extract_arg(s.arg_set_id, 'debug.rl_phase') is not null and s.name != '{EVALUATION}'"""
SESSIONS = f"""select s.id, s.ts, s.dur, {arg('rl.session.id', 'sid')}, {arg('rl.task.id', 'task')},
    {arg('rl.step', 'step')}, {arg('rank')}, {arg('rl.session.status', 'status')},
    st.name as strack, st.type as stype, tt.name as ttrack, pr.name as pname
  from slice s join track st on s.track_id = st.id left join track tt on st.parent_id = tt.id
  left join process_track ptt on ptt.id = tt.id left join process pr on pr.upid = ptt.upid
  where s.category = 'rl.session'"""
CONSUMED = f"""select so.id as src, {arg('rl.session.id', 'sid', 'so')}, {arg('rl.step', 'sstep', 'so')},
    {arg('rank', 'srank', 'so')}, so.ts + so.dur as send, si.ts as cts, st.name as step_name,
    {arg('rl.step', 'tstep', 'st')}, st.ts as step_ts, st.dur as step_dur, pr.name as cproc
  from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
  join slice st on st.track_id = si.track_id and st.name = 'train.step'
       and si.ts between st.ts and st.ts + st.dur
  join thread_track tt on tt.id = si.track_id join thread using(utid) join process pr using(upid)
  where si.category = 'rl.consume'"""
TASK_FLOWS = """select count(*) as n from flow f join slice so on so.id = f.slice_out
  join slice si on si.id = f.slice_in where so.category = 'rl.task' and si.category = 'rl.session'"""
COUNTERS = """select t.name, pr.name as pname, c.ts, c.value from counter c
  join process_counter_track t on c.track_id = t.id join process pr using(upid) order by c.ts"""
NAMELESS = """select count(*) as n from slice s join track t on s.track_id = t.id
  left join thread_track tt on tt.id = t.id left join thread th using(utid)
  where t.name is null and (th.name is null or th.name = '')"""
SESSION_OFF_TRACK = """select count(*) as n from slice s join thread_track tt on s.track_id = tt.id
  where s.category in ('rl.session', 'rl.task')
     or extract_arg(s.arg_set_id, 'debug.rl_session_id') is not null"""
IDS = f"""select s.name, {arg('span_id')}, {arg('trace_id')} from slice s
  where extract_arg(s.arg_set_id, 'debug.span_id') is not null"""


def child_env() -> dict[str, str]:
    """This environment without rank, OTLP or rltrace settings of the caller's."""
    return {k: v for k, v in os.environ.items()
            if (k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
                and not k.startswith(("OTEL_", "RLTRACE_"))) or k == "RLTRACE_PERFETTO_CHECK"}


def records(logdir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((logdir / "session_tracer").rglob("sessions-r*.jsonl")):
        out.extend(orjson.loads(line) for line in f.read_bytes().splitlines() if line)
    return out


def chrome_events(logdir: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted((logdir / "perf_tracer").rglob("traces-r*.jsonl")):
        out.extend(orjson.loads(line) for line in f.read_bytes().splitlines() if line)
    return out


def max_in_flight(intervals: list[tuple[int, int]]) -> int:
    """The most intervals open at once (one ending where another starts: not both)."""
    level = best = 0
    for _, d in sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals]):
        level += d
        best = max(best, level)
    return best


# -- the demo, with OTLP --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("native-demo")
    with OTLPReceiver() as rx:
        proc = subprocess.run(
            [sys.executable, "-m", "rltrace.cli", "demo", "--fileroot", str(root), "--ranks", "2",
             "--steps", "3", "--tasks", "4", "--samples", "4", "--otlp-endpoint", rx.grpc_endpoint,
             "--otlp-protocol", "grpc"],
            capture_output=True, text=True, timeout=180, cwd=root, env=child_env(),
        )
        assert proc.returncode == 0, proc.stderr
        spans = rx.spans()
    logdir = root / "logs" / current_user() / "demo" / "trial0"
    trace = logdir / "trace.pftrace"
    report = perfetto_check(trace, PHASES, SESSIONS, CONSUMED, TASK_FLOWS, COUNTERS, NAMELESS,
                            SESSION_OFF_TRACK, IDS)
    return {"proc": proc, "logdir": logdir, "trace": trace, "spans": spans, "report": report,
            "q": report["queries"], "records": records(logdir)}


def test_the_demo_writes_and_names_its_native_trace_and_it_loads_without_errors(demo: dict[str, Any]) -> None:
    assert f"native trace: {demo['trace']} (" in demo["proc"].stdout
    rep = demo["report"]
    assert rep["load_error"] is None and rep["import_errors"] == [] and rep["ok"] is True
    assert rep["processes"] == 2


def test_every_phase_slice_sits_in_its_sessions_turn_inside_its_session_slice(demo: dict[str, Any]) -> None:
    rows = demo["q"][PHASES]
    expected = sum(n for r in demo["records"] for n in r["phase_counts"].values())
    assert len(rows) == expected > 0
    for r in rows:
        if r["pcat"] == "rl.turn":  # phase -> its turn -> its session
            assert r["pturn"] == r["turn"] and r["gcat"] == "rl.session" and r["gsid"] == r["sid"], r
        else:  # a phase outside any turn: directly in its session
            assert r["pcat"] == "rl.session" and r["psid"] == r["sid"], r
    assert sum(r["pcat"] == "rl.turn" for r in rows) == len(rows)  # the demo's phases all have turns


def test_every_session_sits_on_its_own_track_under_its_task_under_its_ranks_process(
        demo: dict[str, Any]) -> None:
    rows = demo["q"][SESSIONS]
    recs = {(r["rank"], r["session_id"]): r for r in demo["records"]}
    assert len(rows) == len(recs) > 0
    for r in rows:
        rec = recs[(r["rank"], r["sid"])]
        assert r["strack"] == f"session {r['sid']} · {rec['status']}"
        assert r["ttrack"] == f"task {rec['task_id']} · step {rec['step']}"
        assert r["pname"].startswith(f"[actor] Rank {rec['rank']}, Process "), r
    assert demo["q"][SESSION_OFF_TRACK] == [{"n": 0}]  # no session work on a thread lane
    assert demo["q"][NAMELESS] == [{"n": 0}]  # and no track without a name


def test_rejected_and_failed_sessions_end_in_a_marked_instant_with_their_reason(
        demo: dict[str, Any]) -> None:
    q = f"select s.name, {arg('rl.session.id', 'sid')}, s.ts from slice s where s.category = 'rl.status'"
    rows = perfetto_check(demo["trace"], q)["queries"][q]
    ended = Counter(r["name"].split(":")[0] for r in rows)
    by_status = Counter(r["status"] for r in demo["records"])
    assert ended == {k: v for k, v in by_status.items() if k != "accepted"}
    reasons = {r["reason"] for r in demo["records"] if r["status"] == "rejected"}
    rejected = {r["name"] for r in rows if r["name"].startswith("rejected")}
    assert rejected == {f"rejected: {x}" for x in reasons}


def test_every_accepted_session_has_one_arrow_to_the_train_step_that_used_it(demo: dict[str, Any]) -> None:
    rows = demo["q"][CONSUMED]
    accepted = [r for r in demo["records"] if r["status"] == "accepted"]
    assert len(rows) == len(accepted) > 0
    assert len({(r["srank"], r["sid"]) for r in rows}) == len(rows)
    for r in rows:
        # the demo is a synchronous loop: step n's samples train in step n, on their own rank
        assert r["tstep"] == r["sstep"] and r["cproc"].startswith(f"[actor] Rank {r['srank']},"), r
        assert r["step_ts"] <= r["cts"] <= r["step_ts"] + r["step_dur"] and r["cts"] >= r["send"]
    assert demo["q"][TASK_FLOWS] == [{"n": len(demo["records"])}]  # task -> each of its sessions


def test_counters_agree_with_the_session_records_and_the_generate_spans(demo: dict[str, Any]) -> None:
    series: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in demo["q"][COUNTERS]:
        rank = int(r["pname"].split("Rank ")[1].split(",")[0])
        series[(r["name"], rank)].append(r["value"])
    sessions = demo["q"][SESSIONS]
    for rank in (0, 1):
        mine = [(s["ts"], s["ts"] + s["dur"]) for s in sessions if s["rank"] == rank]
        assert max(series[("sessions in flight", rank)]) == max_in_flight(mine)
        assert series[("sessions in flight", rank)][-1] == 0
        assert series[("queue depth (submitted, no phase yet)", rank)][-1] == 0
        for status in ("accepted", "rejected", "failed"):
            per_step = Counter(r["step"] for r in demo["records"]
                               if r["rank"] == rank and r["status"] == status)
            values = series.get((f"{status} in step", rank), [])
            assert max(values, default=0) == max(per_step.values(), default=0), status
            assert len(values) == sum(per_step.values())
        tokens = sum(e["args"]["gen_ai.usage.output_tokens"] for e in chrome_events(demo["logdir"])
                     if e.get("name") == "generate" and e["args"].get("rank") == rank)
        assert sum(series[("generated tokens/s", rank)]) == tokens > 0
        # the version moves when the weights do: one sample per version the rank's sessions
        # were generated with and its steps trained with
        versions = {r["policy_version"] for r in demo["records"] if r["rank"] == rank}
        assert series[("policy version", rank)] == sorted(versions) and len(versions) > 1


def test_every_slice_carries_the_otel_ids_of_the_span_the_receiver_got(demo: dict[str, Any]) -> None:
    got = {s.span_id: s for s in demo["spans"]}
    rows = demo["q"][IDS]
    assert len(rows) >= len(demo["records"]) * 2  # sessions, phases, tasks, train scopes
    for r in rows:
        span = got.get(r["span_id"])
        assert span is not None, f"{r['name']}: span {r['span_id']} never reached the OTLP receiver"
        assert span.trace_id == r["trace_id"]
    ours = {s.span_id for s in demo["spans"] if s.scope_name == "rltrace"}
    assert ours <= {r["span_id"] for r in rows}  # and every span rltrace sent has its slice


# -- torchrun: a rollout rank and a trainer rank ------------------------------------------------------
@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    need("torch", "torch is not installed (pip install torch==2.13.0)")
    root = tmp_path_factory.mktemp("native-torchrun")
    env = child_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(HELPERS / "torchrun_rl_worker.py"), str(root)],
        capture_output=True, text=True, timeout=240, cwd=root, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    logdir = root / "logs" / current_user() / "rl-torchrun" / "t0"
    trace = root / "run.pftrace"
    conv = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(logdir), "-o", str(trace)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert conv.returncode == 0, conv.stderr
    profiled = """select s.name, s.ts, s.dur, th.name as thread, pr.name as pname from slice s
      join thread_track tt on s.track_id = tt.id join thread th using(utid) join process pr using(upid)
      where s.name like 'aten::%' or s.name = 'train.step'"""
    report = perfetto_check(trace, CONSUMED, SESSIONS, profiled)
    return {"logdir": logdir, "report": report, "q": report["queries"], "profiled": profiled,
            "records": records(logdir), "stdout": conv.stdout}


def test_torchrun_sessions_of_the_rollout_rank_point_to_the_trainer_ranks_steps(
        torchrun: dict[str, Any]) -> None:
    rep = torchrun["report"]
    assert rep["ok"] is True and rep["import_errors"] == [] and rep["processes"] == 2
    recs = torchrun["records"]
    accepted = [r for r in recs if r["status"] == "accepted"]
    assert {r["rank"] for r in recs} == {0} and len(accepted) == 12  # 3 steps x 2 tasks x 2
    rows = torchrun["q"][CONSUMED]
    assert len(rows) == len(accepted)
    for r in rows:
        assert r["srank"] == 0 and r["cproc"].startswith("[trainer] Rank 1,"), r
        assert r["tstep"] == r["sstep"] and r["cts"] >= r["send"], r  # trained after it was made
    assert {r["pname"].split(",")[0] for r in torchrun["q"][SESSIONS]} == {"[rollout] Rank 0"}
    assert f"{len(accepted)} arrow(s) to train steps" in torchrun["stdout"]


def test_torch_profiler_slices_land_on_the_trainer_process_inside_the_profiled_step(
        torchrun: dict[str, Any]) -> None:
    rows = torchrun["q"][torchrun["profiled"]]
    steps = sorted((r for r in rows if r["name"] == "train.step"), key=lambda r: r["ts"])
    ops = [r for r in rows if r["name"].startswith("aten::")]
    assert len(steps) == 3 and ops
    profiled = steps[1]  # profile_steps([1])
    for op in ops:
        assert op["pname"] == profiled["pname"] and op["pname"].startswith("[trainer] Rank 1,")
        assert op["thread"].startswith("torch.profiler · ")
        # one epoch clock: the profiler's ops lie inside the step they were recorded in
        assert profiled["ts"] <= op["ts"] and op["ts"] + op["dur"] <= profiled["ts"] + profiled["dur"], op
    assert any(op["name"] == "aten::mm" for op in ops)


def test_a_torn_last_line_costs_only_itself(tmp_path: Path) -> None:
    """A rank killed mid-write: its file ends in half a line; the trace still loads."""
    from rltrace.cli.convert import convert

    logdir = tmp_path / "run"
    (logdir / "perf_tracer").mkdir(parents=True)
    lines = [
        {"pid": 7, "tid": 0, "ph": "M", "name": "process_name",
         "args": {"name": "[rollout] Rank 0, Process 7 · h"}},
        {"pid": 7, "tid": 1, "ph": "M", "name": "thread_name", "args": {"name": "MainThread"}},
        {"pid": 7, "tid": 1, "ph": "X", "ts": 1_000, "dur": 5.0, "name": "generate", "cat": "compute",
         "args": {"rl.phase": "generate", "rl.session.id": 1, "rl.task.id": 0, "rl.turn": 0, "rank": 0}},
        {"pid": 7, "tid": 1, "ph": "X", "ts": 999, "dur": 8.0, "name": "rl.session", "cat": "scheduler",
         "args": {"rl.session.id": 1, "rl.task.id": 0, "rl.session.status": "accepted", "rl.step": 0,
                  "rank": 0}},
    ]
    body = b"".join(orjson.dumps(x) + b"\n" for x in lines)
    (logdir / "perf_tracer" / "traces-r0.jsonl").write_bytes(body + b'{"pid":7,"tid":1,"ph":"X","ts":99')
    res = convert([logdir], tmp_path / "t.pftrace", progress=False)
    assert res.skipped_lines == 1 and res.sessions == 1
    assert "truncated last line" in res.skipped[0]
    rep = perfetto_check(tmp_path / "t.pftrace", SESSIONS, PHASES)
    assert rep["ok"] is True and len(rep["queries"][SESSIONS]) == 1 and len(rep["queries"][PHASES]) == 1
    # no rl.task span (the rank died before the task ended): the session still has a task track
    assert rep["queries"][SESSIONS][0]["ttrack"] == "task 0 · step 0"


# -- the merged Chrome JSON of the same demo -----------------------------------------------------------
JSON_SESSIONS = """select s.name, extract_arg(s.arg_set_id, 'args.rl.session.id') as sid,
    extract_arg(s.arg_set_id, 'args.rl.task.id') as task, th.name as thread, s.dur from slice s
  join thread_track tt on s.track_id = tt.id join thread th using(utid)
  where extract_arg(s.arg_set_id, 'args.rl.session.id') is not null"""
JSON_ARROWS = """select so.name as src, si.name as dst, si.category as dcat,
    st.name as step_name, so.ts + so.dur as send, si.ts as cts
  from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
  left join slice st on st.track_id = si.track_id and st.name = 'train.step'
       and si.ts between st.ts and st.ts + st.dur"""


def test_the_merged_json_puts_each_session_on_a_named_track_with_arrows(demo: dict[str, Any]) -> None:
    """AReaL's JSON format, with what it can hold of the structure: a track per session (named,
    never an anonymous lane) and flow events task -> session -> the train step that used it."""
    q_sessions, q_arrows = JSON_SESSIONS, JSON_ARROWS
    rep = perfetto_check(demo["logdir"] / "trace.json", q_sessions, q_arrows)
    assert rep["ok"] is True and rep["import_errors"] == []
    rows = rep["queries"][q_sessions]
    phases = sum(n for r in demo["records"] for n in r["phase_counts"].values())
    scored = sum(r["phase_counts"].get("reward", 0) for r in demo["records"])  # the demo scores each
    evaluations = [r for r in rows if r["name"] == EVALUATION]
    assert len(evaluations) == scored > 0 and all(r["dur"] == 0 for r in evaluations)
    assert len(rows) == len(demo["records"]) + phases + scored
    for r in rows:  # the session's own slice, its phases and its evaluations, on the session's track
        if r["name"] == EVALUATION:  # an event of the session span: it carries the session, not the task
            assert r["thread"].startswith(f"session {r['sid']} · task "), r
        else:
            assert r["thread"] == f"session {r['sid']} · task {r['task']}", r
    arrows = rep["queries"][q_arrows]
    from_tasks = [a for a in arrows if a["src"] == "rl.task"]
    assert len(from_tasks) == len(demo["records"]) and {a["dst"] for a in from_tasks} == {"rl.session"}
    consumed = [a for a in arrows if a["dcat"] == "rl.consume"]
    assert len(consumed) == sum(r["status"] == "accepted" for r in demo["records"])
    assert all(a["step_name"] == "train.step" and a["cts"] >= a["send"] for a in consumed)
    assert {a["src"] for a in consumed} == {"rl.session"}  # from the session's slice, not a phase's


def test_the_documented_two_queries_run_on_the_demos_native_trace(demo: dict[str, Any]) -> None:
    """The documented example queries (docs/guide/formats.md), as printed there, answer on the
    demo's trace."""
    import re

    from conftest import REPO

    queries = [q.strip().rstrip(";") for q in
               re.findall(r"```sql\n(.*?)```", (REPO / "docs" / "guide" / "formats.md").read_text(), re.S)]
    assert len(queries) == 2
    rep = perfetto_check(demo["trace"], *queries)
    slowest, waits = (rep["queries"][q] for q in queries)
    assert len(slowest) == 10
    assert all(r["task"].startswith("task ") and "Rank " in r["process"] for r in slowest)
    assert [r["ms"] for r in slowest] == sorted((r["ms"] for r in slowest), reverse=True)
    accepted = Counter(r["step"] for r in demo["records"] if r["status"] == "accepted")
    assert {r["step"]: r["samples"] for r in waits} == dict(accepted)
    assert all(0 <= r["avg_wait_ms"] <= r["max_wait_ms"] for r in waits)


def test_a_run_over_max_events_is_split_by_step_range_and_each_file_loads(
        demo: dict[str, Any], tmp_path: Path) -> None:
    from rltrace.cli.convert import convert

    lines = sum(1 for f in (demo["logdir"] / "perf_tracer").rglob("traces-r*.jsonl")
                for _ in f.open("rb"))
    res = convert([demo["logdir"]], tmp_path / "run.pftrace", progress=False, max_events=lines // 3)
    assert len(res.parts) >= 2
    steps = [(p.window.first_step, p.window.last_step) for p in res.parts]
    assert steps[0][0] == 0 and steps[-1][1] == 2
    for (_, last), (first, _) in pairwise(steps):
        assert first == last + 1  # consecutive, whole steps
    # a session's own slice (the one with its status) is in the file whose window holds its start;
    # the demo's ranks run unsynchronised, so a slower rank's session of an earlier step can start
    # in a later file, but no session starts before its own step does
    q = (f"select s.ts as ts, {arg('rl.step', 'step')} from slice s where s.category = 'rl.session' "
         f"and extract_arg(s.arg_set_id, 'debug.rl_session_status') is not null")
    seen = 0
    for part, (first, last) in zip(res.parts, steps, strict=True):
        assert part.path.name == f"run.steps-{first}-{last}.pftrace"
        rep = perfetto_check(part.path, q)
        assert rep["ok"] is True and rep["import_errors"] == []
        rows = rep["queries"][q]
        assert all(part.window.holds(r["ts"]) and r["step"] <= last for r in rows)
        seen += len(rows)
    assert seen == len(demo["records"])  # each session's own slice in exactly one file
    cli = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(demo["logdir"]), "-o",
                          str(tmp_path / "cli.json"), "--max-events", str(lines // 3)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "split by step range" in cli.stdout
    assert any(tmp_path.glob("cli.steps-0-*.json"))
