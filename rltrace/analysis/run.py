"""Reading a log dir into a :class:`Run`: the streamed aggregates plus per-session derived times.

Step start (what session completion times are measured from), per rank and step: the start of
the rollout scope (``train.rollout``) inside that step's ``train.step`` scope on that rank, else
the start of the ``train.step`` scope, else the earliest ``submit_ts`` of the step's sessions on
that rank.  Sessions without a step form their own group (step ``None``) measured from their
rank's earliest submit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .load import Progress, ReportError, Skipped, StepRange, file_rank, find_files, iter_objects
from .sessions import BAD_RECORD, SessionArrays, SessionReader
from .traces import StepInfo, TraceReader

START_ROLLOUT, START_STEP, START_SUBMIT = "rollout scope", "step scope", "first submit"


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
    #: per session: seconds from its step's start to its finalization
    completion: np.ndarray
    #: per phase (and "other"): median seconds over the sessions that ran it
    phase_median: dict[str, float]
    _other: np.ndarray | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted({k[0] for k in self.rank_steps} | {k[0] for k in self.steps_info})

    @property
    def steps(self) -> list[int]:
        return sorted({k[1] for k in self.rank_steps if k[1] is not None}
                      | {k[1] for k in self.steps_info})

    def other_s(self) -> np.ndarray:
        """Per session: total time not in any phase (queueing, overhead), clipped at 0."""
        if self._other is None:
            s = self.sessions
            acc = s.total.astype(np.float64)
            for col in s.phases.values():
                acc -= col
            self._other = np.maximum(acc, 0.0, out=acc)
        return self._other

    def explain(self, brief: dict[str, Any]) -> dict[str, Any]:
        """A slow session with its completion time and the phase that made it slow."""
        out = dict(brief)
        step = brief.get("step")
        rs = self.rank_steps.get((brief["rank"], step))
        out["completion_s"] = (brief["finalized_ts"] - rs.start_s
                               if rs is not None and brief.get("finalized_ts") is not None else None)
        phases = dict(brief.get("phases_s") or {})
        other = max(float(brief["total_s"]) - sum(phases.values()), 0.0)
        if other > 0:
            phases["other"] = other
        best, best_excess = None, -math.inf
        for p, v in phases.items():
            med = self.phase_median.get(p, 0.0)
            if v - med > best_excess:
                best, best_excess = p, v - med
        out["slow_phase"] = best
        if best is not None:
            med = self.phase_median.get(best, 0.0)
            out["slow_phase_s"] = phases[best]
            out["slow_phase_median_s"] = med
            out["slow_phase_x_median"] = phases[best] / med if med > 0 else None
        return out


def load_run(logdir: str | Path, options: ReportOptions | None = None) -> Run:
    """Stream every session and trace file of ``logdir`` once (twice for traces with --steps)."""
    opts = options or ReportOptions()
    root = Path(logdir).expanduser()
    session_files, trace_files = find_files(root)
    skipped = Skipped()
    reader = SessionReader(opts.steps, top=opts.top)
    traces = TraceReader(opts.steps, step_scope=opts.step_scope, rollout_scope=opts.rollout_scope,
                         train_prefix=opts.train_prefix)
    sizes = sum(p.stat().st_size for p in session_files + trace_files)
    if not opts.steps.everything:
        sizes += sum(p.stat().st_size for p in trace_files)
    progress = Progress(sizes, opts.progress)
    try:
        if not opts.steps.everything:
            for fi, path in enumerate(trace_files):
                traces.prescan_windows(fi, path, skipped, progress)
        for fi, path in enumerate(trace_files):
            traces.read(fi, path, skipped, progress)
        for fi, path in enumerate(session_files):
            default_rank = file_rank(path, fi)
            add = reader.add
            for lineno, rec in iter_objects(path, skipped, progress):
                try:
                    add(rec, default_rank)
                except BAD_RECORD as exc:
                    skipped.add(f"{path}:{lineno}: malformed session record ({exc!r}), skipped")
    finally:
        progress.close()
    sessions = reader.arrays()
    steps_info = traces.step_infos()
    if sessions.size == 0 and not steps_info and not traces.scopes:
        what = f" in steps {opts.steps}" if not opts.steps.everything else ""
        raise ReportError(f"rltrace report: no sessions or trace events{what} under {root}")
    rank_steps, completion = _rank_steps(sessions, reader, steps_info)
    run = Run(logdir=root, options=opts, session_files=session_files, trace_files=trace_files,
              skipped=skipped, reader=reader, sessions=sessions, traces=traces,
              steps_info=steps_info, rank_steps=rank_steps, completion=completion, phase_median={})
    run.phase_median = _phase_medians(run)
    return run


def _rank_steps(s: SessionArrays, reader: SessionReader,
                infos: dict[tuple[int, int], StepInfo]) -> tuple[dict[tuple[int, int | None], RankStep],
                                                                  np.ndarray]:
    out: dict[tuple[int, int | None], RankStep] = {}
    completion = np.zeros(0)
    if s.size:
        keys = (s.rank.astype(np.int64) << 32) | (s.step.astype(np.int64) + 1)
        uniq, inv = np.unique(keys, return_inverse=True)
        inv = inv.reshape(-1)
        counts = np.bincount(inv, minlength=uniq.size)
        last = np.full(uniq.size, -np.inf)
        np.maximum.at(last, inv, s.final)
        starts = np.empty(uniq.size)
        for i, key in enumerate(uniq.tolist()):
            rank, step = int(key >> 32), int(key & 0xFFFFFFFF) - 1
            info = infos.get((rank, step)) if step >= 0 else None
            if info is not None and info.rollout_start_us is not None:
                start, src = info.rollout_start_us / 1e6, START_ROLLOUT
            elif info is not None:
                start, src = info.start_us / 1e6, START_STEP
            else:
                start, src = reader.first_submit.get((rank, step), math.nan), START_SUBMIT
            starts[i] = start
            out[(rank, step if step >= 0 else None)] = RankStep(
                rank=rank, step=step if step >= 0 else None, start_s=start, start_source=src,
                sessions=int(counts[i]), last_final_s=float(last[i]), info=info)
        completion = s.final - starts[inv]
    for (rank, step), info in infos.items():
        if (rank, step) not in out:
            start = (info.rollout_start_us if info.rollout_start_us is not None else info.start_us) / 1e6
            out[(rank, step)] = RankStep(rank=rank, step=step, start_s=start,
                                         start_source=START_ROLLOUT if info.rollout_start_us is not None
                                         else START_STEP, info=info)
    return out, completion


def _phase_medians(run: Run) -> dict[str, float]:
    out = {}
    for p, col in run.sessions.phases.items():
        ran = col[col > 0]
        out[p] = float(np.median(ran)) if ran.size else 0.0
    if run.sessions.size:
        other = run.other_s()
        ran = other[other > 0]
        out["other"] = float(np.median(ran)) if ran.size else 0.0
    return out
