"""Conversion of user values into OTel attribute values and JSON-safe values.

Shared by rltrace's span builder and the exporters: tensors, arrays, numpy scalars and
arbitrary objects are converted or stringified so that neither OTLP nor the Chrome encoder can
fail on them (a huge value is truncated with a note of how much was cut, never fatal).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from enum import Enum
from typing import Any

import orjson

MAX_STRING = 65_536
MAX_SEQUENCE = 256
MAX_DEPTH = 4
SMALL_ARRAY = 16
_I64 = 1 << 63


def text(value: Any) -> str:
    """``str(value)``, never raising, valid UTF-8 (lone surrogates escaped), size-capped."""
    try:
        s = value if type(value) is str else str(value)
    except Exception:
        s = f"<unprintable {type(value).__name__}>"
    if type(s) is not str:
        s = f"<unprintable {type(value).__name__}>"
    s = utf8(s)
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
        return text(value)


def utf8(s: str) -> str:
    """``s`` unchanged if it encodes as UTF-8; otherwise lone surrogates escaped (``\\udcff``)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def attr_value(value: Any) -> Any:
    """Convert ``value`` into an OTel attribute value (str, bool, int, float or a sequence)."""
    # the common cases first, inline (this runs for every attribute); the rest in _other_value
    t = type(value)
    if t is str:
        return utf8(value) if len(value) <= MAX_STRING else text(value)
    if t is bool or t is float:
        return value
    if t is int:
        return value if -_I64 <= value < _I64 else str(value)
    return _other_value(value)


def _other_value(value: Any) -> Any:
    """:func:`attr_value` past the exact str/bool/int/float types: None, enums (by value),
    subclasses of those types (numpy's ``float64``, ``IntEnum``...), bytes, sequences, and
    anything else (arrays, tensors, objects)."""
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
        return text(bytes(value))
    if isinstance(value, (list, tuple)):
        return _sequence_value(value)
    return _object_value(value)


def _sequence_value(value: list[Any] | tuple[Any, ...]) -> Any:
    """A list or tuple as a tuple of converted items when they are all of one scalar type and at
    most ``MAX_SEQUENCE``; otherwise its text (OTel attributes hold only homogeneous sequences;
    nested sequences, a list that holds itself among them, are never descended into)."""
    head = value[:MAX_SEQUENCE]
    if any(type(v) in _CONTAINERS for v in head):
        return text(value)
    items = [attr_value(v) for v in head]
    kinds = {type(v) for v in items}
    if len(kinds) <= 1 and not (kinds & {tuple, list}) and len(value) <= MAX_SEQUENCE:
        return tuple(items)
    return text(value)


def _object_value(value: Any) -> Any:
    """Any other object: an array or tensor (see :func:`_array_like`), a scalar with ``.item()``
    (numpy/torch scalars) by its item, else its text."""
    if hasattr(value, "shape") and hasattr(value, "tolist"):
        return _array_like(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            return attr_value(value.item())
        except Exception:
            return text(value)
    return text(value)


_CONTAINERS = (list, tuple, dict)
_PLAIN = frozenset((str, int, float, bool, type(None)))
#: values converted at export by library code only (arrays, tensors, numpy scalars, bytes)
_LIBRARY = (bytes, bytearray)


def recorded(args: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``args`` safe to hold until export, made where it is recorded.

    Plain values (str, int, float, bool, None) and lists and tuples of them are kept as they are
    (one level deep, as ever); arrays, tensors, numpy scalars and bytes too (their conversion at
    export is the library's own code, and a tensor on a GPU is not read back here).  Anything
    else is converted now, on the caller's thread: an object to its text (its ``__str__`` runs
    here, never on the exporter), a container holding such values (or itself) element by
    element, ``MAX_DEPTH`` deep, deeper ones to their text.  Never raises.
    """
    out = dict(args)
    for k, v in out.items():
        if type(v) not in _PLAIN:
            out[k] = _recorded_value(v, 0)
    if not all(type(k) is str for k in out):
        out = {(k if type(k) in _PLAIN else text(k)): v for k, v in out.items()}
    return out


def recorded_value(value: Any) -> Any:
    """One value as :func:`recorded` keeps it."""
    return value if type(value) in _PLAIN else _recorded_value(value, 0)


def _recorded_value(value: Any, depth: int) -> Any:
    t = type(value)
    if t in _PLAIN or isinstance(value, _LIBRARY) or _is_array_like(value):
        return value
    if t is list or t is tuple:
        if all(type(v) in _PLAIN for v in value):
            return value
        if depth >= MAX_DEPTH:
            return text(value)
        return t(_recorded_value(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            return text(value)
        return {(k if type(k) in _PLAIN else text(k)): _recorded_value(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, Enum):
        return _recorded_value(value.value, depth + 1) if depth < MAX_DEPTH else text(value)
    return text(value)


def _is_array_like(value: Any) -> bool:
    """Arrays, tensors and numpy/torch/jax scalars: their own libraries convert them."""
    return hasattr(type(value), "dtype") or (hasattr(value, "shape") and hasattr(value, "tolist"))


def flatten_into(out: dict[str, Any], prefix: str, mapping: Mapping[Any, Any], depth: int = 0) -> None:
    """Flatten nested mappings into ``out`` as ``prefix + key`` (``args.cfg.lr``)."""
    for k, v in mapping.items():
        key = prefix + (k if type(k) is str else text(k))
        if isinstance(v, Mapping) and depth < MAX_DEPTH:
            flatten_into(out, key + ".", v, depth + 1)
        else:
            try:
                out[key] = attr_value(v)
            except Exception:
                out[key] = f"<unconvertible {type(v).__name__}>"


def json_safe(value: Any, depth: int = 0) -> Any:
    """A JSON-encodable copy of ``value`` (nested mappings kept, keys made strings)."""
    if isinstance(value, Mapping) and depth < MAX_DEPTH:
        return {text(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and depth < MAX_DEPTH:
        return [json_safe(v, depth + 1) for v in value[:MAX_SEQUENCE]]
    return attr_value(value)


def json_default(value: Any) -> Any:
    """``default=`` hook for orjson: whatever JSON cannot encode becomes an attribute value."""
    try:
        return attr_value(value)
    except Exception:
        return f"<unconvertible {type(value).__name__}>"


_OPT = orjson.OPT_NON_STR_KEYS
_dumps = orjson.dumps


def dumps_line(obj: Any) -> bytes:
    """``obj`` as compact JSON bytes, whatever it holds.

    String keys and JSON values take orjson's plain call (the common case, and the cheapest);
    non-string keys and values JSON has no form for are written through ``json_default``; what
    orjson still refuses (an int beyond 64 bits, a lone surrogate) is made :func:`json_safe`.
    Every path writes the same bytes for what the plain call accepts.
    """
    try:
        return _dumps(obj)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        return _dumps(obj, default=json_default, option=_OPT)
    except TypeError:
        return _dumps(json_safe(obj), default=json_default, option=_OPT)


def category_name(category: Any, default: str = "misc") -> str:
    """The string form of a category (``Category`` enum member or any string)."""
    if category is None:
        return default
    if isinstance(category, Enum):
        return str(category.value)
    return category if type(category) is str else text(category)


_last_names: dict[int, str] = {}


def refresh_thread_names() -> None:
    """Note the names of the live threads (the exporter calls this once per cycle)."""
    for t in threading.enumerate():
        if t.ident is not None:
            _last_names[t.ident] = t.name


def thread_names() -> dict[int, str]:
    """The live map of thread idents to names that :func:`thread_name` reads (the Chrome
    encoder's loop looks names up in it directly)."""
    return _last_names


def thread_name(ident: int) -> str:
    """The name of the thread with this ident as of the latest refresh (or now, if unseen).

    Looked up at export time (the hot path records only the ident); refreshed every export
    cycle, so a new thread that reuses a finished thread's ident is seen under its own name.
    """
    name = _last_names.get(ident)
    if name is None:
        refresh_thread_names()
        name = _last_names.get(ident)
    return name or f"thread-{ident}"
