"""The TRL one-liner written as a user with ``mypy --strict`` would: checked by ``.ci/typecheck``.

Not a pytest module (it is never run).  ``instrument`` returns the trainer it was given with its
type unchanged, so ``instrument(GRPOTrainer(...)).train()`` stays typed.  The trainer is
described by a protocol here so that the check does not load TRL and transformers (both
typed, and large).
"""

from __future__ import annotations

from typing import Protocol

from rltrace.integrations.trl import FRAMEWORK, UNUSED, errors, instrument, is_instrumented


class Trainer(Protocol):
    """What this file needs of ``trl.GRPOTrainer``."""

    def train(self) -> object: ...


def traced_training(trainer: Trainer) -> dict[str, int]:
    same: Trainer = instrument(trainer)  # the one line; the trainer comes back typed
    same.train()
    assert is_instrumented(trainer)
    framework: str = FRAMEWORK
    reason: str = UNUSED
    del framework, reason
    return errors()  # failures inside rltrace's hooks, by hook (never raised into TRL)
