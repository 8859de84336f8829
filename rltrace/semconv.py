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

# ---- OpenTelemetry GenAI conventions (development status) -----------------------------------
# A session is an agent run (``invoke_agent``), a task the workflow that runs its group of
# sessions (``invoke_workflow``), a generate phase an inference (``text_completion``), a
# tool-call phase ``execute_tool``, and each scored reward an evaluation result event on its
# session.  The session's and task's GenAI attributes and the conversation id are added to the
# OTel spans only (OTLP, span processors); a phase's operation, model, tokens and tool name are
# in its Chrome event too.  See docs/guide/otel-mapping.md.

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_WORKFLOW_NAME = "gen_ai.workflow.name"
GEN_AI_CONVERSATION = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
OP_INVOKE_AGENT = "invoke_agent"
OP_INVOKE_WORKFLOW = "invoke_workflow"
OP_EXECUTE_TOOL = "execute_tool"
#: ``gen_ai.agent.name`` of a session and ``gen_ai.workflow.name`` of a task, unless the span
#: has its own (``span.set_attribute``)
DEFAULT_AGENT_NAME = "rollout"
DEFAULT_WORKFLOW_NAME = "task"


def conversation_id(trace_id: int, session_id: object) -> str:
    """``gen_ai.conversation.id`` of a session and of its generate and tool-call phases:
    ``{trace_id}-{session_id}``, its trace id (its task's, 32 hex digits) then its session id.

    Session ids are unique within one process only (every rank, every restart starts again at
    ``0``); the trace id makes the conversation unique across ranks, restarts and runs sent to one
    backend.  Both parts are fields of the session's record (``trace_id``, ``session_id``), so
    a conversation leads to its record and back."""
    return f"{trace_id:032x}-{session_id}"

EVALUATION_EVENT = "gen_ai.evaluation.result"
EVAL_NAME = "gen_ai.evaluation.name"
EVAL_SCORE_VALUE = "gen_ai.evaluation.score.value"
EVAL_SCORE_LABEL = "gen_ai.evaluation.score.label"
EVAL_EXPLANATION = "gen_ai.evaluation.explanation"
#: payload keys of a phase execution that carry its score (the first present wins; end payload
#: before start payload), its label, its explanation and, optionally, the evaluator's name
SCORE_KEYS = ("score", "reward")
LABEL_KEY = "label"
EXPLANATION_KEY = "explanation"
EVALUATOR_KEY = "evaluator"
_SCORED = frozenset((*SCORE_KEYS, LABEL_KEY))

#: the ``OTEL_SEMCONV_STABILITY_OPT_IN`` value that selects the latest experimental GenAI names
GENAI_LATEST = "gen_ai_latest_experimental"
SEMCONV_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"


def genai_latest_experimental(value: str | None) -> bool:
    """Whether ``value`` (``OTEL_SEMCONV_STABILITY_OPT_IN``: a comma-separated list) opts in to
    the latest experimental GenAI conventions: span names ``invoke_agent {gen_ai.agent.name}``,
    ``invoke_workflow {gen_ai.workflow.name}``, ``{operation} {model}``, ``execute_tool {tool}``
    instead of rltrace's (``rl.session``, ``rl.task``, the phase name)."""
    if not value:
        return False
    return any(part.strip() == GENAI_LATEST for part in value.split(","))


def evaluation_result(phase: str, turn: object, start: dict[str, object] | None,
                      end: dict[str, object] | None) -> dict[str, object] | None:
    """The attributes of the ``gen_ai.evaluation.result`` event for one phase execution whose
    payload scores its session (``score=`` or ``reward=``, a number or bool; ``label=``,
    ``explanation=``, ``evaluator=`` optional), else None.

    The evaluation's name is ``evaluator`` when given, else the phase's name (``reward``).
    """
    if not ((end and not _SCORED.isdisjoint(end)) or (start and not _SCORED.isdisjoint(start))):
        return None  # the usual case (a generate's tokens): one set check per payload
    score: object = None
    payload: dict[str, object] = {}
    for p in (end, start):
        if not p:
            continue
        for key in SCORE_KEYS:
            v = p.get(key)
            if v is not None and score is None and type(v) in (int, float, bool):
                score = v
        for key in (LABEL_KEY, EXPLANATION_KEY, EVALUATOR_KEY):
            if key not in payload and isinstance(p.get(key), str):
                payload[key] = p[key]
    label = payload.get(LABEL_KEY)
    if score is None and label is None:
        return None
    out: dict[str, object] = {EVAL_NAME: payload.get(EVALUATOR_KEY, phase)}
    if score is not None:
        out[EVAL_SCORE_VALUE] = float(score)  # type: ignore[arg-type]
    if label is not None:
        out[EVAL_SCORE_LABEL] = label
    if EXPLANATION_KEY in payload:
        out[EVAL_EXPLANATION] = payload[EXPLANATION_KEY]
    out[ATTR_PHASE] = phase
    if turn is not None:
        out[ATTR_TURN] = turn
    return out

#: a session counter (``trace_session_event("increment_counter", name=N)``) is the session span's
#: attribute ``rl.session.counter.<N>``, and the record's ``counters[N]``
ATTR_SESSION_COUNTER_PREFIX = "rl.session.counter."
