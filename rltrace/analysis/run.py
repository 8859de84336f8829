"""Reading a log dir into a :class:`Run`: the streamed aggregates plus per-session derived times.

Step start (what session completion times are measured from), per rank and step: the start of
the rollout scope (``train.rollout``) inside that step's ``train.step`` scope on that rank, else
the start of the ``train.step`` scope, else the earliest ``submit_ts`` of the step's sessions on
that rank.  Without ``train.step`` scopes (AReaL's guide marks steps only as
``trace_scope("train.rollout", args={"global_step": n})``), a step on a rank is the span of the
``train.*`` scopes whose args carry its number.  Sessions without a step form their own group
(step ``None``) measured from their rank's earliest submit.

Session times are decomposed once (:mod:`.timeline`): the record-only part while reading, the
split of each session's tail into group wait and before-finalize here (:meth:`Run.tail`), and
every section reads the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rltrace.analysis import columns
from rltrace.analysis.load import Progress, ReportError, Skipped, StepRange, file_rank, file_size, find_files
from rltrace.analysis.session_aggregates import (
    BAD_RECORD,
    NO_STEP,
    SessionArrays,
    SessionReader,
    StepResolver,
    iter_sessions,
    rank_step_keys,
    rank_step_of,
    step_or_none,
)
from rltrace.analysis.trace_aggregates import StepInfo, TraceReader

START_ROLLOUT, START_STEP, START_SUBMIT = "rollout scope", "step scope", "first submit"
MAX_SEGMENTS = 200


@dataclass
class ReportOptions:
    """What ``rltrace report`` reads and how it judges outliers."""

    steps: StepRange = field(default_factory=StepRange)
    #: an outlier is above median + k * MAD
    k: float = 3.0
    #: slowest sessions listed
    top: int = 10
    step_scope: str = "train.step"
    rollout_scope: str = "train.rollout"
    train_prefix: str = "train."
    #: progress bar: None = when stderr is a terminal
    progress: bool | None = None


@dataclass
class RankStep:
    """One (rank, step): where its sessions' times start from and how long its rollout took."""

    rank: int
    step: int | None
    start_s: float
    start_source: str
    sessions: int = 0
    last_final_s: float = math.nan
    info: StepInfo | None = None

    @property
    def rollout_s(self) -> float | None:
        """Rollout duration: the rollout scope's, else last session finalized minus step start."""
        if self.info is not None and self.info.rollout_us is not None:
            return self.info.rollout_us / 1e6
        if self.sessions and math.isfinite(self.last_final_s):
            return self.last_final_s - self.start_s
        return None


@dataclass
class Run:
    """Everything the analyses need, in memory bounded by compact per-session columns."""

    logdir: Path
    options: ReportOptions
    session_files: list[Path]
    trace_files: list[Path]
    skipped: Skipped
    reader: SessionReader
    sessions: SessionArrays
    traces: TraceReader
    steps_info: dict[tuple[int, int], StepInfo]
    rank_steps: dict[tuple[int, int | None], RankStep]
    #: per session: seconds from its step's start to its own end (its last phase's end)
    completion: np.ndarray
    #: per phase, queue wait and gap: median seconds of one execution (gaps: per session)
    medians: dict[str, float]
    _tail: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    _buckets: dict[int, dict[str, float]] | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted({k[0] for k in self.rank_steps} | {k[0] for k in self.steps_info})

    @property
    def steps(self) -> list[int]:
        return sorted({k[1] for k in self.rank_steps if k[1] is not None}
                      | {k[1] for k in self.steps_info})

    def tail(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per session: group wait, before-finalize seconds, and its group's end (epoch s).

        A group is the sessions of one task on one rank in one step; its end is the latest own
        end among them (see :mod:`.timeline`).
        """
        if self._tail is None:
            s = self.sessions
            group_end = columns.group_reduce((s.task, s.step, s.rank), s.own_end)
            wait, fin = columns.split_tail(s.own_end, s.final, group_end)
            self._tail = (wait, fin, group_end)
        return self._tail

    def buckets_by_step(self) -> dict[int, dict[str, float]]:
        """step (NO_STEP: none) -> bucket -> seconds, every bucket of :mod:`.timeline` included."""
        if self._buckets is None:
            out = {st: dict(d) for st, d in self.reader.buckets.items()}
            s = self.sessions
            if s.size:
                wait, fin, _ = self.tail()
                steps, inv = np.unique(s.step, return_inverse=True)
                inv = inv.reshape(-1)
                for label, v in ((columns.GROUP, wait), (columns.FINALIZE, fin)):
                    sums = np.bincount(inv, weights=v, minlength=steps.size)
                    for st, x in zip(steps.tolist(), sums.tolist(), strict=True):
                        if x > 0:
                            out.setdefault(st, {})[label] = x
            self._buckets = out
        return self._buckets

    def explain(self, brief: dict[str, Any]) -> dict[str, Any]:
        """A session with its completion time, time decomposition and the segment that made it slow."""
        out = {k: v for k, v in brief.items() if not k.startswith("_")}
        d: columns.Decomposition = brief["_decomp"]
        rs = self.rank_steps.get((brief["rank"], brief.get("step")))
        out["completion_s"] = d.own_end - rs.start_s if rs is not None else None
        group_end = float(self.tail()[2][brief["_index"]]) if self.sessions.size else d.own_end
        segs = columns.split_segments(d, group_end)
        out.update(describe(segs, d.start, self.medians))
        return out


def describe(segs: list[columns.Segment], start: float, medians: dict[str, float]) -> dict[str, Any]:
    """A session's decomposition, shares (adding up to 1) and its slowest segment vs the median."""
    decomp: dict[str, float] = {}
    for seg in segs:
        decomp[seg.label] = decomp.get(seg.label, 0.0) + seg.dur
    whole = sum(decomp.values())
    own = sum(seg.dur for seg in segs if seg.kind not in (columns.KIND_GROUP, columns.KIND_FINALIZE))
    out: dict[str, Any] = {
        "decomposition_s": decomp,
        "shares": {k: (v / whole if whole > 0 else None) for k, v in decomp.items()},
        "group_wait_s": decomp.get(columns.GROUP, 0.0),
        "segments": [{"label": g.label, "kind": g.kind, "turn": g.turn, "start_s": g.start - start,
                      "end_s": g.end - start} for g in segs[:MAX_SEGMENTS]],
        "slow_phase": None, "slow_turn": None,
    }
    cands = [g for g in segs if g.kind in (columns.KIND_PHASE, columns.KIND_QUEUE, columns.KIND_GAP)]
    if not cands:
        return out
    best = max(cands, key=lambda g: g.dur - medians.get(g.label, 0.0))
    med = medians.get(best.label, 0.0)
    out.update(slow_phase=best.label, slow_turn=best.turn, slow_kind=best.kind, slow_phase_s=best.dur,
               slow_phase_median_s=med, slow_phase_x_median=best.dur / med if med > 0 else None,
               slow_share=best.dur / own if own > 0 else None)
    return out


def load_run(logdir: str | Path, options: ReportOptions | None = None) -> Run:
    """Stream every session and trace file of ``logdir`` once (twice for traces with --steps)."""
    opts = options or ReportOptions()
    root = Path(logdir).expanduser()
    session_files, trace_files = find_files(root)
    skipped = Skipped()
    traces = TraceReader(opts.steps, step_scope=opts.step_scope, rollout_scope=opts.rollout_scope,
                         train_prefix=opts.train_prefix)
    sizes = sum(map(file_size, session_files + trace_files))
    if not opts.steps.everything:
        sizes += sum(map(file_size, trace_files))
    progress = Progress(sizes, opts.progress)
    try:
        if not opts.steps.everything:
            for fi, path in enumerate(trace_files):
                traces.prescan_windows(fi, path, skipped, progress)
            traces.finish_prescan()
        for fi, path in enumerate(trace_files):
            traces.read(fi, path, skipped, progress)
        reader = SessionReader(opts.steps, top=opts.top, resolver=StepResolver(traces.rank_step_windows()))
        for fi, path in enumerate(session_files):
            default_rank = file_rank(path, fi)
            add = reader.add
            for lineno, rec in iter_sessions(path, skipped, progress):
                try:
                    add(rec, default_rank)
                except BAD_RECORD as exc:
                    skipped.add(f"{path}:{lineno}: malformed session record ({exc!r}), skipped")
    finally:
        progress.close()
    sessions = reader.arrays()
    steps_info = traces.step_infos()
    if sessions.size == 0 and not steps_info and not traces.scopes:
        raise _nothing_to_report(root, opts.steps, skipped)
    rank_steps, completion = _rank_steps(sessions, reader, steps_info)
    run = Run(logdir=root, options=opts, session_files=session_files, trace_files=trace_files,
              skipped=skipped, reader=reader, sessions=sessions, traces=traces,
              steps_info=steps_info, rank_steps=rank_steps, completion=completion,
              medians=_medians(reader))
    return run


def _nothing_to_report(root: Path, steps: StepRange, skipped: Skipped) -> ReportError:
    """The error for a log dir with nothing to report on, saying what was skipped if anything."""
    what = f" in steps {steps}" if not steps.everything else ""
    unread = f" ({skipped.summary()}; the first: {skipped.messages[0]})" if skipped.messages else ""
    return ReportError(f"rltrace report: no sessions or trace events{what} under {root}{unread}")


def _rank_steps(s: SessionArrays, reader: SessionReader,
                infos: dict[tuple[int, int], StepInfo]) -> tuple[dict[tuple[int, int | None], RankStep],
                                                                  np.ndarray]:
    out: dict[tuple[int, int | None], RankStep] = {}
    completion = np.zeros(0)
    if s.size:
        keys = rank_step_keys(s.rank, s.step)
        uniq, inv = np.unique(keys, return_inverse=True)
        inv = inv.reshape(-1)
        counts = np.bincount(inv, minlength=uniq.size)
        last = np.full(uniq.size, -np.inf)
        np.maximum.at(last, inv, s.final)
        starts = np.empty(uniq.size)
        for i, key in enumerate(uniq.tolist()):
            rank, step = rank_step_of(key)
            info = infos.get((rank, step)) if step != NO_STEP else None
            if info is not None and info.rollout_start_us is not None:
                start, src = info.rollout_start_us / 1e6, START_ROLLOUT
            elif info is not None:
                start, src = info.start_us / 1e6, START_STEP
            else:
                start, src = reader.first_submit.get((rank, step), math.nan), START_SUBMIT
            # sessions generated before their step began (trained in a later step than the
            # rollout that made them: TRL's steps_per_generation, an off-policy buffer) are timed
            # from their first submit, never from a start after them
            first = reader.first_submit.get((rank, step))
            if first is not None and first < start:
                start, src = first, START_SUBMIT
            starts[i] = start
            out[(rank, step_or_none(step))] = RankStep(
                rank=rank, step=step_or_none(step), start_s=start, start_source=src,
                sessions=int(counts[i]), last_final_s=float(last[i]), info=info)
        completion = s.own_end - starts[inv]
    for (rank, step), info in infos.items():
        if (rank, step) not in out:
            start = (info.rollout_start_us if info.rollout_start_us is not None else info.start_us) / 1e6
            out[(rank, step)] = RankStep(rank=rank, step=step, start_s=start,
                                         start_source=START_ROLLOUT if info.rollout_start_us is not None
                                         else START_STEP, info=info)
    return out, completion


def _medians(reader: SessionReader) -> dict[str, float]:
    """Median seconds of one phase execution or queue wait; of a gap bucket per session."""
    out = {}
    for label, q in (*reader.bucket_q.items(), *reader.exec_q.items()):
        m = q.summary((50.0,))["q"][0]
        if m is not None:
            out[label] = float(m)
    return out
