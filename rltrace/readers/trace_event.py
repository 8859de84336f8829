"""The check of one Chrome-trace event (a line of ``traces-r*.jsonl``), used by ``rltrace convert``
and by the report's trace reader.

An event is refused when what places it on the timeline is malformed: ``ph`` not a phase
letter, ``pid`` not an integer, ``tid`` neither an integer nor a string, ``ts`` not a number of
microseconds (every phase but metadata), an ``X`` event's ``dur`` not a number >= 0, a name
that is not a string (or missing where the phase needs one), an async event without an ``id``,
or metadata whose ``args`` do not hold what its name says (``process_name``: ``{"name": str}``,
``*_sort_index``: ``{"sort_index": int}``, ``process_labels``: ``{"labels": str}``).  A
malformed optional field (``args`` not an object, ``cat`` or ``s`` not a string, ``id`` neither a
string nor an integer; null included) is removed and noted.  With ``max_text``, names,
categories and string ``tid`` are capped.  With ``text_pid``, a string ``pid`` is accepted too
(Kineto's ``"Spans"``; Perfetto interns it).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rltrace.readers.fields import MAX_TEXT, Note, cap_text, preview

#: largest |ts| and dur in µs (exact in a double; epoch µs until the year 2255)
TS_MAX = float(1 << 53)
PID_MIN, PID_MAX = -(1 << 63), (1 << 63) - 1
#: "no cap" for :func:`_plain_complete` (a line is at most ``LINE_CAP`` bytes anyway)
NO_CAP = 1 << 62
#: phases that need a name, and those that need an id (async begin/end/instant)
NAMED = frozenset("XBiICMbn")
WITH_ID = frozenset("ben")
#: what the args of a metadata event must hold, by its name
META_ARGS: Mapping[str, tuple[str, type]] = MappingProxyType({
    "process_name": ("name", str), "thread_name": ("name", str), "process_labels": ("labels", str),
    "process_sort_index": ("sort_index", int), "thread_sort_index": ("sort_index", int),
})


def check_trace_event(ev: dict[str, Any], note: Note, max_text: int | None = MAX_TEXT,
                      text_pid: bool = False) -> str | None:
    """Check ``ev`` in place (see the module docstring): None when it can be used, else why not.
    ``note`` receives one ``"field: why"`` per optional field removed."""
    if len(ev) == 8 and ev.get("ph") == "X" and plain_complete(ev, max_text):
        return None
    return check_in_full(ev, note, max_text, text_pid)


def check_in_full(ev: dict[str, Any], note: Note, max_text: int | None = MAX_TEXT,
                  text_pid: bool = False) -> str | None:
    """:func:`check_trace_event` without its shortcut for the common case (the definition)."""
    ph = ev.get("ph")
    if type(ph) is not str or not 0 < len(ph) <= 2:
        return f"ph: expected a phase letter, got {preview(ph)}"
    why = _ids(ev, ph, text_pid) or _times(ev, ph) or _name(ev, ph, max_text)
    if why is None and ph == "M":
        why = _meta_args(ev)
    if why is None:
        _optional(ev, ph, note, max_text)
    return why


def plain_complete(ev: dict[str, Any], max_text: int | None) -> bool:
    """Whether an ``X`` event of 8 fields has rltrace's Chrome exporter's fields (pid, tid, ts, dur,
    name, cat, args), well formed: the common case, decided in one expression.  What it accepts
    (with ``len(ev) == 8`` and ``ph`` ``"X"``), :func:`check_in_full` accepts unchanged and
    without a note."""
    pid, tid, ts, dur = ev.get("pid"), ev.get("tid"), ev.get("ts"), ev.get("dur")
    name, cat = ev.get("name"), ev.get("cat")
    cap = NO_CAP if max_text is None else max_text
    return (type(pid) is int and type(tid) is int and PID_MIN <= pid <= PID_MAX and PID_MIN <= tid <= PID_MAX
            and (type(ts) is int or type(ts) is float) and -TS_MAX <= ts <= TS_MAX
            and (type(dur) is float or type(dur) is int) and 0 <= dur <= TS_MAX
            and type(name) is str and type(cat) is str and len(name) <= cap and len(cat) <= cap
            and type(ev.get("args")) is dict)


def _ids(ev: dict[str, Any], ph: str, text_pid: bool) -> str | None:
    """Why ``pid``, ``tid`` or (async events) ``id`` cannot place the event (None: they can)."""
    pid, tid = ev.get("pid", 0), ev.get("tid", 0)
    if not (type(pid) is int and PID_MIN <= pid <= PID_MAX) and not (text_pid and type(pid) is str):
        return f"pid: expected an integer, got {preview(pid)}"
    if type(tid) is not str and not (type(tid) is int and PID_MIN <= tid <= PID_MAX):
        return f"tid: expected an integer or a string, got {preview(tid)}"
    if ph in WITH_ID and type(ev.get("id")) not in (str, int):
        return f"id: expected a string or an integer, got {preview(ev.get('id'))}"
    return None


def _times(ev: dict[str, Any], ph: str) -> str | None:
    """Why ``ts`` (any phase but metadata) or ``dur`` (``X``) cannot place the event."""
    ts = ev.get("ts")
    if (ph != "M" or ts is not None) and not ((type(ts) is int or type(ts) is float)
                                              and -TS_MAX <= ts <= TS_MAX):
        return f"ts: expected a number of microseconds, got {preview(ts)}"
    if ph == "X":
        dur = ev.get("dur")
        if not ((type(dur) is float or type(dur) is int) and 0 <= dur <= TS_MAX):
            return f"dur: expected a number of microseconds >= 0, got {preview(dur)}"
    return None


#: the args a timeline keys tracks and arrows by: a session's, a task's id, the rank
ID_ARGS = ("rl.session.id", "rl.task.id", "rank")


def plain_ids(ev: dict[str, Any], note: Note) -> None:
    """Remove (and note) an id arg (:data:`ID_ARGS`) of a checked event that is not a plain
    value (None, bool, integer, finite float, string): a list or an object cannot key a track
    (a damaged line), and NaN never equals itself."""
    args = ev.get("args")
    if type(args) is not dict:
        return
    for key in ID_ARGS:
        v = args.get(key)
        if v is not None and type(v) not in (int, str, bool) and not (type(v) is float and v == v
                                                                      and abs(v) != float("inf")):
            note(f"args.{key}: expected an id (an integer or a string), got {preview(args.pop(key))}")


def times_ok(ev: dict[str, Any]) -> bool:
    """Whether a complete (``X``) event's ``ts`` and ``dur`` place it (as :func:`check_trace_event`
    decides): for a pass that reads the lines before the checked pass does."""
    return _times(ev, "X") is None


def _name(ev: dict[str, Any], ph: str, max_text: int | None) -> str | None:
    name = ev.get("name")
    if name is None and ph not in NAMED:
        return None
    if type(name) is not str:
        return f"name: expected a string, got {preview(name)}"
    if max_text is not None and len(name) > max_text:
        ev["name"] = cap_text(name, max_text)
    return None


def _meta_args(ev: dict[str, Any]) -> str | None:
    want = META_ARGS.get(ev["name"])
    if want is None:
        return None
    args = ev.get("args")
    key, typ = want
    v = args.get(key) if type(args) is dict else None
    if type(v) is not typ:
        return f"args.{key}: expected {typ.__name__} for {ev['name']}, got {preview(v)}"
    return None


def _optional(ev: dict[str, Any], ph: str, note: Note, max_text: int | None) -> None:
    """Remove (and note) malformed optional fields; cap string ``cat`` and ``tid``."""
    if "args" in ev and type(ev["args"]) is not dict:
        note(f"args: expected an object, got {preview(ev.pop('args'))}")
    if type(ev.get("cat", "")) is not str:
        note(f"cat: expected a string, got {preview(ev.pop('cat'))}")
    if type(ev.get("s", "")) is not str:
        note(f"s: expected a string, got {preview(ev.pop('s'))}")
    if ph not in WITH_ID and type(ev.get("id", "")) not in (str, int):
        note(f"id: expected a string or an integer, got {preview(ev.pop('id'))}")
    if max_text is not None:
        for key in ("cat", "tid"):
            v = ev.get(key)
            if type(v) is str and len(v) > max_text:
                ev[key] = cap_text(v, max_text)
