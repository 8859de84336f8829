"""OpenRLHF's agent executors as rltrace sessions: ``rltrace.integrations.openrlhf.instrument()``.

OpenRLHF 0.11.2 runs every sample of a rollout in its vLLM engine actors (``LLMRayActor``):
``generate_responses`` awaits, for each of a prompt's ``n_samples_per_prompt`` samples, the
configured agent executor's ``execute`` (``SingleTurnAgentExecutor``, ``MultiTurnAgentExecutor``,
or the ``AgentExecutor`` of the user's ``--agent_func_path`` file), all in
:mod:`openrlhf.utils.agent`.  That module imports with OpenRLHF's ordinary dependencies
(``aiohttp``); its trainer, samples generator, experience maker and engine modules need
``flash_attn``, ``deepspeed`` and ``vllm`` (CUDA builds), so this integration traces the
executors, where each sample's work happens, and leaves the trainer's sections to
``docs/guide/integrations/openrlhf.md`` (the hook points, not instrumented: they cannot be tested here).

Patched, in the process that calls :func:`instrument` (put the call in your agent or reward
function file: OpenRLHF imports it inside each engine actor):

* every executor class's ``execute``: a session per call, in a task per prompt group (the
  concurrent calls with the same ``prompt`` object: ``generate_responses`` passes one object to
  all of a prompt's samples); when the group's last sample ends, each of its sessions is
  finalized ``accepted``, with reason :data:`~rltrace.accounting.goodput.ZERO_ADVANTAGE` when the group's
  rewards (the executor's ``reward`` output) have zero spread, or ``failed`` when ``execute``
  raised; a sample whose output says ``truncated`` gets the session counter ``truncated``;
* the engine's ``generate`` as the executor calls it: a ``generate`` phase per call (one turn
  each) with ``input_tokens``, ``output_tokens``, ``model`` (the tokenizer's name) and
  ``finish_reason``;
* every agent instance's ``step`` (``AgentInstanceBase`` subclasses: the environment's turn):
  a ``toolcall`` phase with ``tool_name`` = the instance's class name;
* ``SingleTurnAgentExecutor._fetch_rewards_via_func`` / ``_fetch_rewards_via_http``: a
  ``reward`` phase with ``reward_fn`` (the function's name, or ``remote_rm``).

Executor classes defined after :func:`instrument` are patched as they are defined.  A hook
that fails logs once and counts in :data:`ERRORS`; OpenRLHF goes on untraced there.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sized
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from rltrace import runtime
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE
from rltrace.integrations._hooks import HookErrors, patch_once, sessions_on
from rltrace.perf_tracer import increment_counter
from rltrace.runtime import RUNTIME
from rltrace.sessions.records import PhaseScope

__all__ = ["ERRORS", "TESTED_VERSION", "OpenRLHFState", "instrument", "is_instrumented"]

#: the OpenRLHF release this integration was written against and tested on
TESTED_VERSION = "0.11.2"
#: hook -> how many times it failed (OpenRLHF went on untraced there); the process's count, kept
#: by the runtime (read through the module's ``__getattr__``)
ERRORS: Counter[str]

#: an async method of OpenRLHF's, as the patches receive and return it
_AsyncMethod = Callable[..., Awaitable[object]]
F = TypeVar("F", bound=Callable[..., object])


class _Completion(Protocol):
    """One of vLLM's ``CompletionOutput`` (the first of a ``RequestOutput``'s ``outputs``)."""

    token_ids: Sized
    finish_reason: object


class _RequestOutput(Protocol):
    outputs: list[_Completion]


class _Engine(Protocol):
    """The engine an executor awaits (OpenRLHF's ``LLMRayActor`` handle or a stand-in)."""

    async def generate(self, prompt_token_ids: Sized, sampling_params: object, *args: object,
                       **kwargs: object) -> _RequestOutput: ...


class OpenRLHFState:
    """This process's OpenRLHF integration, held by the runtime (``RUNTIME.part(OpenRLHFState)``):
    whether it is instrumented, the failures of its hooks and the prompt groups running now."""

    def __init__(self) -> None:
        self.errors = HookErrors("OpenRLHF", "rltrace.integrations.openrlhf.ERRORS")
        self.lock = threading.Lock()
        self.instrumented = False
        #: (id(prompt), id(sampling_params)) -> its open group (the objects are held by the
        #: running calls)
        self.groups: dict[tuple[int, int], _Group] = {}

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()  # another thread may have held it at fork time


def _state() -> OpenRLHFState:
    return RUNTIME.part(OpenRLHFState)


def __getattr__(name: str) -> Counter[str]:
    if name == "ERRORS":
        return _state().errors.counts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class _Group:
    """One prompt's samples while they run (keyed by :func:`_group_key`)."""

    task: object
    key: tuple[int, int]
    open: int = 0
    samples: list[_Sample] = field(default_factory=list)


@dataclass
class _Sample:
    sid: object
    group: _Group
    model: str | None = None
    reward: float | None = None
    truncated: bool = False
    failed: BaseException | None = None


_SAMPLE: ContextVar[_Sample | None] = ContextVar("rltrace_openrlhf_sample", default=None)


def failed(hook: str, exc: BaseException) -> None:
    """Note that ``hook`` failed (logged the first time, counted every time in :data:`ERRORS`)."""
    _state().errors.failed(hook, exc)


def is_instrumented() -> bool:
    """Whether :func:`instrument` ran in this process."""
    return _state().instrumented


def instrument() -> None:
    """Trace OpenRLHF's agent executors in this process (see the module docstring).  Idempotent.
    Raises ImportError, naming the fix, when OpenRLHF is not importable."""
    try:
        agent = importlib.import_module("openrlhf.utils.agent")
    except ImportError as exc:
        raise ImportError(f"rltrace.integrations.openrlhf: cannot import openrlhf.utils.agent ({exc}); "
                          f"install OpenRLHF (tested: openrlhf=={TESTED_VERSION}) in this "
                          f"environment") from exc
    state = _state()
    with state.lock:
        if state.instrumented:
            return
        state.instrumented = True
    _patch_tree(agent.AgentExecutorBase, "execute", _execute)
    _patch_tree(agent.AgentInstanceBase, "step", _step)
    for name in ("_fetch_rewards_via_func", "_fetch_rewards_via_http"):
        patch_once(agent.SingleTurnAgentExecutor, name, functools.partial(_reward, name))


# ---- patching -----------------------------------------------------------------------------------


def _patch_tree(base: Any, name: str, make: Callable[[F], F]) -> None:
    """Patch ``name`` on ``base`` and every subclass that defines it, now and as they are
    defined (``__init_subclass__`` of ``base``).  ``base`` is OpenRLHF's class, typed ``Any``:
    its ``super()`` is the next class of a subclass's MRO, which no static type describes."""
    todo = [base]
    while todo:
        cls = todo.pop()
        patch_once(cls, name, make)
        todo.extend(cls.__subclasses__())
    previous = base.__dict__.get("__init_subclass__")

    def init_subclass(cls: type[object], /, **kwargs: object) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        try:
            patch_once(cls, name, make)
        except Exception as exc:
            failed(f"{cls.__name__}.{name}", exc)

    setattr(base, "__init_subclass__", classmethod(init_subclass))  # noqa: B010


# ---- a sample's session -------------------------------------------------------------------------


def _group_key(prompt: object, sampling_params: object) -> tuple[int, int]:
    """A prompt group: the executions sharing one prompt object and one sampling-params object,
    as ``LLMRayActor.generate_responses`` makes them (one call per prompt; Ray hands each call
    its own deserialized arguments, so two prompts of the same text are two groups)."""
    return id(prompt), id(sampling_params)


def _begin(prompt: object, sampling_params: object, tokenizer: object) -> _Sample:
    reg = runtime.RUNTIME.sessions
    key = _group_key(prompt, sampling_params)
    groups = _state().groups
    group = groups.get(key)
    if group is None:
        group = groups[key] = _Group(reg.register_task(), key)
    group.open += 1
    name = getattr(tokenizer, "name_or_path", None)
    sample = _Sample(reg.register_session(group.task), group, str(name) if name else None)
    group.samples.append(sample)
    return sample


def _end(sample: _Sample, out: object) -> None:
    if isinstance(out, dict):
        sample.truncated = bool(out.get("truncated"))
        sample.reward = _number(out.get("reward"))
    group = sample.group
    group.open -= 1
    if group.open > 0:
        return
    groups = _state().groups
    if groups.get(group.key) is group:
        del groups[group.key]
    done = [s for s in group.samples if s.failed is None]
    rewards = [s.reward for s in done]
    flat = (len(done) > 1 and len(done) == len(group.samples) and None not in rewards
            and max(rewards) == min(rewards))  # type: ignore[type-var]
    reg = runtime.RUNTIME.sessions
    for s in group.samples:
        if s.truncated:
            increment_counter(TRUNCATED, 1, session_id=s.sid)
        if s.failed is not None:
            reg.finalize_session(s.sid, "failed", f"{type(s.failed).__name__}: {s.failed}"[:200])
        else:
            reg.finalize_session(s.sid, "accepted", ZERO_ADVANTAGE if flat else None)


def _number(v: object) -> float | None:
    """A reward as a float (a number, a one-element tensor or list), else None."""
    if isinstance(v, (list, tuple)) and len(v) == 1:
        v = v[0]
    if hasattr(v, "item"):
        try:
            v = v.item()
        except Exception:
            return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _execute(original: _AsyncMethod) -> _AsyncMethod:
    async def execute(self: object, prompt: object, label: object, sampling_params: object,
                      max_length: int, hf_tokenizer: object, llm_engine: _Engine, *args: object,
                      **kwargs: object) -> object:
        sample = None
        if _SAMPLE.get() is None:  # an override calling super().execute(): one session
            try:
                if sessions_on():
                    sample = _begin(prompt, sampling_params, hf_tokenizer)
            except Exception as exc:
                failed("execute", exc)
        if sample is None:
            return await original(self, prompt, label, sampling_params, max_length, hf_tokenizer,
                                  llm_engine, *args, **kwargs)
        token = _SAMPLE.set(sample)
        out = None
        try:
            out = await original(self, prompt, label, sampling_params, max_length, hf_tokenizer,
                                 _TracedEngine(llm_engine, sample), *args, **kwargs)
            return out
        except BaseException as exc:
            sample.failed = exc
            raise
        finally:
            _SAMPLE.reset(token)
            try:
                _end(sample, out)
            except Exception as exc:
                failed("execute", exc)

    return execute


class _TracedEngine:
    """The engine as the executor sees it: ``generate`` timed as a ``generate`` phase of the
    sample's session; everything else passed through."""

    def __init__(self, engine: _Engine, sample: _Sample) -> None:
        self._rltrace_engine = engine
        self._rltrace_sample = sample

    def __getattr__(self, name: str) -> object:
        return getattr(self._rltrace_engine, name)

    async def generate(self, prompt_token_ids: Sized, sampling_params: object, *args: object,
                       **kwargs: object) -> _RequestOutput:
        engine, sample = self._rltrace_engine, self._rltrace_sample
        try:
            start: dict[str, object] = {"input_tokens": len(prompt_token_ids)}
            if sample.model:
                start["model"] = sample.model
            scope = runtime.RUNTIME.sessions.atrace_session_phase("generate", start, session_id=sample.sid)
        except Exception as exc:
            failed("generate", exc)
            return await engine.generate(prompt_token_ids, sampling_params, *args, **kwargs)
        async with scope as ph:
            out = await engine.generate(prompt_token_ids, sampling_params, *args, **kwargs)
            try:
                first = out.outputs[0]
                ph.set_end_payload(output_tokens=len(first.token_ids),
                                   finish_reason=str(first.finish_reason))
            except Exception as exc:
                failed("generate", exc)
        return out


def _phase(hook: str, phase: str, payload: dict[str, object]) -> PhaseScope | None:
    """A phase scope of the current sample's session, or None (no sample, or it failed)."""
    sample = _SAMPLE.get()
    if sample is None:
        return None
    try:
        return runtime.RUNTIME.sessions.atrace_session_phase(phase, payload, session_id=sample.sid)
    except Exception as exc:
        failed(hook, exc)
        return None


def _step(original: _AsyncMethod) -> _AsyncMethod:
    async def step(self: object, *args: object, **kwargs: object) -> object:
        scope = _phase("step", "toolcall", {"tool_name": type(self).__name__})
        if scope is None:
            return await original(self, *args, **kwargs)
        async with scope:
            return await original(self, *args, **kwargs)

    return step


def _reward(name: str, original: _AsyncMethod) -> _AsyncMethod:
    async def fetch(self: object, *args: object, **kwargs: object) -> object:
        fn = getattr(getattr(self, "reward_func", None), "__name__", None)
        reward_fn = fn if name.endswith("func") and fn else "remote_rm"
        scope = _phase(name, "reward", {"reward_fn": reward_fn})
        if scope is None:
            return await original(self, *args, **kwargs)
        async with scope:
            return await original(self, *args, **kwargs)

    return fetch
