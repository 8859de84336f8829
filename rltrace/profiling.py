"""torch.profiler, on rltrace's clock and in its log dir: over chosen training steps
(:class:`profile_steps`, AReaL's) and around one scope (AReaL's ``enable_profiler``).

Traces go to ``{log_dir}/torch_profiler/``; ``rltrace convert`` on the log dir merges them with
rltrace's own on one epoch clock (Kineto's ``baseTimeNanoseconds``).  torch is imported only when
a profile is taken.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rltrace.device import require
from rltrace.logdir.files import make_folders
from rltrace.recording.recorder import internal_error
from rltrace.runtime import RUNTIME
from rltrace.steps import current_step, enclosing_scope_args

if TYPE_CHECKING:
    from torch.profiler import ProfilerActivity


class profile_steps:
    """Run ``torch.profiler`` over chosen training steps (AReaL's ``profile_steps``).

    ``with prof.step(global_step): ...`` profiles that step when it is in ``steps`` and writes
    its Chrome trace to ``{log_dir}/torch_profiler/step{n}-r{rank}.json``.  ``rltrace convert``
    on the log dir merges those files with rltrace's own on one epoch clock (Kineto's
    ``baseTimeNanoseconds``), as a separate process per rank named ``torch.profiler``.
    """

    def __init__(self, steps: Iterable[int] | None, *,
                 activities: Iterable[ProfilerActivity] | None = None, record_shapes: bool = False,
                 out_dir: str | None = None) -> None:
        self.steps = set(steps or ())
        self.activities = activities
        self.record_shapes = record_shapes
        self.out_dir = out_dir
        self.written: list[str] = []

    def step(self, n: int) -> AbstractContextManager[object]:
        """A context manager for step ``n`` (profiling only if ``n`` was chosen)."""
        if n not in self.steps:
            return contextlib.nullcontext()
        return self._profiled(n)

    def _profiled(self, n: int) -> AbstractContextManager[object]:
        p = RUNTIME.pipeline
        out = Path(self.out_dir) if self.out_dir else profiler_dir()
        rank = p.rank if p is not None else 0
        role = f"{p.cfg.role}-" if p is not None and p.cfg.role else ""
        path = out / f"{role}step{n}-r{rank}.json"
        self.written.append(str(path))
        return torch_profile(path, activities=self.activities, record_shapes=self.record_shapes)


def profiler_dir() -> Path:
    """Where torch.profiler traces go: ``{log_dir}/torch_profiler/`` (``rltrace convert`` on the
    log dir merges them), or ``./torch_profiler`` when rltrace is not configured."""
    p = RUNTIME.pipeline
    return p.log_dir / "torch_profiler" if p is not None else Path("torch_profiler")


def torch_profile(path: str | os.PathLike[str], *, activities: Iterable[ProfilerActivity] | None = None,
                  **profiler_args: Any) -> AbstractContextManager[object]:
    """A context manager running ``torch.profiler.profile`` and exporting its Chrome trace to ``path``.

    ``activities`` default to the CPU, plus CUDA when a GPU is available; other keyword
    arguments go to ``torch.profiler.profile`` (``record_shapes``, ``with_stack``,
    ``profile_memory``, ...; AReaL's ``profiler_args``).  The trace keeps Kineto's
    ``baseTimeNanoseconds``, so ``rltrace convert`` puts it on rltrace's epoch clock.
    """
    torch = require("torch")
    from torch.profiler import ProfilerActivity, profile

    acts = activities
    if acts is None:
        acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    target = Path(path)

    @contextlib.contextmanager
    def run() -> Iterator[object]:
        with profile(activities=acts, **profiler_args) as prof:
            yield prof
        try:
            make_folders(target.parent, guard=RUNTIME.guarded)  # never another user's
            prof.export_chrome_trace(str(target))
        except Exception as exc:  # tracing never breaks training
            internal_error(f"torch.profiler export to {target}", exc)

    return run()


#: a torch.profiler session started by ``enable_profiler`` is running in this context
_PROFILER_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("rltrace_profiler_active",
                                                                        default=False)
_SAFE = re.compile(r"[^A-Za-z0-9_.]+")


def _global_step(args: Mapping[str, object] | None) -> object:
    """AReaL's step of a scope: its ``global_step`` arg, an enclosing scope's, or rltrace.step."""
    if args and "global_step" in args:
        return args["global_step"]
    for a in enclosing_scope_args():
        if "global_step" in a:
            return a["global_step"]
    return current_step()


def _profile_steps() -> frozenset[int]:
    cfg = RUNTIME.config
    steps = cfg.profile_steps if cfg is not None and RUNTIME.pipeline is not None else None
    out: set[int] = set()
    for raw in steps or ():
        try:
            out.add(int(raw))
        except (TypeError, ValueError):
            continue
    return frozenset(out)


def profile_path(name: str, step: object) -> Path:
    p = RUNTIME.pipeline
    rank = p.rank if p is not None else 0
    role = f"{p.cfg.role}-" if p is not None and p.cfg.role else ""
    stem = f"{role}step{step}-r{rank}-{_SAFE.sub('_', name)[:80] or 'scope'}"
    path: Path = profiler_dir() / f"{stem}.json"
    k = 2
    while path.exists():
        path = path.with_name(f"{stem}-{k}.json")
        k += 1
    return path


class _ProfiledScope:
    """``torch.profiler`` around one rltrace scope (entered first, left last, so it covers it)."""

    __slots__ = ("_prof", "_token", "path", "scope")

    def __init__(self, scope: Any, path: Path, profiler_args: dict[str, Any] | None) -> None:
        kwargs = dict(profiler_args or {})
        kwargs.setdefault("record_shapes", False)
        kwargs.setdefault("with_stack", False)
        self.scope = scope
        self.path = path
        self._prof = torch_profile(path, **kwargs)
        self._token: contextvars.Token[bool] | None = None

    def __enter__(self) -> Any:
        self._token = _PROFILER_ACTIVE.set(True)
        self._prof.__enter__()
        return self.scope.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.scope.__exit__(exc_type, exc, tb)
        finally:
            try:
                self._prof.__exit__(None, None, None)
            finally:
                if self._token is not None:
                    _PROFILER_ACTIVE.reset(self._token)

    async def __aenter__(self) -> Any:
        return self.__enter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(exc_type, exc, tb)


def maybe_profiled(scope: Any, name: str, args: Mapping[str, object] | None,
                   profiler_args: dict[str, Any] | None) -> Any:
    """``scope`` with ``torch.profiler`` around it when its step is among the config's
    ``profile_steps`` and no profiler started this way is running (AReaL's
    ``enable_profiler``), else ``scope`` itself."""
    if not RUNTIME.state.enabled or _PROFILER_ACTIVE.get():
        return scope
    step = _global_step(args)
    if step is None or step not in _profile_steps():
        return scope
    return _ProfiledScope(scope, profile_path(name, step), profiler_args)
