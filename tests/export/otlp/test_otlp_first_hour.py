"""A new user's first hour with OTLP: a bad endpoint is refused at configure with the config's
error style, and a dead backend costs one warning per rank with an honest breakdown, never the
SDK's own retry lines and never a traceback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, clean_env

import rltrace


@pytest.mark.parametrize(("endpoint", "protocol", "problem"), [
    ("htp://127.0.0.1:4317", None, "did you mean 'http'"),
    ("not a url", None, "must name a host"),
    ("http://localhost:99999", None, "port in 1..65535"),
    ("http://localhost:0", None, "port in 1..65535"),
    ("127.0.0.1:4318", "http/protobuf", "must start with http:// or https://"),
    ("", None, "must be a URL"),
])
def test_a_bad_otlp_endpoint_is_a_config_error_naming_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, protocol: str | None,
        problem: str) -> None:
    clean_env(monkeypatch)
    with pytest.raises(rltrace.ConfigError, match=re.escape("'otlp.endpoint'")) as err:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                          otlp={"endpoint": endpoint, "protocol": protocol})
    assert problem in str(err.value) and not rltrace.is_configured()


def test_good_endpoints_and_the_http_alias_are_accepted(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    for endpoint, protocol in (("http://127.0.0.1:4317", "grpc"), ("127.0.0.1:4317", "grpc"),
                               ("https://collector.example:4318", "http"),
                               ("http://127.0.0.1:4318/v1/traces", "http/protobuf")):
        cfg = rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                                otlp={"endpoint": endpoint, "protocol": protocol})
        assert cfg.otlp.endpoint == endpoint
        rltrace.shutdown()


def test_a_bad_endpoint_from_the_environment_names_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "htp://collector:4317")
    with pytest.raises(rltrace.ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT='htp://collector:4317'"):
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)


def _dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEAD_RUN = """
import sys, rltrace
fileroot, endpoint, protocol = sys.argv[1:4]
rltrace.configure(fileroot=fileroot, experiment_name="dead", trial_name="t0", rank=3,
                  otlp={"endpoint": endpoint, "protocol": protocol, "timeout_s": 1.0})
for i in range(200):
    with rltrace.trace_scope("step", args={"i": i}):
        pass
    if i % 50 == 49:
        rltrace.flush()
p = rltrace.runtime.get_pipeline()
rltrace.shutdown()
o = p.otlp.stats()
print(o["exported"], o["failed"], o["dropped"], o["unsent_at_exit"])
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_dead_backend_costs_one_warning_with_the_breakdown_and_no_sdk_lines(
        tmp_path: Path, protocol: str) -> None:
    endpoint = f"http://127.0.0.1:{_dead_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    proc = subprocess.run([sys.executable, "-c", DEAD_RUN, str(tmp_path), endpoint, protocol],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    exported, failed, dropped, unsent = map(int, proc.stdout.split())
    assert exported == 0 and failed + dropped + unsent == 200
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    expected = (rf"rltrace rank 3: 200 of 200 spans did not reach the OTLP endpoint "
                rf"{re.escape(endpoint)}: {failed} failed \(export errors\), {dropped} dropped \(the "
                rf"send queue was full\), {unsent} still queued at exit \(waited at most 1\.0 s, "
                rf"otlp\.timeout_s\)(; last error: .+)?\. Training was not slowed; check the collector\.")
    assert re.fullmatch(expected, lines[0]), lines[0]


def test_session_calls_with_session_tracing_off_say_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clean_env(monkeypatch)
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    with caplog.at_level("WARNING", logger="rltrace"):
        for _ in range(3):
            sid = rltrace.register_session(rltrace.register_task())
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    said = [r.getMessage() for r in caplog.records if "session tracing is off" in r.getMessage()]
    assert len(said) == 1 and "register_task() was called" in said[0]
    assert "session_tracer={'enabled': True}" in said[0]
    rltrace.shutdown()
    caplog.clear()
    with caplog.at_level("WARNING", logger="rltrace"):
        rltrace.register_session()  # not configured at all: nothing to say
    assert not caplog.records
