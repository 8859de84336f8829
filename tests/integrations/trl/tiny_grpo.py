"""A real TRL ``GRPOTrainer`` small enough for the CPU in seconds, without the hub.

The model is ``Qwen2ForCausalLM`` built from a tiny config (random weights), the tokenizer a
``WordLevel`` model trained here with ``tokenizers`` and wrapped in ``PreTrainedTokenizerFast``,
the dataset ``datasets.Dataset.from_dict``.  Used by the tests in this folder and by
``benchmarks/bench_trl.py`` (``python tiny_grpo.py OUT.json [--instrument] ...`` runs one training
in this interpreter and writes TRL's log history and step times as JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "sky", "sea"]
PROMPTS = [f"{a} {b} {c}" for a, b, c in zip(WORDS, WORDS[3:] + WORDS[:3], WORDS[7:] + WORDS[:7],
                                             strict=True)]


def tokenizer() -> Any:
    """A word-level tokenizer trained on the prompt vocabulary (EOS and PAD included)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<eos>", "<unk>"])
    tok.train_from_iterator([" ".join(WORDS)] * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


#: model shapes: ``tiny`` for the tests (a step in tens of milliseconds on a CPU), ``small`` for
#: the benchmark (a step closer to a real one in what it computes per completion)
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1},
    "small": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2},
}
#: per model shape, the GRPOConfig settings that go with it
SIZE_CONFIG: dict[str, dict[str, int]] = {
    "tiny": {},
    "small": {"max_completion_length": 48, "per_device_train_batch_size": 8, "num_generations": 4},
}


def model(tok: Any, seed: int = 0, size: str = "tiny") -> Any:
    """A Qwen2 of the given shape (:data:`SIZES`) with random weights (seeded)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), **SIZES[size], max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg)


def dataset(n: int = 16) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(n)]})


def reward_len(completions: list[str], **kwargs: Any) -> list[float]:
    """Longer completions score higher (varies within a group: a gradient)."""
    return [float(len(c.split())) for c in completions]


def reward_has_cat(completions: list[str], **kwargs: Any) -> list[float]:
    """1 when the word ``cat`` appears: often the same for a whole group (zero spread)."""
    return [1.0 if "cat" in c.split() else 0.0 for c in completions]


def config(out: str, **overrides: Any) -> Any:
    from trl import GRPOConfig

    kw: dict[str, Any] = dict(
        output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
        max_steps=4, learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, seed=7,
        save_strategy="no", disable_tqdm=True, temperature=1.0, dataloader_num_workers=0,
    )
    kw.update(overrides)
    return GRPOConfig(**kw)


def trainer(out: str, reward_funcs: list[Callable[..., Any]] | None = None, tok: Any = None,
            mdl: Any = None, size: str = "tiny", **overrides: Any) -> Any:
    """A ``GRPOTrainer`` over a model of the given shape (a fresh one unless ``mdl`` is given)."""
    from trl import GRPOTrainer

    tok = tok if tok is not None else tokenizer()
    overrides = {**SIZE_CONFIG[size], **overrides}
    return GRPOTrainer(model=mdl if mdl is not None else model(tok, size=size),
                       reward_funcs=reward_funcs or [reward_len, reward_has_cat],
                       args=config(out, **overrides), train_dataset=dataset(),
                       processing_class=tok)


# ---- tool calling: a chat tokenizer TRL can parse tool calls with, and scripted sampling -------

#: a prefix-preserving chat template that renders tool calls and tool results
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}<|assistant|>{{ m.content }}"
    "{%- for tc in (m.tool_calls or []) -%}<tool_call>{{ tc.function | tojson }}</tool_call>{%- endfor -%}"
    "<|end|>"
    "{%- elif m.role == 'tool' -%}<|tool|>{{ m.content }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}")
#: how ``tokenizer.parse_response`` finds the tool calls in a completion (transformers' legacy
#: response schema, the shape TRL uses for Qwen3)
RESPONSE_SCHEMA: dict[str, Any] = {
    "x-regex": r"^(?P<content>(?:(?!<tool_call>)[\s\S])*?)(?P<tool_calls>(?:<tool_call>(?:(?!</tool_call>)"
               r"[\s\S])+</tool_call>\s*)+)?\s*(?:<\|end\|>)?$",
    "type": "object",
    "properties": {
        "role": {"const": "assistant"},
        "content": {"type": "string"},
        "tool_calls": {
            "type": "array", "x-regex-iterator": r"<tool_call>\s*(.+?)\s*</tool_call>",
            "items": {"x-parser": "json", "x-parser-args": {"transform": "{type: 'function', function: @}"},
                      "type": "object",
                      "properties": {"type": {"const": "function"},
                                     "function": {"type": "object", "properties": {
                                         "name": {"type": "string"},
                                         "arguments": {"type": "object", "additionalProperties": {}}}}}}},
    },
}
TOOL_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def chat_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained here, with the chat template and response schema above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<|end|>", "<|user|>", "<|assistant|>", "<|tool|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [TOOL_CALL, "5 done no", " ".join(WORDS)] * 20
    tok.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        special_tokens=special, vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.response_schema = RESPONSE_SCHEMA
    return fast


def chat_dataset(n: int = 16) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
                                         for i in range(n)]})


def script_generation(mdl: Any, tok: Any) -> None:
    """Replace the model's sampling (``generate``) by a script, so that a random tiny model
    calls a tool: a prompt whose user turn starts with a word at an even index of ``WORDS``
    gets the ``add`` tool call, then (after the tool result) ``done``; other prompts answer
    ``no`` at once.  Everything else (TRL's tool loop, parsing, the loss) runs for real."""
    import torch

    end = tok.eos_token_id
    call = tok(TOOL_CALL, add_special_tokens=False)["input_ids"] + [end]
    done = tok("done", add_special_tokens=False)["input_ids"] + [end]
    plain = tok("no", add_special_tokens=False)["input_ids"] + [end]
    user = tok.convert_tokens_to_ids("<|user|>")
    tool = tok.convert_tokens_to_ids("<|tool|>")
    callers = {tok(w, add_special_tokens=False)["input_ids"][0] for w in WORDS[::2]}

    def generate(input_ids: Any, attention_mask: Any = None, **kw: Any) -> Any:
        rows = []
        for seq in input_ids.tolist():
            first = seq[seq.index(user) + 1] if user in seq else None
            rows.append(done if tool in seq else call if first in callers else plain)
        width = max(len(r) for r in rows)
        out = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], dtype=input_ids.dtype)
        return torch.cat([input_ids, out.to(input_ids.device)], dim=1)

    mdl.generate = generate


def main() -> None:
    """One training run, timed per step; JSON to the file named first."""
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--instrument", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (steadier timings)")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny", help="the model's shape")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ns = ap.parse_args()
    import torch
    from transformers import TrainerCallback

    torch.set_num_threads(ns.threads)
    times: list[float] = []
    cpu: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        """A step's time runs from its begin to the next step's begin (the last: to the end of
        training), so everything done for it counts, the other callbacks' work included."""

        t0: float | None = None
        c0 = 0.0

        def _lap(self) -> None:
            t, c = time.perf_counter(), time.process_time()  # process time: all threads
            if self.t0 is not None:
                times.append(t - self.t0)
                cpu.append(c - self.c0)
            self.t0, self.c0 = t, c

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._lap()

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._lap()

    tr = trainer(ns.workdir, max_steps=ns.steps, size=ns.size, use_cpu=ns.device == "cpu")
    tr.add_callback(Timer())
    if ns.instrument:
        import rltrace
        from rltrace.integrations.trl import instrument

        rltrace.configure(fileroot=ns.workdir, experiment_name="bench", trial_name="traced",
                          session_tracer={"enabled": True})
        instrument(tr)
    tr.train()
    if ns.instrument:
        import rltrace

        rltrace.shutdown()
    with open(ns.out, "w") as f:
        json.dump({"step_s": times, "step_cpu_s": cpu, "log_history": tr.state.log_history}, f)


if __name__ == "__main__":
    sys.exit(main())
