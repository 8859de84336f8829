"""verl's agent loop as rltrace sessions (installed by ``rltrace.integrations.verl.instrument``).

verl runs each sample of a batch in ``AgentLoopWorker._run_agent_loop`` (one asyncio task per
sample, inside ``AgentLoopWorker.generate_sequences``), which builds the configured agent loop
(``SingleTurnAgentLoop``, ``ToolAgentLoop``, yours) and awaits its ``run``.  Patched, in each
agent-loop worker process:

* ``generate_sequences``: a task per prompt group (the samples sharing a dataset ``index``:
  verl's ``rollout_n`` group) and a session per sample, registered when the batch starts; each
  session is finalized when the batch ends: ``accepted``, or with reason ``zero_advantage``
  when its group's rewards (computed in the agent loop) have zero spread (``dropped`` when the
  trainer filters such groups: DAPO's ``algorithm.filter_groups.enable``);
* ``_run_agent_loop``: runs the sample inside its session (a failure finalizes it ``failed``);
  a sample whose response filled ``response_length`` gets the session counter ``truncated``;
* the server manager's ``generate`` (patched on its class at first use): a ``generate`` phase
  with ``input_tokens``, ``output_tokens``, ``model`` and ``finish_reason`` (each call a turn);
  verl's own parameter version of the output (``min_global_steps``) becomes the session's
  policy version;
* ``ToolAgentLoop._call_tool``: a ``toolcall`` phase with ``tool_name``;
* ``AgentLoopWorker._compute_score`` (when it computes the reward): a ``reward`` phase with
  ``reward_fn``;
* the fully-async ``MessageQueue``: its depth as the counter track ``verl.message_queue.depth``.

Validation batches (``meta_info["validate"]``) are not recorded as sessions: they belong to the
trainer's ``train.testing`` section.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence, Sized
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Protocol

from rltrace import runtime
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE
from rltrace.integrations._hooks import HookErrors, patch_once, sessions_on
from rltrace.integrations._verl_imports import after_import
from rltrace.perf_tracer import increment_counter
from rltrace.recording.recorder import detach
from rltrace.runtime import RUNTIME
from rltrace.sessions.context import SESSION_CV
from rltrace.sessions.records import PhaseScope
from rltrace.steps import _STEP_CV

__all__ = ["QUEUE_COUNTER", "VerlErrors", "install"]

#: the counter track of the fully-async message queue's depth (samples waiting for the trainer)
QUEUE_COUNTER = "verl.message_queue.depth"
_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
_TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
_QUEUE = "verl.experimental.fully_async_policy.message_queue"
_SINGLE_TURN = "verl.experimental.agent_loop.single_turn_agent_loop"
#: an async method of verl's, as the patches receive and return it
_AsyncMethod = Callable[..., Awaitable[object]]


class VerlErrors(HookErrors):
    """Failures inside the verl hooks, by hook, for the whole process: held by the runtime
    (``RUNTIME.part(VerlErrors)``); ``rltrace.integrations.verl.ERRORS`` is its count."""

    def __init__(self) -> None:
        super().__init__("verl", "rltrace.integrations.verl.ERRORS")


def _failed(hook: str, exc: BaseException) -> None:
    RUNTIME.part(VerlErrors).failed(hook, exc)


class _DataProto(Protocol):
    """What the hooks read from verl's ``DataProto`` batch."""

    meta_info: dict[str, Any]
    non_tensor_batch: Mapping[str, _Array]

    def __len__(self) -> int: ...


class _Array(Protocol):
    def tolist(self) -> list[object]: ...


class _AgentOutput(Protocol):
    """An agent loop's output, as ``_compute_score`` receives it."""

    reward_score: float | None


class _MessageQueue(Protocol):
    """verl's fully-async ``MessageQueue`` (the actor's own object)."""

    queue: Sized
    _rltrace_depth: int


@dataclass
class _Sample:
    """One sample's session while its agent loop runs."""

    sid: object
    model: str | None = None
    versioned: bool = False
    reward: float | None = None
    truncated: bool = False
    done: bool = False


@dataclass
class _Batch:
    """The sessions of one ``generate_sequences`` batch, by (dataset index, rollout_n)."""

    by_key: dict[tuple[object, object], _Sample] = field(default_factory=dict)
    groups: list[list[_Sample]] = field(default_factory=list)
    filter_groups: bool = False


_BATCH: ContextVar[_Batch | None] = ContextVar("rltrace_verl_batch", default=None)
_SAMPLE: ContextVar[_Sample | None] = ContextVar("rltrace_verl_sample", default=None)


def install() -> None:
    """Patch verl's agent loop and fully-async queue when (or as soon as) they are imported."""
    after_import(_AGENT_LOOP, _patch_agent_loop)
    after_import(_TOOL_LOOP, _patch_tool_loop)
    after_import(_SINGLE_TURN, _untrace_timers)
    after_import(_QUEUE, _patch_queue)


class _Phase:
    """``async with`` one phase execution of a sample's session, where a failure of rltrace's
    (counted in ``ERRORS``) leaves verl's call to run untraced, and verl's own exceptions pass
    through unchanged."""

    __slots__ = ("hook", "inner", "name", "payload", "sid")

    def __init__(self, hook: str, name: str, payload: dict[str, object], sid: object) -> None:
        self.hook, self.name, self.payload, self.sid = hook, name, payload, sid
        self.inner: PhaseScope | None = None

    async def __aenter__(self) -> PhaseScope | None:
        try:
            inner = runtime.atrace_session_phase(self.name, self.payload, session_id=self.sid)
            entered = await inner.__aenter__()
            self.inner = inner
            return entered
        except Exception as exc:
            _failed(self.hook, exc)
            return None

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:  # verl's own exception passes on
        inner, self.inner = self.inner, None
        if inner is not None:
            try:
                await inner.__aexit__(exc_type, exc, tb)
            except Exception as exc2:
                _failed(self.hook, exc2)


# ---- the batch and its samples -----------------------------------------------------------------


def _keys(index: Sequence[object]) -> list[tuple[object, object]]:
    """(sample_index, rollout_n) of each position, as verl's ``get_trajectory_info`` numbers
    them (consecutive equal indices are one prompt's rollouts)."""
    out: list[tuple[object, object]] = []
    n = 0
    for i, idx in enumerate(index):
        n = n + 1 if i > 0 and index[i - 1] == idx else 0
        out.append((idx, n))
    return out


def _config_flag(config: object, path: str) -> bool:
    try:
        from omegaconf import Container, OmegaConf

        return isinstance(config, Container) and bool(OmegaConf.select(config, path, default=False))
    except Exception:
        return False


def _plan(worker: object, batch: _DataProto) -> _Batch | None:
    """Register a task per prompt group and a session per sample of ``batch``."""
    if not sessions_on() or batch.meta_info.get("validate", False):
        return None
    ntb = batch.non_tensor_batch
    index: list[object] = ntb["index"].tolist() if "index" in ntb else list(range(len(batch)))
    step = batch.meta_info.get("global_steps", -1)
    try:
        step = int(step)
    except (TypeError, ValueError):
        step = -1
    model = getattr(getattr(worker, "model_config", None), "path", None)
    plan = _Batch(filter_groups=_config_flag(getattr(worker, "config", None),
                                             "algorithm.filter_groups.enable"))
    reg = runtime.RUNTIME.sessions
    token = _STEP_CV.set(step) if step >= 0 else None  # the trainer step the samples serve
    try:
        task = None
        for key in _keys(index):
            if key[1] == 0 or task is None:
                task = reg.register_task()
                plan.groups.append([])
            sample = _Sample(reg.register_session(task), str(model) if model else None)
            plan.by_key[key] = sample
            plan.groups[-1].append(sample)
    finally:
        if token is not None:
            _STEP_CV.reset(token)
    return plan


def _finish(plan: _Batch) -> None:
    """Finalize the batch's sessions: accepted, zero_advantage for a group with zero reward
    spread (rewards known here only when the agent loop computed them)."""
    for group in plan.groups:
        rewards = [s.reward for s in group]
        flat = (len(group) > 1 and all(s.done for s in group) and None not in rewards
                and max(rewards) == min(rewards))  # type: ignore[type-var]
        for s in group:
            if not s.done:
                _finalize(s, "failed", "not run")
            elif flat:
                _finalize(s, "dropped" if plan.filter_groups else "accepted", ZERO_ADVANTAGE)
            else:
                _finalize(s, "accepted", None)


def _finalize(s: _Sample, status: str, reason: str | None) -> None:
    reg = runtime.RUNTIME.sessions
    sess = reg.session(s.sid)
    if sess is None:  # finalized already (failed)
        return
    if s.truncated:
        increment_counter(TRUNCATED, 1, session_id=s.sid)
    reg.finalize_session(s.sid, status, reason)


def _note_output(s: _Sample, worker: object, out: object) -> None:
    """What the sample's output says: its reward, and whether it filled ``response_length``."""
    score = getattr(out, "reward_score", None)
    s.reward = float(score) if score is not None else None
    limit = getattr(getattr(worker, "rollout_config", None), "response_length", None)
    prompt = getattr(out, "prompt_ids", None)
    mask = getattr(out, "attention_mask", None)
    if limit and prompt is not None and mask is not None and hasattr(prompt, "shape"):
        s.truncated = int(mask[..., prompt.shape[-1]:].sum()) >= int(limit)
    s.done = True


def _generate_sequences(original: _AsyncMethod) -> _AsyncMethod:
    async def generate_sequences(self: object, batch: _DataProto, *args: object, **kwargs: object) -> object:
        plan = None
        try:
            plan = _plan(self, batch)
        except Exception as exc:
            _failed("agent_loop.generate_sequences", exc)
        if plan is None:
            return await original(self, batch, *args, **kwargs)
        token = _BATCH.set(plan)
        try:
            return await original(self, batch, *args, **kwargs)
        finally:
            _BATCH.reset(token)
            try:
                _finish(plan)
            except Exception as exc:
                _failed("agent_loop.finalize", exc)

    return generate_sequences


def _run_agent_loop(original: _AsyncMethod) -> _AsyncMethod:
    async def run_agent_loop(self: object, sampling_params: object, trajectory: Mapping[str, object],
                             *args: object, **kwargs: object) -> object:
        sample, own = None, False
        try:
            plan = _BATCH.get()
            key = (trajectory.get("sample_index"), trajectory.get("rollout_n"))
            if plan is not None:
                sample = plan.by_key.pop(key, None)
            elif sessions_on() and not trajectory.get("validate", False):  # called on its own
                reg = runtime.RUNTIME.sessions
                model = getattr(getattr(self, "model_config", None), "path", None)
                sample = _Sample(reg.register_session(reg.register_task()),
                                 str(model) if model else None)
                own = True
        except Exception as exc:
            _failed("agent_loop.run", exc)
        if sample is None:
            return await original(self, sampling_params, trajectory, *args, **kwargs)
        reg = runtime.RUNTIME.sessions
        try:
            tok, span_tok = reg._enter_session(sample.sid)
        except Exception as exc:
            _failed("agent_loop.run", exc)
            return await original(self, sampling_params, trajectory, *args, **kwargs)
        stok = _SAMPLE.set(sample)
        try:
            out = await original(self, sampling_params, trajectory, *args, **kwargs)
        except BaseException as exc:
            try:
                reg._fail(sample.sid, exc)
            except Exception as exc2:
                _failed("agent_loop.run", exc2)
            raise
        finally:
            _SAMPLE.reset(stok)
            detach(span_tok)
            SESSION_CV.reset(tok)
        try:
            _note_output(sample, self, out)
            if own:
                _finalize(sample, "accepted", None)
        except Exception as exc:
            _failed("agent_loop.run", exc)
        return out

    return run_agent_loop


def _scores_here(worker: object, outputs: Sequence[_AgentOutput]) -> bool:
    """Whether ``_compute_score`` computes the reward (verl's reward-loop workers are set and
    the agent loop did not score the sample itself); otherwise it does nothing."""
    try:
        return bool(getattr(worker, "reward_loop_worker_handles", None) is not None and outputs
                    and outputs[-1].reward_score is None)
    except Exception:
        return False


def _compute_score(original: _AsyncMethod) -> _AsyncMethod:
    async def compute_score(self: object, outputs: Sequence[_AgentOutput], *args: object,
                            **kwargs: object) -> object:
        sample = _SAMPLE.get()
        if sample is None or not _scores_here(self, outputs):
            return await original(self, outputs, *args, **kwargs)
        name = _reward_name(getattr(self, "config", None))
        async with _Phase("reward", "reward", {"reward_fn": name}, sample.sid):
            return await original(self, outputs, *args, **kwargs)

    return compute_score


def _reward_name(config: object) -> str:
    """The reward function's name as the user configured it (verl's default: compute_score)."""
    try:
        from omegaconf import Container, OmegaConf

        if not isinstance(config, Container):
            return "compute_score"
        for path in ("reward.custom_reward_function.name", "custom_reward_function.name"):
            name = OmegaConf.select(config, path, default=None)
            if name:
                return str(name)
    except Exception:
        pass
    return "compute_score"


# ---- the server manager's generate ---------------------------------------------------------------


def _traced_generate(original: _AsyncMethod) -> _AsyncMethod:
    async def generate(self: object, *args: object, **kwargs: object) -> object:
        sample = _SAMPLE.get()
        if sample is None:
            return await original(self, *args, **kwargs)
        start: dict[str, object] = {}
        try:
            prompt = kwargs.get("prompt_ids")
            if isinstance(prompt, Sized):
                start["input_tokens"] = len(prompt)
            if sample.model:
                start["model"] = sample.model
        except Exception as exc:
            _failed("generate", exc)
        async with _Phase("generate", "generate", start, sample.sid) as ph:
            out = await original(self, *args, **kwargs)
            try:
                _note_generate(sample, ph, out)
            except Exception as exc:
                _failed("generate", exc)
            return out

    return generate


def _note_generate(sample: _Sample, ph: PhaseScope | None, out: object) -> None:
    end: dict[str, object] = {}
    tokens = getattr(out, "token_ids", None)
    if tokens is not None:
        end["output_tokens"] = len(tokens)
    reason = getattr(out, "stop_reason", None)
    if reason is not None:
        end["finish_reason"] = str(reason)
    if end and ph is not None:
        ph.set_end_payload(**end)
    extra = getattr(out, "extra_fields", None) or {}
    version = extra.get("min_global_steps")
    if not sample.versioned and type(version) is int and version >= 0:
        sess = runtime.RUNTIME.sessions.session(sample.sid)
        if sess is not None:  # verl's own parameter version of the weights that generated it
            sess.version = version
            sample.versioned = True


def _patch_server(client: object) -> None:
    """Trace ``generate`` of the server manager's class (once per class)."""
    cls = type(client)
    if "_rltrace_generate" in cls.__dict__:
        return
    original = getattr(cls, "generate", None)
    if original is None or getattr(original, "_rltrace_original", None) is not None:
        return
    wrapper = functools.wraps(original)(_traced_generate(original))
    wrapper._rltrace_original = original  # type: ignore[attr-defined]
    setattr(cls, "generate", wrapper)  # noqa: B010
    setattr(cls, "_rltrace_generate", True)  # noqa: B010


def _base_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        try:
            server = getattr(self, "server_manager", None)
            if server is not None:
                _patch_server(server)
        except Exception as exc:
            _failed("generate", exc)

    return __init__


# ---- tools ---------------------------------------------------------------------------------------


def _call_tool(original: _AsyncMethod) -> _AsyncMethod:
    async def call_tool(self: object, tool_call: object, *args: object, **kwargs: object) -> object:
        sample = _SAMPLE.get()
        if sample is None:
            return await original(self, tool_call, *args, **kwargs)
        name = str(getattr(tool_call, "name", "tool"))
        async with _Phase("toolcall", "toolcall", {"tool_name": name}, sample.sid):
            return await original(self, tool_call, *args, **kwargs)

    return call_tool


# ---- fully-async message queue ---------------------------------------------------------------------


def _queue_op(original: _AsyncMethod) -> _AsyncMethod:
    async def op(self: _MessageQueue, *args: object, **kwargs: object) -> object:
        out = await original(self, *args, **kwargs)
        try:
            depth = len(self.queue)
            last = getattr(self, "_rltrace_depth", 0)
            if depth != last:
                runtime.counter(QUEUE_COUNTER).add(depth - last)
                self._rltrace_depth = depth
        except Exception as exc:
            _failed("message_queue", exc)
        return out

    return op


# ---- the patches ---------------------------------------------------------------------------------


def _untrace_timers(module: ModuleType) -> None:
    """verl's agent loops time each sample with ``simple_timer`` (into the sample's metrics):
    those intervals are the session phases, not trainer sections, so the agent-loop modules
    keep verl's untraced timer (validation samples, which have no session, included)."""
    for attr in ("simple_timer", "marked_timer"):
        original = getattr(getattr(module, attr, None), "_rltrace_original", None)
        if original is not None:
            setattr(module, attr, original)


def _patch_agent_loop(module: ModuleType) -> None:
    _untrace_timers(module)
    worker = module.AgentLoopWorker
    patch_once(worker, "generate_sequences", _generate_sequences)
    patch_once(worker, "_run_agent_loop", _run_agent_loop)
    patch_once(worker, "_compute_score", _compute_score)
    patch_once(module.AgentLoopBase, "__init__", _base_init)


def _patch_tool_loop(module: ModuleType) -> None:
    _untrace_timers(module)
    patch_once(module.ToolAgentLoop, "_call_tool", _call_tool)


def _patch_queue(module: ModuleType) -> None:
    # ``MessageQueue`` is a Ray actor class (``@ray.remote``): its methods live on the class it
    # wraps, which the actor's process runs (Ray pickles it from the patched process)
    cls = getattr(module.MessageQueue, "__ray_actor_class__", module.MessageQueue)
    for name in ("put_sample", "get_sample", "clear_queue"):
        patch_once(cls, name, _queue_op)
