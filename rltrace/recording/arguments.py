"""Argument checks shared by the public API: one error policy, enabled or disabled.

Programming errors (a wrong type, an unknown phase, a misspelt method) raise a clear
``TypeError``/``ValueError`` naming the function, the argument and the fix, *before* the
function looks at whether tracing is on, so code that runs with tracing off keeps running
when it is turned on.  The hot paths call these only when a one-line type test fails.
Failures inside rltrace itself never raise into user code (``recorder.internal_error``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import NoReturn


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def type_error(api: str, arg: str, expected: str, value: object, fix: str) -> NoReturn:
    """Raise ``TypeError("rltrace.<api>: <arg> must be <expected>, got <type> <value>; <fix>")``."""
    raise TypeError(f"rltrace.{api}: {arg} must be {expected}, got {type(value).__name__} "
                    f"{_shown(value)}; {fix}")


def check_scope_args(api: str, name: object, args: object) -> None:
    """Validate ``name`` and ``args`` of ``trace_scope``-like calls (raises, or returns).

    ``category`` is not checked: like AReaL's, any value is kept (its string at export).
    """
    if type(name) is not str:
        type_error(api, "name", "a str", name, "pass a string such as 'train.step'")
    check_mapping(api, "args", args)


def check_mapping(api: str, arg: str, value: object) -> None:
    """``value`` must be None or a mapping (args, payloads); keys are stringified at export."""
    if value is not None and not isinstance(value, Mapping):
        type_error(api, arg, "a dict of names to values", value,
                   f"pass {arg}={{'key': value}} (or leave it out)")


def check_optional_int(api: str, arg: str, value: object) -> None:
    """``value`` must be None or an int (not a bool, not a numeric string)."""
    if value is not None and (type(value) is not int):
        type_error(api, arg, "an int or None", value, f"pass {arg}=3 (an int)")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close match among ``choices``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
