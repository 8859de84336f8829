"""verl with one line: ``rltrace.integrations.verl.instrument()``.

Call it in the script that starts verl, before or after verl's modules are imported; verl is not
edited.  What it traces:

* **Trainer sections.**  verl times its trainer with ``marked_timer(name, timing_raw)`` (and
  ``simple_timer``), imported by name into ``ray_trainer`` and the v1, fully-async,
  one-step-off and separation trainers.  Each becomes a scope ``train.<name>`` (args
  ``framework=verl``) with real timestamps; the ``step`` timer becomes the step scope
  ``rltrace.step(global_step)`` (``train.step``), with the trainer's ``global_steps``.
  ``timing_raw`` gets exactly the keys and values it gets untraced: the scope wraps verl's own
  timer, which still does the timing.
* **Policy version.**  At each step the trainer's version is set (:func:`rltrace.set_policy_version`):
  the fully-async trainer's ``current_param_version``, else ``global_steps - 1`` (the weights a
  synchronous step trains from); after a weight sync the version the rollout now has.
* **Agent loop** (:mod:`._verl_agent`), in every agent-loop worker: each sample a session in
  its prompt's task, each generate call a ``generate`` phase with its turn and tokens, each tool
  call a ``toolcall`` phase named by the tool, the reward computation a ``reward`` phase.
* **Ray.**  verl runs its trainer (``TaskRunner``) and agent-loop workers as Ray actors:
  ``instrument()`` registers itself with :func:`rltrace.ray.on_worker_setup`, and (when rltrace
  is configured and Ray not yet started) makes verl's own ``ray.init(...)`` go through
  :func:`rltrace.ray.init`, so every worker is configured from the driver and instrumented.
* **Fully-async mode.**  The message queue between rollouter and trainer as a counter track
  (``verl.message_queue.depth``), and each sample's generating version from verl's own
  parameter version (``min_global_steps`` of the server's output).

Tracing never breaks verl: every hook catches its own errors (logged once, counted in
:data:`ERRORS`) and lets verl's code run as if untraced.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import FrameType, ModuleType, TracebackType
from typing import Any

from rltrace import runtime, steps
from rltrace.integrations._verl_agent import VerlErrors
from rltrace.integrations._verl_agent import install as install_agent_loop
from rltrace.integrations._verl_imports import after_import
from rltrace.recording.recorder import STATE
from rltrace.runtime import RUNTIME
from rltrace.sessions.context import SESSION_CV
from rltrace.spans import TracedScope, trace_scope

__all__ = ["ERRORS", "FRAMEWORK", "VerlState", "instrument", "is_instrumented"]

FRAMEWORK = "verl"
#: where each hook failed, by hook name (a failure is logged once per hook, then counted here);
#: the process's count, kept by the runtime (read through the module's ``__getattr__``)
ERRORS: Counter[str]
#: the names verl times with: traced wherever they are bound
_TIMER_NAMES = ("marked_timer", "simple_timer")
#: modules that define a timer (patched at import, so later ``from ... import`` get the traced one)
_TIMER_SOURCES = (
    "verl.utils.profiler.performance", "verl.utils.profiler.nvtx_profile",
    "verl.utils.profiler.mstx_profile", "verl.utils.profiler", "verl.utils.debug",
    "verl.utils.debug.performance",
)
#: the trainers that import a timer by name (rebound when already imported)
_TIMER_USERS = (
    "verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base",
    "verl.trainer.ppo.v1.trainer_sync", "verl.trainer.ppo.v1.trainer_colocate_async",
    "verl.trainer.ppo.v1.trainer_separate_async",
    "verl.experimental.fully_async_policy.fully_async_trainer",
    "verl.experimental.fully_async_policy.fully_async_rollouter",
    "verl.experimental.separation.ray_trainer", "verl.experimental.one_step_off_policy.ray_trainer",
)
#: timers after which the rollout runs the newly trained weights
_WEIGHT_SYNCS = frozenset({"update_weights", "sync_rollout_weights", "timing_s/param_sync"})
#: verl's ``marked_timer(name, timing_raw, ...)`` / ``simple_timer``
_Timer = Callable[..., AbstractContextManager[object]]


class VerlState:
    """This process's verl integration, held by the runtime (``RUNTIME.part(VerlState)``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: whether :func:`instrument` (or :func:`worker_setup`) ran here
        self.instrumented = False
        #: whether verl's ``ray.init`` is inside :func:`rltrace.ray.init` right now
        self.in_init = False
        #: original timer function -> its traced stand-in
        self.traced: dict[_Timer, _Timer] = {}
        #: steps seen in this process, for a step timer whose trainer has no ``global_steps``
        self.steps_seen = 0

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()  # another thread may have held it at fork time


def _state() -> VerlState:
    return RUNTIME.part(VerlState)


def __getattr__(name: str) -> Counter[str]:
    if name == "ERRORS":
        return RUNTIME.part(VerlErrors).counts
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _args() -> dict[str, object]:
    """The args of every scope this integration opens (a new dict: scopes keep theirs)."""
    return {"framework": FRAMEWORK}


def failed(hook: str, exc: BaseException) -> None:
    """Note that ``hook`` failed (logged the first time, counted every time in :data:`ERRORS`)."""
    RUNTIME.part(VerlErrors).failed(hook, exc)


def _claim() -> bool:
    """Mark this process instrumented; False when it already was."""
    state = _state()
    with state.lock:
        if state.instrumented:
            return False
        state.instrumented = True
    return True


def is_instrumented() -> bool:
    """Whether :func:`instrument` ran in this process."""
    return _state().instrumented


def instrument(ray_workers: bool = True) -> None:
    """Trace verl's trainer sections, agent loop and fully-async queue in this process, and
    (``ray_workers``) in every Ray worker process of the job.  Idempotent; before or after
    verl's modules were imported.  Configure rltrace first (``rltrace.configure(...)``) for the
    Ray workers to get the driver's configuration."""
    if not _claim():
        return
    if runtime.get_config() is None:
        runtime.logger.warning(
            "rltrace.integrations.verl.instrument(): rltrace is not configured yet: verl runs "
            "untraced until rltrace.configure(...) is called, and its Ray workers get the "
            "configuration rltrace has when verl starts Ray (call rltrace.configure first)")
    _instrument_here()
    if ray_workers:
        _instrument_ray()


def _instrument_here() -> None:
    for name in _TIMER_SOURCES + _TIMER_USERS:
        after_import(name, _rebind_timers)
    _rebind_loaded()
    install_agent_loop()


def worker_setup() -> None:
    """In each Ray worker process at start (:func:`rltrace.ray.on_worker_setup`)."""
    if _claim():
        _instrument_here()


# ---- Ray ---------------------------------------------------------------------------------------


def _instrument_ray() -> None:
    try:
        import ray
    except ImportError:
        return
    from rltrace import ray as rltrace_ray

    rltrace_ray.on_worker_setup(f"{__name__}:worker_setup")
    if ray.is_initialized():
        if rltrace_ray.current_job().registry is None:  # started without rltrace.ray.init
            runtime.logger.warning(
                "rltrace.integrations.verl: Ray was started before instrument() without "
                "rltrace.ray.init: verl's Ray workers (its trainer and agent loop) are not "
                "traced. Call instrument() before ray.init / verl's run_ppo, or start Ray with "
                "rltrace.ray.init(...)")
        return
    original = ray.init
    if getattr(original, "_rltrace_original", None) is not None:
        return

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        """verl's ``ray.init(...)``: through :func:`rltrace.ray.init` when rltrace is configured,
        so each worker is configured from the driver and instrumented."""
        state = _state()
        if runtime.get_config() is None or state.in_init:
            return original(*args, **kwargs)
        state.in_init = True
        ray.init = original  # rltrace.ray.init calls ray.init itself
        try:
            return rltrace_ray.init(*args, **kwargs)
        except Exception as exc:
            if ray.is_initialized():  # Ray is up: what failed was rltrace's part after it
                failed("ray.init", exc)
                return None
            return original(*args, **kwargs)  # Ray's own error comes again, as untraced
        finally:
            state.in_init = False

    init._rltrace_original = original  # type: ignore[attr-defined]
    ray.init = init


# ---- trainer timers ----------------------------------------------------------------------------


def _is_timer(fn: object) -> bool:
    """A verl timer function, untraced."""
    return (callable(fn) and getattr(fn, "__name__", None) in _TIMER_NAMES
            and str(getattr(fn, "__module__", "")).startswith("verl.utils.profiler")
            and getattr(fn, "_rltrace_original", None) is None)


def _traced(original: _Timer) -> _Timer:
    known = _state().traced
    traced = known.get(original)
    if traced is not None:
        return traced

    @functools.wraps(original)
    def timer(name: str, timing_raw: dict[str, float], *args: object,
              **kwargs: object) -> AbstractContextManager[object]:
        inner = original(name, timing_raw, *args, **kwargs)
        if not STATE.enabled or SESSION_CV.get() is not None:  # off, or one sample's phase
            return inner
        try:
            return _TimerScope(inner, name, sys._getframe(1))
        except Exception as exc:
            failed("timer", exc)
            return inner

    timer._rltrace_original = original  # type: ignore[attr-defined]
    known[original] = timer
    return timer


def _rebind_timers(module: ModuleType) -> None:
    """Bind the traced timer in place of each untraced one ``module`` holds."""
    ns = vars(module)
    for attr in _TIMER_NAMES:
        fn = ns.get(attr)
        if fn is not None and _is_timer(fn):
            setattr(module, attr, _traced(fn))


def _rebind_loaded() -> None:
    """Every loaded module holding an untraced timer (verl's, a recipe's, the user's)."""
    for module in list(sys.modules.values()):
        try:
            ns = vars(module)
            if any(ns.get(a) is not None and _is_timer(ns.get(a)) for a in _TIMER_NAMES):
                _rebind_timers(module)
        except Exception:  # a module object that does not behave like one
            continue


def _trainer_of(frame: FrameType | None) -> object:
    """The trainer whose method runs the timer: ``self`` of the caller, or of a few callers up
    (a helper method)."""
    for _ in range(4):
        if frame is None:
            return None
        obj = frame.f_locals.get("self")
        if obj is not None and type(getattr(obj, "global_steps", None)) is int:
            return obj
        frame = frame.f_back
    return None


def _trainer_version(trainer: object, step: int | None) -> int | None:
    """The policy version the trainer trains from: the fully-async parameter version, else the
    weights of the step before this one."""
    v = getattr(trainer, "current_param_version", None)
    if type(v) is int and v >= 0:
        return v
    return max(step - 1, 0) if step is not None else None


class _TimerScope:
    """verl's timer context, inside an rltrace scope: the scope opens before verl's timer starts
    and closes after it stopped (``timing_raw`` is verl's own measurement)."""

    __slots__ = ("frame", "inner", "name", "scope", "trainer")

    def __init__(self, inner: AbstractContextManager[object], name: str, frame: FrameType) -> None:
        self.inner = inner
        self.name = name
        self.scope: TracedScope | None = None
        self.trainer: object = None
        self.frame = frame if (name == "step" or name in _WEIGHT_SYNCS) else None

    def __enter__(self) -> object:
        try:
            self.scope = self._open()
            self.scope.__enter__()
        except Exception as exc:
            self.scope = None
            failed("timer", exc)
        self.frame = None  # no frame kept past the entry
        try:
            return self.inner.__enter__()
        except BaseException:
            self._close(*sys.exc_info())
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            self._close(exc_type, exc, tb)

    def _open(self) -> TracedScope:
        name = self.name
        if name == "step":
            trainer = _trainer_of(self.frame)
            n = getattr(trainer, "global_steps", None)
            if type(n) is not int:
                state = _state()
                state.steps_seen += 1
                n = state.steps_seen
            v = _trainer_version(trainer, n)
            if v is not None:
                steps.set_policy_version(v)
            return steps.step(n, args=_args())
        if name in _WEIGHT_SYNCS:
            self.trainer = _trainer_of(self.frame)
        return trace_scope(f"train.{name}", args=_args())

    def _close(self, exc_type: type[BaseException] | None, exc: BaseException | None,
               tb: TracebackType | None) -> None:
        scope, self.scope = self.scope, None
        if scope is None:
            return
        try:
            scope.__exit__(exc_type, exc, tb)
            trainer, self.trainer = self.trainer, None
            if trainer is not None and exc_type is None:  # the rollout has the new weights
                v = getattr(trainer, "current_param_version", None)
                if type(v) is not int:
                    v = getattr(trainer, "global_steps", None)
                if type(v) is int and v >= 0:
                    steps.set_policy_version(v)
        except Exception as exc2:
            failed("timer", exc2)
