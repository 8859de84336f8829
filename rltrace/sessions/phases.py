"""Session phases: the registry of phase names (generate, reward, toolcall, and yours).

A phase is one ``register_phase`` call; it then works with ``trace_session(phase)``,
``trace_session_phase``/``atrace_session_phase``, ``mark_<phase>_start``/``mark_<phase>_end``
and gets its own ``<phase>_s`` field in every session record.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from rltrace.recording.arguments import did_you_mean

__all__ = ["BUILTIN", "PhaseRegistry", "PhaseSpec", "UnknownPhaseError"]

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


class PhaseRegistry:
    """The registered phases: the built-ins, then yours in registration order.

    The runtime owns the process's one (``rltrace.runtime.RUNTIME.phases``; ``register_phase``
    is its method); tests build their own, or take a :meth:`snapshot` of it and :meth:`restore` it.
    """

    def __init__(self, builtin: tuple[PhaseSpec, ...] = BUILTIN) -> None:
        self._lock = threading.Lock()
        #: the registered phases by name (replaced on each registration, never changed in
        #: place: a reader without the lock sees one whole state)
        self.specs: dict[str, PhaseSpec] = {p.name: p for p in builtin}
        self._builtin = frozenset(self.specs)
        self._custom: tuple[str, ...] = ()

    def register(
        self, name: str, *, category: str = "compute", starts_turn: bool = False,
        genai_operation: str | None = None,
    ) -> PhaseSpec:
        """Register a session phase (e.g. ``validation``, ``run_agent``); idempotent for equal
        specs.

        Raises ``ValueError`` for an invalid name, or for re-registering a name with a different
        spec (built-in phases cannot be changed).
        """
        if type(name) is not str or not _NAME_RE.fullmatch(name):
            raise ValueError(
                f"rltrace.register_phase: phase name must be an identifier like 'validation', "
                f"got {name!r}"
            )
        spec = PhaseSpec(name, category, starts_turn, genai_operation)
        with self._lock:
            old = self.specs.get(name)
            if old is not None and old != spec:
                raise ValueError(
                    f"rltrace.register_phase: phase {name!r} is already registered as {old}; "
                    f"a phase can be registered once (same arguments are fine)"
                )
            self._set({**self.specs, name: spec})
        return spec

    def _set(self, phases: dict[str, PhaseSpec]) -> None:
        """Under the lock: the registered phases, and the custom names derived from them."""
        self.specs = phases
        self._custom = tuple(n for n in phases if n not in self._builtin)

    def get(self, name: str) -> PhaseSpec:
        """The spec of a registered phase; :class:`UnknownPhaseError` naming the fix otherwise."""
        spec = self.specs.get(name) if type(name) is str else None
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
            hint = did_you_mean(name, self.specs)
            raise UnknownPhaseError(
                f"unknown session phase {name!r}{hint}: "
                + ("" if hint else f"register it first with rltrace.register_phase({name!r}) ")
                + f"(registered: {', '.join(self.specs)})"
            )
        return spec

    def names(self) -> list[str]:
        """Registered phase names, built-ins first, in registration order."""
        return list(self.specs)

    def custom_names(self) -> tuple[str, ...]:
        """Registered phase names other than the built-ins, in registration order."""
        return self._custom

    def snapshot(self) -> dict[str, PhaseSpec]:
        """What is registered now, for :meth:`restore`."""
        with self._lock:
            return dict(self.specs)

    def restore(self, state: dict[str, PhaseSpec]) -> None:
        """Put back what :meth:`snapshot` returned (phases registered since are forgotten)."""
        with self._lock:
            self._set(dict(state))

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's may have been held at the fork)."""
        self._lock = threading.Lock()

