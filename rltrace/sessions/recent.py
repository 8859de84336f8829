"""Recent entries kept in two generations: an insert is one dict store, and old entries go a
generation at a time (recently registered tasks and sessions, recent Ray calls)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


def remember(gens: list[dict[_K, _V]], key: _K, value: _V, generation: int) -> None:
    """Keep ``key -> value`` among the recent ones, ``generation`` entries to a generation (the
    caller holds the lock that guards ``gens``)."""
    recent = gens[0]
    recent[key] = value
    if len(recent) >= generation:  # the older generation goes
        gens[1] = recent
        gens[0] = {}


def recent(gens: list[dict[_K, _V]], key: _K) -> _V | None:
    """The value remembered for ``key`` in either generation, or None."""
    found = gens[0].get(key)
    return found if found is not None else gens[1].get(key)
