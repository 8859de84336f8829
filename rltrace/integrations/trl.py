"""TRL, traced with one line: ``rltrace.integrations.trl.instrument(trainer)``.

Call it once after a TRL trainer is built and before ``trainer.train()``; TRL is not edited.
What it records, for every trainer instrumented this way:

* **steps**: each optimizer step is ``rltrace.step(n)`` (``train.step`` with ``rl.step``), ``n``
  being the ``step`` TRL logs for it (``state.global_step`` once the step is done); the policy
  version is ``state.global_step`` (``rltrace.set_policy_version`` after each optimizer step), so
  sessions record the weights that generated them and the report computes staleness;
* **TRL's profiled sections** (``trl.extras.profiling``: ``transformers.generate``,
  ``vLLM.generate``, ``sync_weights``, ``compute_loss``, ``_prepare_inputs``,
  ``_calculate_rewards``, the log-prob passes, each reward function by its name) as scopes
  ``train.<name>`` with real timestamps and ``args.framework = "trl"``, plus ``train.backward``
  and ``train.optimizer_step`` (transformers' own, which TRL does not time);
* **sessions** (``GRPOTrainer`` and trainers built like it): each generation batch a task per
  prompt group and a session per completion, with a ``generate`` phase per generation call
  (tokens in and out, ``finish_reason``; a completion cut at ``max_completion_length`` also gets
  the ``truncated`` counter), a ``toolcall`` phase per call of a ``tools=`` callable (with its
  turn), a ``reward`` phase per reward function (``reward_fn`` payload).  A session is finalized
  when TRL hands its completion to a training step, and belongs to that step: with
  ``steps_per_generation`` > gradient accumulation the batch is trained over several steps, and
  the report shows the version lag.  A completion of a group whose rewards have zero spread
  (no GRPO gradient; TRL logs the fraction as ``frac_reward_zero_std``) is ``accepted`` with
  reason ``zero_advantage``; completions generated but never trained (training stopped first)
  are ``dropped`` with reason ``unused``.

TRL's behaviour is unchanged: the hooks only read, the one value they add to TRL's generation
batch (a row index, to know which completion each step trains) is taken out before the loss sees
the batch, and no hook draws random numbers.  A failure inside a hook is counted (:func:`errors`)
and logged once per hook, never raised into TRL.

How: TRL's modules import ``profiling_context`` by name, so the name is rebound in every loaded
``trl`` module that holds it (and in ``trl.extras.profiling``, which ``profiling_decorator``
reads at call time); the replacement returns TRL's own context unchanged for a trainer that is
not instrumented.  The other hooks are a ``TrainerCallback`` and wrappers set on the trainer
instance (``_generate``, ``_generate_single_turn``, ``_calculate_rewards``,
``_generate_and_score_completions``, ``_prepare_inputs``, ``train``, its accelerator's
``backward``) that call TRL's method exactly once.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .. import recorder
from .. import runtime as _runtime
from ..goodput import TRUNCATED, ZERO_ADVANTAGE
from ..perf_tracer import increment_counter
from ..spans import trace_scope
from ..steps import current_step, set_policy_version, step
from ._hooks import HookErrors

__all__ = ["FRAMEWORK", "GENERATION_SECTIONS", "SECTION_PREFIX", "UNUSED", "errors", "instrument",
           "is_instrumented"]

logger = logging.getLogger("rltrace.integrations.trl")

#: the ``framework`` argument of every scope this integration opens
FRAMEWORK = "trl"
#: a TRL section ``name`` is the scope ``train.<name>``
SECTION_PREFIX = "train."
#: the finalize reason of completions generated but never trained on (training stopped first)
UNUSED = "unused"
#: the key of the row index added to TRL's generation batch (removed before the loss sees it)
_ROW_KEY = "_rltrace_row"
_ARGS = {"framework": FRAMEWORK}
#: TRL's sections around the generation itself (a ``generate`` phase spans one under vLLM)
GENERATION_SECTIONS = frozenset({"vLLM.generate", "transformers.generate", "transformers.generate_batch"})

T = TypeVar("T")

#: failures inside rltrace's hooks, by hook (the first of each is logged)
_HOOKS = HookErrors("TRL", "rltrace.integrations.trl.errors()", logger)
_PATCH_LOCK = threading.Lock()


@dataclass
class _Process:
    """What this integration holds for the whole process."""

    #: TRL's own ``profiling_context`` (None until the first ``instrument``)
    original_pc: Callable[..., Any] | None = None
    #: whether the log dir of a configuration made here was printed
    printed: bool = False


_PROCESS = _Process()
#: the instrumented trainers and their tracing state
_STATES: weakref.WeakKeyDictionary[Any, _Tracing] = weakref.WeakKeyDictionary()


def errors() -> dict[str, int]:
    """Failures inside this integration's hooks, by hook (each was logged once, never raised)."""
    return dict(_HOOKS.counts)


def _failed(hook: str) -> None:
    """Count a failure of ``hook`` (called from an ``except`` block); log the first one."""
    _HOOKS.failed(hook)


def is_instrumented(trainer: Any) -> bool:
    """Whether ``instrument`` was called on ``trainer``."""
    try:
        return trainer in _STATES
    except TypeError:
        return False


# ---- the state of one instrumented trainer ------------------------------------------------------


@dataclass
class _Call:
    """One generation call of a batch: its rows, their open generate phases, when it returned."""

    rows: list[int]
    handles: list[Any]
    end_ns: int = 0
    out: list[int] = field(default_factory=list)
    #: each row's start payload (its input tokens)
    per_row: list[dict[str, Any]] | None = None


@dataclass
class _Batch:
    """One generation batch of the instrumented trainer (train mode)."""

    sids: list[Any]
    rows: int
    calls: list[_Call] = field(default_factory=list)
    #: rows whose tools ran since the last generation call (the next call continues them)
    tool_rows: list[int] = field(default_factory=list)
    rewards: Any = None
    zero_adv: list[bool] | None = None
    closed: bool = False
    #: rows not finalized yet
    open_rows: set[int] = field(default_factory=set)


class _Tracing:
    """What one instrumented trainer's hooks share (holds no reference to the trainer)."""

    def __init__(self, reward_names: list[str], model: str) -> None:
        self.reward_names = frozenset(reward_names)
        self.model = model
        self.step_ctx: Any = None
        self.opt_scope: Any = None
        self.batch: _Batch | None = None
        #: the generation call in progress (its phases open with a generation section under vLLM)
        self.call: _Call | None = None
        #: batches handed to TRL's buffer whose rows are not all trained yet
        self.pending: list[_Batch] = []


def _state_of(trainer: Any) -> _Tracing | None:
    try:
        return _STATES.get(trainer)
    except TypeError:
        return None


# ---- TRL's profiled sections as scopes -----------------------------------------------------------


class _Section:
    """TRL's ``ProfilingContext`` for an instrumented trainer, inside a ``train.<name>`` scope
    (and, for a reward function's section, the batch's reward phases)."""

    __slots__ = ("_call", "_name", "_pc", "_phases", "_scope", "_st")

    def __init__(self, pc: Any, st: _Tracing, name: str) -> None:
        self._pc = pc
        self._st = st
        self._name = name
        self._scope: Any = None
        self._phases: list[Any] = []
        self._call: _Call | None = None

    def __getattr__(self, attr: str) -> Any:  # what callers read from TRL's context
        return getattr(self._pc, attr)

    def __enter__(self) -> Any:
        try:
            scope = trace_scope(SECTION_PREFIX + self._name, "compute", _ARGS)
            scope.__enter__()
            self._scope = scope
            st = self._st
            batch = st.batch
            if batch is not None and not batch.closed:
                if self._name in st.reward_names:
                    self._phases = _start_phases(batch, range(batch.rows), "reward",
                                                 {"reward_fn": self._name})
                elif self._name in GENERATION_SECTIONS and st.call is not None and not st.call.handles:
                    call = st.call
                    call.handles = _start_phases(batch, call.rows, "generate", {"model": st.model},
                                                 call.per_row)
                    self._call = call
        except Exception:
            _failed("profiling_context.enter")
        return self._pc.__enter__()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self._pc.__exit__(exc_type, exc, tb)
        finally:
            try:
                for h in self._phases:
                    if h is not None:
                        h.end(exc=exc)
                self._phases = []
                if self._call is not None:  # the generation ends with its section
                    self._call.end_ns = recorder.now_ns()
                    self._call = None
                if self._scope is not None:
                    scope, self._scope = self._scope, None
                    scope.__exit__(exc_type, exc, tb)
            except Exception:
                _failed("profiling_context.exit")


def _profiling_context(trainer: Any, name: str) -> Any:
    """``trl.extras.profiling.profiling_context``, traced for instrumented trainers."""
    original = _PROCESS.original_pc
    assert original is not None
    pc = original(trainer, name)
    st = _state_of(trainer)
    if st is None:
        return pc
    return _Section(pc, st, name)


def _patch_profiling() -> None:
    """Rebind ``profiling_context`` in ``trl.extras.profiling`` and every loaded ``trl`` module
    that imported it by name (idempotent)."""
    with _PATCH_LOCK:
        prof: Any = importlib.import_module("trl.extras.profiling")
        if _PROCESS.original_pc is None:
            current = prof.profiling_context
            if current is _profiling_context:  # pragma: no cover - only if another copy patched it
                raise RuntimeError("trl.extras.profiling.profiling_context is already replaced")
            _PROCESS.original_pc = current
        original = _PROCESS.original_pc
        prof.profiling_context = _profiling_context
        for name, mod in list(sys.modules.items()):
            if (name == "trl" or name.startswith("trl.")) and mod is not None and \
                    getattr(mod, "profiling_context", None) is original:
                setattr(mod, "profiling_context", _profiling_context)  # noqa: B010


# ---- sessions ---------------------------------------------------------------------------------


def _start_phases(batch: _Batch, rows: Any, phase: str, payload: dict[str, Any],
                  per_row: list[dict[str, Any]] | None = None) -> list[Any]:
    """Open ``phase`` in the sessions of ``rows``: a handle per row, None where its session is
    no longer open."""
    event = _runtime.trace_session_event
    method = f"mark_{phase}_start"
    handles: list[Any] = []
    for j, r in enumerate(rows):
        h = None
        if r in batch.open_rows:
            p = dict(payload)
            if per_row is not None:
                p.update(per_row[j])
            h = event(method, session_id=batch.sids[r], **p)
        handles.append(h)
    return handles


def _new_batch(trainer: Any, n: int) -> _Batch:
    """Register a task per prompt group and a session per completion of a batch of ``n`` rows."""
    g = max(int(getattr(trainer, "num_generations", 1) or 1), 1)
    try:
        first = int(trainer.accelerator.process_index) * n
    except Exception:
        first = 0
    tasks: dict[int, Any] = {}
    sids = []
    for i in range(n):
        group = (first + i) // g
        tid = tasks.get(group)
        if tid is None:
            tid = tasks[group] = _runtime.register_task()
        sids.append(_runtime.register_session(task_id=tid))
    return _Batch(sids=sids, rows=n, open_rows=set(range(n)))


def _finalize(batch: _Batch, rows: Any, status: str, reason: str | None = None,
              by_row: Callable[[int], str | None] | None = None) -> None:
    registry = _runtime.RUNTIME.sessions
    for r in rows:
        if r not in batch.open_rows:
            continue
        batch.open_rows.discard(r)
        why = by_row(r) if by_row is not None else reason
        registry.finalize_session(batch.sids[r], status, why)


def _fail_batch(batch: _Batch | None, exc: BaseException) -> None:
    """Close what a batch left open when TRL raised inside it."""
    if batch is None:
        return
    try:
        for call in batch.calls:
            for h in call.handles:
                if h is not None:
                    h.end(exc=exc)
        batch.closed = True
        _finalize(batch, list(batch.open_rows), "failed", f"{type(exc).__name__}: {exc}")
    except Exception:
        _failed("fail_batch")


def _completion_lengths(trainer: Any, completion_ids: Any, tool_mask: Any) -> list[int]:
    """Each completion's length as TRL logs it (model tokens only when tools ran)."""
    if tool_mask is not None:
        return [int(sum(m)) for m in tool_mask]
    return [len(ids) for ids in completion_ids]


def _truncated(trainer: Any, completion_ids: Any) -> list[bool]:
    """Which completions did not end in EOS/pad: cut at the length limit (TRL's own test)."""
    stops = set(getattr(trainer, "eos_token_ids", None) or [])
    tok = getattr(trainer, "_tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is not None:
        stops.add(pad)
    return [bool(ids) and ids[-1] not in stops for ids in completion_ids]


def _close_generation(trainer: Any, batch: _Batch, result: Any) -> None:
    """End the batch's generate phases (at the times their calls returned) with TRL's final
    token counts, and mark truncated completions."""
    # GRPO: (prompt_ids, completion_ids, tool_mask, completions, ...); RLOO: (prompt_ids,
    # completion_ids, completions)
    completion_ids = result[1]
    tool_mask = result[2] if len(result) >= 8 else None
    lengths = _completion_lengths(trainer, completion_ids, tool_mask)
    cut = _truncated(trainer, completion_ids)
    per_row: dict[int, list[tuple[_Call, int]]] = {}
    for call in batch.calls:
        for j, r in enumerate(call.rows):
            per_row.setdefault(r, []).append((call, j))
    out: dict[tuple[int, int], int] = {}
    for r, seq in per_row.items():
        counts = [c.out[j] if j < len(c.out) else 0 for c, j in seq]
        excess = sum(counts) - lengths[r] if r < len(lengths) else 0
        for k in range(len(counts) - 1, -1, -1):  # TRL trims what a call past the limit added
            if excess <= 0:
                break
            cut_k = min(excess, counts[k])
            counts[k] -= cut_k
            excess -= cut_k
        for (c, j), n in zip(seq, counts, strict=True):
            out[(id(c), j)] = n
    for call in batch.calls:
        for j, (r, h) in enumerate(zip(call.rows, call.handles, strict=False)):
            if h is None:
                continue
            payload: dict[str, Any] = {"output_tokens": out.get((id(call), j), 0)}
            if per_row[r][-1][0] is call:  # the completion's last generation call
                payload["finish_reason"] = "length" if r < len(cut) and cut[r] else "stop"
            h.end(call.end_ns or None, payload=payload)
    for r, is_cut in enumerate(cut):
        if is_cut and r in batch.open_rows:
            increment_counter(TRUNCATED, 1, session_id=batch.sids[r])


def _zero_spread(trainer: Any, batch: _Batch) -> list[bool] | None:
    """Which rows belong to a group whose rewards have zero spread, computed as TRL does for
    ``frac_reward_zero_std`` (weighted sum of the reward functions, ``nanstd`` per group)."""
    rpf = batch.rewards
    aggregation = getattr(trainer, "multi_objective_aggregation", None)
    if aggregation is None:  # RLOO: its rewards carry a KL penalty and clipping when set
        if getattr(trainer, "beta", 0.0) or getattr(trainer, "reward_clip_range", None):
            return None
    elif aggregation != "sum_then_normalize":  # normalize_then_sum: not zero when the spread is
        return None
    if rpf is None:
        return None
    import torch  # TRL's own dependency: present whenever a trainer is
    from trl.trainer.utils import nanstd

    g = int(trainer.num_generations)
    with torch.no_grad():
        unscorable = torch.isnan(rpf).all(dim=1)
        rewards = (rpf * trainer.reward_weights.to(rpf.device).unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards.view(-1, g), dim=1)
        zero = torch.isclose(std, torch.zeros_like(std)).repeat_interleave(g).tolist()
    try:
        first = int(trainer.accelerator.process_index) * batch.rows
    except Exception:
        first = 0
    return [bool(v) for v in zero[first:first + batch.rows]]


# ---- tools --------------------------------------------------------------------------------------


def _wrap_tools(trainer: Any, st: _Tracing, batch: _Batch) -> None:
    """Wrap this batch's tool callables (TRL builds a dict of them per completion) so each call
    is a ``toolcall`` phase of that completion's session."""
    for attr, is_async in (("_sync_tool_dicts", False), ("_async_tool_dicts", True)):
        dicts = getattr(trainer, attr, None)
        if not isinstance(dicts, list) or len(dicts) != batch.rows:
            continue
        for r, tools in enumerate(dicts):
            if isinstance(tools, dict):
                for name, fn in list(tools.items()):
                    tools[name] = _tool_wrapper(fn, str(name), batch, r, is_async)


def _tool_wrapper(fn: Any, name: str, batch: _Batch, row: int, is_async: bool) -> Any:
    sid = batch.sids[row]

    def note() -> None:
        if not batch.tool_rows or batch.tool_rows[-1] != row:
            batch.tool_rows.append(row)

    if is_async:
        @functools.wraps(fn)
        async def acall(*a: Any, **k: Any) -> Any:
            phase: Any = None
            try:
                note()
                phase = _runtime.atrace_session_phase("toolcall", {"tool_name": name}, session_id=sid)
                await phase.__aenter__()
            except Exception:
                phase = None
                _failed("toolcall.enter")
            try:
                result = await fn(*a, **k)
            except BaseException as exc:
                _exit_phase(phase, exc)
                raise
            _exit_phase(phase, None)
            return result

        return acall

    @functools.wraps(fn)
    def call(*a: Any, **k: Any) -> Any:
        phase: Any = None
        try:
            note()
            phase = _runtime.trace_session_phase("toolcall", {"tool_name": name}, session_id=sid)
            phase.__enter__()
        except Exception:
            phase = None
            _failed("toolcall.enter")
        try:
            result = fn(*a, **k)
        except BaseException as exc:
            _exit_phase(phase, exc)
            raise
        _exit_phase(phase, None)
        return result

    return call


def _exit_phase(phase: Any, exc: BaseException | None) -> None:
    if phase is None:
        return
    try:
        phase.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception:
        _failed("toolcall.exit")


# ---- the wrappers set on the trainer ------------------------------------------------------------


def _training(trainer: Any) -> bool:
    try:
        return bool(trainer.model.training)
    except Exception:
        return False


def _wrap_generate(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _generate(prompts: Any, *a: Any, **k: Any) -> Any:
        batch = None
        whole: list[Any] = []
        try:
            if _training(trainer) and _runtime.RUNTIME.sessions.enabled:
                batch = _new_batch(trainer, len(prompts))
                st.batch = batch
                if getattr(trainer, "tools", None):
                    _wrap_tools(trainer, st, batch)
                if getattr(trainer, "rollout_func", None) is not None:  # no per-call hook inside
                    whole = _start_phases(batch, range(batch.rows), "generate", {"model": st.model})
                    batch.calls.append(_Call(list(range(batch.rows)), whole))
        except Exception:
            _failed("_generate.enter")
        try:
            result = orig(prompts, *a, **k)
        except BaseException as exc:
            _fail_batch(batch, exc)
            st.batch = None
            raise
        if batch is not None:
            try:
                if whole:
                    call = batch.calls[0]
                    call.end_ns = recorder.now_ns()
                    call.out = [len(ids) for ids in result[1]]
                _close_generation(trainer, batch, result)
            except Exception:
                _failed("_generate.exit")
        return result

    return _generate


def _rows_of_call(batch: _Batch, n: int) -> list[int]:
    """The batch rows a generation call of ``n`` prompts continues: all rows first, then the rows
    whose tools just ran (TRL drops those whose tool results would overflow the length limit:
    the first ``n`` of them are taken then)."""
    if not batch.calls:
        return list(range(min(n, batch.rows)))
    rows = sorted(set(batch.tool_rows))
    return rows[:n]


def _wrap_single_turn(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _generate_single_turn(prompt_ids: Any, *a: Any, **k: Any) -> Any:
        batch = st.batch
        call = None
        try:
            if batch is not None and not batch.closed and _training(trainer):
                rows = _rows_of_call(batch, len(prompt_ids))
                per_row = [{"input_tokens": len(prompt_ids[j])} for j in range(len(rows))]
                call = _Call(rows, [], per_row=per_row)
                if not getattr(trainer, "use_vllm", False):
                    call.handles = _start_phases(batch, rows, "generate", {"model": st.model}, per_row)
                # with vLLM the call first syncs weights: its phases open with the vLLM.generate
                # section (see _Section), not here
                st.call = call
                batch.calls.append(call)
                batch.tool_rows = []
        except Exception:
            call = None
            _failed("_generate_single_turn.enter")
        try:
            result = orig(prompt_ids, *a, **k)
        finally:
            st.call = None
        if call is not None:
            try:
                if not call.handles and batch is not None:  # no generation section was seen
                    call.handles = _start_phases(batch, call.rows, "generate", {"model": st.model},
                                                 call.per_row)
                if not call.end_ns:
                    call.end_ns = recorder.now_ns()
                ids = result[0] if isinstance(result, tuple) else result  # GRPO: (ids, logprobs)
                call.out = [len(ids[j]) for j in range(min(len(ids), len(call.rows)))]
            except Exception:
                _failed("_generate_single_turn.exit")
        return result

    return _generate_single_turn


def _wrap_rewards(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _calculate_rewards(*a: Any, **k: Any) -> Any:
        result = orig(*a, **k)
        batch = st.batch
        if batch is not None and not batch.closed:
            batch.rewards = result
        return result

    return _calculate_rewards


def _wrap_score(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _generate_and_score_completions(*a: Any, **k: Any) -> Any:
        try:
            out = orig(*a, **k)
        except BaseException as exc:
            _fail_batch(st.batch, exc)
            st.batch = None
            raise
        batch = st.batch
        if batch is None:
            return out
        st.batch = None
        try:
            batch.closed = True
            batch.zero_adv = _zero_spread(trainer, batch)
            batch.rewards = None
            if isinstance(out, dict) and batch.open_rows:
                import torch

                out[_ROW_KEY] = torch.arange(batch.rows)
                st.pending.append(batch)
            else:
                _accept(batch, list(batch.open_rows))
        except Exception:
            _failed("_generate_and_score_completions.exit")
        return out

    return _generate_and_score_completions


def _accept(batch: _Batch, rows: list[int]) -> None:
    zero = batch.zero_adv
    _finalize(batch, rows, "accepted",
              by_row=(lambda r: ZERO_ADVANTAGE if zero is not None and r < len(zero) and zero[r] else None))


def _wrap_prepare(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _prepare_inputs(*a: Any, **k: Any) -> Any:
        inputs = orig(*a, **k)
        if isinstance(inputs, dict) and _ROW_KEY in inputs:
            # always taken out (the loss never sees it), also when nothing is pending any more
            # (training ended or raised before): only then are the rows left unrecorded
            rows = inputs.pop(_ROW_KEY)
            if st.pending:
                try:
                    _trained(st, rows)
                except Exception:
                    _failed("_prepare_inputs.exit")
        return inputs

    return _prepare_inputs


def _trained(st: _Tracing, rows_t: Any) -> None:
    """The rows of the newest pending batch that this step trains on: they belong to this step;
    finalize them."""
    batch = st.pending[-1]
    rows = [int(r) for r in rows_t.tolist()]
    now = current_step()
    if now is not None:
        registry = _runtime.RUNTIME.sessions
        for r in rows:
            if r in batch.open_rows:
                sess = registry.session(batch.sids[r])
                if sess is not None:
                    sess.step = now
    _accept(batch, rows)
    # older batches can no longer be trained on (TRL replaced its buffer): their rest is unused
    for old in st.pending[:-1]:
        _finalize(old, list(old.open_rows), "dropped", UNUSED)
    st.pending = [batch] if batch.open_rows else []


def _wrap_train(trainer: Any, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def train(*a: Any, **k: Any) -> Any:
        try:
            result = orig(*a, **k)
        except BaseException as exc:
            _close_all(st, exc)
            raise
        _close_all(st, None)
        return result

    return train


def _close_all(st: _Tracing, exc: BaseException | None) -> None:
    """End what training left open: the step and optimizer scopes, unused samples."""
    try:
        if exc is not None:
            _fail_batch(st.batch, exc)
        st.batch = None
        for batch in st.pending:
            _finalize(batch, list(batch.open_rows), "dropped", UNUSED)
        st.pending = []
        et = type(exc) if exc is not None else None
        if st.opt_scope is not None:
            scope, st.opt_scope = st.opt_scope, None
            scope.__exit__(et, exc, None)
        if st.step_ctx is not None:
            ctx, st.step_ctx = st.step_ctx, None
            ctx.__exit__(et, exc, None)
    except Exception:
        _failed("train.exit")


def _wrap_backward(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def backward(*a: Any, **k: Any) -> Any:
        try:
            scope: Any = trace_scope(SECTION_PREFIX + "backward", "compute", _ARGS)
            scope.__enter__()
        except Exception:
            scope = None
            _failed("backward.enter")
        try:
            result = orig(*a, **k)
        except BaseException as exc:
            _exit_scope(scope, exc, "backward.exit")
            raise
        _exit_scope(scope, None, "backward.exit")
        return result

    return backward


def _exit_scope(scope: Any, exc: BaseException | None, hook: str) -> None:
    if scope is None:
        return
    try:
        scope.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception:
        _failed(hook)


def _callback(st: _Tracing) -> Any:
    """A ``TrainerCallback`` opening a step scope per optimizer step (its begin and end run on
    the training thread, in the same context) and moving the policy version after it."""
    base = importlib.import_module("transformers").TrainerCallback

    def guarded(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def hook(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            try:
                fn(state)
            except Exception:
                _failed(f"callback.{fn.__name__}")

        return hook

    def on_train_begin(state: Any) -> None:
        set_policy_version(int(state.global_step))

    def on_step_begin(state: Any) -> None:
        if st.step_ctx is not None:  # a step never ended (should not happen): close it
            ctx, st.step_ctx = st.step_ctx, None
            ctx.__exit__(None, None, None)
        ctx = step(int(state.global_step) + 1, args=_ARGS)
        ctx.__enter__()
        st.step_ctx = ctx

    def on_pre_optimizer_step(state: Any) -> None:
        scope = trace_scope(SECTION_PREFIX + "optimizer_step", "compute", _ARGS)
        scope.__enter__()
        st.opt_scope = scope

    def on_optimizer_step(state: Any) -> None:
        if st.opt_scope is not None:
            scope, st.opt_scope = st.opt_scope, None
            scope.__exit__(None, None, None)

    def on_step_end(state: Any) -> None:
        on_optimizer_step(state)
        if st.step_ctx is not None:
            ctx, st.step_ctx = st.step_ctx, None
            ctx.__exit__(None, None, None)
        set_policy_version(int(state.global_step))

    def on_train_end(state: Any) -> None:
        _close_all(st, None)

    hooks = {fn.__name__: guarded(fn) for fn in (on_train_begin, on_step_begin, on_pre_optimizer_step,
                                                  on_optimizer_step, on_step_end, on_train_end)}
    cls = type("RltraceTRLCallback", (base,), {"__doc__": "rltrace's step scopes for TRL.", **hooks})
    return cls()


# ---- instrument ---------------------------------------------------------------------------------


def _configure_for(trainer: Any) -> None:
    """Configure rltrace under the trainer's ``output_dir`` (session tracing on) when nothing
    configured it yet, and say where the log dir is (once per process)."""
    if _runtime.is_configured():
        return
    out = getattr(getattr(trainer, "args", None), "output_dir", None) or "."
    _runtime.configure(fileroot=os.path.join(str(out), "rltrace"), experiment_name="trl",
                       trial_name=type(trainer).__name__, session_tracer={"enabled": True})
    pipeline = _runtime.get_pipeline()
    log_dir = getattr(pipeline, "log_dir", None)
    if not _PROCESS.printed and log_dir is not None:
        _PROCESS.printed = True
        print(f"rltrace: tracing {type(trainer).__name__} into {log_dir} "
              f"(then: rltrace report {log_dir})", flush=True)


def _model_name(trainer: Any) -> str:
    model = getattr(trainer, "model", None)
    name = getattr(model, "name_or_path", None) or \
        getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else type(model).__name__


def _set_wrapper(obj: Any, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    orig = getattr(obj, attr, None)
    if orig is None or not callable(orig):
        return
    setattr(obj, attr, make(orig))


def instrument(trainer: T) -> T:
    """Trace ``trainer`` (a TRL trainer, after it is built and before ``train()``); returns it.

    Not configured yet: configures rltrace under ``{output_dir}/rltrace`` with session tracing
    on and prints the log dir.  A second call on the same trainer does nothing.  Trainers other
    than ``GRPOTrainer`` get their step scopes and TRL's profiled sections as scopes; sessions
    come from the GRPO-style generation hooks where the trainer has them.
    """
    if is_instrumented(trainer):
        return trainer
    if not hasattr(trainer, "add_callback") or not hasattr(trainer, "state"):
        raise TypeError(f"rltrace.integrations.trl.instrument: expected a TRL/transformers Trainer, got "
                        f"{type(trainer).__name__}; call instrument(trainer) after building the trainer")
    _configure_for(trainer)
    _patch_profiling()
    st = _Tracing(list(getattr(trainer, "reward_func_names", None) or []), _model_name(trainer))
    _STATES[trainer] = st
    t: Any = trainer
    _set_wrapper(t, "_generate", lambda o: _wrap_generate(t, st, o))
    _set_wrapper(t, "_generate_single_turn", lambda o: _wrap_single_turn(t, st, o))
    _set_wrapper(t, "_calculate_rewards", lambda o: _wrap_rewards(t, st, o))
    _set_wrapper(t, "_generate_and_score_completions", lambda o: _wrap_score(t, st, o))
    _set_wrapper(t, "_prepare_inputs", lambda o: _wrap_prepare(t, st, o))
    _set_wrapper(t, "train", lambda o: _wrap_train(t, st, o))
    accelerator = getattr(t, "accelerator", None)
    if accelerator is not None and not getattr(getattr(accelerator, "backward", None),
                                               "_rltrace_wrapped", False):
        _set_wrapper(accelerator, "backward", _wrap_backward)
        with_flag: Any = accelerator.backward
        with_flag._rltrace_wrapped = True
    t.add_callback(_callback(st))
    return trainer
