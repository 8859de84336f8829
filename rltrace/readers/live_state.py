"""The live-state file (``live-r*.json``): its format, shared by its writer
(:mod:`rltrace.pipeline.live_state`), and the check of one such file, used by ``rltrace top``.

A document that is not a JSON object of format ``rltrace.live/1`` is refused.  Every field
``rltrace top`` reads is checked against what the publisher writes (:data:`SCHEMA`): a field of
the wrong type or range is removed and noted, a bad item of a list (a listed session, a step,
a histogram bucket) is dropped and noted, and lists and maps are read up to a cap far above
what the publisher writes (``LIST_CAP`` listed sessions, ``STEPS_KEPT`` steps, ...).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from rltrace.readers.fields import (
    MAX_SECONDS,
    Note,
    Schema,
    apply,
    boolean,
    dict_of,
    integer,
    list_of,
    number,
    obj,
    pair,
    preview,
    scalar,
    text,
)

#: the format name every live-state file carries
FORMAT = "rltrace.live/1"
#: histogram bucket upper edges in seconds: 1 ms × 2^(k/4), k = 0..119 (19% wide, up to ~10 days);
#: bucket i holds durations in (EDGES[i-1], EDGES[i]], bucket len(EDGES) everything longer
EDGES: tuple[float, ...] = tuple(0.001 * 2 ** (k / 4) for k in range(120))

#: items read per list or map (the publisher writes at most 50 sessions, 17 steps, 33 phases)
MAX_ITEMS = 256
MAX_COUNT = 1 << 53

count = integer(0, MAX_COUNT)
seconds = number(0.0, MAX_SECONDS)
step = integer(-(1 << 63), (1 << 63) - 1)
histogram = list_of(pair(integer(0, len(EDGES)), count), MAX_ITEMS)
by_status = dict_of(count, MAX_ITEMS)


def step_or_older(v: Any, note: Note) -> Any:
    """A step of the open sessions' table: an integer, or ``"older"`` (the steps past its cap)."""
    if type(v) is str and v == "older":
        return v
    return step(v, note)


OPEN: Schema = MappingProxyType({
    "sessions": count, "tasks": count, "between_phases": count, "sampled_every": integer(1, MAX_COUNT),
    "by_phase": dict_of(count, MAX_ITEMS), "oldest_age_s": seconds,
    "by_step": list_of(obj({"step": step_or_older, "open": count, "age_hist": histogram}), MAX_ITEMS),
    "listed": list_of(obj({"session_id": scalar, "task_id": scalar, "step": step, "age_s": seconds,
                           "turn": count, "phases": list_of(text, MAX_ITEMS), "phase_age_s": seconds}),
                      MAX_ITEMS),
})
SCHEMA: Schema = MappingProxyType({
    "rank": integer(0, (1 << 31) - 1), "world_size": count, "role": text, "host": text,
    "pid": integer(-(1 << 63), (1 << 63) - 1), "experiment": text, "trial": text,
    "ts": number(-MAX_SECONDS, MAX_SECONDS), "started_ts": number(-MAX_SECONDS, MAX_SECONDS),
    "interval_s": number(0.0, MAX_SECONDS), "closed": boolean,
    "step": step, "open": obj(OPEN),
    "finished": obj({"total": count, "by_status": by_status, "missed": count,
                     "tokens": dict_of(number(0.0, 1e18), MAX_ITEMS),
                     "phase_s": dict_of(number(0.0, MAX_SECONDS * 1e6), MAX_ITEMS),
                     "lag": list_of(pair(integer(-(1 << 62), 1 << 62), count), MAX_ITEMS),
                     "truncated": count}),
    "steps": list_of(obj({"step": step, "done": count, "by_status": by_status, "hist": histogram,
                          "max_s": seconds}), MAX_ITEMS),
    "goodput": list_of(obj({"step": step, "wall_s": seconds, "scoped": boolean,
                            "seconds": dict_of(seconds, MAX_ITEMS)}), MAX_ITEMS),
})


def check_live_state(doc: Any, note: Note) -> str | None:
    """Check ``doc`` in place (see the module docstring): None when it can be used, else why not.
    ``note`` receives one ``"field: why"`` per field or list item removed."""
    if type(doc) is not dict:
        return f"expected a JSON object, got {preview(doc)}"
    if doc.get("format") != FORMAT:
        return f"format: expected {FORMAT!r}, got {preview(doc.get('format'))}"
    apply(doc, SCHEMA, note)
    return None
