"""Security (issue 8, item 8): nothing secret is recorded by default, and OTLP runs over TLS with
auth headers from rltrace's config or the standard ``OTEL_EXPORTER_OTLP_*`` variables.

Published ports binding 127.0.0.1 are checked by
``tests/export/otlp/test_collector_config.py::test_every_published_port_is_bound_to_loopback_by_default``
(and the in-process receiver refuses non-loopback hosts, tests/export/otlp/test_otlp_receiver.py); the TLS
backends here bind 127.0.0.1 only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, clean_env, need

import rltrace
from rltrace import runtime
from rltrace.testing.otlp_receiver import OTLPReceiver

sys.path.insert(0, str(HELPERS.parent))
from helpers.tls_otlp import TLSOTLPBackend, self_signed_cert

SECRETS = {
    "WANDB_API_KEY": "wandb-SECRET-a1b2c3d4e5f6",
    "HF_TOKEN": "hf_SECRETtokenZZZ9",
    "AWS_SECRET_ACCESS_KEY": "aws-SECRET-key-Q7Q7Q7",
    "OPENAI_API_KEY": "sk-SECRET-openai-4242",
    "DB_PASSWORD": "pw-SECRET-hunter2",
    "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer env-SECRET-bearer-77",
}
CONFIG_HEADER_SECRET = "cfg-SECRET-api-key-31337"


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_", "WANDB_"))}
    env.pop("RANK", None)
    env.update(extra)
    return env


def _needles() -> list[str]:
    """The secret parts (a header value's token too, in case only it were written)."""
    out = [CONFIG_HEADER_SECRET]
    for v in SECRETS.values():
        out.append(v)
        out.extend(p for p in v.replace("=", " ").split() if "SECRET" in p)
    return out


WORKLOAD = """
import logging, sys, rltrace
from rltrace.stats.logs import setup_logging
fileroot, endpoint, secret = sys.argv[1:4]
rltrace.configure(fileroot=fileroot, experiment_name="sec", trial_name="t0", print_summary=True,
                  session_tracer={"enabled": True},
                  otlp={"endpoint": endpoint, "protocol": "http/protobuf", "timeout_s": 2.0,
                        "headers": {"x-api-key": secret}})
setup_logging(logging.DEBUG)  # main.log in the log dir, everything at DEBUG
log = logging.getLogger("train")
with rltrace.trace_scope("warmup"):
    pass
rltrace.flush()
rltrace.runtime.get_pipeline().otlp.force_flush(5000)  # this first export is refused (401)
log.info("starting experiment %s", rltrace.get_config().experiment_name)
with rltrace.step(0):
    with rltrace.trace_scope("train.rollout", args={"n": 3}):
        for i in range(3):
            sid = rltrace.register_session()
            with rltrace.trace_session_phase("generate", {"model": "m"}, session_id=sid):
                log.info("generated %d", i)
            rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    try:
        with rltrace.trace_scope("train.update"):
            raise RuntimeError("update failed")
    except RuntimeError:
        log.exception("update failed")
    rltrace.instant("step.done", args={"step": 0})
rltrace.flush()
print(rltrace.diagnostics())
rltrace.shutdown()
"""


def test_secrets_from_config_and_environment_appear_in_no_file_log_output_or_span(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(WORKLOAD))
    root = tmp_path / "run"
    with OTLPReceiver() as rx:
        rx.fail_with(401, count=1)  # one rejected export: the error paths log too
        proc = subprocess.run(
            [sys.executable, str(script), str(root), rx.http_endpoint, CONFIG_HEADER_SECRET],
            capture_output=True, text=True, timeout=120, env=_env(SECRETS))
        assert proc.returncode == 0, proc.stderr
        spans = rx.wait_for_spans("train.update", timeout=20)
        reqs = rx.requests
    # the secret was in use: it authenticated every export ...
    assert reqs and all(r.headers.get("x-api-key") == CONFIG_HEADER_SECRET for r in reqs)
    assert any(r.outcome == "rejected" for r in reqs)
    # ... and is recorded nowhere
    files = [p for p in root.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", "main.log", "traces-r0.jsonl", "sessions-r0.jsonl"} <= names, names
    assert "<redacted>" in (next(p for p in files if p.name == "config.yaml")).read_text()
    assert "generated 2" in next(p for p in files if p.name == "main.log").read_text()
    for needle in _needles():
        for p in files:
            assert needle.encode() not in p.read_bytes(), f"{needle!r} written to {p}"
        assert needle not in proc.stdout and needle not in proc.stderr, f"{needle!r} in the output"
        for s in rx.spans():
            blob = repr((s.name, s.attributes, s.resource_attributes, s.events))
            assert needle not in blob, f"{needle!r} in span {s.name}"
    assert {s.name for s in spans} == {"train.update"}


def test_wandb_api_key_in_the_experiment_config_never_reaches_the_wandb_run_files(tmp_path: Path) -> None:
    need("wandb")
    script = tmp_path / "wb.py"
    script.write_text(textwrap.dedent("""
        import sys, rltrace
        from rltrace.stats.logger import StatsLogger, StatsLoggerConfig
        from rltrace.stats.wandb_sink import WandBConfig
        rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False)
        key = open(sys.argv[2]).read()  # not on the command line: W&B records a run's argv
        cfg = StatsLoggerConfig(wandb=WandBConfig(mode="offline", wandb_api_key=key), console=False)
        logger = StatsLogger(cfg, exp_config={"stats_logger": cfg, "actor": {"lr": 1e-5}})
        logger.commit(0, 0, 0, {"loss": 1.0})
        logger.close()
        rltrace.shutdown()
    """))
    secret = SECRETS["WANDB_API_KEY"]
    env = _env({"WANDB_SILENT": "true", "WANDB_MODE": "offline"})
    key_file = tmp_path / "key.txt"
    key_file.write_text(secret)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(key_file)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files), "no W&B run was written"
    leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
    assert leaked == []


def test_printing_the_effective_config_never_shows_otlp_headers(tmp_path: Path) -> None:
    cfg = rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                            otlp={"headers": {"x-api-key": CONFIG_HEADER_SECRET}})
    shown = f"{cfg} {cfg!r} {rltrace.get_config()} {cfg.otlp!r}"
    assert CONFIG_HEADER_SECRET not in shown


# ---- OTLP over TLS -------------------------------------------------------------------------------


@pytest.fixture
def tls_backend(tmp_path: Path) -> Iterator[tuple[TLSOTLPBackend, Path]]:
    made = self_signed_cert(tmp_path)
    if made is None:
        pytest.skip("the openssl command is not installed (needed to make a test certificate)")
    cert, key = made
    with TLSOTLPBackend(cert, key) as backend:
        yield backend, cert


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch, "OTEL_")


def _traced_session() -> None:
    with rltrace.trace_scope("tls.scope"):
        pass
    sid = rltrace.register_session()
    with rltrace.trace_session_phase("generate", session_id=sid):
        pass
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")


def _https_session_run(tmp_path: Path, backend: TLSOTLPBackend, cert: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, session_tracer={"enabled": True},
                      otlp={"endpoint": f"https://127.0.0.1:{backend.http_port}", "protocol": "http/protobuf",
                            "certificate_file": str(cert), "timeout_s": 1.0})
    _traced_session()
    rltrace.shutdown()  # delivers the last spans and metrics before it returns
    traces = backend.wait_for("traces", "tls.scope", timeout=3)
    assert traces.protocol == "http" and traces.headers["authorization"] == "Bearer tls-token-1"
    metrics = backend.wait_for("metrics", "rl.sessions", timeout=3)  # the metric exporter trusts it too
    assert metrics.headers["authorization"] == "Bearer tls-token-1"


def test_otlp_http_over_https_verifies_the_server_with_certificate_file_and_sends_env_auth_headers(
    tmp_path: Path, tls_backend: tuple[TLSOTLPBackend, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, cert = tls_backend
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # see the xfail test below
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer tls-token-1")
    _https_session_run(tmp_path, backend, cert)


def test_otlp_http_certificate_file_wins_over_a_requests_ca_bundle_in_the_environment(
    tmp_path: Path, tls_backend: tuple[TLSOTLPBackend, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, cert = tls_backend
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer tls-token-1")
    _https_session_run(tmp_path, backend, cert)


def test_otlp_https_to_a_server_the_certificate_does_not_vouch_for_sends_nothing_and_counts_it(
    tmp_path: Path, tls_backend: tuple[TLSOTLPBackend, Path]
) -> None:
    backend, _ = tls_backend
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False,
                      otlp={"endpoint": f"https://127.0.0.1:{backend.http_port}", "protocol": "http/protobuf",
                            "timeout_s": 1.0, "metrics": False})  # no certificate_file: system CAs only
    with rltrace.trace_scope("untrusted"):
        pass
    rltrace.flush()
    p = runtime.get_pipeline()
    assert p is not None and p.otlp is not None
    p.otlp.force_flush(10_000)
    stats = rltrace.diagnostics()["otlp"]
    assert stats["exported"] == 0 and stats["failed"] == 1, stats
    assert not [r for r in backend.requests if r.signal == "traces"]  # TLS refused before any request


@pytest.mark.parametrize("cert_from", ["config", "OTEL_EXPORTER_OTLP_CERTIFICATE"])
def test_otlp_grpc_over_tls_with_insecure_false_delivers_spans_and_config_headers(
    tmp_path: Path, tls_backend: tuple[TLSOTLPBackend, Path], monkeypatch: pytest.MonkeyPatch, cert_from: str
) -> None:
    backend, cert = tls_backend
    otlp: dict[str, Any] = {"endpoint": f"https://127.0.0.1:{backend.grpc_port}", "protocol": "grpc",
                            "insecure": False, "timeout_s": 5.0,
                            "headers": {"authorization": "Bearer grpc-tls"}}
    if cert_from == "config":
        otlp["certificate_file"] = str(cert)
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert))
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, session_tracer={"enabled": True},
                      otlp=otlp)
    _traced_session()
    rltrace.shutdown()
    traces = backend.wait_for("traces", "tls.scope")
    assert traces.protocol == "grpc" and traces.headers["authorization"] == "Bearer grpc-tls"
    assert "rl.session" in traces.names or backend.wait_for("traces", "rl.session")
    metrics = backend.wait_for("metrics", "rl.sessions")
    assert metrics.headers["authorization"] == "Bearer grpc-tls"


CHILDREN = """
import json, multiprocessing as mp, os, stat, subprocess, sys
import rltrace

def dump(path):
    with open(path, "w") as fh:
        json.dump(dict(os.environ), fh)

def forked(out):
    with rltrace.trace_scope("forked.child"):
        pass
    dump(out)

def spawned(out, endpoint):
    cfg = rltrace.configure_child()
    with rltrace.trace_scope("spawned.child"):
        pass
    rltrace.flush()
    rltrace.runtime.get_pipeline().otlp.force_flush(10000)
    dump(out)
    rltrace.shutdown()

if __name__ == "__main__":
    fileroot, endpoint, secret, out = sys.argv[1:5]
    rltrace.configure(fileroot=fileroot, experiment_name="sec", trial_name="children",
                      session_tracer={"enabled": True},
                      otlp={"endpoint": endpoint, "protocol": "http/protobuf", "timeout_s": 5.0,
                            "headers": {"x-api-key": secret}})
    dump(out + "/parent.json")
    info = {"secrets_address": os.environ["RLTRACE_PARENT_SECRETS"]}
    for method, target, args in (("fork", forked, (out + "/fork.json",)),
                                 ("spawn", spawned, (out + "/spawn.json", endpoint))):
        p = mp.get_context(method).Process(target=target, args=args)
        p.start()
        p.join(120)
        info[method] = p.exitcode
    code = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    info["subprocess"] = subprocess.run([sys.executable, "-c", code, out + "/subprocess.json"],
                                        timeout=60).returncode
    print(json.dumps(info), flush=True)
    rltrace.shutdown()
"""


def test_children_get_the_otlp_headers_without_them_in_any_environment_or_file(tmp_path: Path) -> None:
    script = tmp_path / "children.py"
    script.write_text(textwrap.dedent(CHILDREN))
    root, dumps, tmp = tmp_path / "run", tmp_path / "env", tmp_path / "tmp"
    dumps.mkdir()
    tmp.mkdir()
    with OTLPReceiver() as rx:
        proc = subprocess.run(
            [sys.executable, str(script), str(root), rx.http_endpoint, CONFIG_HEADER_SECRET, str(dumps)],
            capture_output=True, text=True, timeout=240, env=_env({"TMPDIR": str(tmp)}),
            cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        rx.wait_for_spans("spawned.child", timeout=30)
        reqs = rx.requests
    info = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert (info["fork"], info["spawn"], info["subprocess"]) == (0, 0, 0), (info, proc.stderr)
    # the spawned child authenticated with the parent's header: it did get the secret ...
    assert reqs and all(r.headers.get("x-api-key") == CONFIG_HEADER_SECRET for r in reqs)
    # ... from the parent's memory (an abstract socket: no file anywhere), gone with the parent
    assert info["secrets_address"].startswith("abstract:")
    assert list(tmp.iterdir()) == []
    assert not _socket_answers(info["secrets_address"])
    # no environment holds it: the parent's own, a forked, a spawned and a subprocess child's
    envs = {p.stem: p.read_text() for p in dumps.glob("*.json")}
    assert set(envs) == {"parent", "fork", "spawn", "subprocess"}
    for who, text in envs.items():
        assert "RLTRACE_PARENT_CONFIG" in text or who == "parent", who
        assert CONFIG_HEADER_SECRET not in text, f"the secret is in the {who}'s environment"
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name.startswith("traces-") for p in files)
    for p in files:
        assert CONFIG_HEADER_SECRET.encode() not in p.read_bytes(), f"the secret is written to {p}"
    assert CONFIG_HEADER_SECRET not in proc.stdout + proc.stderr


def _socket_answers(address: str) -> bool:
    """Whether something still listens at a parent's secrets address."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect("\0" + address.removeprefix("abstract:"))
        except OSError:
            return False
    return True


KILLED_PARENT = """
import os, signal, subprocess, sys, time
import rltrace

fileroot, endpoint, secret, how = sys.argv[1:5]
rltrace.configure(fileroot=fileroot, experiment_name="sec", trial_name="killed",
                  otlp={"endpoint": endpoint, "protocol": "http/protobuf", "timeout_s": 5.0,
                        "headers": {"x-api-key": secret}})
child = ("import rltrace; rltrace.configure_child(); "
         "p = rltrace.runtime.get_pipeline(); "
         "print(p.cfg.otlp.headers.get('x-api-key') == sys.argv[1], flush=True)")
out = subprocess.run([sys.executable, "-c", "import sys; " + child, secret], capture_output=True,
                     text=True, timeout=60)
print(out.stdout.strip(), os.environ["RLTRACE_PARENT_SECRETS"], flush=True)
if how == "exit":
    os._exit(0)
os.kill(os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM}[how])
time.sleep(60)
"""


@pytest.mark.parametrize("how", ["kill", "term", "exit"])
def test_no_secret_outlives_a_parent_killed_terminated_or_exited(tmp_path: Path, how: str) -> None:
    """The child got the header from its parent; once the parent is gone (SIGKILL, SIGTERM,
    os._exit) nothing holds it: no file in the temp dir, no socket answering."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with OTLPReceiver() as rx:
        proc = subprocess.run(
            [sys.executable, "-c", KILLED_PARENT, str(tmp_path / "run"), rx.http_endpoint,
             CONFIG_HEADER_SECRET, how], capture_output=True, text=True, timeout=120,
            env=_env({"TMPDIR": str(tmp)}), cwd=str(tmp_path))
    got, address = proc.stdout.split()
    assert got == "True", proc.stderr  # the child authenticated with the parent's header
    assert proc.returncode == {"kill": -9, "term": -15, "exit": 0}[how], proc.stderr
    assert list(tmp.iterdir()) == []
    assert not _socket_answers(address)
    assert CONFIG_HEADER_SECRET not in proc.stderr


def test_secrets_left_by_killed_runs_of_older_versions_are_removed(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Owner-only folders in the temp dir: one of a pid that no longer runs, one of a live
    process (kept), one without a pid untouched for two days (an older version's: removed)."""
    import tempfile
    import time

    from rltrace.process import secret_server

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    folders = {name: tmp_path / f"rltrace-secrets-{name}" for name in
               (f"{dead}-abc", f"{os.getpid()}-def", "old_xyz")}
    for folder in folders.values():
        folder.mkdir(mode=0o700)
        (folder / "otlp-headers.json").write_text("{}")
    old = time.time() - 2 * 24 * 3600
    os.utime(folders["old_xyz"], (old, old))
    assert secret_server.remove_stale_files() == 2
    assert [p.name for p in tmp_path.iterdir()] == [f"rltrace-secrets-{os.getpid()}-def"]


def test_off_linux_the_fallback_file_is_owner_only_and_removed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import stat
    import tempfile

    from rltrace.process import secret_server

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = secret_server.write_file({"otlp": {"headers": {"x-api-key": CONFIG_HEADER_SECRET}}})
    assert path.parent.name.startswith(f"rltrace-secrets-{os.getpid()}-")
    assert (stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(path.parent.stat().st_mode)) == (0o600, 0o700)
    assert secret_server.fetch(str(path)) == {"otlp": {"headers": {"x-api-key": CONFIG_HEADER_SECRET}}}
    secret_server.remove_file(path)
    assert list(tmp_path.iterdir()) == []

