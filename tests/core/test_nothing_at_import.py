"""Importing rltrace changes nothing in the process: OpenTelemetry's runtime context is wrapped at
the first ``configure()`` and given back at ``shutdown()``, and the fork hook is registered at the
first ``configure()``, once per process.

Each case runs in a fresh interpreter (``sys.executable``), since the process running the test
suite has long configured rltrace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# os.register_at_fork keeps its hooks inside the interpreter with no way to list or count them
# from Python, so the only way to observe a registration is to wrap the function before rltrace is
# imported and count the calls that reach it; only hooks defined in rltrace's modules count (the
# standard library's threading, logging and random register their own on import).
LIFECYCLE = '''
import json, os, sys
calls = []
_register = os.register_at_fork
def counting(**hooks):
    if any(str(getattr(h, "__module__", "")).startswith("rltrace") for h in hooks.values()):
        calls.append(sorted(hooks))
    _register(**hooks)
os.register_at_fork = counting

from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
original = context._RUNTIME_CONTEXT
out = {}

import rltrace
import rltrace.testing
out["import_same_context"] = context._RUNTIME_CONTEXT is original
out["import_fork_hooks"] = len(calls)

tracer = TracerProvider().get_tracer("user")
with rltrace.testing.capture_spans(sys.argv[1]) as cap:
    out["configured_context"] = type(context._RUNTIME_CONTEXT).__name__
    out["configured_inner_is_original"] = getattr(context._RUNTIME_CONTEXT, "inner", None) is original
    out["configure_fork_hooks"] = len(calls)
    with tracer.start_as_current_span("otel.outer") as outer:
        with rltrace.trace_scope("rl.mid") as mid:
            out["otel_sees_scope"] = trace.get_current_span() is mid
            with tracer.start_as_current_span("otel.inner") as inner:
                pass
    spans = {s.name: s for s in cap.spans()}
    out["scope_parent_is_otel_outer"] = spans["rl.mid"].parent.span_id == outer.get_span_context().span_id
    out["otel_inner_parent_is_scope"] = inner.parent.span_id == mid.get_span_context().span_id
out["shutdown_same_context"] = context._RUNTIME_CONTEXT is original

with rltrace.testing.capture_spans(sys.argv[1]):
    out["reconfigured_context"] = type(context._RUNTIME_CONTEXT).__name__
    with rltrace.trace_scope("again") as again:
        out["reconfigured_otel_sees_scope"] = trace.get_current_span() is again
out["second_shutdown_same_context"] = context._RUNTIME_CONTEXT is original
out["fork_hooks_after_two_configures"] = len(calls)
print(json.dumps(out))
'''

# a child forked before anything configured rltrace ran no fork hook (none was registered): its
# first configure re-arms it, so that its ids are not the parent's sequence
FORKED_BEFORE_CONFIGURE = '''
import json, os, sys
import rltrace
import rltrace.testing

r, w = os.pipe()
pid = os.fork()
root = os.path.join(sys.argv[1], "child" if pid == 0 else "parent")
with rltrace.testing.capture_spans(root):
    with rltrace.trace_scope("first") as scope:
        ids = [scope.get_span_context().trace_id, scope.get_span_context().span_id]
if pid == 0:
    os.write(w, json.dumps(ids).encode())
    os._exit(0)
os.close(w)
child = json.loads(os.read(r, 4096))
os.waitpid(pid, 0)
print(json.dumps({"parent": ids, "child": child}))
'''


def _run(script: str, tmp_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_import_leaves_otel_alone_and_configure_wraps_until_shutdown(tmp_path: Path) -> None:
    out = _run(LIFECYCLE, tmp_path)
    assert out["import_same_context"] is True
    assert out["import_fork_hooks"] == 0
    assert out["configured_context"] == "FrameAwareContext"
    assert out["configured_inner_is_original"] is True
    assert out["configure_fork_hooks"] == 1
    assert out["otel_sees_scope"] is True
    assert out["scope_parent_is_otel_outer"] is True
    assert out["otel_inner_parent_is_scope"] is True
    assert out["shutdown_same_context"] is True
    assert out["reconfigured_context"] == "FrameAwareContext"
    assert out["reconfigured_otel_sees_scope"] is True
    assert out["second_shutdown_same_context"] is True
    assert out["fork_hooks_after_two_configures"] == 1  # once per process


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_child_forked_before_configure_draws_ids_of_its_own(tmp_path: Path) -> None:
    out = _run(FORKED_BEFORE_CONFIGURE, tmp_path)
    assert out["parent"] != out["child"]


NO_PLUGIN_PROJECT = textwrap.dedent('''
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext


    def test_otel_context_is_untouched_even_after_importing_rltrace():
        before = context._RUNTIME_CONTEXT
        assert type(before) is ContextVarsRuntimeContext
        import rltrace  # noqa: F401
        import rltrace.testing  # noqa: F401
        assert context._RUNTIME_CONTEXT is before
''')


def test_a_pytest_session_without_the_plugin_leaves_otel_context_untouched(tmp_path: Path) -> None:
    (tmp_path / "test_their_project.py").write_text(NO_PLUGIN_PROJECT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RLTRACE_", "OTEL_"))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
