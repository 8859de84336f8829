"""Live state of a running rank: a small JSON file that ``rltrace top`` reads.

Spans and session records are written when they end, so the files of a run in progress say
nothing about what is in flight.  :class:`LivePublisher` fills that gap: every
``live_interval_s`` the exporter thread (from ``Pipeline._drain``; the cost when nothing is due
is one clock read) writes ``{log_dir}/live/[{role}/]live-r{rank}[-p{pid}].json`` atomically
(temp file + ``os.replace``, so a reader, also on a shared file system, sees the old file or
the new one, never a part).  It holds:

* the current step (the highest step among open and finished sessions) and the open sessions:
  how many, open phase executions by phase, sessions between phases, counts and age
  histograms by step, and the ``LIST_CAP`` oldest with their open phases and ages;
* finished sessions: counts by status, and per step (the ``STEPS_KEPT`` highest) counts by
  status and a histogram of session durations (submit to finalize);
* goodput: tokens and phase time generated, accepted and thrown away, the policy version lag
  at finalize, and each kept step's time split into productive, overhead, idle and wasted
  (:mod:`rltrace.accounting.goodput`, the report's split: from the step scope, once it ended, and the
  phase executions of the step's sessions; a rank without step scopes from its sessions).

The file is bounded whatever the run: at most ``LIST_CAP`` sessions listed, ``STEPS_KEPT``
steps with at most ``len(EDGES) + 1`` histogram buckets each, ``BY_STEP_CAP`` steps of open
counts and ``PHASE_CAP`` phase names (7 KB with 100k sessions open).  So is the cost: the registry
of open sessions is read without locks (C-level ``islice`` passes under the GIL; a race costs
at most a session counted in the wrong phase), at most ``SAMPLE_CAP`` of them are examined
(beyond it every k-th, with the counts by phase and step scaled), and finished records are
aggregated in C-level passes (~0.5 µs each) from a queue of at most ``RECENT_CAP``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Sequence
from itertools import chain, compress, islice, repeat
from operator import attrgetter, eq, itemgetter, sub
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from rltrace.accounting.goodput import (
    BUCKETS,
    ZERO_ADVANTAGE,
    RankStepWork,
    ScopeStep,
    StepScopeCollector,
    session_fate,
    split_rank_step,
    truncated_of,
)
from rltrace.logdir.files import GuardedDirs, write_atomically
from rltrace.readers.live_state import EDGES, FORMAT
from rltrace.sessions import SessionRegistry

if TYPE_CHECKING:
    from rltrace.sessions.metrics_processor import SessionMetricsProcessor

_V = TypeVar("_V")

__all__ = ["EDGES", "FORMAT", "LIST_CAP", "STEPS_KEPT", "LivePublisher", "bucket_upper"]

logger = logging.getLogger("rltrace")

LIVE_DIR = "live"
#: oldest open sessions listed one by one
LIST_CAP = 50
#: steps whose finished-session statistics are kept (the highest step numbers)
STEPS_KEPT = 8
#: steps with open sessions counted one by one (the highest; the rest are summed as "older")
BY_STEP_CAP = 16
#: phase names counted one by one (the rest are summed as "other")
PHASE_CAP = 32
#: open sessions examined per publish: beyond it every k-th one (k = ceil(n / SAMPLE_CAP)) is, and
#: the counts by phase and step are scaled by k (``open.sampled_every`` in the file)
SAMPLE_CAP = 8_192
#: finished records held for aggregation (their step, status and total): aggregated at each
#: publish, or sooner once ``AGGREGATE_AT`` wait; beyond ``RECENT_CAP``
#: (a burst of that many sessions in one export cycle) the oldest are counted as ``missed``
RECENT_CAP = 8_192
AGGREGATE_AT = 2_048
_EDGES_NS: tuple[int, ...] = tuple(round(e * 1e9) for e in EDGES)

_OPEN_PHASES = attrgetter("open_phases")
_NAME = attrgetter("name")
_STEP = attrgetter("step")
_START = attrgetter("start_ns")
#: phase time and tokens by fate: accepted means trained on with a gradient; zero_advantage (trained
#: on or dropped with no gradient) is also counted in wasted
_FATES = ("generated", "accepted", "wasted", "zero_advantage")


def _finished(rec: dict[str, Any]) -> tuple[Any, ...]:
    """What the live state keeps of a finished session record: (step, status, total_s, output
    tokens, phase seconds, version lag at finalize (None: no version), its phase executions as
    flat (start, end, start, end, ...) seconds, submit, finalize, the version that generated
    it, its finalize reason, whether it was truncated).  One pass over its phases: this runs
    for every session, on the exporter thread.  Only numbers and tuples of numbers, which the
    garbage collector stops tracking after one look, so the held entries cost the user's
    collections nothing."""
    iv: list[float] = []
    phase_s = 0.0
    for execs in rec["phases"].values():
        for e in execs:
            s, t = e["start_ts"], e["end_ts"]
            iv += (s, t)
            phase_s += t - s
    v = rec.get("policy_version")
    lag = None
    if type(v) is int:
        at = rec.get("policy_version_at_finalize", v)
        lag = at - v if type(at) is int else None
    return (rec["step"], rec["status"], rec["total_s"], rec.get("output_tokens", 0), phase_s, lag,
            tuple(iv), rec.get("submit_ts"), rec["finalized_ts"], v, rec.get("reason"), truncated_of(rec))


_R_STEP = itemgetter(0)
_R_STATUS = itemgetter(1)
_R_TOTAL = itemgetter(2)


def _keep(kept: dict[int, _V], step: int, value: _V) -> _V | None:
    """Put ``value`` under ``step`` in ``kept`` if ``step`` is among the ``STEPS_KEPT`` highest
    (dropping the lowest); returns it, or None when ``step`` is too old to keep."""
    if step not in kept and len(kept) >= STEPS_KEPT:
        lowest = min(kept)
        if step < lowest:
            return None
        del kept[lowest]
    kept[step] = value
    return value


def bucket_upper(i: int) -> float:
    """Upper edge (seconds) of histogram bucket ``i`` (the last bucket: twice the last edge)."""
    return EDGES[i] if i < len(EDGES) else EDGES[-1] * 2


def _histogram(ascending: Sequence[float], edges: Sequence[float]) -> list[tuple[int, int]]:
    """Non-empty buckets of sorted values: bucket i holds ``edges[i-1] <= v < edges[i]`` (bucket 0
    everything below ``edges[0]``, bucket ``len(edges)`` everything from ``edges[-1]`` on), as
    ``bisect_right(edges, v)`` numbers them; one binary search per edge."""
    out: list[tuple[int, int]] = []
    n = len(ascending)
    prev = 0
    for i, e in enumerate(edges):
        if prev == n:
            return out
        k = bisect_left(ascending, e, prev)
        if k > prev:
            out.append((i, k - prev))
        prev = k
    if prev < n:
        out.append((len(edges), n - prev))
    return out


def _jsonable_id(v: object) -> int | str | None:
    if v is None or type(v) is int:
        return v
    text = v if type(v) is str else str(v)
    return text if len(text) <= 64 else text[:61] + "..."


def _step_key(step: object) -> float:
    return step if type(step) is int else float("-inf")


class _StepStats:
    __slots__ = ("by_status", "done", "hist", "max_s")

    def __init__(self) -> None:
        self.done = 0
        self.by_status: Counter[str] = Counter()
        self.hist: Counter[int] = Counter()
        self.max_s = 0.0


class LivePublisher:
    """Publishes one rank's live state to ``path`` (see module docstring).

    ``session_processor`` (a :class:`~rltrace.sessions.metrics_processor.SessionMetricsProcessor`) feeds
    finished records through a bounded queue (one C-level ``append`` per record on the exporter
    thread); they are aggregated at the next publish.  Every method runs on the exporter thread
    or under the pipeline's lock, and none raises.
    """

    def __init__(self, path: Path, *, interval_s: float,
                 session_processor: SessionMetricsProcessor, rank: int, world_size: int,
                 role: str | None = None, host: str | None = None,
                 experiment: str | None = None, trial: str | None = None,
                 registry: SessionRegistry, step_scopes: StepScopeCollector | None = None,
                 guard: GuardedDirs | None = None) -> None:
        self.path = Path(path)
        #: the log dir's guarded bases (the folders on the way are checked at each publish)
        self.guard = guard
        #: this process's step scopes as they end (the scope side of each step's goodput split)
        self.step_scopes = step_scopes
        #: the registry whose open tasks and sessions are published
        self.registry = registry
        self._dir_made = False
        self.interval_s = float(interval_s)
        self.sp = session_processor
        self.header: dict[str, Any] = {
            "format": FORMAT, "rank": rank, "world_size": world_size, "role": role,
            "host": host or socket.gethostname(), "pid": os.getpid(), "experiment": experiment,
            "trial": trial, "interval_s": self.interval_s, "started_ts": time.time(),
        }
        # a small tuple of each finished record (:func:`_finished`), not the record dict
        # (holding up to AGGREGATE_AT records of ~1 KB each grew memory by ~2 MB between publishes)
        self._recent: deque[tuple[Any, ...]] = deque(maxlen=RECENT_CAP)
        append = self._recent.append
        self._listener = lambda rec: append(_finished(rec))
        if session_processor is not None:
            session_processor.listeners.append(self._listener)
        self._reset_counts()
        self._next = 0.0  # monotonic time of the next publish: the first cycle publishes
        self.seq = 0
        self.errors = 0
        #: wall seconds the last publish took (its own figure is in the file too)
        self.last_cost_s = 0.0
        self.closed = False

    def _reset_counts(self) -> None:
        self.steps: dict[Any, _StepStats] = {}
        self.by_status: Counter[str] = Counter()
        #: what finished sessions generated and what was thrown away (``rltrace top``'s goodput
        #: line): output tokens and phase seconds by fate, and policy version lag at finalize
        self.goodput: dict[str, Any] = {"tokens": dict.fromkeys(_FATES, 0.0),
                                        "phase_s": dict.fromkeys(_FATES, 0.0), "lag": Counter(),
                                        "truncated": 0}
        self.aggregated = 0
        self.max_step: int | None = None
        #: the goodput split's inputs of the ``STEPS_KEPT`` highest steps: the sessions' work and
        #: the step scope (once it ended)
        self.work: dict[int, RankStepWork] = {}
        self.scopes: dict[int, ScopeStep] = {}
        #: whether a step scope ended on this rank (then only those steps are split)
        self.scoped = False
        self.base_sessions = self.sp.sessions if self.sp is not None else 0

    # -- called from the pipeline -----------------------------------------------------------
    def due(self) -> bool:
        """Whether a publish is due."""
        return time.monotonic() >= self._next

    def maybe_publish(self) -> None:
        """Publish when due (one clock read and one length check otherwise)."""
        if time.monotonic() >= self._next:
            self.publish()
        elif len(self._recent) >= AGGREGATE_AT:  # keep the held records few
            self.aggregate()

    def publish(self, closed: bool = False) -> bool:
        """Write the state now; returns False when it could not be written (never raises)."""
        t0 = time.perf_counter()
        self._next = time.monotonic() + 0.9 * self.interval_s  # tolerant of the thread's jitter
        try:
            doc = self.snapshot(closed=closed)
            doc["publish_cost_s"] = round(self.last_cost_s, 6)
            self._write(orjson.dumps(doc, default=str))
        except Exception as exc:
            self.errors += 1
            if self.errors == 1:
                logger.warning("rltrace: cannot publish the live state to %s (%r); rltrace top "
                               "will not show this rank (tracing continues)", self.path, exc)
            return False
        finally:
            self.last_cost_s = time.perf_counter() - t0
        self.seq += 1
        return True

    def close(self) -> None:
        """Publish the final state, marked ``closed`` (the run ended on this rank)."""
        if not self.closed:
            self.closed = True
            self.publish(closed=True)
        if self.sp is not None and self._listener in self.sp.listeners:
            self.sp.listeners.remove(self._listener)

    def reset_after_fork(self, path: Path) -> None:
        """In a forked child: its own file; the parent's sessions and counts are the parent's."""
        self.path = Path(path)
        self._dir_made = False
        self.header = {**self.header, "pid": os.getpid(), "started_ts": time.time()}
        self._recent.clear()
        self._reset_counts()
        if self.step_scopes is not None:
            self.step_scopes.reset()
        self._next = 0.0
        self.seq = 0
        self.closed = False

    # -- the state ---------------------------------------------------------------------------
    def snapshot(self, closed: bool = False) -> dict[str, Any]:
        """The state as a JSON-ready dict (also what :meth:`publish` writes)."""
        self._aggregate_finished()
        now_ns = time.time_ns()
        doc = dict(self.header)
        doc.update(ts=now_ns / 1e9, seq=self.seq, closed=closed)
        open_doc, open_steps = self._open_state(now_ns)
        max_step = self.max_step
        for s in open_steps:
            if type(s) is int and (max_step is None or s > max_step):
                max_step = s
        self.max_step = max_step
        total = self.sp.sessions - self.base_sessions if self.sp is not None else self.aggregated
        doc["step"] = max_step
        doc["open"] = open_doc
        gp = self.goodput
        doc["finished"] = {"total": total, "by_status": dict(self.by_status),
                           "missed": max(0, total - self.aggregated),
                           "tokens": dict(gp["tokens"]), "phase_s": dict(gp["phase_s"]),
                           "lag": sorted(gp["lag"].items()), "truncated": gp["truncated"]}
        doc["steps"] = [
            {"step": s, "done": st.done, "by_status": dict(st.by_status),
             "hist": sorted(st.hist.items()), "max_s": round(st.max_s, 6)}
            for s, st in sorted(self.steps.items(), key=lambda kv: _step_key(kv[0]))
        ]
        doc["goodput"] = self._goodput_steps()
        return doc

    def _goodput_steps(self) -> list[dict[str, Any]]:
        """Each kept step's time split into the goodput buckets (:mod:`rltrace.accounting.goodput`): a step
        with a step scope once it ended, a rollout-only one from its sessions so far."""
        if self.step_scopes is not None:
            for step, ended in self.step_scopes.take():
                _keep(self.scopes, step, ended)
                self.scoped = True
        rollout = self.step_scopes.rollout_scope if self.step_scopes is not None else "train.rollout"
        out = []
        for step in sorted(set(self.work) | set(self.scopes)):
            info = self.scopes.get(step)
            if info is None and self.scoped:
                continue  # a rank with step scopes: this one's has not ended yet
            wall, sec = split_rank_step(info, self.work.get(step), rollout)
            if wall > 0:
                out.append({"step": step, "wall_s": round(wall, 6), "scoped": info is not None,
                            "seconds": {k: round(sec[k], 6) for k in BUCKETS}})
        return out

    def aggregate(self) -> None:
        """Count the finished sessions held so far (an explicit flush: nothing stays held)."""
        try:
            self._aggregate_finished()
        except Exception as exc:  # pragma: no cover - defensive
            self.errors += 1
            logger.debug("rltrace live state: %r", exc)

    def _aggregate_finished(self) -> None:
        recent = self._recent
        if not recent:
            return
        recs = list(recent)  # under the pipeline lock: nothing appends meanwhile
        recent.clear()
        self.aggregated += len(recs)
        self._aggregate_goodput(recs)
        steps = list(map(_R_STEP, recs))
        statuses = list(map(_R_STATUS, recs))
        totals = list(map(_R_TOTAL, recs))
        distinct = set(steps)
        for step in distinct:
            if len(distinct) == 1:
                s_st, s_tot = statuses, totals
            else:
                mask = list(map(eq, steps, repeat(step)))
                s_st, s_tot = list(compress(statuses, mask)), list(compress(totals, mask))
            st = self._step_stats(step)
            if st is None:  # older than every kept step: only the totals count it
                self.by_status.update(s_st)
                continue
            counts = Counter(s_st)
            self.by_status.update(counts)
            st.done += len(s_st)
            st.by_status.update(counts)
            s_tot = sorted(s_tot)
            hist = st.hist
            for b, c in _histogram(s_tot, EDGES):
                hist[b] += c
            st.max_s = max(st.max_s, s_tot[-1])
            if type(step) is int and (self.max_step is None or step > self.max_step):
                self.max_step = step

    def _aggregate_goodput(self, recs: list[tuple[Any, ...]]) -> None:
        """Tokens and phase time by fate (:func:`rltrace.accounting.goodput.session_fate`), version lag at
        finalize (the rank's policy version then minus the one that generated the session) of
        accepted sessions, truncated completions, and each kept step's work for its goodput
        split."""
        tokens, phase_s, lag = self.goodput["tokens"], self.goodput["phase_s"], self.goodput["lag"]
        work = self.work
        for step, status, _total, tok, ph, moved, phases, submit, final, version, reason, cut in recs:
            if type(step) is int:
                w = work.get(step)
                if w is None:
                    w = _keep(work, step, RankStepWork())
                if w is not None:
                    w.add(zip(phases[::2], phases[1::2], strict=True), status, tok, version, submit, final,
                          reason, cut)
            fate = session_fate(status, reason)
            tokens["generated"] += tok
            phase_s["generated"] += ph
            if cut:
                self.goodput["truncated"] += 1
            if fate is not None:
                key = "accepted" if fate == "useful" else "wasted"
                tokens[key] += tok
                phase_s[key] += ph
                if reason == ZERO_ADVANTAGE and fate == "wasted":
                    tokens["zero_advantage"] += tok
                    phase_s["zero_advantage"] += ph
            if status == "accepted" and moved is not None:
                lag[moved] += 1

    def _step_stats(self, step: Any) -> _StepStats | None:
        st = self.steps.get(step)
        if st is not None:
            return st
        steps = self.steps
        if len(steps) >= STEPS_KEPT:
            lowest = min(steps, key=_step_key)
            if _step_key(step) <= _step_key(lowest):
                return None
            del steps[lowest]
        st = steps[step] = _StepStats()
        return st

    def _open_state(self, now_ns: int) -> tuple[dict[str, Any], list[Any]]:
        reg = self.registry.sessions
        sample: list[Any] = []
        oldest: list[Any] = []
        n = every = 1
        for _ in range(3):  # C-level passes: atomic under the GIL (retried on free-threaded builds)
            try:
                n = len(reg)
                every = -(-n // SAMPLE_CAP) or 1
                sample = list(islice(reg.values(), 0, None, every))
                oldest = list(islice(reg.values(), LIST_CAP))  # registration order: oldest first
                break
            except RuntimeError:
                continue
        scale = n / len(sample) if sample else 0.0
        ops = list(map(_OPEN_PHASES, sample))
        busy = len(ops) - ops.count([])  # sessions with an open phase
        by_phase = Counter(map(_NAME, chain.from_iterable(ops)))
        if len(by_phase) > PHASE_CAP:
            kept = dict(by_phase.most_common(PHASE_CAP))
            kept["other"] = kept.get("other", 0) + sum(by_phase.values()) - sum(kept.values())
            by_phase = Counter(kept)
        steps = list(map(_STEP, sample))
        counts = Counter(steps)
        ordered = sorted(counts, key=_step_key, reverse=True)
        ages = list(map(sub, repeat(now_ns), map(_START, sample)))
        by_step: list[dict[str, Any]] = []
        for i, step in enumerate(ordered[:BY_STEP_CAP]):
            entry: dict[str, Any] = {"step": step, "open": round(counts[step] * scale)}
            if i < STEPS_KEPT:
                group = ages if len(counts) == 1 else list(compress(ages, map(eq, steps, repeat(step))))
                group.sort()
                entry["age_hist"] = [(b, round(c * scale)) for b, c in _histogram(group, _EDGES_NS)]
            by_step.append(entry)
        if len(ordered) > BY_STEP_CAP:
            by_step.append({"step": "older",
                            "open": round(sum(counts[s] for s in ordered[BY_STEP_CAP:]) * scale)})
        listed = []
        for s in oldest:
            phases = list(s.open_phases)
            latest = max((p.start_ns for p in phases), default=None)
            listed.append({
                "session_id": _jsonable_id(s.session_id), "task_id": _jsonable_id(s.task_rec.task_id),
                "step": s.step, "age_s": round((now_ns - s.start_ns) / 1e9, 4), "turn": max(s.turn, 0),
                "phases": [p.name for p in phases],
                "phase_age_s": round((now_ns - latest) / 1e9, 4) if latest is not None else None,
            })
        doc = {"sessions": n, "tasks": len(self.registry.tasks),
               "between_phases": round((len(ops) - busy) * scale),
               "by_phase": {k: round(v * scale) for k, v in by_phase.items()}, "by_step": by_step,
               "sampled_every": every,
               "oldest_age_s": listed[0]["age_s"] if listed else None, "listed": listed}
        return doc, ordered

    def _write(self, data: bytes) -> None:
        write_atomically(self.path, data, guard=self.guard)  # makes the folder, never hers


def live_path(log_dir: Path, file_name: str) -> Path:
    """``{log_dir}/live/{file_name}`` with the ``.jsonl`` suffix of a rank file made ``.json``."""
    return Path(log_dir) / LIVE_DIR / Path(file_name).with_suffix(".json")
