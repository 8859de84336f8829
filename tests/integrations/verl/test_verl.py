"""``rltrace.integrations.verl`` on verl's own code, on the CPU (verl 0.9.1, imported once here).

* The trainer timers: ``marked_timer`` as verl's trainers imported it (``ray_trainer``, the
  fully-async trainer and rollouter, one-step-off, separation), instrumented after import.
* The agent loop: verl's ``AgentLoopWorker`` (built from verl's own config, a tiny model
  directory whose tokenizer is trained here) runs its ``ToolAgentLoop`` with verl's function
  tool loaded from ``calc_tool.py`` through ``function_tool_path``.  The inference server is
  scripted (``ScriptedServer``: no vLLM/SGLang server can run on the CPU here), and so is the
  reward-loop worker (``ScriptedReward``: verl's stands on a Ray actor and a reward model).
* The fully-async message queue (verl's ``MessageQueue`` class, in-process).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

verl = pytest.importorskip("verl", reason="verl is not installed (pip install 'rltrace[verl]', "
                                          "after torch==2.13.0)")

from verl_agent_fixtures import (  # noqa: E402
    RESPONSE_LENGTH,
    ScriptedReward,
    ScriptedServer,
    model_dir,
    two_prompt_batch,
    verl_config,
)

import rltrace  # noqa: E402
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE  # noqa: E402
from rltrace.integrations import verl as rv  # noqa: E402
from rltrace.integrations._verl_agent import QUEUE_COUNTER  # noqa: E402
from rltrace.testing import capture_spans, read_jsonl  # noqa: E402

# verl's trainers that import ``marked_timer`` by name (the v1 trainers need the
# ``transfer_queue`` package, which verl 0.9.1 does not install: they are not imported here)
TRAINERS = (
    "verl.trainer.ppo.ray_trainer",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.experimental.fully_async_policy.fully_async_rollouter",
    "verl.experimental.separation.ray_trainer",
    "verl.experimental.one_step_off_policy.ray_trainer",
)


@pytest.fixture(scope="module")
def trainers() -> dict[str, Any]:
    """verl's trainer modules, imported BEFORE ``instrument()`` (as a user's script may)."""
    import importlib

    mods = {name: importlib.import_module(name) for name in TRAINERS}
    originals = {name: m.marked_timer for name, m in mods.items()}
    rv.instrument(ray_workers=False)
    return {"modules": mods, "originals": originals}


class Trainer:
    """Runs verl's timers the way ``RayPPOTrainer.fit`` does, with the trainer's ``global_steps``
    on ``self`` (what the step scope reads)."""

    def __init__(self, timer: Any, global_steps: int) -> None:
        self.timer = timer
        self.global_steps = global_steps

    def fit_step(self, fail_in: str | None = None) -> dict[str, float]:
        timing_raw: dict[str, float] = {}
        with self.timer("step", timing_raw):
            for name in ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights"):
                with self.timer(name, timing_raw, color="red"):
                    if name == fail_in:
                        raise RuntimeError(f"planted failure in {name}")
        return timing_raw


class StepClock:
    """A scripted ``perf_counter`` for verl's timer (``codetiming``): every reading 0.25 s later,
    so ``timing_raw`` has the same values in every run that takes the same readings."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.25
        return self.now


def test_every_trainer_module_holds_the_traced_timer_after_instrument(trainers: dict[str, Any]) -> None:
    for name, module in trainers["modules"].items():
        assert module.marked_timer is not trainers["originals"][name], name
        assert module.marked_timer._rltrace_original is trainers["originals"][name], name
    from verl.utils import debug, profiler

    assert debug.marked_timer._rltrace_original is not None  # later imports get the traced one
    assert profiler.simple_timer._rltrace_original is not None


def test_timers_become_train_scopes_nested_under_the_step_with_real_timestamps(
        trainers: dict[str, Any], tmp_path: Path) -> None:
    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    with capture_spans(tmp_path) as cap:
        timing = Trainer(timer, global_steps=7).fit_step()
        spans = {s.name: s for s in cap.spans()}
    step = spans["train.step"]
    assert step.attributes["rl.step"] == 7
    assert step.attributes["args.framework"] == "verl"
    for name in ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights"):
        span = spans[f"train.{name}"]
        assert span.parent is not None and span.parent.span_id == step.context.span_id, name
        assert span.attributes["args.framework"] == "verl"
        assert span.attributes["rl.step"] == 7
        assert step.start_time <= span.start_time <= span.end_time <= step.end_time
        # the scope wraps verl's own timer: it lasts at least what timing_raw says
        assert (span.end_time - span.start_time) / 1e9 >= timing[name]
    assert set(timing) == {"step", "gen", "reward", "old_log_prob", "adv", "update_actor",
                           "update_weights"}


def test_timing_raw_keeps_exactly_its_keys_and_values(trainers: dict[str, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import codetiming._timer

    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    untraced = timer._rltrace_original
    runs = []
    for fn, traced in ((untraced, False), (timer, True)):
        clock = StepClock()
        monkeypatch.setattr(codetiming._timer, "time", clock)
        if traced:
            with capture_spans(tmp_path) as cap:
                runs.append(Trainer(fn, 3).fit_step())
                assert len(cap.by_name("train.gen")) == 1
        else:
            runs.append(Trainer(fn, 3).fit_step())
    assert runs[0] == runs[1]
    assert runs[0]["gen"] == 0.25


def test_a_failing_section_keeps_verls_behaviour_and_marks_the_scope(
        trainers: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import codetiming._timer

    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    seen = []
    for fn in (timer._rltrace_original, timer):
        monkeypatch.setattr(codetiming._timer, "time", StepClock())
        trainer = Trainer(fn, 2)
        with capture_spans(tmp_path) as cap:
            with pytest.raises(RuntimeError, match="planted failure in adv"):
                trainer.fit_step(fail_in="adv")
            spans = {s.name: s for s in cap.spans()}
        seen.append(spans)
    assert not seen[0]  # untraced: no scopes
    assert seen[1]["train.adv"].status.status_code.name == "ERROR"
    assert seen[1]["train.step"].status.status_code.name == "ERROR"


def test_policy_version_follows_the_trainer_and_its_weight_syncs(trainers: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    with capture_spans(tmp_path) as cap:
        Trainer(timer, global_steps=5).fit_step()
        step = cap.one("train.step")
        assert step.attributes["rl.policy.version"] == 4  # a sync step trains from step 4's weights
        assert rltrace.policy_version() == 5  # after update_weights the rollout runs step 5's

        class FullyAsync(Trainer):  # verl's fully-async trainer: its own parameter version
            current_param_version = 11

        cap.clear()
        FullyAsync(timer, global_steps=30).fit_step()
        assert cap.one("train.step").attributes["rl.policy.version"] == 11


def test_a_timer_that_is_not_a_trainers_gets_a_step_count_of_its_own(trainers: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    timer = trainers["modules"]["verl.experimental.one_step_off_policy.ray_trainer"].marked_timer
    with capture_spans(tmp_path) as cap:
        timing: dict[str, float] = {}
        with timer("step", timing):  # no trainer with global_steps among the callers
            pass
        assert type(cap.one("train.step").attributes["rl.step"]) is int
    assert set(timing) == {"step"}


def test_timers_pass_through_when_rltrace_is_not_configured(trainers: dict[str, Any]) -> None:
    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    timing = Trainer(timer, 1).fit_step()
    assert set(timing) == {"step", "gen", "reward", "old_log_prob", "adv", "update_actor",
                           "update_weights"}


# ---- the agent loop --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory, trainers: dict[str, Any]) -> dict[str, Any]:
    """verl's ``AgentLoopWorker`` from verl's own ``ppo_trainer`` config (tools from
    ``calc_tool.py``), built after ``instrument()`` (the module fixture ran it)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    path = tmp_path_factory.mktemp("model")
    tokenizer = model_dir(path)
    server = ScriptedServer(tokenizer)
    worker = AgentLoopWorker(verl_config(path), server, reward_loop_worker_handles=[ScriptedReward()])
    return {"worker": worker, "server": server}


def _run(agent: dict[str, Any], tmp_path: Path, **config: Any) -> dict[str, Any]:
    agent["server"].calls.clear()
    agent["worker"].reward_loop_worker_handles[0].seen.clear()
    config.setdefault("session_tracer", {"enabled": True})
    with capture_spans(tmp_path, **config) as cap:
        out = asyncio.run(agent["worker"].generate_sequences(two_prompt_batch()))
        spans = cap.spans()
        log_dir = cap.log_dir
    files = list(log_dir.rglob("sessions-*.jsonl"))
    records = [r for f in files for r in read_jsonl(f)]
    return {"out": out, "spans": spans, "records": records}


def _by_session(spans: list[Any], phase: str) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for s in spans:
        if s.name == phase:
            out.setdefault(s.attributes["rl.session.id"], []).append(s)
    return {k: sorted(v, key=lambda s: s.start_time) for k, v in out.items()}


def test_each_sample_is_a_session_in_its_prompt_groups_task(agent: dict[str, Any],
                                                            tmp_path: Path) -> None:
    run = _run(agent, tmp_path)
    records = sorted(run["records"], key=lambda r: r["session_id"])
    assert len(records) == 4  # one per sample the loop returned
    assert len(run["out"]) == 4
    tasks = [r["task_id"] for r in records]
    assert tasks[0] == tasks[1] != tasks[2] == tasks[3]  # verl's rollout_n groups
    assert {r["step"] for r in records} == {3}
    assert {r["policy_version"] for r in records} == {2}  # the server's min_global_steps
    assert len([s for s in run["spans"] if s.name == "rl.task"]) == 2


def test_generate_phases_carry_the_turns_and_tokens_the_loop_returned(agent: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    run = _run(agent, tmp_path)
    out, server = run["out"], agent["server"]
    gens = _by_session(run["spans"], "generate")
    records = {r["session_id"]: r for r in run["records"]}
    order = sorted(records)
    mask = out.batch["response_mask"].sum(-1).tolist()
    for i, sid in enumerate(order):
        phases = gens[sid]
        assert [p.attributes["rl.turn"] for p in phases] == list(range(len(phases)))
        generated = sum(p.attributes["gen_ai.usage.output_tokens"] for p in phases)
        if i < 2:  # arithmetic: tool call, then the answer; every generated token kept
            assert len(phases) == 2
            assert generated == mask[i]
        else:  # the story: one reply, cut by the agent loop at response_length
            assert len(phases) == 1
            assert mask[i] == RESPONSE_LENGTH < generated
        assert records[sid]["turns"] == len(phases)
        for p in phases:
            assert p.attributes["gen_ai.request.model"]
            assert p.attributes["rl.end.finish_reason"] == "completed"
    # the server saw exactly these calls, with these token counts
    seen = sorted((p.attributes["gen_ai.usage.input_tokens"], p.attributes["gen_ai.usage.output_tokens"])
                  for ps in gens.values() for p in ps)
    assert seen == sorted((n_in, n_out) for _, n_in, n_out in server.calls)


def test_tool_calls_are_toolcall_phases_named_by_the_tool(agent: dict[str, Any],
                                                          tmp_path: Path) -> None:
    run = _run(agent, tmp_path)
    tools = _by_session(run["spans"], "toolcall")
    gens = _by_session(run["spans"], "generate")
    order = sorted(r["session_id"] for r in run["records"])
    assert set(tools) == set(order[:2])  # the arithmetic samples called calc, the story did not
    for sid in order[:2]:
        (call,) = tools[sid]
        assert call.attributes["gen_ai.tool.name"] == "calc"
        assert call.attributes["rl.turn"] == 0
        assert gens[sid][0].end_time <= call.start_time <= call.end_time <= gens[sid][1].start_time
    # verl's own per-sample timers are the phases, not trainer sections
    assert not [s for s in run["spans"] if s.name.startswith("train.")]


def test_rewards_zero_advantage_groups_and_truncation_follow_the_contract(
        agent: dict[str, Any], tmp_path: Path) -> None:
    run = _run(agent, tmp_path)
    records = sorted(run["records"], key=lambda r: r["session_id"])
    rewards = _by_session(run["spans"], "reward")
    assert len(rewards) == 4
    for r in records:
        (phase,) = rewards[r["session_id"]]
        assert phase.attributes["rl.start.reward_fn"] == "compute_score"
        assert r["reward_s"] > 0
    scores = [float(s) for s in run["out"].batch["rm_scores"].sum(-1).tolist()]
    assert scores[:2] == [1.0, 1.0] and sorted(scores[2:]) == [0.0, 1.0]
    # group 0 has zero reward spread: verl's GRPO trains on it, without a gradient
    assert [(r["status"], r["reason"]) for r in records] == [
        ("accepted", ZERO_ADVANTAGE), ("accepted", ZERO_ADVANTAGE), ("accepted", None),
        ("accepted", None)]
    assert [r.get("counters", {}).get(TRUNCATED) for r in records] == [None, None, 1, 1]


def test_filter_groups_drops_the_zero_advantage_group(agent: dict[str, Any],
                                                      tmp_path: Path) -> None:
    from omegaconf import OmegaConf, open_dict

    cfg = agent["worker"].config
    with open_dict(cfg):
        OmegaConf.update(cfg, "algorithm.filter_groups", {"enable": True}, force_add=True)
    try:
        run = _run(agent, tmp_path)
    finally:
        with open_dict(cfg):
            cfg.algorithm.pop("filter_groups")
    records = sorted(run["records"], key=lambda r: r["session_id"])
    assert [(r["status"], r["reason"]) for r in records[:2]] == [("dropped", ZERO_ADVANTAGE)] * 2
    assert [r["status"] for r in records[2:]] == ["accepted", "accepted"]


def test_a_failing_server_fails_the_sessions_and_reaches_verl_unchanged(
        agent: dict[str, Any], tmp_path: Path) -> None:
    agent["server"].fail = True
    try:
        with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
            with pytest.raises(ConnectionError, match="scripted server down"):
                asyncio.run(agent["worker"].generate_sequences(two_prompt_batch()))
            log_dir = cap.log_dir
    finally:
        agent["server"].fail = False
    records = [r for f in log_dir.rglob("sessions-*.jsonl") for r in read_jsonl(f)]
    assert len(records) == 4
    assert {r["status"] for r in records} == {"failed"}
    assert any("scripted server down" in (r["reason"] or "") for r in records)


def test_the_agent_loop_runs_untraced_with_session_tracing_off(agent: dict[str, Any],
                                                               tmp_path: Path) -> None:
    run = _run(agent, tmp_path, session_tracer={"enabled": False})
    assert len(run["out"]) == 4
    assert run["records"] == []
    assert not [s for s in run["spans"] if s.name in ("rl.session", "generate")]


# ---- fully-async: the message queue ------------------------------------------------------------


def test_the_message_queue_depth_is_a_counter_track(trainers: dict[str, Any], tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.experimental.fully_async_policy.message_queue import MessageQueue

    async def traffic(q: Any) -> list[Any]:
        for i in range(3):
            await q.put_sample({"sample": i})
        return [await q.get_sample()]

    with capture_spans(tmp_path) as cap:
        # the class verl's ``@ray.remote`` wraps, run in-process (the actor runs the same code)
        queue = MessageQueue.__ray_actor_class__(OmegaConf.create({}), max_queue_size=10)
        (got,) = asyncio.run(traffic(queue))
        assert got == ({"sample": 0}, 2)  # verl's own answer: the sample and the depth left
        assert rltrace.counter(QUEUE_COUNTER).value == 2
        rltrace.flush()
        log_dir = cap.log_dir
    events = [e for f in log_dir.rglob("traces-*.jsonl") for e in read_jsonl(f)]
    counts = [e["args"]["value"] for e in events
              if e.get("ph") == "C" and e.get("name") == QUEUE_COUNTER]
    assert counts and counts[-1] == 2


# ---- the Ray seam (in-process; the run through a real Ray actor is test_verl_ray.py) ------------


def test_instrument_registers_the_worker_setup_with_rltrace_ray(
        trainers: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
    import rltrace.ray

    monkeypatch.setattr(rltrace.ray.worker_setups(), "targets", [])
    monkeypatch.setattr(ray, "init", ray.init)  # restored after the test
    original = ray.init
    rv._instrument_ray()
    assert rltrace.ray.worker_setups().targets == ["rltrace.integrations.verl:worker_setup"]
    # verl's own ray.init(...) goes through rltrace.ray.init (so workers are configured)
    assert ray.init is not original and ray.init._rltrace_original is original
    # in a worker, the hook runs the setup: instrumenting there is the same as here (idempotent)
    rltrace.ray.run_worker_setups(tuple(rltrace.ray.worker_setups().targets))
    assert rv.is_instrumented()


def test_a_failing_worker_setup_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install ray==2.60.0)")
    import rltrace.ray

    with pytest.raises(ValueError, match=r"package\.module:function"):
        rltrace.ray.on_worker_setup("no_colon_here")
    rltrace.ray.run_worker_setups(("rltrace.integrations.verl:no_such_setup",))
    assert "rltrace.integrations.verl:no_such_setup failed" in caplog.text


def test_the_report_reads_verls_steps_sections_staleness_and_waste(
        agent: dict[str, Any], trainers: dict[str, Any], tmp_path: Path) -> None:
    """Two steps of a synchronous verl trainer: timers around the agent loop's batch, the server
    reporting the previous step's weights (as verl's does for on-policy training)."""
    from rltrace.analysis import ReportOptions, build_report, load_run

    timer = trainers["modules"]["verl.trainer.ppo.ray_trainer"].marked_timer
    worker, server = agent["worker"], agent["server"]

    class Fit(Trainer):
        def fit(self) -> None:
            for step in (1, 2):
                self.global_steps = step
                server.version = step - 1
                worker.reward_loop_worker_handles[0].seen.clear()
                timing_raw: dict[str, float] = {}
                with self.timer("step", timing_raw):
                    with self.timer("gen", timing_raw):
                        asyncio.run(worker.generate_sequences(two_prompt_batch(step)))
                    for name in ("old_log_prob", "adv", "update_actor", "update_weights"):
                        with self.timer(name, timing_raw):
                            pass

    try:
        with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
            Fit(timer, 1).fit()
            log_dir = cap.log_dir
    finally:
        server.version = 2
    gp = build_report(load_run(log_dir, ReportOptions(progress=False)))["goodput"]
    assert [s["step"] for s in gp["by_step"]] == [1, 2]
    assert gp["staleness"]["lag"] == {"0": 8}  # on-policy: trained from the weights it generated
    assert (gp["zero_advantage"]["groups"], gp["zero_advantage"]["groups_total"]) == (2, 4)
    assert gp["truncated"]["sessions"] == 4
    classes = {s["section"]: s["class"] for s in gp["sections"]}
    assert classes["train.gen"] == "rollout"
    assert classes["train.update_actor"] == "productive"
    assert classes["train.update_weights"] == "overhead"


def test_a_failing_hook_leaves_verl_running_untraced(agent: dict[str, Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted rltrace failure")

    before = rv.ERRORS["agent_loop.generate_sequences"]
    with capture_spans(tmp_path, session_tracer={"enabled": True}):
        monkeypatch.setattr(type(rltrace.runtime.RUNTIME.sessions), "register_task", broken)
        out = asyncio.run(agent["worker"].generate_sequences(two_prompt_batch()))
    assert len(out) == 4  # verl's batch, as untraced
    assert out.batch["response_mask"].sum(-1).tolist()[:2] == [22, 22]
    assert rv.ERRORS["agent_loop.generate_sequences"] == before + 1


def test_errors_is_the_count_the_runtime_holds_and_other_names_stay_missing() -> None:
    from rltrace.integrations._verl_agent import VerlErrors

    assert rv.ERRORS is rltrace.runtime.RUNTIME.part(VerlErrors).counts
    assert not hasattr(rv, "NO_SUCH_NAME")
    with pytest.raises(AttributeError, match="NO_SUCH_NAME"):
        getattr(rv, "NO_SUCH_NAME")  # noqa: B009


def test_the_agent_loop_modules_keep_verls_untraced_per_sample_timer(agent: dict[str, Any]) -> None:
    from verl.experimental.agent_loop import agent_loop, single_turn_agent_loop, tool_agent_loop
    from verl.utils import profiler

    for module in (agent_loop, tool_agent_loop, single_turn_agent_loop):
        assert module.simple_timer is profiler.simple_timer._rltrace_original, module.__name__


def test_a_validation_batch_records_no_sessions_and_no_sections(agent: dict[str, Any],
                                                                tmp_path: Path) -> None:
    batch = two_prompt_batch()
    batch.meta_info["validate"] = True
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        out = asyncio.run(agent["worker"].generate_sequences(batch))
        spans = cap.spans()
        log_dir = cap.log_dir
    assert len(out) == 4
    assert not [r for f in log_dir.rglob("sessions-*.jsonl") for r in read_jsonl(f)]
    assert not [s for s in spans if s.name.startswith("train.") or s.name == "rl.session"]


def test_instrument_before_import_patches_a_module_as_it_is_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The post-import hook ``instrument()`` uses for verl modules not imported yet (in a Ray
    worker, verl is imported after rltrace's setup): the patch runs once the module's code ran,
    before the importer gets it."""
    import sys

    from rltrace.integrations._verl_imports import after_import

    (tmp_path / "rltrace_probe_mod.py").write_text("def marked_timer():\n    return 'verl'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rltrace_probe_mod", raising=False)
    seen: list[str] = []

    def patch(module: Any) -> None:
        seen.append(module.marked_timer())
        module.marked_timer = lambda: "traced"

    after_import("rltrace_probe_mod", patch)
    import rltrace_probe_mod  # type: ignore[import-not-found]

    assert seen == ["verl"]
    assert rltrace_probe_mod.marked_timer() == "traced"
    monkeypatch.delitem(sys.modules, "rltrace_probe_mod")
