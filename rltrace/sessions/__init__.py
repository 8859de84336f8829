"""Task/session lifecycle (AReaL's session tracer) as OpenTelemetry parent/child spans.

* a task (one dataset item) is a root span ``rl.task`` (one trace per task), attribute
  ``rl.task.id``;
* each session (one sample) is its child span ``rl.session`` with ``rl.session.id``,
  ``rl.task.id``, ``rl.session.status``, ``rl.session.reason``;
* each phase execution (generate, reward, toolcall, or a registered custom phase) is a child
  span of its session named by the phase, with ``rl.phase``, ``rl.turn``, start/end payloads
  (``rl.start.<key>``, ``rl.end.<key>``) and OTel GenAI attributes on generate/toolcall.

Every open phase is held by its own handle, so overlapping executions of one phase in one
session pair correctly; finalizing a session closes whatever is still open (marked
``rl.phase.interrupted``) so no phase ever lacks an end.  Finalized sessions and finished
tasks leave no state behind.  The figures (``total_s``, ``<phase>_s``, turns) are derived from
these spans by :class:`rltrace.sessions.metrics_processor.SessionMetricsProcessor`.

Rooms: :mod:`.context` (the current task and session of a context), :mod:`.records` (the task,
session and phase span records), :mod:`.registry` (the registry and the lifecycle API; the
runtime owns the process's one and binds the module functions to it), :mod:`.phases` (the phase
names), :mod:`.metrics_processor` and :mod:`.metric_aggregates` (the session records and metrics
derived from the spans), :mod:`.flight` (the flight recorder: finished sessions in a ring that
survives SIGKILL), :mod:`.shared_counts` (session counts in a page that outlives the process),
:mod:`.recent` (recent entries kept in two generations).
"""

from rltrace.sessions.context import (
    CALLER_TASK_KEY,
    caller_task,
    get_session_id,
    get_task_id,
    set_session_id,
    set_task_id,
)
from rltrace.sessions.records import (
    FINAL_STATUSES,
    STATUSES,
    THROWN_AWAY,
    PhaseHandle,
    PhaseScope,
    RemoteTaskScope,
    SessionScope,
    SyncedPhaseScope,
    TaskScope,
)
from rltrace.sessions.registry import RECENT_CAP, SessionRegistry

__all__ = [
    "CALLER_TASK_KEY",
    "FINAL_STATUSES",
    "RECENT_CAP",
    "STATUSES",
    "THROWN_AWAY",
    "PhaseHandle",
    "PhaseScope",
    "RemoteTaskScope",
    "SessionRegistry",
    "SessionScope",
    "SyncedPhaseScope",
    "TaskScope",
    "caller_task",
    "get_session_id",
    "get_task_id",
    "set_session_id",
    "set_task_id",
]
