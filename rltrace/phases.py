"""Session phases: the registry of phase names (generate, reward, toolcall, and yours).

A phase is one ``register_phase`` call; it then works with ``trace_session(phase)``,
``trace_session_phase``/``atrace_session_phase``, ``mark_<phase>_start``/``mark_<phase>_end``
and gets its own ``<phase>_s`` field in every session record.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

from .checks import did_you_mean

__all__ = ["PhaseSpec", "UnknownPhaseError", "get_phase", "phase_names", "register_phase"]

_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class UnknownPhaseError(ValueError):
    """A session phase name was used without being registered."""


@dataclass(frozen=True)
class PhaseSpec:
    """How one phase is recorded."""

    name: str
    #: Chrome/OTel category of the phase span
    category: str = "compute"
    #: each execution starts a new turn of the session (``generate`` does, as in verl)
    starts_turn: bool = False
    #: OTel GenAI ``gen_ai.operation.name`` set on the phase span, if any
    genai_operation: str | None = None

    @property
    def metric(self) -> str:
        """The session-record field holding this phase's total seconds."""
        return f"{self.name}_s"


BUILTIN = (
    PhaseSpec("generate", "compute", starts_turn=True, genai_operation="text_completion"),
    PhaseSpec("reward", "compute"),
    PhaseSpec("toolcall", "io", genai_operation="execute_tool"),
)

_LOCK = threading.Lock()
_PHASES: dict[str, PhaseSpec] = {p.name: p for p in BUILTIN}
_BUILTIN_NAMES = frozenset(_PHASES)
_CUSTOM: tuple[str, ...] = ()


def register_phase(
    name: str, *, category: str = "compute", starts_turn: bool = False,
    genai_operation: str | None = None,
) -> PhaseSpec:
    """Register a session phase (e.g. ``validation``, ``run_agent``); idempotent for equal specs.

    Raises ``ValueError`` for an invalid name, or for re-registering a name with a different
    spec (built-in phases cannot be changed).
    """
    if type(name) is not str or not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"rltrace.register_phase: phase name must be an identifier like 'validation', got {name!r}"
        )
    spec = PhaseSpec(name, category, starts_turn, genai_operation)
    with _LOCK:
        old = _PHASES.get(name)
        if old is not None and old != spec:
            raise ValueError(
                f"rltrace.register_phase: phase {name!r} is already registered as {old}; "
                f"a phase can be registered once (same arguments are fine)"
            )
        _PHASES[name] = spec
        global _CUSTOM
        _CUSTOM = tuple(n for n in _PHASES if n not in _BUILTIN_NAMES)
    return spec


def get_phase(name: str) -> PhaseSpec:
    """The spec of a registered phase; :class:`UnknownPhaseError` naming the fix otherwise."""
    spec = _PHASES.get(name) if type(name) is str else None
    if spec is None:
        if callable(name):
            raise TypeError(
                f"rltrace: a session phase name is needed, got the function "
                f"{getattr(name, '__qualname__', type(name).__name__)}: write "
                f"@trace_session('generate'), with the phase name in parentheses"
            )
        if type(name) is not str:
            raise TypeError(f"rltrace: the session phase must be a str, got "
                            f"{type(name).__name__} {name!r}; pass e.g. 'generate'")
        hint = did_you_mean(name, _PHASES)
        raise UnknownPhaseError(
            f"unknown session phase {name!r}{hint}: "
            + ("" if hint else f"register it first with rltrace.register_phase({name!r}) ")
            + f"(registered: {', '.join(_PHASES)})"
        )
    return spec


def phase_names() -> list[str]:
    """Registered phase names, built-ins first, in registration order."""
    return list(_PHASES)


def custom_phase_names() -> tuple[str, ...]:
    """Registered phase names other than the built-ins, in registration order."""
    return _CUSTOM


def _reset_after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
