"""Goodput in the report: planted runs with known answers (a trainer idle for a known share, a
known fraction of tokens thrown away, a known version lag), and a real run recorded by rltrace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import HELPERS

import rltrace
from rltrace.analysis import ReportOptions, build_report, load_run
from rltrace.analysis.render import render_md
from rltrace.config import current_user

sys.path.insert(0, str(HELPERS))
from synth_run import session_record, x_event

T0 = 1_800_000_000.0
STEP_S = 100.0


def meta(pid: int, rank: int, role: str) -> list[bytes]:
    head = b'{"pid":%d,"tid":0,"ph":"M","name":' % pid
    return [head + b'"process_name","args":{"name":"[%s] Rank %d"}}\n' % (role.encode(), rank),
            head + b'"process_labels","args":{"labels":"rank=%d,world_size=2,role=%s"}}\n'
            % (rank, role.encode())]


def step_scopes(pid: int, step: int, rollout_s: float, ppo_s: float, sync_s: float,
                version: int | None = None) -> list[bytes]:
    """``train.step`` holding ``train.rollout``, ``train.ppo_update`` and ``train.weight_sync``."""
    t = T0 + step * STEP_S
    args: dict[str, Any] = {"rl.step": step}
    if version is not None:
        args["rl.policy.version"] = version
    return [x_event(pid, 1, t, rollout_s, "train.rollout", args={"global_step": step}),
            x_event(pid, 1, t + rollout_s, ppo_s, "train.ppo_update"),
            x_event(pid, 1, t + rollout_s + ppo_s, sync_s, "train.weight_sync", "comm"),
            x_event(pid, 1, t, rollout_s + ppo_s + sync_s, "train.step", args=args)]


def write(logdir: Path, rank: int, role: str, lines: list[bytes], records: list[dict[str, Any]]) -> None:
    (logdir / "perf_tracer").mkdir(parents=True, exist_ok=True)
    (logdir / "session_tracer").mkdir(parents=True, exist_ok=True)
    trace = b"".join(meta(100 + rank, rank, role) + lines)
    (logdir / "perf_tracer" / f"traces-r{rank}.jsonl").write_bytes(trace)
    (logdir / "session_tracer" / f"sessions-r{rank}.jsonl").write_bytes(
        b"".join(orjson.dumps(r) + b"\n" for r in records))


def rollout_sessions(rank: int, step: int, n: int, each_s: float, rejected: set[int], tokens: int,
                     versions: list[int | None]) -> list[dict[str, Any]]:
    """``n`` sessions run one after another from the step's start, each one generate phase of
    ``each_s`` seconds and ``tokens`` output tokens; those in ``rejected`` are rejected."""
    out = []
    t = T0 + step * STEP_S
    for i in range(n):
        rec = session_record(task_id=step * 100 + i // 4, session_id=step * 100 + i, rank=rank, step=step,
                             status="rejected" if i in rejected else "accepted",
                             reason="stale_weight" if i in rejected else None, submit=t,
                             phases={"generate": [(t, t + each_s, 0)]}, final=t + each_s)
        rec["output_tokens"], rec["input_tokens"] = tokens, 10
        if versions[i] is not None:
            rec["policy_version"] = versions[i]
        out.append(rec)
        t += each_s
    return out


def goodput_of(logdir: Path) -> dict[str, Any]:
    return build_report(load_run(logdir, ReportOptions(progress=False)))["goodput"]


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, Any]:
    """Rank 0 (rollout+train, synchronous): each of 3 steps rolls out 10 sessions back to back
    for 50 s of a 60 s rollout (3 rejected), trains 35 s, syncs 5 s.  Rank 1 (trainer) waits 40 s
    for rollouts, trains 50 s, syncs 10 s.  Step s trains with policy version s + 1; sessions of
    even index were generated with version s (one behind), the rest with s + 1."""
    logdir = tmp_path / "run"
    r0, r1, recs = [], [], []
    for step in range(3):
        r0 += step_scopes(100, step, 60.0, 35.0, 5.0, version=step + 1)
        r1 += step_scopes(101, step, 40.0, 50.0, 10.0, version=step + 1)
        recs += rollout_sessions(0, step, 10, 5.0, {1, 4, 7}, 100,
                                 [step if i % 2 == 0 else step + 1 for i in range(10)])
    write(logdir, 0, "actor", r0, recs)
    write(logdir, 1, "trainer", r1, [])
    return {"logdir": logdir, "gp": goodput_of(logdir)}


def test_a_trainer_waiting_for_rollouts_is_idle_for_the_planted_share(planted: dict[str, Any]) -> None:
    trainer = planted["gp"]["by_role"]["trainer"]["share"]
    assert trainer["idle"] == pytest.approx(0.40, abs=0.01)
    assert trainer["productive"] == pytest.approx(0.50, abs=0.01)
    assert trainer["overhead"] == pytest.approx(0.10, abs=0.01)
    assert trainer["wasted"] == pytest.approx(0.0, abs=0.01)


def test_the_rollout_ranks_step_splits_into_the_planted_buckets(planted: dict[str, Any]) -> None:
    """50 s busy of a 60 s rollout: 35 s accepted + 15 s rejected phase time, 10 s idle; 35 s
    train compute; 5 s sync."""
    actor = planted["gp"]["by_role"]["actor"]["share"]
    assert actor["productive"] == pytest.approx(0.70, abs=0.01)
    assert actor["wasted"] == pytest.approx(0.15, abs=0.01)
    assert actor["idle"] == pytest.approx(0.10, abs=0.01)
    assert actor["overhead"] == pytest.approx(0.05, abs=0.01)
    for row in planted["gp"]["by_step"]:
        assert sum(row["share"].values()) == pytest.approx(1.0)


def test_the_planted_fraction_of_generated_tokens_is_thrown_away(planted: dict[str, Any]) -> None:
    tok = planted["gp"]["tokens"]
    assert tok["generated"] == 3 * 10 * 100 and tok["accepted"] == 3 * 7 * 100
    assert tok["wasted_share"] == pytest.approx(0.30, abs=0.01)
    per_step = planted["gp"]["by_step"][0]["tokens_per_s"]
    assert per_step["generated"] == pytest.approx(1000 / STEP_S)
    thrown = planted["gp"]["staleness"]["thrown_away"]
    assert thrown == [{"status": "rejected", "reason": "stale_weight", "sessions": 9,
                       "seconds": pytest.approx(45.0), "tokens": 900}]


def test_the_planted_version_lag_of_trained_samples(planted: dict[str, Any]) -> None:
    """Accepted sessions: even indexes 0, 2, 6, 8 lag 1, odd ones 3, 5, 9 lag 0 (1, 4, 7 are
    rejected), in each of 3 steps."""
    st = planted["gp"]["staleness"]
    assert st["lag"] == {"0": 9, "1": 12}
    assert st["trained"] == 21 and st["unknown"] == 0 and st["max_lag"] == 1
    assert st["mean_lag"] == pytest.approx(12 / 21)


def test_the_report_says_it_in_words_and_tables(planted: dict[str, Any], tmp_path: Path) -> None:
    rep = build_report(load_run(planted["logdir"], ReportOptions(progress=False)))
    texts = [f["text"] for f in rep["findings"] if f["kind"] == "goodput"]
    assert texts[0] == ("Where the ranks' step time went: productive 60.0%, overhead 7.5%, idle 25.0%, "
                        "wasted 7.5%.")
    assert any("30.0% of generated tokens thrown away" in t for t in texts)
    assert any("lag: 0 for 42.9%, 1 for 57.1%" in t for t in texts)
    md = render_md(rep, [])
    assert "## Goodput: where the step time and the tokens went" in md
    assert "| all | – | 60.0% | 7.5% | 25.0% | 7.5% |" in md


def test_a_real_run_records_tokens_and_versions_the_report_turns_into_goodput(tmp_path: Path) -> None:
    """rltrace itself records what goodput needs: tokens from the phases' payloads, the version
    sessions were generated with, and the version each train step trained with."""
    rltrace.configure(fileroot=str(tmp_path), experiment_name="gp", trial_name="t", flush_at_exit=False,
                      session_tracer={"enabled": True})
    for step in range(2):
        rltrace.set_policy_version(step)
        with rltrace.step(step):
            with rltrace.trace_scope("train.rollout", args={"global_step": step}):
                for i in range(4):
                    sid = rltrace.register_session()
                    with rltrace.trace_session_phase("generate", {"input_tokens": 50},
                                                     session_id=sid) as ph:
                        ph.set_end_payload(output_tokens=10 * (i + 1))
                    rltrace.trace_session_event("mark_finalized", session_id=sid,
                                                status="rejected" if i == 3 else "accepted",
                                                reason="stale_weight" if i == 3 else None)
            with rltrace.trace_scope("train.ppo_update"):
                sum(range(10_000))
    rltrace.shutdown()
    logdir = tmp_path / "logs" / current_user() / "gp" / "t"
    records = [orjson.loads(line) for f in (logdir / "session_tracer").rglob("sessions-r*.jsonl")
               for line in f.read_bytes().splitlines()]
    assert sorted(r["output_tokens"] for r in records) == [10, 10, 20, 20, 30, 30, 40, 40]
    assert {r["input_tokens"] for r in records} == {50}
    assert {(r["step"], r["policy_version"]) for r in records} == {(0, 0), (1, 1)}
    gp = goodput_of(logdir)
    assert gp["tokens"]["generated"] == 200 and gp["tokens"]["wasted"] == 80
    assert gp["staleness"]["lag"] == {"0": 6}
    for row in gp["by_step"]:
        assert sum(row["share"].values()) == pytest.approx(1.0)


def test_set_policy_version_refuses_what_is_not_a_version() -> None:
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(TypeError, match=r"set_policy_version: the version must be an int >= 0"):
            rltrace.set_policy_version(bad)  # type: ignore[arg-type]
    rltrace.set_policy_version(None)
    assert rltrace.policy_version() is None


def test_a_session_finalized_after_the_policy_moved_on_records_both_versions(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="gp", trial_name="lag", flush_at_exit=False,
                      session_tracer={"enabled": True})
    rltrace.set_policy_version(4)
    stale, fresh = rltrace.register_session(), rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=fresh, status="accepted")
    rltrace.set_policy_version(6)  # two weight updates land while the first session still runs
    rltrace.trace_session_event("mark_finalized", session_id=stale, status="accepted")
    rltrace.shutdown()
    logdir = tmp_path / "logs" / current_user() / "gp" / "lag"
    records = {r["session_id"]: r for f in (logdir / "session_tracer").rglob("sessions-r*.jsonl")
               for r in map(orjson.loads, f.read_bytes().splitlines())}
    assert records[stale]["policy_version"] == 4 and records[stale]["policy_version_at_finalize"] == 6
    assert records[fresh]["policy_version"] == 4 and "policy_version_at_finalize" not in records[fresh]


def test_areals_own_version_notion_gives_the_staleness_without_set_policy_version(tmp_path: Path) -> None:
    """AReaL's trainer never calls rltrace: its version is ``global_step + 1`` from the end of its
    ``train.update_weights`` scope (what its engines' ``set_version`` get).  Through rltrace's
    AReaL namespace the sessions then record the version they were generated with, the step's
    scopes the version it trained with, and the report turns them into the version lag."""
    from rltrace import perf_tracer

    perf_tracer.configure({"enabled": True, "fileroot": str(tmp_path), "experiment_name": "gp",
                           "trial_name": "areal", "session_tracer": {"enabled": True}}, rank=0)
    early = None
    for g in range(3):
        with perf_tracer.trace_scope("train.rollout", args={"global_step": g}):
            for i in range(3):
                sid = perf_tracer.register_session()
                if g == 1 and i == 0:
                    early = sid  # still running when the weights move on: finalized after them
                    continue
                with perf_tracer.trace_session_phase("generate", session_id=sid):
                    pass
                perf_tracer.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        with perf_tracer.trace_scope("train.ppo_update", args={"global_step": g}):
            pass
        with perf_tracer.trace_scope("train.update_weights", "communication", args={"global_step": g}):
            assert rltrace.policy_version() == (g or None)  # moves on when the update has ended
        assert rltrace.policy_version() == g + 1
        with perf_tracer.trace_scope("train.save", "io", args={"global_step": g}):
            pass
        if g == 1:
            perf_tracer.trace_session_event("mark_finalized", session_id=early, status="accepted")
    with pytest.raises(RuntimeError):  # a failed update does not move the version
        with perf_tracer.trace_scope("train.update_weights", args={"global_step": 3}):
            raise RuntimeError("broadcast failed")
    assert rltrace.policy_version() == 3
    perf_tracer.save(force=True)
    rltrace.shutdown()
    logdir = tmp_path / "logs" / current_user() / "gp" / "areal"
    records = {r["session_id"]: r for f in (logdir / "session_tracer").rglob("sessions-r*.jsonl")
               for r in map(orjson.loads, f.read_bytes().splitlines())}
    assert sorted((r["step"], r.get("policy_version")) for r in records.values()) == [
        (0, None)] * 3 + [(1, 1)] * 3 + [(2, 2)] * 3
    assert records[early]["policy_version_at_finalize"] == 2
    st = goodput_of(logdir)["staleness"]
    assert st["lag"] == {"0": 6}  # steps 1 and 2 trained with versions 1 and 2
    assert st["unknown"] == 3  # step 0 ran before AReaL's first update: no version yet


def test_set_policy_version_wins_over_areals_notion_and_works_with_tracing_off() -> None:
    from rltrace import perf_tracer

    update = perf_tracer.trace_scope("train.update_weights", args={"global_step": 4})
    update.set_attribute("bytes", 1)  # the scope's own API, as on any scope (a no-op: tracing off)
    with update:
        pass
    assert rltrace.policy_version() == 5  # tracing is off: the version moves all the same
    rltrace.set_policy_version(40)
    with perf_tracer.trace_scope("train.update_weights", args={"global_step": 5}):
        pass
    assert rltrace.policy_version() == 40


# -- the cross-rank critical path ---------------------------------------------------------------------
def test_a_planted_slow_sample_on_another_rank_sets_the_steps_critical_path(tmp_path: Path) -> None:
    """Rank 1 rolls out 8 samples at once (each one 5 s generate; in step 1 sample 3 takes 20 s);
    rank 0 only trains: it waits for them, trains 50 s and syncs 5 s, so it ends every step.  The
    step's critical path crosses to rank 1's slow sample, which at the median would have saved
    15 s (the next sample ended 15 s before it); the other steps have nothing to save there."""
    logdir = tmp_path / "run"
    r0: list[bytes] = []
    r1: list[bytes] = []
    recs: list[dict[str, Any]] = []
    for step in range(3):
        t = T0 + step * STEP_S
        slow = 20.0 if step == 1 else 5.0
        for i in range(8):
            g = slow if i == 3 else 5.0
            recs.append(session_record(task_id=step * 10 + i // 4, session_id=step * 10 + i, rank=1,
                                       step=step, status="accepted", reason=None, submit=t,
                                       phases={"generate": [(t, t + g, 0)]}, final=t + g))
        r1.append(x_event(101, 1, t, slow + 0.5, "train.rollout", args={"global_step": step}))
        r1.append(x_event(101, 1, t, slow + 1.0, "train.step", args={"rl.step": step}))
        r0 += step_scopes(100, step, slow + 0.5, 50.0, 5.0)
    write(logdir, 0, "trainer", r0, [])
    write(logdir, 1, "rollout", r1, recs)
    rep = build_report(load_run(logdir, ReportOptions(progress=False)))
    cp = rep["critical_path"]
    assert [s["ended_by_rank"] for s in cp["steps"]] == [0, 0, 0]
    step1 = cp["steps"][1]
    assert step1["length_s"] == pytest.approx(20.5 + 55.0, rel=1e-6)
    link = step1["links"][0]
    assert (link["kind"], link["rank"], link["session_id"], link["segment"], link["turn"]) == (
        "session", 1, 13, "generate", 0)
    assert link["crosses_ranks"] is True
    assert link["what_if_s"] == pytest.approx(15.0, rel=0.01)
    assert [x["what"] for x in step1["links"][1:]] == ["train.ppo_update", "train.weight_sync"]
    for other in (cp["steps"][0], cp["steps"][2]):
        assert other["links"][0]["what_if_s"] == pytest.approx(0.0, abs=1e-6)
    assert cp["top_links"][0]["session_id"] == 13 and cp["top_links"][0]["rank"] == 1
    text = next(f["text"] for f in rep["findings"] if f["kind"] == "critical path")
    assert "rank 1 step 1 session 13: generate turn 0 (15.00 s over 1 step(s))" in text
