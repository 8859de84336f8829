"""One error policy for every public function (issue 13, item 5).

Each row is a programming error a user can make.  It must raise the same clear exception
(type and message, naming the function, the argument and the fix) whether tracing is off
(never configured), on with spans and sessions, or on with sessions only; and it must never be
a raw error from deep inside (``dictionary update sequence``, ``not all arguments converted``,
``'NoneType' object has no attribute``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

import rltrace
from rltrace import perf_tracer


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)


def _decorate_without_phase() -> Any:
    @rltrace.trace_session  # type: ignore[arg-type]  # the phase name is missing
    def generate() -> None:
        return None

    return generate


def _enter(cm: Any) -> None:
    with cm:
        pass


# (id, call, exception type, substrings the message must contain)
ROWS: list[tuple[str, Callable[[], Any], type[Exception], tuple[str, ...]]] = [
    ("trace_scope args str", lambda: rltrace.trace_scope("x", args="abc"),  # type: ignore[arg-type]
     TypeError, ("rltrace.trace_scope", "args must be a dict", "args={'key': value}")),
    ("trace_scope name int", lambda: rltrace.trace_scope(3),  # type: ignore[arg-type]
     TypeError, ("rltrace.trace_scope", "name must be a str")),
    ("atrace_scope args list", lambda: rltrace.atrace_scope("x", args=[1]),  # type: ignore[arg-type]
     TypeError, ("rltrace.atrace_scope", "args must be a dict")),
    ("instant args str", lambda: rltrace.instant("x", args="s"),  # type: ignore[arg-type]
     TypeError, ("rltrace.instant", "args must be a dict")),
    ("save step str", lambda: rltrace.save(step="3"),  # type: ignore[arg-type]
     TypeError, ("rltrace.save", "step must be an int or None", "'3'")),
    ("save step float", lambda: rltrace.save(step=3.0),  # type: ignore[arg-type]
     TypeError, ("rltrace.save", "step must be an int or None")),
    ("trace_session_event None", lambda: rltrace.trace_session_event(None),  # type: ignore[arg-type]
     TypeError, ("rltrace.trace_session_event", "method must be a str", "mark_finalized")),
    ("trace_session_event typo", lambda: rltrace.trace_session_event("mark_finalised", status="accepted"),
     ValueError, ("unknown method 'mark_finalised'", "did you mean 'mark_finalized'")),
    ("mark_finalized bad status", lambda: rltrace.trace_session_event("mark_finalized", status="ok"),
     ValueError, ("status must be one of", "accepted")),
    ("trace_session without phase", _decorate_without_phase,
     TypeError, ("@trace_session('generate')",)),
    ("trace_session_phase typo", lambda: rltrace.trace_session_phase("generat"),
     rltrace.UnknownPhaseError, ("'generat'", "did you mean 'generate'")),
    ("trace_session_phase unknown", lambda: rltrace.trace_session_phase("validation_xyz"),
     rltrace.UnknownPhaseError, ("register_phase('validation_xyz')",)),
    ("trace_session_phase int", lambda: rltrace.trace_session_phase(7),  # type: ignore[arg-type]
     TypeError, ("session phase must be a str",)),
    ("trace_session_phase payload", lambda: rltrace.trace_session_phase("generate", "m"),  # type: ignore[arg-type]
     TypeError, ("rltrace.trace_session_phase", "start_payload must be a dict")),
    ("trace_session_phase turn", lambda: rltrace.trace_session_phase("generate", turn="1"),  # type: ignore[arg-type]
     TypeError, ("rltrace.trace_session_phase", "turn must be an int")),
    ("mark phase typo", lambda: rltrace.trace_session_event("mark_generat_start"),
     rltrace.UnknownPhaseError, ("did you mean 'generate'",)),
    ("register_phase bad name", lambda: rltrace.register_phase("bad name"),
     ValueError, ("rltrace.register_phase", "identifier")),
    ("step str", lambda: rltrace.step("3"),  # type: ignore[arg-type]
     TypeError, ("rltrace.step", "must be an int")),
    ("counter empty", lambda: rltrace.counter(""),
     TypeError, ("rltrace.counter", "non-empty str")),
    ("perf_tracer trace_scope args", lambda: perf_tracer.trace_scope("x", args="abc"),  # type: ignore[arg-type]
     TypeError, ("args must be a dict",)),
]

RAW = ("dictionary update sequence", "not all arguments converted", "has no attribute")


def _configure(mode: str, tmp_path: Path) -> None:
    if mode == "off":
        return
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, enabled=(mode == "spans"),
                      session_tracer={"enabled": True})


@pytest.mark.parametrize(("row_id", "call", "exc_type", "needles"), ROWS, ids=[r[0] for r in ROWS])
def test_misuse_raises_the_same_clear_error_with_tracing_off_and_on(
        tmp_path: Path, row_id: str, call: Callable[[], Any], exc_type: type[Exception],
        needles: tuple[str, ...]) -> None:
    messages = {}
    for mode in ("off", "spans", "sessions"):
        rltrace.shutdown()
        _configure(mode, tmp_path / mode)
        with pytest.raises(exc_type) as info:
            out = call()
            if hasattr(out, "__enter__"):  # a scope: misuse must not wait for the with
                _enter(out)
        msg = str(info.value)
        assert type(info.value) is exc_type, (mode, repr(info.value))
        assert all(n in msg for n in needles), (mode, msg)
        assert not any(r in msg for r in RAW), (mode, msg)
        messages[mode] = msg
    assert len(set(messages.values())) == 1, messages


def test_valid_calls_next_to_the_rows_still_work_off_and_on(tmp_path: Path) -> None:
    """The checks accept what the API documents: Mapping args, Category, str categories."""
    from types import MappingProxyType

    for mode in ("off", "spans"):
        rltrace.shutdown()
        _configure(mode, tmp_path / mode)
        with rltrace.trace_scope("x", rltrace.Category.IO, MappingProxyType({"k": 1})):
            rltrace.instant("i", "custom-cat", {"a": 1})
        rltrace.save(step=3)
        rltrace.save()
        with rltrace.trace_session_phase("generate", {"model": "m"}, turn=0):
            pass
