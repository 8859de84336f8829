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
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence, Sized
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from rltrace import runtime as _runtime
from rltrace.accounting.goodput import TRUNCATED, ZERO_ADVANTAGE
from rltrace.integrations._hooks import HookErrors
from rltrace.perf_tracer import increment_counter
from rltrace.recording import recorder
from rltrace.runtime import RUNTIME
from rltrace.sessions.records import PhaseScope
from rltrace.spans import TracedScope, trace_scope
from rltrace.steps import current_step, set_policy_version, step

if TYPE_CHECKING:
    import torch

__all__ = ["FRAMEWORK", "GENERATION_SECTIONS", "SECTION_PREFIX", "UNUSED", "TrlState", "errors",
           "instrument", "is_instrumented"]

logger = logging.getLogger("rltrace.integrations.trl")

#: the ``framework`` argument of every scope this integration opens
FRAMEWORK = "trl"
#: a TRL section ``name`` is the scope ``train.<name>``
SECTION_PREFIX = "train."
#: the finalize reason of completions generated but never trained on (training stopped first)
UNUSED = "unused"
#: the key of the row index added to TRL's generation batch (removed before the loss sees it)
_ROW_KEY = "_rltrace_row"
#: TRL's sections around the generation itself (a ``generate`` phase spans one under vLLM)
GENERATION_SECTIONS = frozenset({"vLLM.generate", "transformers.generate", "transformers.generate_batch"})

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

#: TRL's ``profiling_context(trainer, name)``
_ProfilingContext = Callable[[object, str], AbstractContextManager[object]]
#: makes the wrapper of a trainer method from the method (TRL's methods are untyped: the seam)
_MakeWrapper = Callable[[Callable[..., Any]], Callable[..., object]]


class _Accelerator(Protocol):
    process_index: int


class _Module(Protocol):
    training: bool


class _Trainer(Protocol):
    """What the hooks read directly from a TRL trainer (the GRPO-style attributes are read only
    on trainers that generate; optional ones are read with ``getattr`` and a default)."""

    model: _Module
    accelerator: _Accelerator
    num_generations: int
    reward_weights: torch.Tensor


class _TrainerState(Protocol):
    """transformers' ``TrainerState``, as a callback receives it."""

    global_step: int


class TrlState:
    """This process's TRL integration, held by the runtime (``RUNTIME.part(TrlState)``): the
    instrumented trainers, TRL's own ``profiling_context`` and the failures of the hooks."""

    def __init__(self) -> None:
        #: failures inside rltrace's hooks, by hook (the first of each is logged)
        self.hooks = HookErrors("TRL", "rltrace.integrations.trl.errors()", logger)
        self.patch_lock = threading.Lock()
        #: TRL's own ``profiling_context`` (None until the first ``instrument``)
        self.original_pc: _ProfilingContext | None = None
        #: whether the log dir of a configuration made here was printed
        self.printed = False
        #: the instrumented trainers and their tracing state
        self.trainers: weakref.WeakKeyDictionary[object, _Tracing] = weakref.WeakKeyDictionary()

    def after_fork_in_child(self) -> None:
        self.patch_lock = threading.Lock()  # another thread may have held it at fork time


def _state() -> TrlState:
    return RUNTIME.part(TrlState)


def _args() -> dict[str, object]:
    """The args of every scope this integration opens (a new dict: scopes keep theirs)."""
    return {"framework": FRAMEWORK}


def errors() -> dict[str, int]:
    """Failures inside this integration's hooks, by hook (each was logged once, never raised)."""
    return dict(_state().hooks.counts)


def _failed(hook: str) -> None:
    """Count a failure of ``hook`` (called from an ``except`` block); log the first one."""
    _state().hooks.failed(hook)


def is_instrumented(trainer: object) -> bool:
    """Whether ``instrument`` was called on ``trainer``."""
    try:
        return trainer in _state().trainers
    except TypeError:
        return False


# ---- the state of one instrumented trainer ------------------------------------------------------


@dataclass
class _Call:
    """One generation call of a batch: its rows, their open generate phases, when it returned."""

    rows: list[int]
    handles: list[PhaseScope | None]
    end_ns: int = 0
    out: list[int] = field(default_factory=list)
    #: each row's start payload (its input tokens)
    per_row: list[dict[str, object]] | None = None


@dataclass
class _Batch:
    """One generation batch of the instrumented trainer (train mode)."""

    sids: list[object]
    rows: int
    calls: list[_Call] = field(default_factory=list)
    #: rows whose tools ran since the last generation call (the next call continues them)
    tool_rows: list[int] = field(default_factory=list)
    rewards: torch.Tensor | None = None
    zero_adv: list[bool] | None = None
    closed: bool = False
    #: rows not finalized yet
    open_rows: set[int] = field(default_factory=set)


class _Tracing:
    """What one instrumented trainer's hooks share (holds no reference to the trainer)."""

    def __init__(self, reward_names: list[str], model: str) -> None:
        self.reward_names = frozenset(reward_names)
        self.model = model
        self.step_ctx: TracedScope | None = None
        self.opt_scope: TracedScope | None = None
        self.batch: _Batch | None = None
        #: the generation call in progress (its phases open with a generation section under vLLM)
        self.call: _Call | None = None
        #: batches handed to TRL's buffer whose rows are not all trained yet
        self.pending: list[_Batch] = []


def _state_of(trainer: object) -> _Tracing | None:
    try:
        return _state().trainers.get(trainer)
    except TypeError:
        return None


# ---- TRL's profiled sections as scopes -----------------------------------------------------------


class _Section:
    """TRL's ``ProfilingContext`` for an instrumented trainer, inside a ``train.<name>`` scope
    (and, for a reward function's section, the batch's reward phases)."""

    __slots__ = ("_call", "_name", "_pc", "_phases", "_scope", "_st")

    def __init__(self, pc: AbstractContextManager[object], st: _Tracing, name: str) -> None:
        self._pc = pc
        self._st = st
        self._name = name
        self._scope: TracedScope | None = None
        self._phases: list[PhaseScope | None] = []
        self._call: _Call | None = None

    def __getattr__(self, attr: str) -> object:  # what callers read from TRL's context
        return getattr(self._pc, attr)

    def __enter__(self) -> object:
        try:
            scope = trace_scope(SECTION_PREFIX + self._name, "compute", _args())
            scope.__enter__()
            self._scope = scope
            self._open_phases()
        except Exception:
            _failed("profiling_context.enter")
        return self._pc.__enter__()

    def _open_phases(self) -> None:
        """A reward function's section opens the batch's reward phases; a generation section
        opens the generate phases of the call in progress (under vLLM)."""
        st = self._st
        batch = st.batch
        if batch is None or batch.closed:
            return
        if self._name in st.reward_names:
            self._phases = _start_phases(batch, range(batch.rows), "reward", {"reward_fn": self._name})
        elif self._name in GENERATION_SECTIONS and st.call is not None and not st.call.handles:
            call = st.call
            call.handles = _start_phases(batch, call.rows, "generate", {"model": st.model}, call.per_row)
            self._call = call

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
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


def _profiling_context(trainer: object, name: str) -> AbstractContextManager[object]:
    """``trl.extras.profiling.profiling_context``, traced for instrumented trainers."""
    original = _state().original_pc
    assert original is not None
    pc = original(trainer, name)
    st = _state_of(trainer)
    if st is None:
        return pc
    return _Section(pc, st, name)


def _patch_profiling() -> None:
    """Rebind ``profiling_context`` in ``trl.extras.profiling`` and every loaded ``trl`` module
    that imported it by name (idempotent)."""
    state = _state()
    with state.patch_lock:
        prof = importlib.import_module("trl.extras.profiling")
        if state.original_pc is None:
            current = prof.profiling_context
            if current is _profiling_context:  # pragma: no cover - only if another copy patched it
                raise RuntimeError("trl.extras.profiling.profiling_context is already replaced")
            state.original_pc = current
        original = state.original_pc
        setattr(prof, "profiling_context", _profiling_context)  # noqa: B010
        for name, mod in list(sys.modules.items()):
            if (name == "trl" or name.startswith("trl.")) and mod is not None and \
                    getattr(mod, "profiling_context", None) is original:
                setattr(mod, "profiling_context", _profiling_context)  # noqa: B010


# ---- sessions ---------------------------------------------------------------------------------


def _start_phases(batch: _Batch, rows: Iterable[int], phase: str, payload: Mapping[str, object],
                  per_row: list[dict[str, object]] | None = None) -> list[PhaseScope | None]:
    """Open ``phase`` in the sessions of ``rows``: a handle per row, None where its session is
    no longer open."""
    event = _runtime.trace_session_event
    method = f"mark_{phase}_start"
    handles: list[PhaseScope | None] = []
    for j, r in enumerate(rows):
        h = None
        if r in batch.open_rows:
            p = dict(payload)
            if per_row is not None:
                p.update(per_row[j])
            h = event(method, session_id=batch.sids[r], **p)
        handles.append(h)
    return handles


def _first_row(trainer: _Trainer, rows: int) -> int:
    """The global index of this process's first row (processes generate ``rows`` each)."""
    try:
        return int(trainer.accelerator.process_index) * rows
    except Exception:
        return 0


def _new_batch(trainer: _Trainer, n: int) -> _Batch:
    """Register a task per prompt group and a session per completion of a batch of ``n`` rows."""
    g = max(int(getattr(trainer, "num_generations", 1) or 1), 1)
    first = _first_row(trainer, n)
    tasks: dict[int, object] = {}
    sids: list[object] = []
    for i in range(n):
        group = (first + i) // g
        tid = tasks.get(group)
        if tid is None:
            tid = tasks[group] = _runtime.register_task()
        sids.append(_runtime.register_session(task_id=tid))
    return _Batch(sids=sids, rows=n, open_rows=set(range(n)))


def _finalize(batch: _Batch, rows: Iterable[int], status: str, reason: str | None = None,
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


def _completion_lengths(completion_ids: Iterable[Sized],
                        tool_mask: Iterable[Iterable[int]] | None) -> list[int]:
    """Each completion's length as TRL logs it (model tokens only when tools ran)."""
    if tool_mask is not None:
        return [int(sum(m)) for m in tool_mask]
    return [len(ids) for ids in completion_ids]


def _truncated(trainer: _Trainer, completion_ids: Iterable[Sequence[int]]) -> list[bool]:
    """Which completions did not end in EOS/pad: cut at the length limit (TRL's own test)."""
    stops = set(getattr(trainer, "eos_token_ids", None) or [])
    tok = getattr(trainer, "_tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    if pad is not None:
        stops.add(pad)
    return [bool(ids) and ids[-1] not in stops for ids in completion_ids]


def _calls_by_row(batch: _Batch) -> dict[int, list[tuple[_Call, int]]]:
    """Each row's generation calls, in order, with the row's position in each call."""
    per_row: dict[int, list[tuple[_Call, int]]] = {}
    for call in batch.calls:
        for j, r in enumerate(call.rows):
            per_row.setdefault(r, []).append((call, j))
    return per_row


def _output_tokens(per_row: Mapping[int, list[tuple[_Call, int]]],
                   lengths: Sequence[int]) -> dict[tuple[int, int], int]:
    """The output tokens of each (call, position) once TRL trimmed the completion to its final
    length: what a call added past the limit is taken off the last calls first."""
    out: dict[tuple[int, int], int] = {}
    for r, seq in per_row.items():
        counts = [c.out[j] if j < len(c.out) else 0 for c, j in seq]
        excess = sum(counts) - lengths[r] if r < len(lengths) else 0
        for k in range(len(counts) - 1, -1, -1):
            if excess <= 0:
                break
            cut_k = min(excess, counts[k])
            counts[k] -= cut_k
            excess -= cut_k
        for (c, j), n in zip(seq, counts, strict=True):
            out[(id(c), j)] = n
    return out


def _close_generation(trainer: _Trainer, batch: _Batch, result: Sequence[Any]) -> None:
    """End the batch's generate phases (at the times their calls returned) with TRL's final
    token counts, and mark truncated completions."""
    # GRPO: (prompt_ids, completion_ids, tool_mask, completions, ...); RLOO: (prompt_ids,
    # completion_ids, completions)
    completion_ids = result[1]
    tool_mask = result[2] if len(result) >= 8 else None
    cut = _truncated(trainer, completion_ids)
    per_row = _calls_by_row(batch)
    out = _output_tokens(per_row, _completion_lengths(completion_ids, tool_mask))
    for call in batch.calls:
        for j, (r, h) in enumerate(zip(call.rows, call.handles, strict=False)):
            if h is None:
                continue
            payload: dict[str, object] = {"output_tokens": out.get((id(call), j), 0)}
            if per_row[r][-1][0] is call:  # the completion's last generation call
                payload["finish_reason"] = "length" if r < len(cut) and cut[r] else "stop"
            h.end(call.end_ns or None, payload=payload)
    for r, is_cut in enumerate(cut):
        if is_cut and r in batch.open_rows:
            increment_counter(TRUNCATED, 1, session_id=batch.sids[r])


def _zero_spread(trainer: _Trainer, batch: _Batch) -> list[bool] | None:
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
    first = _first_row(trainer, batch.rows)
    return [bool(v) for v in zero[first:first + batch.rows]]


# ---- tools --------------------------------------------------------------------------------------


def _wrap_tools(trainer: object, batch: _Batch) -> None:
    """Wrap this batch's tool callables (TRL builds a dict of them per completion) so each call
    is a ``toolcall`` phase of that completion's session."""
    for attr, is_async in (("_sync_tool_dicts", False), ("_async_tool_dicts", True)):
        dicts = getattr(trainer, attr, None)
        if not isinstance(dicts, list) or len(dicts) != batch.rows:
            continue
        for r, tools in enumerate(dicts):
            if isinstance(tools, dict):
                for name, fn in list(tools.items()):
                    wrap = _async_tool if is_async else _sync_tool
                    tools[name] = wrap(fn, str(name), batch, r)


def _note_tool_row(batch: _Batch, row: int) -> None:
    """``row``'s tools ran: the next generation call continues it."""
    if not batch.tool_rows or batch.tool_rows[-1] != row:
        batch.tool_rows.append(row)


def _async_tool(fn: Callable[P, Awaitable[R]], name: str, batch: _Batch,
                row: int) -> Callable[P, Coroutine[object, object, R]]:
    sid = batch.sids[row]

    @functools.wraps(fn)
    async def acall(*a: P.args, **k: P.kwargs) -> R:
        phase: PhaseScope | None = None
        try:
            _note_tool_row(batch, row)
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


def _sync_tool(fn: Callable[P, R], name: str, batch: _Batch, row: int) -> Callable[P, R]:
    sid = batch.sids[row]

    @functools.wraps(fn)
    def call(*a: P.args, **k: P.kwargs) -> R:
        phase: PhaseScope | None = None
        try:
            _note_tool_row(batch, row)
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


def _exit_phase(phase: PhaseScope | None, exc: BaseException | None) -> None:
    if phase is None:
        return
    try:
        phase.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception:
        _failed("toolcall.exit")


# ---- the wrappers set on the trainer ------------------------------------------------------------


def _training(trainer: _Trainer) -> bool:
    try:
        return bool(trainer.model.training)
    except Exception:
        return False


def _wrap_generate(trainer: _Trainer, st: _Tracing, orig: Callable[..., Any]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _generate(prompts: Sized, *a: object, **k: object) -> object:
        batch = None
        whole: list[PhaseScope | None] = []
        try:
            if _training(trainer) and _runtime.RUNTIME.sessions.enabled:
                batch = _new_batch(trainer, len(prompts))
                st.batch = batch
                if getattr(trainer, "tools", None):
                    _wrap_tools(trainer, batch)
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


def _wrap_single_turn(trainer: _Trainer, st: _Tracing,
                      orig: Callable[..., Any]) -> Callable[..., object]:
    @functools.wraps(orig)
    def _generate_single_turn(prompt_ids: Sequence[Sized], *a: object, **k: object) -> object:
        batch = st.batch
        call = None
        try:
            if batch is not None and not batch.closed and _training(trainer):
                rows = _rows_of_call(batch, len(prompt_ids))
                per_row: list[dict[str, object]] = [{"input_tokens": len(prompt_ids[j])}
                                                     for j in range(len(rows))]
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


def _wrap_rewards(st: _Tracing, orig: Callable[P, torch.Tensor]) -> Callable[P, torch.Tensor]:
    @functools.wraps(orig)
    def _calculate_rewards(*a: P.args, **k: P.kwargs) -> torch.Tensor:
        result = orig(*a, **k)
        batch = st.batch
        if batch is not None and not batch.closed:
            batch.rewards = result
        return result

    return _calculate_rewards


def _wrap_score(trainer: _Trainer, st: _Tracing, orig: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(orig)
    def _generate_and_score_completions(*a: P.args, **k: P.kwargs) -> R:
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


def _wrap_prepare(st: _Tracing, orig: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(orig)
    def _prepare_inputs(*a: P.args, **k: P.kwargs) -> R:
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


def _trained(st: _Tracing, rows_t: torch.Tensor) -> None:
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


def _wrap_train(st: _Tracing, orig: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(orig)
    def train(*a: P.args, **k: P.kwargs) -> R:
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


def _wrap_backward(orig: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(orig)
    def backward(*a: P.args, **k: P.kwargs) -> R:
        scope: TracedScope | None
        try:
            scope = trace_scope(SECTION_PREFIX + "backward", "compute", _args())
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


def _exit_scope(scope: TracedScope | None, exc: BaseException | None, hook: str) -> None:
    if scope is None:
        return
    try:
        scope.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception:
        _failed(hook)


def _callback(st: _Tracing) -> object:
    """A ``TrainerCallback`` opening a step scope per optimizer step (its begin and end run on
    the training thread, in the same context) and moving the policy version after it."""
    base = importlib.import_module("transformers").TrainerCallback

    def guarded(fn: Callable[[_TrainerState], None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def hook(self: object, args: object, state: _TrainerState, control: object,
                 **kwargs: object) -> None:
            try:
                fn(state)
            except Exception:
                _failed(f"callback.{fn.__name__}")

        return hook

    def on_train_begin(state: _TrainerState) -> None:
        set_policy_version(int(state.global_step))

    def on_step_begin(state: _TrainerState) -> None:
        if st.step_ctx is not None:  # a step never ended (should not happen): close it
            ctx, st.step_ctx = st.step_ctx, None
            ctx.__exit__(None, None, None)
        ctx = step(int(state.global_step) + 1, args=_args())
        ctx.__enter__()
        st.step_ctx = ctx

    def on_pre_optimizer_step(state: _TrainerState) -> None:
        scope = trace_scope(SECTION_PREFIX + "optimizer_step", "compute", _args())
        scope.__enter__()
        st.opt_scope = scope

    def on_optimizer_step(state: _TrainerState) -> None:
        if st.opt_scope is not None:
            scope, st.opt_scope = st.opt_scope, None
            scope.__exit__(None, None, None)

    def on_step_end(state: _TrainerState) -> None:
        on_optimizer_step(state)
        if st.step_ctx is not None:
            ctx, st.step_ctx = st.step_ctx, None
            ctx.__exit__(None, None, None)
        set_policy_version(int(state.global_step))

    def on_train_end(state: _TrainerState) -> None:
        _close_all(st, None)

    hooks = {fn.__name__: guarded(fn) for fn in (on_train_begin, on_step_begin, on_pre_optimizer_step,
                                                  on_optimizer_step, on_step_end, on_train_end)}
    cls = type("RltraceTRLCallback", (base,), {"__doc__": "rltrace's step scopes for TRL.", **hooks})
    return cls()


# ---- instrument ---------------------------------------------------------------------------------


def _configure_for(trainer: object) -> None:
    """Configure rltrace under the trainer's ``output_dir`` (session tracing on) when nothing
    configured it yet, and say where the log dir is (once per process)."""
    if _runtime.is_configured():
        return
    out = getattr(getattr(trainer, "args", None), "output_dir", None) or "."
    _runtime.configure(fileroot=os.path.join(str(out), "rltrace"), experiment_name="trl",
                       trial_name=type(trainer).__name__, session_tracer={"enabled": True})
    pipeline = _runtime.get_pipeline()
    log_dir = getattr(pipeline, "log_dir", None)
    state = _state()
    if not state.printed and log_dir is not None:
        state.printed = True
        print(f"rltrace: tracing {type(trainer).__name__} into {log_dir} "
              f"(then: rltrace report {log_dir})", flush=True)


def _model_name(trainer: object) -> str:
    model = getattr(trainer, "model", None)
    name = getattr(model, "name_or_path", None) or \
        getattr(getattr(model, "config", None), "_name_or_path", None)
    return str(name) if name else type(model).__name__


def _set_wrapper(obj: object, attr: str, make: _MakeWrapper) -> None:
    orig = getattr(obj, attr, None)
    if orig is None or not callable(orig):
        return
    setattr(obj, attr, make(orig))


def _wrap_backward_once(accelerator: object) -> None:
    """Time the accelerator's ``backward`` (once: trainers may share an accelerator)."""
    if getattr(getattr(accelerator, "backward", None), "_rltrace_wrapped", False):
        return
    _set_wrapper(accelerator, "backward", _wrap_backward)
    backward = getattr(accelerator, "backward", None)
    if backward is not None:
        backward._rltrace_wrapped = True


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
    _state().trainers[trainer] = st
    t: Any = trainer  # a transformers Trainer (checked above): the seam to the typed hooks
    _set_wrapper(t, "_generate", lambda o: _wrap_generate(t, st, o))
    _set_wrapper(t, "_generate_single_turn", lambda o: _wrap_single_turn(t, st, o))
    _set_wrapper(t, "_calculate_rewards", lambda o: _wrap_rewards(st, o))
    _set_wrapper(t, "_generate_and_score_completions", lambda o: _wrap_score(t, st, o))
    _set_wrapper(t, "_prepare_inputs", lambda o: _wrap_prepare(st, o))
    _set_wrapper(t, "train", lambda o: _wrap_train(st, o))
    accelerator = getattr(t, "accelerator", None)
    if accelerator is not None:
        _wrap_backward_once(accelerator)
    t.add_callback(_callback(st))
    return trainer
