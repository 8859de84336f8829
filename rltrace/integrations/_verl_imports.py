"""Run a function on a module right after it is imported (a post-import hook).

``rltrace.integrations.verl.instrument()`` may be called before verl's modules are imported
(in the user's main script, or in a Ray worker at start, where importing verl eagerly would
cost seconds in every worker whether it uses verl or not).  A finder placed first on
``sys.meta_path`` lets the normal finders find the module, then wraps its loader so that the
patch runs once the module's code has executed, before the importer sees it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Protocol

from rltrace import runtime
from rltrace.runtime import RUNTIME

__all__ = ["after_import"]

Patch = Callable[[ModuleType], None]


class _ModuleLoader(Protocol):
    """A loader that executes a module (``importlib.abc.Loader`` with ``exec_module``)."""

    def exec_module(self, module: ModuleType) -> None: ...


class _Loader(importlib.abc.Loader):
    """The found loader, with ``patch`` run on the module after it executed."""

    def __init__(self, inner: _ModuleLoader, patch: Patch) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self.inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _safe_patch(self.patch, module)

    def __getattr__(self, name: str) -> object:  # get_source, is_package, ... of the real loader
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, and wraps the loader of a watched module."""

    def __init__(self) -> None:
        self.watched: dict[str, Patch] = {}
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.watched.get(fullname)
        if patch is None or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname  # the finders after us, not ourselves again
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.name = None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, patch)
        return spec


class ImportWatch:
    """This process's post-import hooks, held by the runtime (``RUNTIME.part(ImportWatch)``):
    the finder (placed on ``sys.meta_path`` at the first :func:`after_import`) and its lock."""

    def __init__(self) -> None:
        self.finder = _Finder()
        self.lock = threading.Lock()

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()  # another thread may have held it at fork time


def _safe_patch(patch: Patch, module: ModuleType) -> None:
    try:
        patch(module)
    except Exception as exc:  # tracing must never break the import of the user's framework
        runtime.logger.warning("rltrace.integrations: patching %s failed (it runs untraced): %s",
                               module.__name__, exc)


def after_import(name: str, patch: Patch) -> None:
    """Run ``patch(module)`` on module ``name`` now if it is imported, else when it is.
    ``patch`` must be idempotent (it may run again after a reload)."""
    watch = RUNTIME.part(ImportWatch)
    with watch.lock:
        if watch.finder not in sys.meta_path:
            sys.meta_path.insert(0, watch.finder)
        watch.finder.watched[name] = patch
    module = sys.modules.get(name)
    if module is not None:
        _safe_patch(patch, module)
