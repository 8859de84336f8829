"""Credentials in the OTLP endpoint URL (``http://user:password@host``): the HTTP exporter sends
them (basic auth), and every place rltrace shows or saves the endpoint shows ``<redacted>@``
instead: ``config.yaml``, stderr warnings, ``diagnostics()``, reprs, log files, error messages,
the CLI and the environment handed to child processes.

The runs are real: a subprocess configures rltrace against the in-process OTLP receiver (which
sees the real credentials arrive), then against a dead port (so the loss warning names the
endpoint), and a spawned child gets the real endpoint from its parent.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import clean_env

import rltrace
from rltrace.config import redact_endpoint, redact_urls
from rltrace.pipeline.otlp_exporter import SdkLogFold
from rltrace.testing.otlp_receiver import OTLPReceiver

PASSWORD = "pw-SECRET-in-url-5150"
USER = "otel-user"

WORKLOAD = """
import json, logging, multiprocessing as mp, os, socket, sys
import rltrace
from rltrace.stats.logs import setup_logging

def spawned(out):
    cfg = rltrace.configure_child()
    with open(out, "w") as fh:
        json.dump({"endpoint": cfg.otlp.endpoint, "env": dict(os.environ)}, fh)
    rltrace.shutdown()

if __name__ == "__main__":
    fileroot, endpoint, out = sys.argv[1:4]
    cfg = rltrace.configure(fileroot=fileroot, experiment_name="sec", trial_name="url",
                            session_tracer={"enabled": True},
                            otlp={"endpoint": endpoint, "protocol": "http/protobuf", "timeout_s": 2.0})
    setup_logging(logging.DEBUG)  # main.log in the log dir, everything at DEBUG
    logging.getLogger("train").info("config %r", rltrace.get_config())
    print(cfg, repr(cfg), cfg.otlp, flush=True)
    with rltrace.trace_scope("warmup"):
        pass
    rltrace.flush()
    rltrace.runtime.get_pipeline().otlp.force_flush(5000)  # refused (401): the SDK logs it
    with rltrace.trace_scope("url.scope"):
        pass
    rltrace.flush()
    rltrace.runtime.get_pipeline().otlp.force_flush(5000)
    p = mp.get_context("spawn").Process(target=spawned, args=(out,))
    p.start()
    p.join(120)
    print(json.dumps(rltrace.diagnostics(), default=str), flush=True)
    rltrace.shutdown()
    # a dead endpoint: the loss warning on stderr names it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = endpoint.rsplit(":", 1)[0] + f":{port}"
    rltrace.configure(fileroot=fileroot, experiment_name="sec", trial_name="dead",
                      otlp={"endpoint": dead, "protocol": "http/protobuf", "timeout_s": 0.5})
    with rltrace.trace_scope("lost.scope"):
        pass
    rltrace.shutdown()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.pop("RANK", None)
    return env


def test_credentials_in_the_endpoint_reach_the_collector_and_nothing_else(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(WORKLOAD))
    root, out = tmp_path / "run", tmp_path / "child.json"
    with OTLPReceiver() as rx:
        rx.fail_with(401, count=1)
        endpoint = rx.http_endpoint.replace("http://", f"http://{USER}:{PASSWORD}@")
        proc = subprocess.run([sys.executable, str(script), str(root), endpoint, str(out)],
                              capture_output=True, text=True, timeout=180, env=_env(),
                              cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        rx.wait_for_spans("url.scope", timeout=20)
        reqs = rx.requests
    # the real value reached the exporter: every request carried the basic auth ...
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert reqs and all(r.headers.get("authorization") == basic for r in reqs)
    assert any(r.outcome == "rejected" for r in reqs)
    # ... and so did the spawned child's config, though its environment holds only the redacted one
    child = json.loads(out.read_text())
    assert child["endpoint"] == endpoint
    assert PASSWORD not in json.dumps(child["env"])
    assert "<redacted>@127.0.0.1" in child["env"]["RLTRACE_PARENT_CONFIG"]
    # shown: the reprs and diagnostics (stdout), the loss warning (stderr), config.yaml, main.log
    assert f"http://<redacted>@127.0.0.1:{endpoint.rsplit(':', 1)[1]}" in proc.stdout
    assert "did not reach the OTLP endpoint http://<redacted>@127.0.0.1:" in proc.stderr, proc.stderr
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {"config.yaml", "main.log"} <= {p.name for p in files}
    assert "endpoint: http://<redacted>@127.0.0.1" in next(
        p for p in files if p.name == "config.yaml").read_text()
    for text in (proc.stdout, proc.stderr, *(p.read_bytes().decode(errors="replace") for p in files)):
        assert PASSWORD not in text and f"{USER}:" not in text


@pytest.mark.parametrize("endpoint", [f"ftp://{USER}:{PASSWORD}@collector:4318",
                                      f"http://{USER}:{PASSWORD}@collector:99999"])
def test_a_bad_endpoint_with_credentials_is_named_redacted_in_the_config_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    clean_env(monkeypatch, "OTEL_")
    with pytest.raises(rltrace.ConfigError, match=r"otlp\.endpoint") as info:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, otlp={"endpoint": endpoint})
    assert PASSWORD not in str(info.value) and "<redacted>@collector" in str(info.value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    with pytest.raises(rltrace.ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT") as info:
        rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    assert PASSWORD not in str(info.value) and "<redacted>@collector" in str(info.value)


def test_the_cli_names_a_bad_endpoint_redacted_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rltrace.cli", "demo", "--fileroot", str(tmp_path),
         "--otlp-endpoint", f"ftp://{USER}:{PASSWORD}@collector:4318"],
        capture_output=True, text=True, timeout=60, env=_env())
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "<redacted>@collector:4318" in proc.stderr and PASSWORD not in proc.stderr


def test_the_sdk_log_lines_folded_into_rltrace_warnings_are_redacted() -> None:
    fold = SdkLogFold()
    import logging

    record = logging.LogRecord("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                               logging.WARNING, __file__, 1,
                               "Failed to export span batch to %s: [Errno 111] Connection refused",
                               (f"http://{USER}:{PASSWORD}@h:4318/v1/traces",), None)
    assert fold.filter(record) is False
    assert fold.last is not None and PASSWORD not in fold.last


@pytest.mark.parametrize(("given", "shown"), [
    (f"http://{USER}:{PASSWORD}@h:4318/v1/traces", "http://<redacted>@h:4318/v1/traces"),
    (f"{USER}:{PASSWORD}@h:4317", "<redacted>@h:4317"),  # gRPC's bare host:port
    ("https://u:p@ss@h:1/x?q=a@b", "https://<redacted>@h:1/x?q=a@b"),  # '@' in the password
    ("http://h:4318/v1/traces", "http://h:4318/v1/traces"),
    ("http://h:4318/a@b", "http://h:4318/a@b"),  # an '@' in the path is no userinfo
    (None, None),
])
def test_redact_endpoint_removes_exactly_the_userinfo(given: str | None, shown: str | None) -> None:
    assert redact_endpoint(given) == shown
    if given is not None and "://" in given:
        assert redact_urls(f"to {given}, then") == f"to {shown}, then"
