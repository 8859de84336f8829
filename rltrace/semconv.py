"""Attribute and span names rltrace writes (its own ``rl.*`` conventions plus OTel's).

Kept in one leaf module so the API, the processors and the exporters agree without importing
each other.
"""

#: span names (low cardinality; ids go into attributes)
TASK_SPAN = "rl.task"
SESSION_SPAN = "rl.session"

ATTR_CATEGORY = "rl.category"
ATTR_LANE = "rl.lane"
ATTR_INSTANT = "rl.instant"
ATTR_STEP = "rl.step"
ATTR_TASK = "rl.task.id"
ATTR_SESSION = "rl.session.id"
ATTR_STATUS = "rl.session.status"
ATTR_REASON = "rl.session.reason"
ATTR_PHASE = "rl.phase"
ATTR_TURN = "rl.turn"
ATTR_INTERRUPTED = "rl.phase.interrupted"
#: the policy (weights) version a session was generated with, or a train step trained with
ATTR_POLICY_VERSION = "rl.policy.version"
#: the process's policy version when a session was finalized (set only when it moved on since
#: the session was registered)
ATTR_VERSION_AT_FINALIZE = "rl.policy.version_at_finalize"
ATTR_THREAD_ID = "thread.id"
ATTR_THREAD_NAME = "thread.name"
ARGS_PREFIX = "args."
