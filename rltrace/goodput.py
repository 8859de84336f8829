"""Goodput: where the seconds of one rank's step went, in four buckets that add up to its wall time.

One implementation, used by the report (:mod:`rltrace.analysis.goodput`, from the log files)
and by the live state ``rltrace top`` reads (:mod:`rltrace.live`, from the records as they end).

A rank's step is its step scope (``rltrace.step``: ``train.step``); on a rank that only rolls
out, its sessions' first submit to last finalize in that step.  Its time splits into:

* **productive**: train compute (the ``train.*`` scopes directly under the step that are not
  overhead or the rollout) and the generation, tool and reward time of samples that were
  accepted (trained on);
* **overhead**: weight sync, checkpoints, data loading, flushing (``train.*`` scopes named for
  them: :data:`OVERHEAD_WORDS`) and the step's time outside any ``train.*`` scope (untraced);
* **idle**: rollout time with no session phase running on the rank (a trainer waiting for
  rollouts, a rollout worker waiting for work or weights);
* **wasted**: the generation, tool and reward time of rejected, failed and dropped samples.

During the rollout the rank is busy while any of its sessions runs a phase (the union of their
phase executions); that busy time is shared between productive and wasted in proportion to the
phase time of accepted and of thrown-away sessions.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .sessions import THROWN_AWAY

__all__ = ["BUCKETS", "OVERHEAD_WORDS", "TRUNCATED", "ZERO_ADVANTAGE", "RankStepWork", "ScopeStep", "StepScopeCollector",
           "StepScopes", "split_rank_step", "union_s"]

BUCKETS = ("productive", "overhead", "idle", "wasted")
#: the finalize reason of a sample whose group's rewards have zero spread (no GRPO gradient):
#: wasted work whether the framework trains on it (``accepted``) or filters it (``dropped``)
ZERO_ADVANTAGE = "zero_advantage"
#: the session counter marking a completion cut at the length limit
TRUNCATED = "truncated"
#: ``train.*`` scopes whose name holds one of these words are overhead, not train compute
OVERHEAD_WORDS = ("sync", "weight", "broadcast", "checkpoint", "ckpt", "save", "load", "data",
                  "offload", "flush")
_OVERHEAD = re.compile("|".join(OVERHEAD_WORDS), re.IGNORECASE)


class StepScopes(Protocol):
    """One step scope on one rank and the ``train.*`` scopes directly under it (µs)."""

    start_us: float
    dur_us: float
    #: train-side scopes directly under the step (not nested in another ``train.*`` scope): µs
    breakdown: dict[str, float]
    rollout_start_us: float | None
    rollout_end_us: float | None


@dataclass
class ScopeStep:
    """A :class:`StepScopes` built from records as they end (the live state's)."""

    start_us: float
    dur_us: float
    breakdown: dict[str, float] = field(default_factory=dict)
    rollout_start_us: float | None = None
    rollout_end_us: float | None = None


@dataclass
class RankStepWork:
    """What the session records say one rank did in one step."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    accepted_s: float = 0.0
    wasted_s: float = 0.0
    first_submit: float = float("inf")
    last_final: float = float("-inf")
    tokens_generated: float = 0.0
    tokens_accepted: float = 0.0
    tokens_wasted: float = 0.0
    #: policy version that generated each accepted session -> sessions
    versions: Counter[int] = field(default_factory=Counter)
    accepted: int = 0
    unversioned: int = 0

    def add(self, phases: Iterable[tuple[float, float]], status: str, tokens: float,
            version: Any, submit: float | None, final: float) -> float:
        """Take one finished session: its phase executions ((start, end) in seconds), status,
        output tokens, the policy version that generated it, submit and finalize times.
        Returns its phase seconds."""
        phase_s = 0.0
        starts, ends = self.starts, self.ends
        for s, e in phases:
            if e > s:
                starts.append(s)
                ends.append(e)
                phase_s += e - s
        if submit is not None and submit < self.first_submit:
            self.first_submit = submit
        if final > self.last_final:
            self.last_final = final
        self.tokens_generated += tokens
        if status == "accepted":
            self.accepted_s += phase_s
            self.tokens_accepted += tokens
            self.accepted += 1
            if type(version) is int:
                self.versions[version] += 1
            else:
                self.unversioned += 1
        elif status in THROWN_AWAY:
            self.wasted_s += phase_s
            self.tokens_wasted += tokens
        return phase_s


def union_s(starts: array[float], ends: array[float], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one of the intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts, ends, strict=True)):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def split_rank_step(info: StepScopes | None, work: RankStepWork | None,
                    rollout_scope: str) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per bucket) of one rank's step: its step scope ``info`` (None: a
    rank without step scopes) and its sessions' ``work``."""
    b = dict.fromkeys(BUCKETS, 0.0)
    if info is not None:
        wall = info.dur_us / 1e6
        lo, hi = info.start_us / 1e6, (info.start_us + info.dur_us) / 1e6
        rollout_s, covered = 0.0, 0.0
        for name, us in info.breakdown.items():
            s = us / 1e6
            covered += s
            if name == rollout_scope:
                rollout_s += s
            else:
                b["overhead" if _OVERHEAD.search(name) else "productive"] += s
        if info.rollout_start_us is not None and info.rollout_end_us is not None:
            lo, hi = info.rollout_start_us / 1e6, info.rollout_end_us / 1e6
        b["overhead"] += max(wall - covered, 0.0)  # untraced
    elif work is not None and work.last_final > work.first_submit:
        lo, hi = work.first_submit, work.last_final
        wall = rollout_s = hi - lo
    else:
        return 0.0, b
    busy = 0.0
    if work is not None and rollout_s > 0:
        busy = min(union_s(work.starts, work.ends, lo, hi), rollout_s)
        phase = work.accepted_s + work.wasted_s
        if phase > 0:
            b["productive"] += busy * work.accepted_s / phase
            b["wasted"] += busy * work.wasted_s / phase
    b["idle"] += max(rollout_s - busy, 0.0)
    return wall, b


class StepScopeCollector:
    """Builds a :class:`ScopeStep` for each step scope of this process as the records end.

    A record processor (``on_record`` on the exporter thread): a ``train.*`` scope whose nearest
    ``train.*`` ancestor is a step scope is held under that step (its name, start and end);
    when the step scope itself ends (after its children) they become its breakdown.  Steps are
    only those of ``rltrace.step`` scopes (``rl.step`` on the record); a run that marks its
    steps only by an argument of its rollout scope (AReaL's guide) gets its split from the
    report.  Bounded: at most ``PENDING_CAP`` steps wait for their scope (a step scope that
    never ends), the oldest dropped.
    """

    PENDING_CAP = 64

    def __init__(self, *, step_scope: str = "train.step", rollout_scope: str = "train.rollout",
                 train_prefix: str = "train.") -> None:
        self.step_scope = step_scope
        self.rollout_scope = rollout_scope
        self.train_prefix = train_prefix
        #: id of an open step scope -> (the scope, its children: (name, start ns, end ns))
        self._pending: dict[int, tuple[Any, list[tuple[str, int, int]]]] = {}
        #: (step, ScopeStep) of each step scope that ended, in order; taken by :meth:`take`
        self.done: list[tuple[int, ScopeStep]] = []

    def on_record(self, rec: Any) -> None:
        name = rec.name
        if type(name) is not str or not name.startswith(self.train_prefix):
            return
        own = rec.own_step() if name == self.step_scope else None
        if type(own) is int:
            self._close(own, rec)
            return
        parent = rec.parent
        for _ in range(64):  # the nearest train.* ancestor
            if parent is None or not hasattr(parent, "own_step"):
                return
            pname = parent.name
            if type(pname) is str and pname.startswith(self.train_prefix):
                break
            parent = parent.parent
        else:
            return
        if pname != self.step_scope or type(parent.own_step()) is not int:
            return  # nested in another train.* scope: counted in that one
        entry = self._pending.get(id(parent))
        if entry is None:
            if len(self._pending) >= self.PENDING_CAP:
                del self._pending[next(iter(self._pending))]
            entry = self._pending[id(parent)] = (parent, [])
        entry[1].append((name, rec.start_ns, rec.end_ns))

    def _close(self, step: int, rec: Any) -> None:
        entry = self._pending.pop(id(rec), None)
        info = ScopeStep(rec.start_ns / 1e3, (rec.end_ns - rec.start_ns) / 1e3)
        for name, s, e in entry[1] if entry is not None and entry[0] is rec else ():
            info.breakdown[name] = info.breakdown.get(name, 0.0) + (e - s) / 1e3
            if name == self.rollout_scope:
                lo, hi = info.rollout_start_us, info.rollout_end_us
                info.rollout_start_us = s / 1e3 if lo is None else min(lo, s / 1e3)
                info.rollout_end_us = e / 1e3 if hi is None else max(hi, e / 1e3)
        self.done.append((step, info))

    def take(self) -> list[tuple[int, ScopeStep]]:
        """The steps that ended since the last call."""
        out, self.done = self.done, []
        return out

    def reset(self) -> None:
        """Forget everything (a forked child: the parent's steps are the parent's)."""
        self._pending.clear()
        self.done = []

    def shutdown(self) -> None:
        return None
