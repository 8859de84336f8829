"""``rltrace.ray`` on a real local Ray cluster (``ray`` from the package index, CPU, 2 CPUs).

One module-scoped run of ``tests/helpers/ray_driver.py`` in its own interpreter (so Ray's
processes never touch pytest's): a driver configures rltrace once and starts Ray through
``rltrace.ray.init``; two rollout actors (sync and async, rank 2 planted slow), a trainer and a
third actor that is ``ray.kill``-ed run a small RL loop over three steps; OTLP goes to the
in-process receiver with a secret header.  The tests read what the run left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")

from conftest import REPO, perfetto_check

from rltrace.ray import WORKER_RANK_BASE
from rltrace.sessions.shared_counts import read_tally

ROOT = REPO
DRIVER = ROOT / "tests" / "helpers" / "ray_driver.py"
SECRET = "ray-secret-7f3a"
STEPS, SESSIONS = 3, 4


def _drive(out: Path, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RLTRACE_", "RAY_"))}
    proc = subprocess.run([sys.executable, str(DRIVER), str(out), *args], capture_output=True,
                          text=True, env=env, cwd=out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ray")
    _drive(out)
    result = json.loads((out / "result.json").read_text())
    result["logdir"] = out / "logs" / next(p.name for p in (out / "logs").iterdir()) / "ray" / "t"
    return result


def _records(logdir: Path, role: str) -> list[dict[str, Any]]:
    return [json.loads(line) for f in (logdir / "session_tracer" / role).glob("sessions-*.jsonl")
            for line in f.read_text().splitlines()]


def test_an_actor_created_without_actor_options_is_labelled_by_its_class() -> None:
    """In-process (no cluster): the creation options rltrace.ray.init adds to a plain
    ``Cls.remote()``; the cluster run below checks they reach the actor's process."""
    import ray

    import rltrace.ray as rray

    @ray.remote
    class Scorer:
        pass

    ranks = rray.RankAllocator()
    ranks.take(1)  # an actor_options(...) actor already holds rank 1
    own = {"env_vars": {"HF_HOME": "/cache"}, "config": {"setup_timeout_seconds": 30}}
    got = rray.labelled_options(Scorer, {"num_cpus": 0, "runtime_env": own}, ranks)
    assert got["num_cpus"] == 0  # the rest kept (Ray adds its config defaults)
    assert got["runtime_env"]["config"]["setup_timeout_seconds"] == 30
    assert got["runtime_env"]["env_vars"] == {"HF_HOME": "/cache", rray.ROLE_ENV: "Scorer",
                                              rray.RANK_ENV: "2"}
    assert own == {"env_vars": {"HF_HOME": "/cache"}, "config": {"setup_timeout_seconds": 30}}
    assert rray.labelled_options(Scorer, {}, ranks)["runtime_env"]["env_vars"][rray.RANK_ENV] == "3"
    labelled = rray.actor_options("judge", rank=7)  # explicit: kept as given, no rank taken
    assert rray.labelled_options(Scorer, labelled, ranks) is labelled
    assert ranks.take(None) == 4


def test_init_names_a_bad_flush_tasks_mode_and_the_ones_there_are() -> None:
    """Checked before anything starts (no cluster), whether rltrace is configured or not."""
    import rltrace.ray as rray

    with pytest.raises(ValueError, match="flush_tasks must be one of all, files, cycle, got 'al'"):
        rray.init(flush_tasks="al")


def test_ray_get_links_each_producing_call_once_and_no_more_than_the_link_limit(
        tmp_path: Path) -> None:
    """In-process (no cluster): object refs made from ids, mapped to producer spans as the
    wrapped ``_remote`` maps them; the cluster run checks the wrapping itself."""
    import ray
    from opentelemetry.trace import SpanContext, TraceFlags

    import rltrace
    from rltrace.ray.links import Submissions

    rltrace.configure(fileroot=str(tmp_path), exporters={"chrome": False})
    subs = Submissions()
    refs = [ray.ObjectRef(os.urandom(28)) for _ in range(300)]
    for i, ref in enumerate(refs):
        sc = SpanContext(0xABC0 + i // 2, 0x10 + i // 2, False, TraceFlags(1))  # 2 refs a call
        subs._note(ref, sc)
    with rltrace.trace_scope("consumer") as scope:
        assert subs.link_consumer(refs[:6] + refs[:6]) == 3  # three calls, each linked once
        assert subs.link_consumer(refs[:6]) == 0
        assert subs.link_consumer(refs) == 128 - 3  # the SDK's default link limit
        links = scope.extras()["links"]
    assert len(links) == 128
    assert len({(t.trace_id, t.span_id) for t, _ in links}) == 128
    assert {a["rl.link.type"] for _, a in links} == {"ray.get"}
    with rltrace.trace_scope("same.trace") as own:  # a call made under the consumer's own trace
        subs._note(refs[0], own.get_span_context())
        assert subs.link_consumer(refs[0]) == 0
    rltrace.shutdown()


def test_an_explicit_rank_already_held_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    import rltrace.ray as rray

    ranks = rray.RankAllocator()
    assert ranks.take(None) == 1 and ranks.take(3) == 3
    with caplog.at_level("WARNING", logger="rltrace"):
        assert ranks.take(3) == 3 and ranks.take(0) == 0
    held = [r.getMessage() for r in caplog.records]
    assert len(held) == 2 and "rank 3 is already held by another actor" in held[0]
    assert "rank 0 is already held by the driver" in held[1]


def test_every_actor_is_configured_from_the_driver_with_its_role_rank_and_files(
        run: dict[str, Any]) -> None:
    logdir = run["logdir"]
    traces = sorted(str(p.relative_to(logdir / "perf_tracer")) for p in
                    (logdir / "perf_tracer").rglob("traces-*.jsonl"))
    roles = Counter(Path(t).parent.name for t in traces if "/" in t)
    roles.pop("ray-worker", None)  # pooled workers (remote functions): tested below
    # a file per actor process; the reward actor was created without actor_options: its class
    # names its role, and it got the next free rank; so did the two the trainer created (one
    # plain, one with actor_options): the job's ranks, not the trainer's own count
    assert roles == {"rollout": 2, "trainer": 1, "doomed": 1, "Reward": 1, "restarted": 2,
                     "Judge": 1, "nested": 1}
    assert all("-p" in t for t in traces if "/" in t)  # per process: a restart gets new files
    assert {r["rank"] for r in _records(logdir, "rollout")} == {1, 2}
    assert {r["role"] for r in _records(logdir, "rollout")} == {"rollout"}
    by_role = {(s["resource"].get("rl.role"), s["resource"].get("rl.rank"))
               for s in run["spans"] if s["name"].endswith("ray.remote_worker")
               and s["resource"].get("rl.role") != "ray-worker"}
    # (the killed actor sent its constructor's span with its flush before the kill)
    assert by_role == {("rollout", 1), ("rollout", 2), ("trainer", 3), ("doomed", 4),
                       ("Reward", 5), ("restarted", 6), ("Judge", 7), ("nested", 8)}


def test_otlp_headers_reach_the_collector_from_workers_and_no_environment_or_file(
        run: dict[str, Any]) -> None:
    worker_spans = [s for s in run["spans"] if s["resource"].get("rl.role") is not None]
    assert worker_spans  # workers exported over OTLP, all requests carried the header
    assert run["secret_headers"] == [SECRET]
    assert not run["environ_has_secret"] and not run["worker_environ_has_secret"]
    for f in Path(run["logdir"]).rglob("*"):
        if f.is_file():
            assert SECRET not in f.read_text(errors="replace"), f


def test_actor_work_is_in_the_drivers_trace_and_carries_the_step(run: dict[str, Any]) -> None:
    spans = run["spans"]
    by_id = {s["span_id"]: s for s in spans}
    updates = [s for s in spans if s["name"] == "train.update"]
    assert len(updates) == STEPS
    for upd in updates:  # trainer scope -> Ray worker span -> Ray caller span -> train.step
        chain = [upd]
        while chain[-1]["parent"] in by_id:
            chain.append(by_id[chain[-1]["parent"]])
        assert [c["name"] for c in chain] == ["train.update", "Trainer.train ray.remote_worker",
                                              "Trainer.train ray.remote", "train.step"]
        assert len({c["trace_id"] for c in chain}) == 1
        assert upd["attributes"]["rl.step"] == chain[-1]["attributes"]["rl.step"]
    for name in ("rollout.batch", "rl.session"):  # sync and async actors: the driver's step
        got = Counter(s["attributes"].get("rl.step") for s in spans
                      if s["name"] == name and s["resource"].get("rl.role") == "rollout")
        want = SESSIONS * 2 if name == "rl.session" else 1
        assert got == {step: want for step in range(STEPS)}, (name, got)
    records = _records(run["logdir"], "rollout")
    assert Counter(r["step"] for r in records) == {step: 2 * SESSIONS for step in range(STEPS)}


def test_sessions_run_by_actors_are_children_of_the_drivers_task_in_one_trace(
        run: dict[str, Any]) -> None:
    """The driver registers a task per step and calls the rollout actors under it; the actors
    register sessions without a task id: they join the driver's task, in its trace."""
    spans = run["spans"]
    tasks = [s for s in spans if s["name"] == "rl.task" and s["resource"].get("rl.role") is None]
    assert len(tasks) == STEPS
    # the killed actor's own tasks have ids of their own (worker ids start at pid << 32)
    assert not {t["attributes"]["rl.task.id"] for t in tasks} & {
        s["attributes"]["rl.task.id"] for s in spans
        if s["name"] == "rl.task" and s["resource"].get("rl.role") == "doomed"}
    for task in tasks:  # the driver's (a task span is recorded once, where it was registered)
        mine = [s for s in spans if s["name"] == "rl.session"
                and s["attributes"]["rl.task.id"] == task["attributes"]["rl.task.id"]]
        assert len(mine) == 2 * SESSIONS
        assert {s["resource"]["rl.rank"] for s in mine} == {1, 2}  # sync and async actors
        assert {(s["trace_id"], s["parent"]) for s in mine} == {(task["trace_id"], task["span_id"])}
    records = _records(run["logdir"], "rollout")
    by_task = {t["attributes"]["rl.task.id"]: t["trace_id"] for t in tasks}  # hex, as in records
    assert Counter(r["task_id"] for r in records) == {t: 2 * SESSIONS for t in by_task}
    assert all(r["trace_id"] == by_task[r["task_id"]] for r in records)


def test_ray_shutdown_flushes_every_actor_and_ray_kill_loses_only_the_unflushed(
        run: dict[str, Any]) -> None:
    """The driver calls plain ``ray.shutdown()``; the actors export only when flushed
    (``flush_interval_s`` is an hour), so every record on disk is the shutdown's flush."""
    # the killed one too (flushing it is skipped: dead); the restarted one once
    assert run["announced_actors"] == 8
    assert len(run["warnings"]) == 1 and run["warnings"][0].startswith("rltrace.ray: 1 of 8 actors")
    assert len(_records(run["logdir"], "rollout")) == 2 * SESSIONS * STEPS  # every session
    # the killed actor: 3 sessions exported before the kill, 5 recorded after its last export
    # cycle (the README's bound: what the actor finished in its last flush_interval_s), in its
    # files and over OTLP alike
    assert len(_records(run["logdir"], "doomed")) == 3
    doomed = Counter(s["name"] for s in run["spans"] if s["resource"].get("rl.role") == "doomed")
    assert doomed["rl.session"] == 3 and doomed["rl.task"] == 3
    # ...and counted: the actor's tally (shared memory, kept by the kernel after the SIGKILL)
    # says how many of its sessions never reached its files
    [lost] = [x for x in run["losses"] if x["role"] != "ray-worker"]
    assert {k: lost[k] for k in ("role", "rank", "pid", "registered", "finalized", "written",
                                 "unwritten", "exited")} == {
        "role": "doomed", "rank": 4, "pid": run["pids"]["doomed"], "registered": 8,
        "finalized": 8, "written": 3, "unwritten": 5, "exited": False}
    assert f"rank 4 (doomed, pid {run['pids']['doomed']}): 5 of its 8 sessions not written (0 open)" \
        in run["warnings"][0]


def test_a_remote_function_killed_midway_has_its_unwritten_sessions_counted(
        run: dict[str, Any]) -> None:
    """A pooled worker has no handle to flush it by: ``ray.shutdown()`` reads the tally of each
    pooled worker that ran a remote function.  The killed one registered two sessions (one
    finalized) that never reached its files; the workers whose calls ended hold nothing
    unwritten and are not named."""
    assert run["died_midway"]
    [lost] = [x for x in run["losses"] if x["role"] == "ray-worker"]
    assert lost["unwritten"] == 2 and lost["finalized"] - lost["written"] == 1
    assert lost["rank"] >= WORKER_RANK_BASE and not lost["exited"]
    assert len(run["pooled_warnings"]) == 1
    assert (f"rank {lost['rank']} (ray-worker, pid {lost['pid']}): 2 of its "
            f"{lost['registered']} sessions not written (1 open)") in run["pooled_warnings"][0]


def test_actors_created_by_an_actor_get_the_jobs_ranks_and_flush_at_a_graceful_end(
        run: dict[str, Any]) -> None:
    """The trainer actor created two: a plain ``Judge.remote()`` it keeps, and one with
    ``actor_options("nested")`` it lets go (Ray ends it gracefully).  Both got the job's next
    free ranks (7, 8: not the trainer's own count from 1); the one let go flushed at its exit,
    which its tally records, so ``ray.shutdown()``'s flush counts it as ended, not lost."""
    logdir = run["logdir"]
    assert run["nested_exited"]
    for role, rank in (("Judge", 7), ("nested", 8)):
        pid = run["pids"][role.lower()]
        [traces] = (logdir / "perf_tracer" / role).glob(f"traces-r{rank}-p{pid}.jsonl")
        assert "reward.score" in traces.read_text()  # flushed: by ray.shutdown(), at its exit
    nested = read_tally(logdir / "ray" / f"tally-r8-p{run['pids']['nested']}.bin")
    assert nested is not None and nested["exited"] == 1
    assert sorted(x["role"] for x in run["losses"]) == ["doomed", "ray-worker"]  # not nested


def test_an_actor_restarted_by_ray_keeps_distinct_files_and_its_rank(run: dict[str, Any]) -> None:
    """The actor crashed (``os._exit``) after exporting 2 sessions; Ray restarted it in a new
    process, which recorded 2 more (flushed by ``ray.shutdown()``): both processes' files are
    there, side by side, with the same role and rank."""
    first, second = run["pids"]["restarted"]
    assert first != second
    logdir = run["logdir"]
    files = sorted(p.name for p in (logdir / "session_tracer" / "restarted").iterdir()
                   if not p.name.startswith("."))  # (a killed process's flight ring is hidden)
    assert files == sorted(f"sessions-r6-p{pid}.jsonl" for pid in (first, second))
    records = _records(logdir, "restarted")
    assert len(records) == 4 and {(r["role"], r["rank"]) for r in records} == {("restarted", 6)}
    assert len({r["session_id"] for r in records}) == 4  # ids of their own in each process


def test_the_merged_trace_shows_each_actor_as_a_named_process(run: dict[str, Any],
                                                              tmp_path: Path) -> None:
    merged = tmp_path / "merged.json"
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(run["logdir"]),
                           "-o", str(merged)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    res = perfetto_check(merged, "select name from process where name is not null")
    names = sorted(r["name"].split(" · ")[0] for r in
                   res["queries"]["select name from process where name is not null"])
    pid = run["pids"]
    assert f"[trainer] Rank 3, Process {pid['trainer']}" in names
    assert f"[doomed] Rank 4, Process {pid['doomed']}" in names
    assert f"[Reward] Rank 5, Process {pid['reward']}" in names
    assert f"[Judge] Rank 7, Process {pid['judge']}" in names  # created by the trainer
    assert f"[nested] Rank 8, Process {pid['nested']}" in names
    for restarted in pid["restarted"]:  # both processes of the restarted actor
        assert f"[restarted] Rank 6, Process {restarted}" in names
    assert sum(n.startswith("[rollout] Rank ") for n in names) == 2


def test_the_native_trace_puts_actor_sessions_under_their_task_with_arrows_from_the_drivers_task(
        run: dict[str, Any], tmp_path: Path) -> None:
    """The driver registers one task per step; the rollout actors run its sessions.  In the
    native trace each actor's sessions sit on tracks under a task track of the actor's process,
    and the driver's task slice (another file) has an arrow to every one of them."""
    trace = tmp_path / "ray.pftrace"
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(run["logdir"]),
                           "-o", str(trace)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sessions = """select extract_arg(s.arg_set_id, 'debug.rl_task_id') as task, st.name as strack,
        tt.name as ttrack, pr.name as pname from slice s join track st on s.track_id = st.id
        join track tt on st.parent_id = tt.id join process_track ptt on ptt.id = tt.id
        join process pr on pr.upid = ptt.upid where s.category = 'rl.session'"""
    arrows = """select extract_arg(so.arg_set_id, 'debug.rl_task_id') as task, po.name as src,
        extract_arg(si.arg_set_id, 'debug.rl_task_id') as stask
        from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
        join process_track pto on pto.id = so.track_id join process po on po.upid = pto.upid
        where so.category = 'rl.task' and si.category = 'rl.session'"""
    res = perfetto_check(trace, sessions, arrows)
    assert res["ok"] is True and res["import_errors"] == []
    records = _records(run["logdir"], "rollout")
    rows = [r for r in res["queries"][sessions] if r["pname"].startswith("[rollout] ")]
    assert len(rows) == len(records) == STEPS * 2 * SESSIONS
    for r in rows:
        assert r["ttrack"].startswith(f"task {r['task']} · step "), r
    got = Counter(r["task"] for r in res["queries"][arrows] if r["task"] == r["stask"])
    driver_tasks = {r["task_id"] for r in records}
    assert {t: got[t] for t in driver_tasks} == {t: 2 * SESSIONS for t in driver_tasks}
    assert all(not r["src"].startswith("[rollout] ") for r in res["queries"][arrows]
               if r["task"] in driver_tasks)  # drawn from the driver's task slice


def test_rltrace_top_shows_each_actor_as_a_rank_with_its_role(run: dict[str, Any]) -> None:
    """``rltrace top --once`` over the run: a row per process, with the actor's rank and role
    (the live files each worker published), the pooled workers in their band."""
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "top", "--once",
                           str(run["logdir"])], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    ranks_table = proc.stdout.split("long tail")[0]  # the first table: a row per process
    rows = {tuple(line.split()[:3]) for line in ranks_table.splitlines()
            if line.split()[:1] and line.split()[0].isdigit()}
    pid = run["pids"]
    for role, rank, p in (("trainer", 3, pid["trainer"]), ("doomed", 4, pid["doomed"]),
                          ("Reward", 5, pid["reward"]), ("Judge", 7, pid["judge"]),
                          ("nested", 8, pid["nested"])):
        assert (str(rank), role, str(p)) in rows, (role, rows)
    assert {r[1] for r in rows if r[0] in ("1", "2")} == {"rollout"}
    assert {(r[0], r[1]) for r in rows if r[0] == "6"} == {("6", "restarted")}
    workers = {r for r in rows if r[1] == "ray-worker"}
    assert workers and all(int(r[0]) >= WORKER_RANK_BASE for r in workers)


def test_the_report_names_the_planted_slow_actor_in_every_step(run: dict[str, Any],
                                                               tmp_path: Path) -> None:
    """Rollout rank 2's generate takes 30 ms more: it holds every step's rollout."""
    pytest.importorskip("numpy", reason="numpy is not installed (pip install 'rltrace[analysis]')")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "report", str(run["logdir"]),
                           "--format", "json", "-o", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    # two rollout ranks: the slower one of each step holds the barrier (too few for MAD
    # outliers; sessions of actors outside the steps are in none of them)
    held = {r["step"]: (r["slowest_rank"], r["held_by"]["rank"])
            for r in rep["stragglers"]["per_step"]}
    assert held == {step: (2, 2) for step in range(STEPS)}
    # the rollout actors, and the pooled workers that ran the step's remote function (their
    # ranks are a band of their own)
    for r in rep["stragglers"]["per_step"]:
        assert {"1", "2"} <= set(r["rollout_s"]), r
        assert all(int(k) >= WORKER_RANK_BASE for k in set(r["rollout_s"]) - {"1", "2"}), r
    # each actor is a rank with its role: the findings name both
    assert {rep["inputs"]["roles"][r] for r in ("1", "2")} == {"rollout"}
    assert {role for rank, role in rep["inputs"]["roles"].items()
            if int(rank) >= WORKER_RANK_BASE} == {"ray-worker"}
    assert all(r["held_by"]["role"] == "rollout" for r in rep["stragglers"]["per_step"])
    named = [f for f in rep["findings"] if f["kind"] == "straggler" and f.get("rank") == 2]
    assert any(f"Rank 2 (rollout) is the slowest rank in {STEPS} of {STEPS} steps" in f["text"]
               for f in named)


def test_remote_functions_run_in_workers_with_ranks_of_their_own_and_nothing_is_lost(
        run: dict[str, Any]) -> None:
    """A remote function runs in a pooled worker: rank from the band at WORKER_RANK_BASE, one
    per process, never the driver's 0 nor an actor's.  Its worker is flushed when each call
    ends, before the result reaches the caller: every session record is in the files and
    every span reached the collector, though ``flush_interval_s`` is an hour and
    ``ray.shutdown()`` ends pooled workers without their exit handlers."""
    scored = run["scored"]
    assert [s["submitted_in"] for s in scored] == list(range(STEPS))
    assert all(s["sent_before_result"] for s in scored)  # OTLP too, before the result came
    every = _records(run["logdir"], "ray-worker")
    # (a pooled worker SIGKILLed inside a call (the losses test) had finalized a session
    # it never wrote: the next worker configured on the log dir restored it from its flight ring)
    records = [r for r in every if not r.get("recovered")]
    assert len(records) == STEPS and len(every) - len(records) <= 1
    assert all(r["rank"] >= WORKER_RANK_BASE for r in every)
    assert Counter(r["step"] for r in records) == {step: 1 for step in range(STEPS)}
    spans = run["spans"]
    phases = [s for s in spans if s["name"] == "reward"
              and s["resource"].get("rl.role") == "ray-worker"]
    rank_of = {s["resource"]["process.pid"]: s["resource"]["rl.rank"] for s in phases}
    assert sorted(s["resource"]["process.pid"] for s in phases) == sorted(s["pid"] for s in scored)
    assert sorted(r["rank"] for r in records) == sorted(rank_of[s["pid"]] for s in scored)
    # two calls that ran at once, so in two processes: two ranks of the band
    met = run["met"]
    assert [m["met"] for m in met] == [2, 2] and len({m["pid"] for m in met}) == 2
    ranks = {s["resource"]["process.pid"]: s["resource"]["rl.rank"] for s in spans
             if s["name"] == "meet"}
    assert set(ranks) == {m["pid"] for m in met}
    assert len(set(ranks.values())) == 2 and min(ranks.values()) >= WORKER_RANK_BASE
    assert all(ranks[pid] == rank_of[pid] for pid in set(ranks) & set(rank_of))


def test_ray_get_links_the_consuming_step_to_the_call_that_produced_the_result(
        run: dict[str, Any]) -> None:
    """A remote function and an actor method are called in step N and their results taken
    (``ray.get``) in step N+1: step N+1's span links to both calls' spans in step N's trace,
    whose subtrees hold the workers' spans; the last result is taken outside any step: no
    link."""
    spans = run["spans"]
    by_id = {s["span_id"]: s for s in spans}
    steps = {s["attributes"]["rl.step"]: s for s in spans if s["name"] == "train.step"}
    calls = {by_id[s["parent"]]["attributes"]["rl.step"]: s for s in spans
             if s["name"] == "__main__.score ray.remote"}
    pings = {by_id[s["parent"]]["attributes"]["rl.step"]: s for s in spans
             if s["name"] == "Rollout.ping ray.remote"}
    assert sorted(calls) == sorted(pings) == list(range(STEPS))
    for step in range(STEPS):
        links = {(t, sp) for t, sp, attrs in steps[step]["links"]
                 if attrs.get("rl.link.type") == "ray.get"}
        want = set() if step == 0 else {(c[step - 1]["trace_id"], c[step - 1]["span_id"])
                                        for c in (calls, pings)}
        assert links == want, step
        assert calls[step]["trace_id"] == pings[step]["trace_id"] == steps[step]["trace_id"]
    workers = [s for s in spans if s["name"] == "__main__.score ray.remote_worker"]
    assert {(w["trace_id"], w["parent"]) for w in workers} == {
        (c["trace_id"], c["span_id"]) for c in calls.values()}


def test_driver_exit_without_ray_shutdown_flushes_every_actor(tmp_path: Path) -> None:
    """The driver's last line is a remote call: no ``ray.shutdown()``, no flush of its own.
    At driver exit Ray ends the job's actors gracefully, and the actor's exit flushes the
    sessions it never exported otherwise (``flush_interval_s`` is an hour)."""
    _drive(tmp_path, "--exit-without-shutdown")
    logdir = tmp_path / "logs" / next(p.name for p in (tmp_path / "logs").iterdir()) / "ray" / "exit"
    assert len(_records(logdir, "rollout")) == SESSIONS
