"""The live state (``rltrace.pipeline.live_state``) and ``rltrace top``: real pipelines, real files,
real terminal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS

import rltrace
from rltrace.config import ConfigError, current_user
from rltrace.pipeline import live_state as live_mod
from rltrace.runtime import get_pipeline

sys.path.insert(0, str(HELPERS))
from live_run import expected


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def read_live(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def _configure(tmp_path: Path, **kw: Any) -> Path:
    rltrace.configure(fileroot=str(tmp_path), session_tracer__enabled=True, flush_at_exit=False,
                      **{"live_interval_s": 0.05, "flush_interval_s": 0.05, **kw})
    p = get_pipeline()
    assert p is not None and p.live is not None
    return p.live.path


def test_publisher_shows_open_sessions_by_phase_with_ages_and_the_step(tmp_path: Path) -> None:
    path = _configure(tmp_path, rank=1, world_size=2, role="rollout")
    assert path == tmp_path / "logs" / current_user() / "default" / "trial0" / "live" / "rollout" / \
        "live-r1.json"
    t_reg = time.time()
    with rltrace.step(7):
        task = rltrace.register_task("prompt-1")
        gen = [rltrace.register_session(task) for _ in range(3)]
        tool = rltrace.register_session(task)
        idle = rltrace.register_session(task)
        done = [rltrace.register_session(task) for _ in range(3)]
        for sid in gen:
            rltrace.trace_session_event("mark_generate_start", session_id=sid)
        rltrace.trace_session_event("mark_toolcall_start", session_id=tool)
        for sid, status in zip(done, ("accepted", "accepted", "failed"), strict=True):
            rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
    t_phase = time.time()

    def published() -> dict[str, Any] | None:
        doc = read_live(path)
        return doc if doc and doc["finished"]["total"] == 3 and doc["open"]["sessions"] == 5 else None

    doc = wait_for(published, what="the exporter thread to publish 5 open and 3 finished sessions")
    now = doc["ts"]
    assert (doc["format"], doc["rank"], doc["world_size"], doc["role"]) == ("rltrace.live/1", 1, 2, "rollout")
    assert doc["step"] == 7 and doc["closed"] is False and doc["pid"] == os.getpid()
    op = doc["open"]
    assert op["by_phase"] == {"generate": 3, "toolcall": 1} and op["between_phases"] == 1
    assert op["tasks"] == 1 and op["sampled_every"] == 1
    assert [(e["step"], e["open"]) for e in op["by_step"]] == [(7, 5)]
    assert sum(c for _, c in op["by_step"][0]["age_hist"]) == 5
    listed = op["listed"]
    assert [e["session_id"] for e in listed] == [*gen, tool, idle]  # oldest first
    for e in listed:
        assert e["task_id"] == "prompt-1" and e["step"] == 7
        assert now - t_phase - 0.01 <= e["age_s"] <= now - t_reg + 0.01
    assert [e["phases"] for e in listed] == [["generate"]] * 3 + [["toolcall"], []]
    assert all(e["phase_age_s"] <= e["age_s"] for e in listed[:4]) and listed[4]["phase_age_s"] is None
    assert doc["finished"]["by_status"] == {"accepted": 2, "failed": 1}
    (st,) = doc["steps"]
    assert st["step"] == 7 and st["done"] == 3 and sum(c for _, c in st["hist"]) == 3
    assert st["by_status"] == {"accepted": 2, "failed": 1} and st["max_s"] > 0
    # shutdown: open sessions are written as pending, and the file says the rank is done
    rltrace.shutdown()
    final = read_live(path)
    assert final is not None and final["closed"] is True and final["open"]["sessions"] == 0
    assert final["finished"]["by_status"] == {"accepted": 2, "failed": 1, "pending": 5}


def test_live_interval_zero_turns_it_off_and_negative_is_an_error(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), session_tracer__enabled=True, live_interval_s=0,
                      flush_at_exit=False)
    p = get_pipeline()
    assert p is not None and p.live is None
    rltrace.register_session()
    rltrace.flush()
    assert not list(tmp_path.rglob("live-r*.json"))
    with pytest.raises(ConfigError, match="live_interval_s"):
        rltrace.configure(fileroot=str(tmp_path), live_interval_s=-1)


_READER = textwrap.dedent("""
    import json, sys, pathlib
    path, stop, ready = map(pathlib.Path, sys.argv[1:4])
    reads = bad = 0
    sizes = set()
    ready.write_text("1")
    while not stop.exists():
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        reads += 1
        sizes.add(len(data))
        try:
            json.loads(data)
        except ValueError:
            bad += 1
    print(json.dumps({"reads": reads, "bad": bad, "sizes": len(sizes)}))
""")


def test_live_file_is_always_valid_json_for_a_reader_in_another_process(tmp_path: Path) -> None:
    path = _configure(tmp_path, live_interval_s=3600)  # published here, by hand, as fast as it goes
    p = get_pipeline()
    assert p is not None and p.live is not None
    p.live.publish()
    script = tmp_path / "reader.py"
    script.write_text(_READER)
    stop, ready = tmp_path / "stop", tmp_path / "ready"
    reader = subprocess.Popen([sys.executable, str(script), str(path), str(stop), str(ready)],
                              stdout=subprocess.PIPE, text=True)
    try:
        wait_for(ready.exists, what="the reader process to start")
        held = []
        for i in range(400):  # the file grows and shrinks: a torn write would show as bad JSON
            if i % 40 < 20:
                held.append(rltrace.register_session())
            elif held:
                rltrace.trace_session_event("mark_finalized", session_id=held.pop(), status="accepted")
            with p._lock:
                assert p.live.publish()
    finally:
        stop.write_text("1")
        out, _ = reader.communicate(timeout=60)
    res = json.loads(out)
    assert res["bad"] == 0, res
    assert res["reads"] > 50 and res["sizes"] > 5, res
    assert p.live.errors == 0
    assert not [f for f in path.parent.iterdir() if f.name.endswith(".tmp")]  # no temp file left


def test_live_file_stays_bounded_with_100k_open_sessions(tmp_path: Path) -> None:
    path = _configure(tmp_path, live_interval_s=3600)
    p = get_pipeline()
    assert p is not None and p.live is not None
    n = 100_000
    with rltrace.step(3):
        sids = [rltrace.register_session() for _ in range(n)]
    with rltrace.step(4):
        sids += [rltrace.register_session() for _ in range(10)]
    for i, sid in enumerate(sids):
        rltrace.trace_session_event("mark_generate_start" if i % 2 else "mark_toolcall_start",
                                    session_id=sid)
    with p._lock:
        t0 = time.perf_counter()
        assert p.live.publish()
        cost = time.perf_counter() - t0
    data = path.read_bytes()
    doc = json.loads(data)
    print(f"publish with {n} open sessions: {cost * 1000:.1f} ms, {len(data)} bytes")
    assert len(data) < 64 * 1024
    op = doc["open"]
    assert op["sessions"] == n + 10 and len(op["listed"]) == live_mod.LIST_CAP
    assert [e["session_id"] for e in op["listed"]] == sids[:live_mod.LIST_CAP]  # the oldest
    assert op["sampled_every"] == -(-(n + 10) // live_mod.SAMPLE_CAP)
    for phase in ("generate", "toolcall"):  # estimated from every k-th session
        assert abs(op["by_phase"][phase] - (n + 10) / 2) < 0.02 * n, op["by_phase"]
    by_step = {e["step"]: e["open"] for e in op["by_step"]}
    assert set(by_step) <= {3, 4} and abs(by_step[3] - n) < 0.02 * n and doc["step"] == 4
    # the per-step statistics are bounded too: STEPS_KEPT steps
    for step in range(20):
        with rltrace.step(100 + step):
            rltrace.trace_session_event("mark_finalized", session_id=rltrace.register_session(),
                                        status="accepted")
    rltrace.flush()
    with p._lock:
        assert p.live.publish()
    doc = json.loads(path.read_bytes())
    assert [s["step"] for s in doc["steps"]] == list(range(112, 120))
    assert doc["finished"]["total"] == 20 and doc["step"] == 119


# ---- rltrace top -------------------------------------------------------------------------------


def _top_once(logdir: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "top", str(logdir), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_top_once_on_a_finished_run_says_it_is_not_live(tmp_path: Path) -> None:
    path = _configure(tmp_path, rank=0)
    with rltrace.step(2):
        sid = rltrace.register_session()
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        rltrace.register_session()
    rltrace.shutdown()
    logdir = path.parents[1]
    out = _top_once(logdir)
    assert "run finished: not live" in out and "closed" in out
    # a rank that stopped publishing without closing (killed, hung): its last state, not live
    doc = json.loads(path.read_bytes())
    doc.update(closed=False, ts=time.time() - 600)
    path.write_text(json.dumps(doc))
    out = _top_once(logdir)
    assert "not live: last update 10.0m ago" in out and "stale" in out
    (tmp_path / "empty").mkdir()
    assert "no live files yet" in _top_once(tmp_path / "empty")  # (a missing one: an error)


def _rank_rows(screen: str) -> dict[int, dict[str, str]]:
    """The rows of the ranks table, by rank, as header -> cell."""
    lines = screen.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["rank"] and "flight" in ln), None)
    if start is None:
        return {}
    header = lines[start].split()
    rows: dict[int, dict[str, str]] = {}
    for ln in lines[start + 2:]:
        cells = ln.split()
        if not cells:
            break
        if len(cells) == len(header) and cells[0].isdigit():
            rows[int(cells[0])] = dict(zip(header, cells, strict=True))
    return rows


def _matches(rows: dict[int, dict[str, str]], docs: dict[int, dict[str, Any]]) -> bool:
    if set(rows) != set(docs):
        return False
    for rank, doc in docs.items():
        row, op = rows[rank], doc["open"]
        want = {"step": str(doc["step"]), "flight": str(op["sessions"]),
                "idle": str(op["between_phases"]), "done": str(doc["finished"]["total"]),
                **{p: str(c) for p, c in op["by_phase"].items()}}
        if any(row.get(k) != v for k, v in want.items()):
            return False
    return True


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed (apt-get install -y tmux)")
def test_top_in_a_real_terminal_follows_a_two_rank_run(tmp_path: Path) -> None:
    ranks, steps = 2, 2
    control = tmp_path / "control"
    control.mkdir()
    logdir = tmp_path / "logs" / current_user() / "live" / "trial0"
    files = {r: logdir / "live" / f"live-r{r}.json" for r in range(ranks)}
    procs = [subprocess.Popen([sys.executable, str(HELPERS / "live_run.py"), str(tmp_path), str(r),
                               str(ranks), str(steps), str(control)]) for r in range(ranks)]
    sock = f"rltrace-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock]
    try:  # top refuses a log dir that does not exist (yet): start it once the ranks made theirs
        wait_for(logdir.is_dir, 60, "the ranks to make their log dir")
        subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "200", "-y", "60",
                        f"{sys.executable} -m rltrace.cli top {logdir} --interval 0.2"], check=True,
                       env={**os.environ, "TERM": "xterm-256color"})

        def pane() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True,
                                  text=True, check=True).stdout

        def files_at(step: int) -> dict[int, dict[str, Any]] | None:
            docs = {r: read_live(f) for r, f in files.items()}
            for r, d in docs.items():
                want = expected(r, step)
                if not d or d["step"] != step or d["open"]["sessions"] != want["flight"]:
                    return None
            return docs  # type: ignore[return-value]

        def screen_matching(docs: dict[int, dict[str, Any]]) -> str | None:
            shot = pane()
            return shot if _matches(_rank_rows(shot), docs) else None

        shots = []
        for step in range(steps):
            docs = wait_for(lambda s=step: files_at(s), 60, f"both ranks to publish step {step}")
            for r, d in docs.items():  # the helper's figures, as the files hold them
                want = expected(r, step)
                assert d["open"]["by_phase"] == {"generate": want["generate"], "toolcall": want["toolcall"]}
                assert d["open"]["between_phases"] == want["idle"]
                assert d["finished"]["total"] == sum(expected(r, s)["flight"] for s in range(step))
            shot = wait_for(lambda d=docs: screen_matching(d), 30,
                            f"rltrace top to show step {step} as the files hold it")
            assert "live" in shot.splitlines()[0]
            shots.append(shot)
            (control / f"go-{step}").write_text("go")
        assert shots[0] != shots[1]
        rows0, rows1 = _rank_rows(shots[0]), _rank_rows(shots[1])
        for r in range(ranks):
            assert (rows0[r]["step"], rows1[r]["step"]) == ("0", "1")
            assert (rows0[r]["flight"], rows1[r]["flight"]) == (str(expected(r, 0)["flight"]),
                                                                str(expected(r, 1)["flight"]))
            assert rows0[r]["done"] == "0" and rows1[r]["done"] == str(expected(r, 0)["flight"])
        assert "long tail" in shots[1] and "oldest sessions in flight" in shots[1]
        for p in procs:
            assert p.wait(timeout=60) == 0
        wait_for(lambda: "run finished: not live" in pane(), 30, "top to say the run finished")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_demo_live_shows_top_on_the_run_then_its_summary(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rltrace.cli", "demo", "--live", "--fileroot", str(tmp_path), "--ranks", "2",
         "--steps", "1", "--tasks", "2", "--samples", "2"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    top, _, rest = out.partition("rltrace demo: 2 rank(s)")
    assert "rltrace top" in top and "run finished: not live" in top  # the last frame: ranks closed
    rows = _rank_rows(top.split("rltrace top")[-1])
    assert set(rows) == {0, 1}
    assert all((r["role"], r["step"], r["flight"], r["state"]) == ("actor", "0", "0", "closed")
               for r in rows.values())
    assert "sessions: 8" in rest  # then the demo's own summary
    logdir = tmp_path / "logs" / current_user() / "demo" / "trial0"
    docs = [json.loads(f.read_bytes()) for f in sorted(logdir.rglob("live-r*.json"))]
    assert [d["rank"] for d in docs] == [0, 1] and all(d["closed"] for d in docs)
    assert sum(d["finished"]["total"] for d in docs) == 8
    # goodput in top: the step's time split on both ranks, thrown-away shares and tokens/s
    assert [[g["step"] for g in d["goodput"]] for d in docs] == [[0], [0]]
    last = " ".join(top.split("rltrace top")[-1].split())  # as one line, however it wrapped
    assert "step time, step 0 (2 ranks): productive " in last and " wasted " in last
    assert "goodput: thrown away " in last and "tokens/s" in last
    assert "policy version lag at finalize: 0 for " in last  # staleness: the demo sets versions


def test_top_splits_each_steps_time_into_the_reports_goodput_buckets(tmp_path: Path) -> None:
    """A real run with all four buckets planted (accepted and rejected generations, a gap in the
    rollout with nothing running, train compute, a weight sync): the live state splits each
    step's time exactly as ``rltrace report`` does from the files (one implementation,
    :mod:`rltrace.accounting.goodput`), and ``top`` prints that split."""
    pytest.importorskip("numpy", reason="the report needs the analysis extra: "
                                        "pip install 'rltrace[analysis]'")
    from rltrace.analysis import ReportOptions, build_report, load_run

    path = _configure(tmp_path, rank=0)
    for step in range(3):
        with rltrace.step(step):
            with rltrace.trace_scope("train.rollout"):
                for i in range(4):
                    sid = rltrace.register_session()
                    with rltrace.trace_session_phase("generate", session_id=sid):
                        time.sleep(0.004)  # the planted workload, not a wait for another thread
                    rejected = i == 3
                    rltrace.trace_session_event("mark_finalized", session_id=sid,
                                                status="rejected" if rejected else "accepted",
                                                reason="stale_weight" if rejected else None)
                    time.sleep(0.002)  # idle: no phase running
            with rltrace.trace_scope("train.ppo_update"):
                time.sleep(0.005)
            with rltrace.trace_scope("train.weight_sync"):
                time.sleep(0.002)
    rltrace.shutdown()
    live = {e["step"]: e for e in json.loads(path.read_bytes())["goodput"]}
    logdir = path.parents[1]
    report = build_report(load_run(logdir, ReportOptions(progress=False)))["goodput"]
    assert sorted(live) == [r["step"] for r in report["by_step"]] == [0, 1, 2]
    for row in report["by_step"]:
        got = live[row["step"]]
        assert got["scoped"] is True
        assert got["wall_s"] == pytest.approx(row["wall_s"], abs=1e-5)
        for k in ("productive", "overhead", "idle", "wasted"):
            assert got["seconds"][k] > 0.0
            assert got["seconds"][k] == pytest.approx(row["seconds"][k], abs=2e-5), k
        assert sum(got["seconds"].values()) == pytest.approx(got["wall_s"], abs=5e-6)  # each rounded to 1 µs
    newest = live[2]["seconds"]
    line = next(ln for ln in _top_once(logdir).splitlines() if ln.startswith("step time"))
    pct = {k: f"{100 * v / sum(newest.values()):.1f}%" for k, v in newest.items()}
    assert line.startswith("step time, step 2 (1 rank): "
                           + " · ".join(f"{k} {v}" for k, v in pct.items())), line
