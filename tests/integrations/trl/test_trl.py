"""``rltrace.integrations.trl.instrument`` on a real TRL ``GRPOTrainer`` (CPU, no hub).

Each module-scoped run trains the tiny model of ``tiny_grpo.py`` for a few steps; the tests
compare what rltrace wrote with what TRL itself logged (``trainer.state.log_history``):
sessions = completions, tasks = groups, tokens = TRL's completion lengths, zero-advantage groups
= ``frac_reward_zero_std``, truncation = ``completions/clipped_ratio``, identical losses with and
without ``instrument``.  The reward function ``reward_slow`` sleeps in one step (a planted slow
workload, not synchronisation) so the report has something to name.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install 'rltrace[trl]': trl==1.16.0)")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_grpo as tg
from conftest import perfetto_check

import rltrace
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE
from rltrace.integrations import trl as rtrl

#: TRL's step (as logged) in which ``reward_slow`` sleeps
SLOW_STEP = 3
SLOW_S = 0.4
#: prompts whose first word is here get a constant reward: their groups have zero spread
FLAT = set(tg.WORDS[::2])
#: log_history keys that measure wall time (differ between any two runs)
TIMING_KEYS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def reward_len(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
    """Completion length, except a constant for the FLAT prompts (zero spread in their group)."""
    return [1.0 if p.split()[0] in FLAT else float(len(c.split()))
            for p, c in zip(prompts, completions, strict=True)]


def reward_slow(completions: list[str], trainer_state: Any, **kw: Any) -> list[float]:
    """A reward function that is slow in one step (TRL's ``global_step`` is the step's number - 1)."""
    if trainer_state.global_step == SLOW_STEP - 1:
        time.sleep(SLOW_S)
    return [0.0 for _ in completions]


def reward_messages(completions: list[list[dict[str, Any]]], **kw: Any) -> list[float]:
    """A conversational completion's number of messages (more with a tool call)."""
    return [float(len(c)) for c in completions]


REWARDS = [reward_len, reward_slow]


def _records(log_dir: Path) -> list[dict[str, Any]]:
    lines = (log_dir / "session_tracer" / "sessions-r0.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _events(log_dir: Path) -> list[dict[str, Any]]:
    lines = (log_dir / "perf_tracer" / "traces-r0.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _logged(history: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """TRL's per-step log entries (those with a loss), by step."""
    return {h["step"]: h for h in history if "loss" in h}


@pytest.fixture(scope="module")
def tok() -> Any:
    return tg.tokenizer()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> dict[str, Any]:
    """A traced run (rltrace configured by ``instrument`` itself) and the same run untraced, with
    rltrace configured but the trainer not instrumented."""
    rltrace.shutdown()
    base = tmp_path_factory.mktemp("trl")
    traced = tg.trainer(str(base / "traced"), REWARDS, tok, per_device_train_batch_size=8)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert rtrl.instrument(traced) is traced
        callbacks = len(traced.callback_handler.callbacks)
        rtrl.instrument(traced)  # a second call is a no-op
        second_callbacks = len(traced.callback_handler.callbacks)
    printed = out.getvalue()
    traced.train()
    rltrace.shutdown()
    plain_dir = base / "untraced-logs"
    rltrace.configure(fileroot=str(plain_dir), experiment_name="e", trial_name="t",
                      session_tracer={"enabled": True})
    plain = tg.trainer(str(base / "untraced"), REWARDS, tok, per_device_train_batch_size=8)
    plain.train()
    plain_log = Path(rltrace.runtime.get_pipeline().log_dir)  # type: ignore[union-attr]
    rltrace.shutdown()
    log_dir = Path(printed.split(" into ", 1)[1].split(" (", 1)[0])
    return {"traced": traced, "plain": plain, "printed": printed, "log_dir": log_dir,
            "plain_log": plain_log, "callbacks": (callbacks, second_callbacks), "base": base}


def test_unconfigured_instrument_configures_under_output_dir_and_prints_log_dir(runs: dict[str, Any]) -> None:
    log_dir: Path = runs["log_dir"]
    assert runs["printed"].count("rltrace: tracing GRPOTrainer into") == 1
    assert log_dir.is_relative_to(runs["base"] / "traced")
    assert (log_dir / "session_tracer" / "sessions-r0.jsonl").is_file()


def test_second_instrument_of_same_trainer_adds_nothing(runs: dict[str, Any]) -> None:
    first, second = runs["callbacks"]
    assert first == second
    events = _events(runs["log_dir"])
    assert sum(1 for e in events if e.get("name") == "train.step") == 4  # not 8: one callback


def test_losses_and_trl_logging_identical_traced_and_untraced(runs: dict[str, Any]) -> None:
    a, b = runs["traced"].state.log_history, runs["plain"].state.log_history
    assert [sorted(h) for h in a] == [sorted(h) for h in b]
    for ha, hb in zip(a, b, strict=True):
        assert {k: v for k, v in ha.items() if k not in TIMING_KEYS} == \
            {k: v for k, v in hb.items() if k not in TIMING_KEYS}
    assert len(_logged(a)) == 4
    assert rtrl.errors() == {}


def test_uninstrumented_trainer_produces_no_scopes_or_sessions(runs: dict[str, Any]) -> None:
    names = {e.get("name") for e in _events(runs["plain_log"]) if e.get("ph") == "X"}
    assert not any(str(n).startswith("train.") for n in names), names
    path = runs["plain_log"] / "session_tracer" / "sessions-r0.jsonl"
    assert not path.exists() or not path.read_text().strip()


def test_sessions_are_completions_and_tasks_are_groups(runs: dict[str, Any]) -> None:
    tr = runs["traced"]
    recs = _records(runs["log_dir"])
    per_step = tr.args.per_device_train_batch_size  # completions per step (one process)
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_step[r["step"]].append(r)
    assert sorted(by_step) == sorted(_logged(tr.state.log_history))
    for step, rs in by_step.items():
        assert len(rs) == per_step, step
        tasks = Counter(r["task_id"] for r in rs)
        assert len(tasks) == per_step // tr.num_generations
        assert set(tasks.values()) == {tr.num_generations}
        assert all(r["status"] == "accepted" for r in rs)
        assert all(r["policy_version"] == step - 1 for r in rs)  # the weights before the step


def test_tokens_per_session_equal_trl_completion_lengths(runs: dict[str, Any]) -> None:
    tr = runs["traced"]
    recs = _records(runs["log_dir"])
    logged = _logged(tr.state.log_history)
    seen = 0
    for step in sorted(logged):
        rs = [r for r in recs if r["step"] == step]
        out = [r["output_tokens"] for r in rs]
        assert sum(out) / len(out) == pytest.approx(logged[step]["completions/mean_length"])
        assert min(out) == logged[step]["completions/min_length"]
        assert max(out) == logged[step]["completions/max_length"]
        cut = sum(1 for r in rs if r.get("counters", {}).get(TRUNCATED) == 1)
        assert cut / len(rs) == pytest.approx(logged[step]["completions/clipped_ratio"])
        assert all((r["output_tokens"] == tr.max_completion_length) for r in rs
                   if r.get("counters", {}).get(TRUNCATED))
        seen += sum(r["input_tokens"] + r["output_tokens"] for r in rs)
        assert seen == logged[step]["num_tokens"]  # TRL's running count of prompt + completion


def test_zero_advantage_groups_equal_trl_frac_reward_zero_std(runs: dict[str, Any]) -> None:
    tr = runs["traced"]
    recs = _records(runs["log_dir"])
    total = 0
    for step, h in _logged(tr.state.log_history).items():
        rs = [r for r in recs if r["step"] == step]
        groups = len({r["task_id"] for r in rs})
        zero = {r["task_id"] for r in rs if r["reason"] == ZERO_ADVANTAGE}
        assert len(zero) == round(h["frac_reward_zero_std"] * groups), step
        for t in zero:  # a whole group or nothing
            assert all(r["reason"] == ZERO_ADVANTAGE for r in rs if r["task_id"] == t)
        total += len(zero)
    assert total > 0  # the FLAT prompts made some


def test_generate_and_reward_phases_have_real_intervals_inside_trl_sections(runs: dict[str, Any]) -> None:
    recs = _records(runs["log_dir"])
    events = [e for e in _events(runs["log_dir"]) if e.get("ph") == "X"]
    gens = [e for e in events if e["name"] == "train.transformers.generate"]
    prep = [e for e in events if e["name"] == "train._prepare_inputs"]
    rewards = {n: [e for e in events if e["name"] == f"train.{n}"] for n in ("reward_len", "reward_slow")}
    assert len(gens) == 4 and all(len(v) == 4 for v in rewards.values())
    for r in recs:
        (g,) = r["phases"]["generate"]
        assert g["turn"] == 0
        # the generation call's own interval: around TRL's generate section, inside its batch
        around = [e for e in gens if g["start_ts"] <= e["ts"] / 1e6 and
                  (e["ts"] + e["dur"]) / 1e6 <= g["end_ts"]]
        assert len(around) == 1
        assert g["end_ts"] - g["start_ts"] < 1.5 * around[0]["dur"] / 1e6 + 0.05
        assert any(e["ts"] / 1e6 <= g["start_ts"] and g["end_ts"] <= (e["ts"] + e["dur"]) / 1e6
                   for e in prep)
        assert len(r["phases"]["reward"]) == 2  # one execution per reward function
    slow = [e for e in events if e["name"] == "train.reward_slow"]
    assert [e["dur"] >= SLOW_S * 1e6 for e in sorted(slow, key=lambda e: e["ts"])] == \
        [s == SLOW_STEP for s in range(1, 5)]


def test_trl_sections_nest_under_step_scopes(runs: dict[str, Any]) -> None:
    events = [e for e in _events(runs["log_dir"]) if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"] == "train.step"), key=lambda e: e["ts"])
    assert [e["args"]["rl.step"] for e in steps] == [1, 2, 3, 4]
    for name in ("train._prepare_inputs", "train.transformers.generate", "train._calculate_rewards",
                 "train.compute_loss", "train.backward", "train.optimizer_step"):
        got = [e for e in events if e["name"] == name]
        assert len(got) == 4, name
        for e in got:
            assert e["args"]["framework"] == "trl"
            assert any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] for s in steps), name


def test_report_names_the_slow_reward_in_its_step(runs: dict[str, Any]) -> None:
    analysis = pytest.importorskip("rltrace.analysis", reason="needs the analysis extra")
    rep, _ = analysis.report(runs["log_dir"], runs["base"] / "report.json")
    phase = [f for f in rep["findings"] if f.get("kind") == "phase" and f.get("step") is not None]
    # the reward phase is flagged in the slow step and in no other (other phases may be flagged
    # too on a loaded machine: the first step's log-prob pass warms up)
    assert [f["step"] for f in phase if f["phase"] == "reward"] == [SLOW_STEP]
    # the reward function itself is named in its step, and in no other step
    sections = [f for f in rep["findings"] if f.get("kind") == "section"]
    assert [f["step"] for f in sections if f["section"] == "train.reward_slow"] == [SLOW_STEP], sections
    # the scope of the reward function itself, as the run summary lists it
    scopes = {s["name"]: s for s in rep["summary"]["scopes"]}
    assert scopes["train.reward_slow"]["max_s"] >= SLOW_S
    assert scopes["train.reward_len"]["max_s"] < SLOW_S / 4
    gp = rep["goodput"]
    zero = [t for t in gp["staleness"]["thrown_away"] if t["reason"] == ZERO_ADVANTAGE]
    assert zero and zero[0]["sessions"] == sum(1 for r in _records(runs["log_dir"])
                                               if r["reason"] == ZERO_ADVANTAGE)
    assert gp["share"]["wasted"] > 0


@pytest.mark.perfetto
def test_merged_trace_loads_in_perfetto(runs: dict[str, Any]) -> None:
    out = runs["base"] / "merged.json"
    cmd = [sys.executable, "-m", "rltrace.cli", "convert", str(runs["log_dir"]), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sql = ("select name, count(*) as n from slice where name like 'train.%' "
           "or name in ('generate', 'reward') group by name order by name")
    rep = perfetto_check(out, sql)
    assert rep["ok"] is True and rep["import_errors"] == []
    rows = {r["name"]: r["n"] for r in rep["queries"][sql]}
    assert rows["train.step"] == 4
    assert rows["generate"] == 32 and rows["reward"] == 64
    assert rows["train.transformers.generate"] == 4


# ---- staleness: a generation batch trained over two steps ---------------------------------------


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> dict[str, Any]:
    """``steps_per_generation=2``: each batch of 16 completions is trained 8 per step over two
    steps; three steps, so the second batch's second half is never trained."""
    rltrace.shutdown()
    base = tmp_path_factory.mktemp("trl-stale")
    rltrace.configure(fileroot=str(base), experiment_name="e", trial_name="t",
                      session_tracer={"enabled": True})
    tr = tg.trainer(str(base / "out"), [reward_len], tok, per_device_train_batch_size=8,
                    steps_per_generation=2, max_steps=3)
    rtrl.instrument(tr)
    tr.train()
    log_dir = Path(rltrace.runtime.get_pipeline().log_dir)  # type: ignore[union-attr]
    rltrace.shutdown()
    return {"trainer": tr, "log_dir": log_dir, "base": base}


def test_batch_reused_over_steps_shows_version_lag_in_report(stale: dict[str, Any]) -> None:
    analysis = pytest.importorskip("rltrace.analysis", reason="needs the analysis extra")
    recs = _records(stale["log_dir"])
    trained = [r for r in recs if r["status"] == "accepted"]
    assert Counter(r["step"] for r in trained) == {1: 8, 2: 8, 3: 8}
    assert Counter(r["policy_version"] for r in trained) == {0: 16, 2: 8}  # generated in steps 1, 3
    unused = [r for r in recs if r["status"] == "dropped"]
    assert len(unused) == 8 and {r["reason"] for r in unused} == {rtrl.UNUSED}
    rep, _ = analysis.report(stale["log_dir"], stale["base"] / "report.json")
    assert rep["goodput"]["staleness"]["lag"] == {"0": 16, "1": 8}
    # a step that trains a batch generated in an earlier step times its sessions from their
    # submit, never from its own later start: no negative completion times in the long tail
    tail = rep["longtail"]
    assert min(tail["cdf"]["completion_s"]) >= 0, tail["per_step"]


# ---- tracing failures never reach TRL ------------------------------------------------------------


def test_failing_hooks_are_counted_and_training_completes(tmp_path: Path, tok: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t",
                      session_tracer={"enabled": True})
    tr = tg.trainer(str(tmp_path / "out"), [reward_len], tok, max_steps=2)
    rtrl.instrument(tr)

    def broken(*a: Any, **k: Any) -> Any:  # fault injection: rltrace itself failing inside a hook
        raise RuntimeError("planted rltrace failure")

    monkeypatch.setattr(rtrl._runtime, "register_task", broken)
    monkeypatch.setattr(rtrl, "trace_scope", broken)
    before = rtrl.errors()
    tr.train()
    after = rtrl.errors()
    assert len(_logged(tr.state.log_history)) == 2
    assert after.get("_generate.enter", 0) - before.get("_generate.enter", 0) == 2
    assert after.get("profiling_context.enter", 0) > before.get("profiling_context.enter", 0)
    assert after.get("backward.enter", 0) - before.get("backward.enter", 0) == 2


def test_instrument_rejects_what_is_not_a_trainer() -> None:
    with pytest.raises(TypeError, match="expected a TRL/transformers Trainer"):
        rtrl.instrument(object())


# ---- another TRL trainer: RLOO ---------------------------------------------------------------------


def test_rloo_trainer_gets_steps_sections_and_sessions(tmp_path: Path, tok: Any) -> None:
    from trl import RLOOConfig, RLOOTrainer

    rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t",
                      session_tracer={"enabled": True})
    args = RLOOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=2, logging_steps=1, report_to=[], use_cpu=True,
                      seed=7, save_strategy="no", disable_tqdm=True, beta=0.0)
    tr = RLOOTrainer(model=tg.model(tok), reward_funcs=[reward_len], args=args, train_dataset=tg.dataset(),
                     processing_class=tok)
    rtrl.instrument(tr)
    tr.train()
    log_dir = Path(rltrace.runtime.get_pipeline().log_dir)  # type: ignore[union-attr]
    rltrace.shutdown()
    recs = _records(log_dir)
    names = Counter(e["name"] for e in _events(log_dir) if e.get("ph") == "X")
    assert names["train.step"] == 2 and names["train.compute_loss"] == 2
    assert names["train.transformers.generate"] == 2 and names["train.reward_len"] == 2
    logged = _logged(tr.state.log_history)
    for step, h in logged.items():
        rs = [r for r in recs if r["step"] == step]
        assert len(rs) == 8 and len({r["task_id"] for r in rs}) == 2
        assert sum(r["output_tokens"] for r in rs) / 8 == pytest.approx(h["completions/mean_length"])
        zero = {r["task_id"] for r in rs if r["reason"] == ZERO_ADVANTAGE}
        assert len(zero) == round(h["frac_reward_zero_std"] * 2)


# ---- tools: TRL's tool-calling loop ------------------------------------------------------------


def test_tool_calls_are_toolcall_phases_between_generate_turns(tmp_path: Path) -> None:
    pytest.importorskip("jmespath", reason="TRL's tool calling on transformers < 5.13 needs jmespath "
                                           "(pip install jmespath==1.0.1)")
    from trl import GRPOTrainer

    tok = tg.chat_tokenizer()
    mdl = tg.model(tok)
    # scripted sampling stands in for the random model (which never emits a tool call): TRL's
    # tool loop, response parsing, tool execution and loss run for real
    tg.script_generation(mdl, tok)
    rltrace.configure(fileroot=str(tmp_path), experiment_name="e", trial_name="t",
                      session_tracer={"enabled": True})
    tr = GRPOTrainer(model=mdl, reward_funcs=[reward_messages], processing_class=tok, tools=[tg.add],
                     args=tg.config(str(tmp_path / "out"), max_completion_length=64, max_steps=2,
                                    per_device_train_batch_size=8),
                     train_dataset=tg.chat_dataset())
    rtrl.instrument(tr)
    tr.train()
    log_dir = Path(rltrace.runtime.get_pipeline().log_dir)  # type: ignore[union-attr]
    rltrace.shutdown()
    recs = _records(log_dir)
    calls = 0
    for step, h in _logged(tr.state.log_history).items():
        rs = [r for r in recs if r["step"] == step]
        tools = [len(r["phases"].get("toolcall", [])) for r in rs]
        assert sum(tools) / len(rs) == pytest.approx(h["tools/call_frequency"])
        assert sum(r["output_tokens"] for r in rs) / len(rs) == pytest.approx(h["completions/mean_length"])
        for r in rs:
            gens = r["phases"]["generate"]
            if r["phases"].get("toolcall"):
                (tc,) = r["phases"]["toolcall"]
                assert [g["turn"] for g in gens] == [0, 1] and tc["turn"] == 0
                assert gens[0]["end_ts"] <= tc["start_ts"] <= tc["end_ts"] <= gens[1]["start_ts"]
                assert r["turns"] == 2
            else:
                assert [g["turn"] for g in gens] == [0]
        calls += sum(tools)
    assert calls > 0
    named = [e for e in _events(log_dir) if e.get("name") == "toolcall" and e.get("ph") == "X"]
    assert len(named) == calls and all(e["args"]["gen_ai.tool.name"] == "add" for e in named)
