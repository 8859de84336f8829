"""Flushing the job's worker processes at shutdown, and counting what could not be flushed.

Ray's ``ray.shutdown()`` ends worker processes without their exit handlers.  Actors are flushed
by handle (every actor that announced itself to the job's registry); pooled workers, which have
no handle, flush when each remote function returns and publish their session tally file at
start, so the driver can count what one still held unwritten.  Whatever did not answer is
named in one warning and kept for :func:`losses`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from rltrace import runtime
from rltrace.ray.job import Loss, RayJob, WorkerInfo, current_job
from rltrace.ray.ranks import kv_prefix
from rltrace.sessions.shared_counts import read_tally

if TYPE_CHECKING:
    from ray import ObjectRef


def announced_actors() -> list[Any]:
    """Handles of the job's actors that have announced themselves (each does at its first
    call): what :func:`flush_actors` and ``ray.shutdown()`` flush."""
    return current_job().actors()


def flush_actors(*actors: Any, timeout_s: float = 30.0) -> int:
    """Flush rltrace in each of these actors now (sync or async); returns how many confirmed.

    With no actors given: every actor of the job that has run a method.  An actor that is dead
    or does not answer within ``timeout_s`` is skipped, and counted in :func:`losses`.
    """
    import ray

    job = current_job()
    entries = job.entries()
    if not actors:
        actors = tuple(handle for handle, _ in entries.values())
    infos = {aid: info for aid, (_, info) in entries.items()}
    refs = [a.__ray_call__.remote(flush_here) for a in actors]
    if not refs:
        return 0
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    answered = _answered(ready)
    silent = [_loss(a, infos.get(_actor_id(a) or "")) for a, ref in zip(actors, refs, strict=True)
              if ref not in answered]
    _report_silent(job, silent, len(actors), timeout_s)
    return len(answered)


def flush_all(job: RayJob, *actors: Any, timeout_s: float = 30.0) -> int:
    """At shutdown: flush these actors (default: every announced one), then count what
    the job's pooled workers hold unwritten (``ray.shutdown()`` ends them next)."""
    import ray

    if not ray.is_initialized():
        return 0
    confirmed = flush_actors(*actors, timeout_s=timeout_s)
    _count_pooled_losses(job)
    return confirmed


def losses() -> list[Loss]:
    """What the flushes of this driver found not flushed: one dict per actor that did not answer
    and per pooled worker that held sessions unwritten at shutdown (``role``, ``rank``,
    ``pid``; ``registered``, ``finalized``, ``written`` sessions and ``unwritten``, those whose
    record never reached its files, read from the worker's :mod:`rltrace.sessions.shared_counts` file; None
    where no count could be read: an actor lost with its node, or one that never announced
    itself).  An actor that had ended gracefully (it flushed at its exit and wrote every
    session) is not among them."""
    return [x.copy() for x in current_job().losses.values()]


def flush_here(_actor: object) -> int:
    """Run in an actor (``__ray_call__``): flush its files, session records and OTLP sender."""
    p = runtime.get_pipeline()
    timeout = p.cfg.otlp.timeout_s if p is not None and p.cfg.otlp.timeout_s is not None else 5.0
    runtime.flush(wait_s=timeout)  # files, session records, and what the OTLP sender holds
    return os.getpid()


def _answered(ready: list[ObjectRef[object]]) -> set[ObjectRef[object]]:
    """The flush calls among ``ready`` that returned (an actor that died meanwhile: nothing to
    flush there)."""
    import ray

    answered = set()
    for ref in ready:
        try:
            ray.get(ref)
            answered.add(ref)
        except Exception:
            pass
    return answered


def _report_silent(job: RayJob, silent: list[Loss], asked: int, timeout_s: float) -> None:
    """Actors that did not answer a flush: those that ended gracefully (their handles out of
    scope, ``exit_actor``) flushed at their exit; the others are counted in :func:`losses` and
    named in one warning."""
    ended = [x for x in silent if x["exited"] and x["unwritten"] == 0]
    lost = [x for x in silent if not (x["exited"] and x["unwritten"] == 0)]
    if ended:
        runtime.logger.debug("rltrace.ray: %d actors had ended and flushed at their exit: %s",
                             len(ended), ", ".join(f"rank {x['rank']} ({x['role']})"
                                                   for x in ended))
    if lost:
        job.losses.update((x["actor_id"] or f"#{len(job.losses)}", x) for x in lost)
        runtime.logger.warning(
            "rltrace.ray: %d of %d actors did not answer the flush (killed, lost with their node, "
            "or still busy after %.0f s); what each recorded since its last export cycle (at "
            "most flush_interval_s) is not in its files: %s", len(lost), asked,
            timeout_s, "; ".join(map(_describe_loss, lost)))


def _count_pooled_losses(job: RayJob) -> None:
    """At shutdown: pooled workers have no handle to flush them by.  Each flushes when a remote
    function returns (``flush_tasks``) and published its tally file in Ray's key-value store
    at start; what one holds unwritten (a call killed or still running, or the export cycle's
    share under ``flush_tasks="cycle"``) is lost when ``ray.shutdown()`` ends it, and counted
    here.  A tally that cannot be read here (another node, no shared file system) is not
    counted: nothing says that worker lost anything.  A pooled worker that hosts an actor is
    the actor's (flushed by handle)."""
    actor_pids = {info.get("pid") for _, info in job.entries().values()}
    lost = []
    for info in _pooled_workers():
        tally = info.get("tally")
        if info.get("pid") in actor_pids or not tally:
            continue
        out = _loss(None, info)  # (no handle: actor_id None)
        if not out["unwritten"]:  # nothing unwritten, or no count readable here
            continue
        lost.append(out)
        job.losses[tally] = out
    if lost:
        runtime.logger.warning(
            "rltrace.ray: %d pooled worker processes hold sessions not in their files (a remote "
            "function killed midway or still running, or left to the export cycle): %s",
            len(lost), "; ".join(map(_describe_loss, lost)))


def publish_pooled_worker(info: WorkerInfo) -> None:
    """In a pooled worker at start: its role, rank, pid and tally file, for the driver."""
    from ray.experimental.internal_kv import _internal_kv_put

    try:
        _internal_kv_put(f"{kv_prefix()}/worker-info/{info['rank']}".encode(),
                         json.dumps(info).encode(), overwrite=True)
    except Exception as exc:
        runtime.logger.debug("rltrace.ray: pooled worker not published: %s", exc)


def _pooled_workers() -> list[WorkerInfo]:
    """What the job's pooled workers published at start (read in the driver)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    try:
        prefix = f"{kv_prefix()}/worker-info/".encode()
        out = []
        for key in _internal_kv_list(prefix):
            value = _internal_kv_get(key)
            if value:
                out.append(json.loads(value))
        return out
    except Exception as exc:
        runtime.logger.debug("rltrace.ray: pooled workers not read: %s", exc)
        return []


def _actor_id(handle: Any) -> str | None:
    try:
        return str(handle._actor_id.hex())
    except Exception:
        return None


def _loss(handle: object, info: WorkerInfo | None) -> Loss:
    tally = info.get("tally") if info else None
    counts = read_tally(tally) if tally else None

    def count(key: str) -> int | None:
        return counts[key] if counts is not None else None

    return Loss(actor_id=_actor_id(handle), role=info.get("role") if info else None,
                rank=info.get("rank") if info else None, pid=info.get("pid") if info else None,
                registered=count("registered"), finalized=count("finalized"),
                written=count("written"), unwritten=count("unwritten"), exited=bool(count("exited")))


def _describe_loss(x: Loss) -> str:
    who = f"rank {x['rank']} ({x['role']}, pid {x['pid']})" if x["pid"] else f"actor {x['actor_id']}"
    if x["unwritten"] is None or x["registered"] is None or x["finalized"] is None:
        return f"{who}: session count unknown"
    return (f"{who}: {x['unwritten']} of its {x['registered']} sessions not written "
            f"({x['registered'] - x['finalized']} open)")

