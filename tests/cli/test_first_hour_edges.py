"""The edges a new user hits in the first hour (issue 41, items 4-10): a rank that cannot configure,
a bounded ``flush(wait_s)`` with a dead collector, suggestions that work after the README's
install, inputs that are not what a command reads, ``--help`` and the commands' own messages.

Each error case is one line on stderr naming the problem, exit code 2, no traceback; the commands
run for real in subprocesses where the process boundary is the point (spawned ranks, a terminal
or not), in-process through ``rltrace.cli.main`` elsewhere.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import REPO

from rltrace.cli import build_parser, main
from rltrace.cli.demo import DemoOptions
from rltrace.config import current_user, load_config
from rltrace.pipeline.otlp_exporter import otlp_protocol


def _cli(*argv: str, env: dict[str, str] | None = None, cwd: Path | str = REPO,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.update(extra)
    return env


def _one_line_exit_2(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed (after argparse's usage, if any)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith(("usage:", " "))]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real demo run (2 ranks, 3 steps) given a *relative* --fileroot; returns (cwd, log dir)."""
    cwd = tmp_path_factory.mktemp("edges")
    proc = _cli("demo", "--fileroot", "rel-root", "--ranks", "2", "--steps", "3", "--tasks", "3",
                "--samples", "2", env=_clean_env(), cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return cwd, cwd / "rel-root" / "logs" / current_user() / "demo" / "trial0"


# ---- 4. a rank that cannot configure --------------------------------------------------------------

@pytest.mark.parametrize(("env", "args", "says"), [
    ({"RLTRACE_SAVE_INTERVAL": "abc"}, [], "'save_interval' (in environment variable RLTRACE_SAVE_INTERVAL) "
                                           "must be an integer"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:99999"}, [],
     "OTEL_EXPORTER_OTLP_ENDPOINT='http://127.0.0.1:99999' must have a port in 1..65535"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "json"}, [],
     "OTLP protocol 'json' is not supported"),
    ({}, ["--experiment", "a/b"], "'experiment_name': must be a non-empty name without '/'"),
], ids=["save-interval", "otel-endpoint", "otel-protocol", "experiment-slash"])
def test_demo_checks_what_every_rank_configures_before_starting_any(
        tmp_path: Path, env: dict[str, str], args: list[str], says: str) -> None:
    root = tmp_path / "root"
    proc = _cli("demo", "--fileroot", str(root), "--steps", "1", "--tasks", "1", *args,
                env=_clean_env(**env))
    line = _one_line_exit_2(proc)
    assert line.startswith("rltrace demo: ") and not line.startswith("rltrace demo: rltrace:"), line
    assert says in line, line
    assert "Process rltrace-demo" not in proc.stderr  # no rank was started
    assert not root.exists(), sorted(map(str, root.rglob("*")))  # nothing left behind


def test_a_rank_that_fails_sends_one_line_and_exits_2_without_a_traceback(tmp_path: Path) -> None:
    # a real spawned rank, as the demo starts them, given options its configure refuses (the
    # demo's own check would stop these before any rank: this is the rank's own report)
    from rltrace.cli.demo import _rank_entry

    ctx = multiprocessing.get_context("spawn")
    errors = ctx.SimpleQueue()
    opts = DemoOptions(fileroot=str(tmp_path), experiment_name="a/b", steps=1, tasks_per_step=1)
    proc = ctx.Process(target=_rank_entry, args=(opts, 0, errors))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 2
    rank, msg = errors.get()
    assert rank == 0 and "'experiment_name'" in msg and "\n" not in msg


def test_rank_failures_are_one_line_each_message_once() -> None:
    from rltrace.cli.demo import rank_failures

    same = rank_failures([(0, 2), (1, 2)], [(1, "bad key"), (0, "bad key")])
    assert same == "rltrace demo: ranks 0, 1: bad key"
    killed = rank_failures([(1, -9)], [])
    assert killed == "rltrace demo: rank process(es) failed: rank 1 killed by signal 9"
    assert "\n" not in rank_failures([(0, 1), (1, 2)], [(0, "RuntimeError: x"), (1, "bad key")])


def test_demo_config_stores_an_absolute_fileroot(run: tuple[Path, Path]) -> None:
    cwd, logdir = run
    text = (logdir / "config.yaml").read_text()
    m = re.search(r"^fileroot: (.+)$", text, re.MULTILINE)
    assert m is not None, text
    assert Path(m.group(1).strip("'\"")) == cwd / "rel-root"


# ---- 5. flush(wait_s) is bounded; the warning names the cause ---------------------------------------

FLUSH_RUN = """
import sys, time, rltrace
fileroot, endpoint, protocol = sys.argv[1:4]
rltrace.configure(fileroot=fileroot, otlp={"endpoint": endpoint, "protocol": protocol})
for i in range(10):
    with rltrace.trace_scope("step", args={"i": i}):
        pass
t = time.monotonic()
rltrace.flush(wait_s=1)
print(time.monotonic() - t, flush=True)
rltrace.shutdown()
"""


def _refusing_port() -> int:
    """A port on 127.0.0.1 that refuses connections (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_flush_wait_s_returns_within_its_bound_and_the_warning_names_the_refusal(tmp_path: Path) -> None:
    # the exporter's own timeout stays at the SDK's default (10 s, retries 1 + 2 + 4 s): the
    # flush must not wait for it; both protocols run at once
    procs = {proto: subprocess.Popen(
        [sys.executable, "-c", FLUSH_RUN, str(tmp_path / proto.replace("/", "-")),
         f"http://127.0.0.1:{_refusing_port()}", proto],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_env(), cwd=REPO)
        for proto in ("grpc", "http/protobuf")}
    for proto, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        took = float(out.split()[0])
        assert took < 1 + 1.5, f"{proto}: flush(wait_s=1) took {took:.1f} s"
        warning = err.strip().splitlines()
        assert len(warning) == 1, err
        assert "last error:" in warning[0] and "Connection refused" in warning[0], warning[0]
        assert "Shutdown in progress" not in warning[0], warning[0]


@pytest.mark.parametrize(("line", "cause"), [
    ("Shutdown in progress, aborting retry.", None),
    ("Failed to export spans batch due to timeout, max retries or shutdown.", None),
    ("Transient error HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: "
     "/v1/traces (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=1): Failed to "
     "establish a new connection: [Errno 111] Connection refused\")) encountered while exporting spans "
     "batch, retrying in 0.88s.", "Failed to establish a new connection: [Errno 111] Connection refused"),
    ("Transient error StatusCode.UNAVAILABLE encountered while exporting traces to 127.0.0.1:1, retrying "
     "in 1.04s. Error details: failed to connect to all addresses; last error: UNKNOWN: "
     "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused",
     "StatusCode.UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
     "Failed to connect to remote host: Connection refused"),
])
def test_sdk_lines_give_their_cause_and_give_up_lines_none(line: str, cause: str | None) -> None:
    from rltrace.pipeline.otlp_exporter import sdk_cause

    assert sdk_cause(line) == cause


# ---- 7. only suggestions that work after the README's install --------------------------------------

def test_demo_and_convert_suggest_the_perfetto_ui_not_a_trace_processor_binary(
        run: tuple[Path, Path], tmp_path: Path) -> None:
    _, logdir = run
    proc = _cli("convert", str(logdir), "-o", str(tmp_path / "t.json"), env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "trace_processor" not in proc.stdout and "https://ui.perfetto.dev" in proc.stdout
    assert "Query (SQL)" in proc.stdout
    from rltrace.cli.demo import _next_steps

    steps = _next_steps(logdir, logdir / "trace.pftrace")
    assert "trace_processor" not in steps and "https://ui.perfetto.dev" in steps


# ---- 8. inputs that are not what the command reads --------------------------------------------------

def test_convert_of_a_file_that_is_not_a_trace_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    png = tmp_path / "report-cdf.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    out = tmp_path / "y.json"
    line = _one_line_exit_2(_cli("convert", str(png), "-o", str(out), env=_clean_env()))
    assert f"rltrace convert: {png} is not a trace file" in line
    assert not out.exists()


def test_top_of_a_missing_folder_is_an_error_without_once(tmp_path: Path) -> None:
    line = _one_line_exit_2(_cli("top", str(tmp_path / "nope"), "--interval", "0.2", env=_clean_env(),
                                 timeout=30))
    assert "is not a folder" in line


def test_top_off_a_terminal_prints_plain_frames_as_they_come(run: tuple[Path, Path]) -> None:
    _, logdir = run
    # Ctrl-C's own handler, set in the child: a pytest started in the background by a script
    # runs with SIGINT ignored, and a child would inherit that and never see the SIGINT below
    start = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "sys.argv[0] = 'rltrace'; runpy.run_module('rltrace.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", start, "top", str(logdir), "--interval", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_clean_env(), cwd=REPO)
    assert proc.stdout is not None
    got = b""
    deadline = time.monotonic() + 60
    try:
        while got.count(b"rltrace top") < 2 and time.monotonic() < deadline:  # two frames, live
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                got += chunk
        assert got.count(b"rltrace top") >= 2, got[-2000:]
        assert b"\x1b[" not in got  # plain text: no cursor movement or colours
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0


# ---- 9. --help and argument errors ------------------------------------------------------------------

@pytest.mark.parametrize("command", ["convert", "demo", "report", "top", "recover", "diff"])
def test_help_shows_each_default_once_and_every_command_has_a_description(command: str) -> None:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    text = " ".join(sub.format_help().split())
    assert "(default: None)" not in text
    assert not re.search(r"\(default: [^)]*\) \(default:", text), text
    assert sub.description, f"rltrace {command} has no description"


def test_a_mistyped_option_gets_its_commands_usage_and_the_closest_option(run: tuple[Path, Path]) -> None:
    _, logdir = run
    proc = _cli("report", str(logdir), "--stesp", "1", env=_clean_env())
    line = _one_line_exit_2(proc)
    assert proc.stderr.startswith("usage: rltrace report "), proc.stderr
    assert "unrecognized arguments: --stesp 1 (did you mean --steps?)" in line


def test_otlp_protocol_http_is_accepted_as_http_protobuf() -> None:
    from rltrace.cli.demo import _rank_config

    args = build_parser().parse_args(["demo", "--otlp-protocol", "http",
                                      "--otlp-endpoint", "http://127.0.0.1:4318"])
    opts = DemoOptions(otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol)
    base, overrides = _rank_config(opts, 0)  # what each rank configures with
    assert otlp_protocol(load_config(base, env={}, **overrides).otlp) == "http/protobuf"


# ---- 10. the commands' own messages -----------------------------------------------------------------

def test_report_findings_keep_a_space_after_a_long_kind(run: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, logdir = run
    assert main(["report", str(logdir), "-o", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    findings = orjson.loads((tmp_path / "r.json").read_bytes())["findings"]
    assert findings
    for f in findings:
        assert re.search(rf"^  {re.escape(f['kind'])} +{re.escape(f['text'][:30])}", out, re.MULTILINE), \
            (f, out)


def test_diff_names_runs_by_their_log_dirs(run: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, logdir = run
    assert main(["diff", str(logdir), str(logdir)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"rltrace diff: A = {logdir} ") and f"B = {logdir} " in first, first


@pytest.mark.parametrize(("argv", "says"), [
    (["diff", "{log}", "{missing}"], "rltrace diff: {missing} is not a directory"),
    (["diff", "{log}", "--steps-a", "3:1", "--steps-b", "0:1"],
     "rltrace diff: --steps-a '3:1' is an empty range"),
    (["report", "{log}", "--steps", "abc"], "rltrace report: --steps 'abc': expected A:B"),
    (["report", "{log}", "--steps", "3:1"], "rltrace report: --steps '3:1' is an empty range"),
    (["report", "{log}", "--steps", "2:2"], "rltrace report: --steps '2:2' is an empty range"),
])
def test_step_ranges_and_missing_runs_are_one_line_with_one_prefix(
        run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        says: str) -> None:
    _, logdir = run
    places = {"log": str(logdir), "missing": str(tmp_path / "nope")}
    assert main([a.format(**places) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(says.format(**places)), err
    assert err[0].count("rltrace ") == 1, err[0]


def test_report_numbers_are_never_in_scientific_notation(run: tuple[Path, Path], tmp_path: Path) -> None:
    from rltrace.analysis.render import _num

    assert _num(109870.5) == "109.9k" and _num(4.56e6) == "4.56M" and _num(12.5) == "12.5"
    _, logdir = run
    assert main(["report", str(logdir), "-o", str(tmp_path / "r.md")]) == 0
    md = (tmp_path / "r.md").read_text()
    assert not re.search(r"\d\.\d+e[+-]\d\d", md), re.search(r".{60}\d\.\d+e[+-]\d\d.{20}", md)


def test_one_turn_sessions_plot_their_turns_on_whole_numbers() -> None:
    from rltrace.analysis.plots import plot_turns

    rep: dict[str, Any] = {
        "turns": {"distribution": [{"turns": 1, "fraction": 1.0}],
                  "generate_by_turn": [{"turn": 0, "mean_s": 0.01}],
                  "session_time_by_turns": [{"turns": 1, "mean_s": 0.02}]},
    }
    fig = plot_turns(rep)
    assert fig is not None
    for ax in fig.axes:
        ticks = list(ax.get_xticks())
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
