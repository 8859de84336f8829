"""Turn recorded scopes into OpenTelemetry SDK ``ReadableSpan`` objects (exporter thread).

Also the conversion of user values (``args``, ``set_attribute``) into valid OTel attribute
values: tensors, arrays, numpy scalars and arbitrary objects are converted or stringified so
that neither OTLP nor the Chrome encoder can fail on them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from enum import Enum
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from .recorder import Scope

#: attribute names set on every rltrace span
ATTR_CATEGORY = "rl.category"
ATTR_LANE = "rl.lane"
ATTR_INSTANT = "rl.instant"
ATTR_THREAD_ID = "thread.id"
ATTR_THREAD_NAME = "thread.name"
ARGS_PREFIX = "args."
DEFAULT_CATEGORY = "misc"

MAX_STRING = 65_536
MAX_SEQUENCE = 256
MAX_DEPTH = 4
SMALL_ARRAY = 16

_UNSET = Status(StatusCode.UNSET)
_INTERNAL = SpanKind.INTERNAL
_I64 = 1 << 63


def _text(value: Any) -> str:
    try:
        s = value if type(value) is str else str(value)
    except Exception:
        s = f"<unprintable {type(value).__name__}>"
    return s if len(s) <= MAX_STRING else s[:MAX_STRING] + f"...<{len(s) - MAX_STRING} more chars>"


def _array_like(value: Any) -> Any:
    """Tensors / ndarrays / jax arrays: small ones become numbers or lists, big ones a summary."""
    try:
        shape = tuple(int(d) for d in value.shape)
        size = 1
        for d in shape:
            size *= d
        if size <= SMALL_ARRAY:
            v = value.detach() if hasattr(value, "detach") else value
            return attr_value(v.tolist())
        return f"{type(value).__name__}(shape={shape}, dtype={getattr(value, 'dtype', '?')})"
    except Exception:
        return _text(value)


def attr_value(value: Any) -> Any:
    """Convert ``value`` into an OTel attribute value (str, bool, int, float or a sequence)."""
    t = type(value)
    if t is str:
        return value if len(value) <= MAX_STRING else _text(value)
    if t is bool or t is float:
        return value
    if t is int:
        return value if -_I64 <= value < _I64 else str(value)
    if value is None:
        return "None"
    if isinstance(value, Enum):
        return attr_value(value.value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return attr_value(int(value))
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return attr_value(str(value))
    if isinstance(value, (bytes, bytearray)):
        return _text(bytes(value))
    if isinstance(value, (list, tuple)):
        items = [attr_value(v) for v in value[:MAX_SEQUENCE]]
        kinds = {type(v) for v in items}
        if len(kinds) <= 1 and not (kinds & {tuple, list}) and len(value) <= MAX_SEQUENCE:
            return tuple(items)
        return _text(value)
    if hasattr(value, "shape") and hasattr(value, "tolist"):
        return _array_like(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            return attr_value(value.item())
        except Exception:
            return _text(value)
    return _text(value)


def flatten_into(out: dict[str, Any], prefix: str, mapping: Mapping[Any, Any], depth: int = 0) -> None:
    """Flatten nested mappings into ``out`` as ``prefix + key`` (``args.cfg.lr``)."""
    for k, v in mapping.items():
        key = prefix + (k if type(k) is str else _text(k))
        if isinstance(v, Mapping) and depth < MAX_DEPTH:
            flatten_into(out, key + ".", v, depth + 1)
        else:
            try:
                out[key] = attr_value(v)
            except Exception:
                out[key] = f"<unconvertible {type(v).__name__}>"


def category_name(category: Any) -> str:
    if category is None:
        return DEFAULT_CATEGORY
    if isinstance(category, Enum):
        return str(category.value)
    return category if type(category) is str else _text(category)


_thread_names: dict[int, str] = {}


def thread_name(ident: int) -> str:
    name = _thread_names.get(ident)
    if name is None:
        t = threading._active.get(ident)  # type: ignore[attr-defined]
        if t is None:
            return f"thread-{ident}"
        name = _thread_names[ident] = t.name
    return name


class SpanBuilder:
    """Builds ``ReadableSpan``s for one pipeline (its resource and instrumentation scope)."""

    def __init__(self, resource: Resource, scope: InstrumentationScope) -> None:
        self.resource = resource
        self.scope = scope

    def build(self, rec: Scope) -> ReadableSpan:
        attrs: dict[str, Any] = {
            ATTR_CATEGORY: category_name(rec.category),
            ATTR_THREAD_ID: rec.thread,
            ATTR_THREAD_NAME: thread_name(rec.thread),
            ATTR_LANE: rec.lane,
        }
        if rec.instant:
            attrs[ATTR_INSTANT] = True
        if rec.args:
            flatten_into(attrs, ARGS_PREFIX, rec.args)
        if rec.attrs:
            flatten_into(attrs, "", rec.attrs)
        events: list[Event] = []
        if rec.events:
            for name, ts, ev_args, ev_cat in rec.events:
                ev_attrs: dict[str, Any] = {}
                if ev_cat is not None:
                    ev_attrs[ATTR_CATEGORY] = category_name(ev_cat)
                if ev_args:
                    flatten_into(ev_attrs, ARGS_PREFIX, ev_args)
                events.append(Event(_text(name), ev_attrs, ts))
        status = rec.status or _UNSET
        if rec.error is not None:
            etype, msg, stack = rec.error
            status = Status(StatusCode.ERROR, f"{etype}: {msg}")
            events.append(Event("exception", {
                "exception.type": etype, "exception.message": _text(msg),
                "exception.stacktrace": _text(stack), "exception.escaped": True,
            }, rec.end_ns))
        parent = rec.parent
        if parent is not None and type(parent) is Scope:
            parent = parent.get_span_context()
        return ReadableSpan(
            name=rec.name,
            context=rec.get_span_context(),
            parent=parent,
            resource=self.resource,
            attributes=attrs,
            events=events,
            kind=_INTERNAL,
            status=status,
            start_time=rec.start_ns,
            end_time=rec.end_ns,
            instrumentation_scope=self.scope,
        )
