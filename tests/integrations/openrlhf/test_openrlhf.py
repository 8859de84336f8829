"""OpenRLHF's own agent executors (``openrlhf.utils.agent`` 0.11.2, imported for real) traced by
``rltrace.integrations.openrlhf.instrument()``: sessions, groups, phases, turns, tokens,
rewards, zero-advantage groups and truncation match what the executors returned.

OpenRLHF's engine actor (``LLMRayActor``) needs vLLM (a CUDA build), so a scripted engine
stands in for it (``ScriptedEngine``: the same ``generate(prompt_token_ids, sampling_params,
multi_modal_data=)`` coroutine, answering with vLLM's ``RequestOutput`` shape), a small
dataclass stands in for ``vllm.SamplingParams`` (the two fields the executors read), and
``generate_responses`` below runs the executors the way ``LLMRayActor.generate_responses``
does (one ``execute`` per sample, all of a prompt's samples gathered, the prompt object shared).
The tokenizer is a real ``PreTrainedTokenizerFast`` trained here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from conftest import need

import rltrace
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE
from rltrace.analysis import ReportOptions, build_report, load_run
from rltrace.config import current_user
from rltrace.runtime import RUNTIME

# OpenRLHF lives in a folder of its own (.ci/run installs it there: its wheel pins a CUDA build and
# ships a top-level ``tests`` package that would shadow this suite's in a shared site-packages)
_SITE = os.environ.get("RLTRACE_OPENRLHF_SITE")
if _SITE and _SITE not in sys.path:
    sys.path.append(_SITE)
agent = need("openrlhf.utils.agent", "install it as .ci/run does: pip install --no-deps --target DIR "
             "openrlhf==0.11.2, then RLTRACE_OPENRLHF_SITE=DIR (its flash-attn pin has no CPU build)")
torch = need("torch")

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "ok", "done", "answer", "is", "yes", "no"]


def tokenizer() -> Any:
    """A word-level tokenizer trained here (no hub), as OpenRLHF's ``hf_tokenizer``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>"])
    tok.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")
    out.name_or_path = "tiny-wordlevel"
    return out


@dataclass
class SamplingParams:
    """Stands in for ``vllm.SamplingParams`` (vLLM needs CUDA here): what the executors read."""

    max_tokens: int | None = 6
    logprobs: int | None = None


class ScriptedEngine:
    """Stands in for OpenRLHF's vLLM engine actor: answers each ``generate`` with the next of a
    prompt's scripted completions (word lists), ``finish_reason="length"`` when one fills
    ``max_tokens``; yields to the event loop first, as a real engine call does."""

    def __init__(self, tok: Any, completions: dict[str, list[list[str]]]) -> None:
        self.tok = tok
        self.completions = completions
        self.calls: list[tuple[int, int]] = []  # (input tokens, output tokens)
        self.finishes: list[str] = []

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any,
                       multi_modal_data: Any = None) -> Any:
        await asyncio.sleep(0.001)
        text = self.tok.decode(prompt_token_ids)
        key = next(k for k in self.completions if text.startswith(k))
        words = self.completions[key].pop(0)
        ids = [self.tok.convert_tokens_to_ids(w) for w in words][: sampling_params.max_tokens]
        finish = "length" if len(ids) >= sampling_params.max_tokens else "stop"
        self.calls.append((len(prompt_token_ids), len(ids)))
        self.finishes.append(finish)
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text=" " + " ".join(words[: len(ids)]),
                                                        finish_reason=finish, logprobs=None)])


async def generate_responses(executor: Any, engine: Any, tok: Any, prompts: dict[str, str], n: int,
                             max_length: int) -> list[list[dict[str, Any]]]:
    """As ``LLMRayActor.generate_responses`` per prompt, the prompts' calls concurrent."""

    async def one(prompt: str, label: str) -> list[dict[str, Any]]:
        params = SamplingParams()  # one per call, shared by the prompt's samples, as there
        return list(await asyncio.gather(*[
            executor.execute(prompt=prompt, label=label, sampling_params=params,
                             max_length=max_length, hf_tokenizer=tok, llm_engine=engine)
            for _ in range(n)]))

    return list(await asyncio.gather(*[one(p, lab) for p, lab in prompts.items()]))


def run_traced(tmp_path: Path, trial: str, body: Any) -> tuple[Any, list[dict[str, Any]], Path]:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="orlhf", trial_name=trial, flush_at_exit=False,
                      session_tracer={"enabled": True})
    from rltrace.integrations import openrlhf

    openrlhf.instrument()
    try:
        out = asyncio.run(body())
    finally:
        rltrace.shutdown()
    logdir = tmp_path / "logs" / current_user() / "orlhf" / trial
    records = [r for f in (logdir / "session_tracer").rglob("sessions-r*.jsonl")
               for r in map(orjson.loads, f.read_bytes().splitlines())]
    assert openrlhf.ERRORS == {}
    return out, records, logdir


def trace_events(logdir: Path) -> list[dict[str, Any]]:
    return [ev for f in (logdir / "perf_tracer").rglob("traces-r*.jsonl")
            for ev in map(orjson.loads, f.read_bytes().splitlines()) if ev.get("ph") == "X"]


def phases(rec: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return rec["phases"].get(name, [])


class Env(agent.AgentInstanceBase):
    """A two-turn environment: reward 1 when the answer says ``yes`` (defined after
    ``instrument`` is imported but before it runs: patched by the walk of subclasses)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.turns = 0

    async def step(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.turns += 1
        await asyncio.sleep(0.001)
        good = "yes" in state_dict["action_text"]
        return {"rewards": torch.tensor(1.0 if good else 0.0), "scores": torch.tensor(1.0 if good else 0.0),
                "environment_feedback": " ok ", "done": self.turns >= 2}


def test_multi_turn_samples_become_sessions_with_their_turns_tool_steps_tokens_and_groups(
        tmp_path: Path) -> None:
    tok = tokenizer()
    # prompt "the cat": both samples answer yes then no (same reward: zero spread);
    # prompt "a dog": one sample says yes, one no
    script = {"the cat": [["yes"], ["yes"], ["no", "done"], ["no", "done"]],
              "a dog": [["yes", "done"], ["no", "ran", "on", "the", "mat", "ok"], ["ok"], ["ok", "done"]]}
    engine = ScriptedEngine(tok, script)
    executor = agent.MultiTurnAgentExecutor(Env)
    prompts = {"the cat": "yes", "a dog": "yes"}
    out, records, logdir = run_traced(
        tmp_path, "multi", lambda: generate_responses(executor, engine, tok, prompts, 2, 40))
    samples = [s for group in out for s in group]
    assert len(records) == len(samples) == 4
    assert len({r["task_id"] for r in records}) == 2  # a task per prompt
    assert all(len(phases(r, "generate")) == 2 and len(phases(r, "toolcall")) == 2 for r in records)
    assert sum(r["output_tokens"] for r in records) == sum(o for _, o in engine.calls)
    assert sum(r["input_tokens"] for r in records) == sum(i for i, _ in engine.calls)
    for r in records:
        assert [e["turn"] for e in phases(r, "generate")] == [0, 1]
        assert [e["turn"] for e in phases(r, "toolcall")] == [0, 1]
    spans = trace_events(logdir)
    tools = [e["args"] for e in spans if e["name"] == "toolcall"]
    assert len(tools) == 8 and {a["gen_ai.tool.name"] for a in tools} == {"Env"}
    gens = [e["args"] for e in spans if e["name"] == "generate"]
    assert sorted((a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) for a in gens) == \
        sorted(engine.calls)
    assert {a["gen_ai.request.model"] for a in gens} == {"tiny-wordlevel"}
    assert sorted(a["rl.end.finish_reason"] for a in gens) == sorted(engine.finishes)
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        by_task.setdefault(r["task_id"], []).append(r)
    reasons = sorted(tuple(sorted(str(r.get("reason")) for r in g)) for g in by_task.values())
    assert reasons == [("None", "None"), (ZERO_ADVANTAGE, ZERO_ADVANTAGE)]
    assert all(r["status"] == "accepted" for r in records)
    assert not any(s["truncated"] for s in samples) and not any(r.get("counters") for r in records)
    gp = build_report(load_run(logdir, ReportOptions(progress=False)))["goodput"]
    assert gp["zero_advantage"]["groups"] == 1 and gp["zero_advantage"]["groups_total"] == 2
    assert gp["zero_advantage"]["sessions"] == 2


def test_single_turn_samples_get_a_reward_phase_per_reward_function_call(tmp_path: Path) -> None:
    tok = tokenizer()
    rm = tmp_path / "reward.py"
    rm.write_text("import torch\n"
                  "def reward_func(queries, prompts, labels):\n"
                  "    r = torch.tensor([1.0 if 'yes' in q else 0.0 for q in queries])\n"
                  "    return {'rewards': r, 'scores': r, 'extra_logs': {}}\n")
    script = {"the cat": [["yes"], ["no"]], "a dog": [["no"], ["no"]],
              "the dog": [["yes", "yes", "yes", "yes", "yes", "yes", "yes"], ["yes"]]}
    engine = ScriptedEngine(tok, script)
    executor = agent.SingleTurnAgentExecutor(str(rm))
    out, records, logdir = run_traced(
        tmp_path, "single", lambda: generate_responses(executor, engine, tok, {k: "" for k in script}, 2, 40))
    samples = [s for group in out for s in group]
    assert len(records) == 6 and len({r["task_id"] for r in records}) == 3
    for r in records:
        assert len(phases(r, "generate")) == 1 and len(phases(r, "reward")) == 1
    rewards = [e["args"] for e in trace_events(logdir) if e["name"] == "reward"]
    assert len(rewards) == 6 and {a["rl.start.reward_fn"] for a in rewards} == {"reward_func"}
    assert sorted(r["output_tokens"] for r in records) == sorted(o for _, o in engine.calls)
    zero = [r for r in records if r.get("reason") == ZERO_ADVANTAGE]
    assert len(zero) == 4  # "a dog" (both 0) and "the dog" (both 1)
    truncated = sum(bool(s["truncated"]) for s in samples)  # "the dog"'s 7 words over max_tokens=6
    assert truncated == 1 == sum(r.get("counters", {}).get(TRUNCATED, 0) for r in records)
    gens = [e["args"] for e in trace_events(logdir) if e["name"] == "generate"]
    assert [a["rl.end.finish_reason"] for a in gens].count("length") == 1
    report = build_report(load_run(logdir, ReportOptions(progress=False)))
    assert report["goodput"]["truncated"]["sessions"] == 1


def test_a_failing_sample_is_finalized_failed_and_openrlhf_sees_its_error(tmp_path: Path) -> None:
    tok = tokenizer()

    class Broken(agent.AgentInstanceBase):  # defined after instrument: patched as it is defined
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        async def step(self, state_dict: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            raise RuntimeError("environment down")

    engine = ScriptedEngine(tok, {"the cat": [["yes"]]})

    async def body() -> Any:
        executor = agent.MultiTurnAgentExecutor(Broken)
        return await generate_responses(executor, engine, tok, {"the cat": ""}, 1, 40)

    with pytest.raises(RuntimeError, match="environment down"):
        run_traced(tmp_path, "broken", body)
    logdir = tmp_path / "logs" / current_user() / "orlhf" / "broken"
    (rec,) = [orjson.loads(line) for f in (logdir / "session_tracer").rglob("sessions-r*.jsonl")
              for line in f.read_bytes().splitlines()]
    assert rec["status"] == "failed" and "environment down" in rec["reason"]
    assert len(phases(rec, "toolcall")) == 1


def test_errors_is_the_count_the_runtime_holds_and_other_names_stay_missing() -> None:
    from rltrace.integrations import openrlhf

    assert openrlhf.ERRORS is RUNTIME.part(openrlhf.OpenRLHFState).errors.counts
    assert not hasattr(openrlhf, "NO_SUCH_NAME")


def test_instrument_names_the_fix_when_openrlhf_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from rltrace.integrations import openrlhf

    monkeypatch.setitem(sys.modules, "openrlhf.utils.agent", None)  # importing it then raises ImportError
    monkeypatch.setattr(RUNTIME.part(openrlhf.OpenRLHFState), "instrumented", False)
    with pytest.raises(ImportError, match=r"install OpenRLHF \(tested: openrlhf==0\.11\.2\)"):
        openrlhf.instrument()
