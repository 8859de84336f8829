"""What every framework integration needs to hook a framework it does not own: a counter of the
hooks that failed (each failure logged once, never raised into the framework), a method patched
once per class, and whether session tracing is on.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from rltrace import runtime

__all__ = ["HookErrors", "patch_once", "sessions_on"]

F = TypeVar("F", bound=Callable[..., object])


class HookErrors:
    """Failures inside one integration's hooks, by hook: each counted, the first of each logged
    as a warning naming where the count is kept.  The framework goes on untraced there."""

    def __init__(self, framework: str, where: str, logger: logging.Logger | None = None) -> None:
        self.framework = framework
        #: where users read the counts (named in the warning)
        self.where = where
        #: hook -> failures
        self.counts: Counter[str] = Counter()
        self.logger = logger or runtime.logger

    def failed(self, hook: str, exc: BaseException | None = None) -> None:
        """Count a failure of ``hook`` (``exc``, else the exception being handled)."""
        self.counts[hook] += 1
        if self.counts[hook] == 1:
            self.logger.warning("rltrace: the %s hook %s failed; %s goes on untraced there "
                                "(further failures counted in %s)", self.framework, hook,
                                self.framework, self.where, exc_info=exc if exc is not None else True)


def patch_once(cls: type, name: str, make: Callable[[F], F]) -> None:
    """Replace ``cls.name`` (defined on ``cls`` itself) by ``make(original)``, once: a method
    already patched keeps its wrapper (the original is kept on it as ``_rltrace_original``)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, "_rltrace_original", None) is not None:
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, "_rltrace_original", original)  # noqa: B010
    setattr(cls, name, wrapper)


def sessions_on() -> bool:
    """Whether session tracing is on in this process (hooks that make sessions skip otherwise)."""
    return bool(runtime.RUNTIME.sessions.enabled)
