"""Goodput: where the seconds of one rank's step went, in four buckets that add up to its wall time.

One implementation, used by the report (:mod:`rltrace.analysis.goodput`, from the log files),
by the live state ``rltrace top`` reads (:mod:`rltrace.pipeline.live_state`, from the records as
they end) and,
through the report, by ``rltrace diff``.  It holds the **waste taxonomy**: one table
(:data:`TAXONOMY`) saying which of each framework's sections (verl's timers, TRL's profiled
sections, OpenRLHF's trainer methods, AReaL's and rltrace's own ``train.*`` names) is productive,
overhead, idle or the rollout, and the rule (:func:`session_fate`) saying which sessions are waste.

A rank's step is its step scope (``rltrace.step``: ``train.step``); on a rank that only rolls
out, its sessions' first submit to last finalize in that step.  Its time splits into:

* **productive**: train compute (sections the table calls productive, and unknown ``train.*``
  names) and the generation, tool and reward time of samples trained on with a gradient;
* **overhead**: weight sync, validation, checkpoints, data loading, mode switches (sections
  the table calls overhead; unknown names holding one of :data:`OVERHEAD_WORDS`) and the step's
  time outside any ``train.*`` scope (untraced);
* **idle**: sections the table calls idle (waiting on the batch or on weights) and rollout
  time with no session phase running on the rank (a trainer waiting for rollouts, a rollout
  worker waiting for work or weights);
* **wasted**: the generation, tool and reward time of rejected, failed and dropped samples and
  of samples trained on without a gradient (reason :data:`ZERO_ADVANTAGE`).

Sections nest: a section's own time (its duration less its ``train.*`` children's) goes to its
own bucket, so TRL's ``sync_weights`` inside ``_prepare_inputs`` is overhead and the log-prob
pass inside it productive; a nested name the table does not know takes its parent's bucket (a
TRL reward function, named by the user, inside ``_calculate_rewards`` is rollout).

During the rollout sections the rank is busy while any of its sessions runs a phase (the union
of their phase executions); that busy time is shared between productive and wasted in
proportion to the phase time of useful and of wasted sessions, the rest is idle.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

from rltrace.sessions import THROWN_AWAY

__all__ = ["BUCKETS", "CLASS_MEANING", "OVERHEAD_WORDS", "SECTION_CLASSES", "TABLE", "TAXONOMY",
           "TRUNCATED", "ZERO_ADVANTAGE", "RankStepWork", "ScopeStep", "Section", "StepScopeCollector",
           "StepScopes", "TreeEntry", "classify", "section_times", "session_fate", "split_rank_step",
           "taxonomy_markdown", "truncated_of", "union_s"]

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

#: what a section can be: one of the four step buckets, or the rollout (the section during which
#: sessions run; its time is split by what the sessions' phases covered and their fates)
SECTION_CLASSES = ("productive", "overhead", "idle", "rollout")
SectionClass = Literal["productive", "overhead", "idle", "rollout"]


@dataclass(frozen=True)
class Section:
    """One framework section of the taxonomy: its name as the framework names it (the scope is
    ``train.<name>``), its class and why."""

    framework: str
    name: str
    cls: SectionClass
    why: str


def _sections(framework: str, cls: SectionClass, why: str, *names: str) -> tuple[Section, ...]:
    return tuple(Section(framework, n, cls, why) for n in names)


#: The waste taxonomy: every framework section rltrace knows, by framework, in the order the docs
#: show them (``docs/guide/waste.md`` is generated from it).  A section name means the same class in
#: every framework that has it (a test holds that), so a scope is classified by its name alone
#: even where its ``framework`` argument was lost.
TAXONOMY: tuple[Section, ...] = (
    # verl 0.9.1: marked_timer / simple_timer names in its trainers and agent loop
    *_sections("verl", "rollout", "generation: sessions run in it (in fully-async and one-step-off "
               "trainers, fetching the generated batch: idle unless sessions run on the rank)",
               "gen", "generate_async", "generate_sequences", "tool_calls", "compute_score"),
    *_sections("verl", "productive", "train compute on the batch", "reward", "old_log_prob", "ref",
               "values", "adv", "update_critic", "update_actor"),
    *_sections("verl", "overhead", "weight sync to the rollout engines", "update_weights",
               "sync_rollout_weights", "timing_s/param_sync"),
    *_sections("verl", "overhead", "hybrid engine mode switch (offload, onload, abort)",
               "switch_to_trainer", "switch_to_rollout"),
    *_sections("verl", "overhead", "validation, checkpoint, dumps, profiler control", "testing",
               "rollouter/validate_time", "save_checkpoint", "dump_rollout_generations",
               "start_profile", "stop_profile"),
    *_sections("verl", "idle", "waiting for enough generated samples", "switch_wait",
               "wait_for_enough_samples"),
    # TRL 1.16: trl.extras.profiling names (profiling_context / profiling_decorator)
    *_sections("trl", "rollout", "generation and scoring of the batch: sessions run in it (a "
               "reward function's section, named by the function, nests here)", "_prepare_inputs",
               "_generate_and_score_completions", "transformers.generate",
               "transformers.generate_batch", "vLLM.generate", "_calculate_rewards", "_fill_buffer",
               "_generate_on_policy_for_slices", "_generate_student_completions"),
    *_sections("trl", "productive", "train compute (`backward` and `optimizer_step`: the "
               "integration's own sections around the trainer's backward pass and optimizer step)",
               "compute_loss", "training_step", "_get_per_token_logps_and_entropies",
               "_get_last_hidden_state", "backward", "optimizer_step"),
    *_sections("trl", "overhead", "weight sync to vLLM", "sync_weights"),
    # OpenRLHF 0.11.2: method names of its PPO trainer, samples generator and experience maker
    *_sections("openrlhf", "rollout", "generation and scoring of samples: sessions run in it",
               "generate_samples", "_fetch_rewards_via_func", "_fetch_rewards_via_http"),
    *_sections("openrlhf", "productive", "train compute (experience making: reward model, "
               "log-prob and value passes on the generated batch)", "make_experience_batch",
               "compute_advantages_and_returns", "ppo_train", "training_step"),
    *_sections("openrlhf", "overhead", "weight sync to vLLM", "broadcast_to_vllm"),
    *_sections("openrlhf", "overhead", "validation, checkpoint, logging", "evaluate",
               "save_logs_and_checkpoints"),
    # AReaL's guide and rltrace's own names
    *_sections("rltrace", "rollout", "the rollout scope (the report's --rollout-scope)", "rollout"),
    *_sections("rltrace", "productive", "train compute", "ppo_update", "train_step",
               "compute_advantages", "compute_logp", "update"),
    *_sections("rltrace", "overhead", "weight sync, validation", "weight_sync", "update_weights",
               "eval"),
)
#: framework -> section name -> class (read-only)
TABLE: Mapping[str, Mapping[str, SectionClass]] = MappingProxyType({
    fw: MappingProxyType({s.name: s.cls for s in TAXONOMY if s.framework == fw})
    for fw in dict.fromkeys(s.framework for s in TAXONOMY)})
#: section name -> class, the first framework's that names it (read-only)
_BY_NAME: Mapping[str, SectionClass] = MappingProxyType(
    {s.name: s.cls for s in reversed(TAXONOMY)})


def classify(scope: str, framework: str | None = None, parent: SectionClass | None = None,
             *, rollout_scope: str = "train.rollout", train_prefix: str = "train.") -> SectionClass:
    """The class of the section scope ``scope`` (``train.<name>``): the table's for its
    ``framework`` (or for its name in any framework), else ``parent``'s (a nested name the
    table does not know), else overhead when its name holds one of :data:`OVERHEAD_WORDS`, else
    productive.  ``rollout_scope`` (the report's ``--rollout-scope``) is always the rollout."""
    if scope == rollout_scope:
        return "rollout"
    name = scope[len(train_prefix):] if scope.startswith(train_prefix) else scope
    cls = None
    if framework is not None:
        fw = TABLE.get(framework)
        cls = fw.get(name) if fw is not None else None
    if cls is None:
        cls = _BY_NAME.get(name)
    if cls is not None:
        return cls
    if parent is not None:
        return parent
    return "overhead" if _OVERHEAD.search(name) else "productive"


#: a session's fate: ``useful`` (trained on, with a gradient), ``wasted``, or None (not final)
Fate = Literal["useful", "wasted"]


def session_fate(status: Any, reason: Any) -> Fate | None:
    """Whether a finished session was useful or wasted: rejected, failed and dropped sessions are
    wasted, and so are accepted ones with reason :data:`ZERO_ADVANTAGE` (trained on, but their
    group's rewards had zero spread: no gradient)."""
    if status == "accepted":
        return "wasted" if reason == ZERO_ADVANTAGE else "useful"
    if status in THROWN_AWAY:
        return "wasted"
    return None


def truncated_of(rec: Mapping[str, Any]) -> bool:
    """Whether a session record is a completion cut at the length limit (its :data:`TRUNCATED`
    counter is positive: the integrations set it, with ``finish_reason="length"`` on the
    generate phase's end payload)."""
    counters = rec.get("counters")
    if isinstance(counters, Mapping):
        v = counters.get(TRUNCATED)
        if isinstance(v, (int, float)) and v > 0:
            return True
    return False


#: one ``train.*`` scope under a step: (name, start µs, duration µs, index of its nearest
#: ``train.*`` ancestor in the same list, -1 when directly under the step); parents come first
TreeEntry = tuple[str, float, float, int]


class StepScopes(Protocol):
    """One step scope on one rank and the ``train.*`` scopes under it (µs)."""

    start_us: float
    dur_us: float
    #: train-side scopes directly under the step (not nested in another ``train.*`` scope): µs
    breakdown: dict[str, float]
    rollout_start_us: float | None
    rollout_end_us: float | None
    #: every train.* scope under the step, nested ones included (empty: only ``breakdown`` known)
    tree: list[TreeEntry]


@dataclass
class ScopeStep:
    """A :class:`StepScopes` built from records as they end (the live state's)."""

    start_us: float
    dur_us: float
    breakdown: dict[str, float] = field(default_factory=dict)
    rollout_start_us: float | None = None
    rollout_end_us: float | None = None
    tree: list[TreeEntry] = field(default_factory=list)


@dataclass
class RankStepWork:
    """What the session records say one rank did in one step."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    #: phase seconds of useful sessions (trained on with a gradient) and of wasted ones
    accepted_s: float = 0.0
    wasted_s: float = 0.0
    first_submit: float = float("inf")
    last_final: float = float("-inf")
    tokens_generated: float = 0.0
    tokens_accepted: float = 0.0
    tokens_wasted: float = 0.0
    #: policy version that generated each trained (accepted) session -> sessions
    versions: Counter[int] = field(default_factory=Counter)
    accepted: int = 0
    unversioned: int = 0
    #: sessions finalized with reason ZERO_ADVANTAGE (trained on or dropped), their phase
    #: seconds and output tokens (all counted in the wasted figures too)
    zero_adv: int = 0
    zero_adv_s: float = 0.0
    zero_adv_tokens: float = 0.0
    #: finished sessions, and those cut at the length limit (the TRUNCATED counter) with tokens
    sessions: int = 0
    truncated: int = 0
    truncated_tokens: float = 0.0

    def add(self, phases: Iterable[tuple[float, float]], status: str, tokens: float,
            version: Any, submit: float | None, final: float, reason: Any = None,
            truncated: bool = False) -> float:
        """Take one finished session: its phase executions ((start, end) in seconds), status,
        output tokens, the policy version that generated it, submit and finalize times, its
        finalize reason and whether it was truncated.  Returns its phase seconds."""
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
        self.sessions += 1
        if truncated:
            self.truncated += 1
            self.truncated_tokens += tokens
        if status == "accepted":
            self.accepted += 1
            if type(version) is int:
                self.versions[version] += 1
            else:
                self.unversioned += 1
        fate = session_fate(status, reason)
        if fate == "useful":
            self.accepted_s += phase_s
            self.tokens_accepted += tokens
        elif fate == "wasted":
            self.wasted_s += phase_s
            self.tokens_wasted += tokens
            if reason == ZERO_ADVANTAGE:
                self.zero_adv += 1
                self.zero_adv_s += phase_s
                self.zero_adv_tokens += tokens
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


def section_times(info: StepScopes, rollout_scope: str = "train.rollout"
                  ) -> tuple[dict[str, tuple[SectionClass, float]], float | None, float | None]:
    """The own time of each section of one step by name, with its class (:func:`classify`,
    nested names inheriting their parent's class), in seconds, and the (start, end) seconds of
    the hull of its rollout sections (None, None: no rollout section with a start).  Without a
    tree (only the direct children's totals known) each direct child is a section."""
    out: dict[str, tuple[SectionClass, float]] = {}
    tree = getattr(info, "tree", None) or ()
    lo: float | None = None
    hi: float | None = None
    if not tree:
        for name, us in info.breakdown.items():
            cls = classify(name, rollout_scope=rollout_scope)
            prev = out.get(name)
            out[name] = (cls, (prev[1] if prev else 0.0) + us / 1e6)
        if info.rollout_start_us is not None and info.rollout_end_us is not None:
            lo, hi = info.rollout_start_us / 1e6, info.rollout_end_us / 1e6
        return out, lo, hi
    classes: list[SectionClass] = []
    own = [dur for _, _, dur, _ in tree]
    for name, _, dur, parent in tree:
        if 0 <= parent < len(classes):
            classes.append(classify(name, parent=classes[parent], rollout_scope=rollout_scope))
            own[parent] -= dur
        else:
            classes.append(classify(name, rollout_scope=rollout_scope))
    for (name, start, dur, _), cls, us in zip(tree, classes, own, strict=True):
        prev = out.get(name)
        out[name] = (cls, (prev[1] if prev else 0.0) + max(us, 0.0) / 1e6)
        if cls == "rollout":
            s, e = start / 1e6, (start + dur) / 1e6
            lo = s if lo is None else min(lo, s)
            hi = e if hi is None else max(hi, e)
    return out, lo, hi


def split_rank_step(info: StepScopes | None, work: RankStepWork | None,
                    rollout_scope: str) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per bucket) of one rank's step: its step scope ``info`` (None: a
    rank without step scopes) and its sessions' ``work``."""
    b = dict.fromkeys(BUCKETS, 0.0)
    if info is not None:
        wall = info.dur_us / 1e6
        lo, hi = info.start_us / 1e6, (info.start_us + info.dur_us) / 1e6
        rollout_s = 0.0
        sections, r_lo, r_hi = section_times(info, rollout_scope)
        for cls, s in sections.values():
            if cls == "rollout":
                rollout_s += s
            else:
                b[cls] += s
        if r_lo is not None and r_hi is not None:
            lo, hi = r_lo, r_hi
        covered = sum(info.breakdown.values()) / 1e6
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

    A record processor (``on_record`` on the exporter thread): a ``train.*`` scope under a step
    scope is held under that step (its name, start, end and nearest ``train.*`` ancestor); when
    the step scope itself ends (after its children) they become its breakdown (the direct
    children) and its tree (all of them, for the taxonomy's nested classes).  Steps are only
    those of ``rltrace.step`` scopes (``rl.step`` on the record); a run that marks its steps only
    by an argument of its rollout scope (AReaL's guide) gets its split from the report.  Bounded:
    at most ``PENDING_CAP`` steps wait for their scope (a step scope that never ends), the oldest
    dropped, and at most ``TREE_CAP`` scopes are held per step (the rest count only when direct).
    """

    PENDING_CAP = 64
    TREE_CAP = 4096

    def __init__(self, *, step_scope: str = "train.step", rollout_scope: str = "train.rollout",
                 train_prefix: str = "train.") -> None:
        self.step_scope = step_scope
        self.rollout_scope = rollout_scope
        self.train_prefix = train_prefix
        #: id of an open step scope -> (the scope, its train.* scopes: (name, start ns, end ns,
        #: id of the record, id of its nearest train.* ancestor or None when directly under it))
        self._pending: dict[int, tuple[Any, list[tuple[str, int, int, int, int | None]]]] = {}
        #: (step, ScopeStep) of each step scope that ended, in order; taken by :meth:`take`
        self.done: list[tuple[int, ScopeStep]] = []

    def on_record(self, rec: Any) -> None:
        name = rec.name
        prefix = self.train_prefix
        if type(name) is not str or not name.startswith(prefix):
            return
        own = rec.own_step() if name == self.step_scope else None
        if type(own) is int:
            self._close(own, rec)
            return
        parent = rec.parent
        nearest: Any = None
        for _ in range(64):  # up to the step scope, noting the nearest train.* ancestor
            if parent is None or not hasattr(parent, "own_step"):
                return
            pname = parent.name
            if type(pname) is str and pname.startswith(prefix):
                if pname == self.step_scope and type(parent.own_step()) is int:
                    break
                if nearest is None:
                    nearest = parent
            parent = parent.parent
        else:
            return
        entry = self._pending.get(id(parent))
        if entry is None:
            if len(self._pending) >= self.PENDING_CAP:
                del self._pending[next(iter(self._pending))]
            entry = self._pending[id(parent)] = (parent, [])
        if nearest is None or len(entry[1]) < self.TREE_CAP:
            entry[1].append((name, rec.start_ns, rec.end_ns, id(rec),
                             None if nearest is None else id(nearest)))

    def _close(self, step: int, rec: Any) -> None:
        entry = self._pending.pop(id(rec), None)
        info = ScopeStep(rec.start_ns / 1e3, (rec.end_ns - rec.start_ns) / 1e3)
        held = entry[1] if entry is not None and entry[0] is rec else []
        held.sort(key=lambda t: (t[1], t[1] - t[2]))  # parents first: earlier start, then longer
        index: dict[int, int] = {}  # record id -> its index (ids of ended records can be reused:
        for name, s, e, rid, pid in held:  # in start order, the latest holder is the live one)
            parent = -1 if pid is None else index.get(pid, -2)
            if parent == -2:
                continue  # its ancestor was not held (over TREE_CAP)
            index[rid] = len(info.tree)
            info.tree.append((name, s / 1e3, (e - s) / 1e3, parent))
            if parent != -1:
                continue
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


#: the sentence each section class gets in the docs (``docs/guide/waste.md``)
CLASS_MEANING: Mapping[str, str] = MappingProxyType({
    "productive": "train compute: counted productive",
    "overhead": "weight sync, validation, checkpoints, mode switches: counted overhead",
    "idle": "waiting on the batch or on weights: counted idle",
    "rollout": "sessions run in it: its busy time is productive or wasted by their fates, the rest idle",
})


def taxonomy_markdown() -> str:
    """The taxonomy as the Markdown table ``docs/guide/waste.md`` shows (a test holds them equal)."""
    lines = ["| framework | section (scope `train.<section>`) | class | why |", "|---|---|---|---|"]
    rows: dict[tuple[str, str, str], list[str]] = {}
    for s in TAXONOMY:
        rows.setdefault((s.framework, s.cls, s.why), []).append(f"`{s.name}`")
    for (fw, cls, why), names in rows.items():
        lines.append(f"| {fw} | {', '.join(names)} | {cls} | {why} |")
    return "\n".join(lines) + "\n"
