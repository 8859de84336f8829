"""Typed checks of single values read from a file: each returns the value to use or raises :class:`Bad`.

Numbers are ``int`` or ``float`` (never ``bool``), finite and within the bounds a reader can
use; strings longer than ``MAX_TEXT`` characters are cut, with a marker saying by how much.
Containers (:func:`list_of`, :func:`dict_of`, :func:`obj`) keep their good items and note each
bad one through ``note`` (a reader counts the notes as fields ignored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

#: the longest string copied from a file into a report, a live view or a message
MAX_TEXT = 300
#: largest magnitude of a time in seconds (epoch or duration): year ~33,600
MAX_SECONDS = 1e12

#: a problem noted on a kept record: ``note("field: why")``
Note = Callable[[str], None]
#: a check of one value: returns what to use, raises :class:`Bad` (may note problems inside it)
Check = Callable[[Any, Note], Any]


class Bad(ValueError):
    """A value of the wrong type or out of range; the message says what was expected."""


def cap_text(s: str, limit: int = MAX_TEXT) -> str:
    """``s``, or its first ``limit`` characters and ``…(+N chars)`` for the ``N`` cut."""
    if len(s) <= limit:
        return s
    return f"{s[:limit]}…(+{len(s) - limit} chars)"


def preview(v: object) -> str:
    """A short description of a bad value for a message (never the whole of a big one)."""
    if type(v) is str:
        return repr(cap_text(v, 40))
    if type(v) is list or type(v) is dict:
        return f"a {type(v).__name__} of {len(v)}"
    return cap_text(repr(v), 40)


def is_number(v: object) -> TypeGuard[float]:
    """An ``int`` or a finite ``float`` (not a ``bool``)."""
    return type(v) is int or (type(v) is float and math.isfinite(v))


def number(lo: float, hi: float) -> Check:
    """A number with ``lo <= v <= hi``, returned as it is."""
    def check(v: object, note: Note | None = None) -> Any:
        if is_number(v) and lo <= v <= hi:
            return v
        raise Bad(f"expected a number in [{lo:g}, {hi:g}], got {preview(v)}")
    return check


def integer(lo: int, hi: int) -> Check:
    """An integer (a float with an integral value is taken as one) with ``lo <= v <= hi``."""
    def check(v: object, note: Note | None = None) -> int:
        if type(v) is float and v.is_integer():
            v = int(v)
        if type(v) is int and lo <= v <= hi:
            return v
        raise Bad(f"expected an integer in [{lo}, {hi}], got {preview(v)}")
    return check


def text(v: object, note: Note | None = None) -> str:
    """A string, capped at ``MAX_TEXT`` characters."""
    if type(v) is str:
        return v if len(v) <= MAX_TEXT else cap_text(v)
    raise Bad(f"expected a string, got {preview(v)}")


def boolean(v: object, note: Note | None = None) -> bool:
    if type(v) is bool:
        return v
    raise Bad(f"expected true or false, got {preview(v)}")


def scalar(v: object, note: Note | None = None) -> Any:
    """An id: a string (capped), a number or a boolean, never a list or an object."""
    if type(v) is str:
        return v if len(v) <= MAX_TEXT else cap_text(v)
    if type(v) is int or type(v) is bool or (type(v) is float and math.isfinite(v)):
        return v
    raise Bad(f"expected a string or a number, got {preview(v)}")


def list_of(item: Check, cap: int) -> Check:
    """A list of at most ``cap`` good items: bad items (and those past the cap) are dropped and noted."""
    def check(v: object, note: Note) -> list[Any]:
        if type(v) is not list:
            raise Bad(f"expected a list, got {preview(v)}")
        out = []
        for i, x in enumerate(v):
            if i >= cap:
                note(f"[{cap}:]: {len(v) - cap} item(s) past the {cap} read")
                break
            try:
                out.append(item(x, _prefixed(note, f"[{i}]")))
            except Bad as exc:
                note(f"[{i}]: {exc}")
        return out
    return check


def dict_of(value: Check, cap: int) -> Check:
    """A JSON object of at most ``cap`` entries, keys capped, bad values dropped and noted."""
    def check(v: object, note: Note) -> dict[str, Any]:
        if type(v) is not dict:
            raise Bad(f"expected an object, got {preview(v)}")
        out: dict[str, Any] = {}
        for i, (k, x) in enumerate(v.items()):
            if i >= cap:
                note(f": {len(v) - cap} entry(ies) past the {cap} read")
                break
            where = f".{cap_text(k, 40)}"
            try:
                out[k if len(k) <= MAX_TEXT else cap_text(k)] = value(x, _prefixed(note, where))
            except Bad as exc:
                note(f"{where}: {exc}")
        return out
    return check


def pair(first: Check, second: Check) -> Check:
    """A two-item list ``[a, b]``, returned as a tuple."""
    def check(v: object, note: Note) -> tuple[Any, Any]:
        if type(v) is not list or len(v) != 2:
            raise Bad(f"expected a pair [a, b], got {preview(v)}")
        return first(v[0], note), second(v[1], note)
    return check


Schema = Mapping[str, Check]


def apply(doc: dict[str, Any], schema: Schema, note: Note, where: str = "") -> None:
    """Check ``doc``'s fields named in ``schema`` in place: a bad one is removed and noted as
    ``{where}{field}: why``; null and absent fields are left as they are."""
    for key, check in schema.items():
        v = doc.get(key)
        if v is None:
            continue
        try:
            doc[key] = check(v, _prefixed(note, f"{where}{key}"))
        except Bad as exc:
            del doc[key]
            note(f"{where}{key}: {exc}")


def obj(schema: Schema) -> Check:
    """A JSON object whose fields named in ``schema`` are checked (see :func:`apply`)."""
    def check(v: object, note: Note) -> dict[str, Any]:
        if type(v) is not dict:
            raise Bad(f"expected an object, got {preview(v)}")
        apply(v, schema, note, ".")
        return v
    return check


def _prefixed(note: Note, prefix: str) -> Note:
    return lambda msg: note(prefix + msg)
