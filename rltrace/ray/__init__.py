"""Ray: rltrace in every worker process of a Ray job, configured once in the driver.

verl, OpenRLHF and AReaL's Ray launcher run rollout workers, reward models and trainers as Ray
actors.  In the driver, after :func:`rltrace.configure`::

    import rltrace, rltrace.ray
    rltrace.configure(fileroot="/shared/logs", session_tracer={"enabled": True})
    rltrace.ray.init(num_cpus=8)                       # instead of ray.init(...)
    rollouts = [Rollout.options(**rltrace.ray.actor_options("rollout")).remote()
                for i in range(2)]                     # ranks 1, 2 (or rank=... of yours)
    trainer = Trainer.options(**rltrace.ray.actor_options("trainer")).remote()      # rank 3

What it does:

* **Configure once.**  Every worker process of the job configures rltrace from the driver's
  configuration at start (Ray's ``worker_process_setup_hook``).  The configuration travels
  inside that hook, which Ray keeps in its control store (GCS): OTLP headers never enter an
  environment variable or a file.  Workers write their own files (``-p{pid}``: a restarted
  actor gets new files), under their role's folder.
* **Rank and role per actor.**  :func:`actor_options` gives an actor its role and rank (as
  ``RLTRACE_ROLE``/``RLTRACE_RANK`` in the actor's runtime environment: Ray starts such an
  actor in a worker process of its own).  An actor created without it gets its class name as
  role and the next free rank (``init(label_actors=False)`` turns that off).  Ranks are the
  job's, handed out by its registry actor: actors created by other actors (verl's workers are
  created by its ``TaskRunner`` actor) get ranks no other actor of the job has, with or
  without :func:`actor_options`.  Pooled workers, which run remote functions (tasks), are
  role ``ray-worker`` with ranks of their own from :data:`WORKER_RANK_BASE` up.
  Each actor is then a named process in merged traces (``[rollout] Rank 1, Process …``), a
  rank/role in ``rltrace report`` and ``rltrace top``.
* **Context across ``.remote()``.**  Ray's own trace propagation is switched on
  (``_tracing_startup_hook``): every remote function and actor-method call (sync or async
  actors, through an ``ActorPool`` as well) carries the caller's trace context, and runs
  under a Ray span of that trace in the worker, so what an actor records is in the driver's
  trace.  rltrace adds the current step (``rltrace.step(n)``, or AReaL's
  ``args={"global_step": n}``): spans, tasks and sessions recorded in the actor carry it; and
  the current task (``set_task_id``): a session the actor registers without a task joins the
  driver's task, as a child of its ``rl.task`` span in the driver's trace, with its task id.
* **Results back.**  ``ray.get`` links the current span to the remote calls whose results it
  returned, when they were made under another trace (:mod:`rltrace.ray.links`).
* **Lifecycle.**  Each actor announces itself to a registry actor at its first call.
  ``ray.shutdown()`` (wrapped by :func:`init`: Ray itself ends workers without their exit
  handlers) and :func:`shutdown` flush every announced actor first; at driver exit Ray ends
  the actors gracefully and each flushes at its own exit, as a graceful
  ``ray.actor.exit_actor()`` or an actor whose handles went out of scope does (its tally
  records that it did, so the flush counts it as ended, not lost).  Session records are
  written every export cycle in workers (``flush_threshold`` 1), so ``ray.kill`` (SIGKILL)
  or a lost node loses at most what the actor recorded in its last ``flush_interval_s``.
  A pooled worker flushes when each remote function returns (``init(flush_tasks=...)``).
  Each worker counts its sessions
  (registered, finalized, written) in a small shared-memory file (:mod:`rltrace.sessions.shared_counts`) whose
  stores survive a SIGKILL: the flush names each actor that did not answer with the exact
  number of its sessions that never reached its files (:func:`losses`); for an actor lost
  with its node the count is unknown.

A task whose sessions run in actors ends where it was registered: finalize it there
(``trace_session_event("mark_finalized", task_id=...)``) once its sessions are done.

The room, by concept: :mod:`.driver` (``init``, ``shutdown``), :mod:`.ranks` (ranks and roles
across the job), :mod:`.labels` (an actor's role and rank in its creation options), :mod:`.job`
(the job's registry actor and this process's side of the job), :mod:`.flush` (flushing the
job's workers, counting losses), :mod:`.worker` (a worker process's setup), :mod:`.propagation`
(step and task across ``.remote()``) and :mod:`.links` (``ray.get`` links).
"""

from __future__ import annotations

from rltrace.ray.driver import FLUSH_TASKS, init, shutdown
from rltrace.ray.flush import announced_actors, flush_actors, losses
from rltrace.ray.job import REGISTRY_NAME, Loss, RayJob, WorkerInfo, current_job
from rltrace.ray.labels import actor_options, labelled_options
from rltrace.ray.propagation import CallerContextPropagator, install_propagator
from rltrace.ray.ranks import DEFAULT_ROLE, RANK_ENV, ROLE_ENV, WORKER_RANK_BASE, RankAllocator
from rltrace.ray.worker import WorkerSetups, on_worker_setup, run_worker_setups, worker_setups

__all__ = [
    "DEFAULT_ROLE", "FLUSH_TASKS", "RANK_ENV", "REGISTRY_NAME", "ROLE_ENV", "WORKER_RANK_BASE",
    "CallerContextPropagator", "Loss", "RankAllocator", "RayJob", "WorkerInfo", "WorkerSetups",
    "actor_options", "announced_actors", "current_job", "flush_actors", "init",
    "install_propagator", "labelled_options", "losses", "on_worker_setup", "run_worker_setups",
    "shutdown", "worker_setups",
]
