"""Every wrong input to the ``rltrace`` command: one line naming the problem and the fix, exit
code 2, no traceback (argparse's own errors: its usage line, then that one line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

CASES = [  # (arguments, what the last line of stderr must say); {log} = a real run's log dir
    (["demo", "--ranks", "0"], "rltrace demo: --ranks must be at least 1, got 0"),
    (["demo", "--steps", "0"], "rltrace demo: --steps must be at least 1, got 0"),
    (["demo", "--tasks", "-1"], "rltrace demo: --tasks must be at least 1, got -1"),
    (["demo", "--samples", "0"], "rltrace demo: --samples must be at least 1, got 0"),
    (["demo", "--ranks", "two"], "argument --ranks: invalid int value: 'two'"),
    (["demo", "--fileroot", "{file}"], "cannot write the log dir"),
    (["demo", "--otlp-endpoint", "htp://127.0.0.1:4317"], "(did you mean 'http'?)"),
    (["demo", "--otlp-endpoint", "http://localhost:99999"], "must have a port in 1..65535"),
    (["demo", "--otlp-protocol", "http/json"], "argument --otlp-protocol: invalid choice"),
    (["demo", "--experiment", "a/b"], "rltrace demo: rltrace config key 'experiment_name'"),
    (["top", "{missing}", "--once"], "is not a folder; give a run's log dir"),
    (["top", "{log}", "--interval", "0"], "--interval must be > 0, got 0"),
    (["report", "{missing}"], "is not a directory"),
    (["report", "{log}", "-o", "{tmp}/r.pdf"], "the suffix '.pdf' names no report format"),
    (["report", "{log}", "-o", "{file}/r.html"], "is a file, not a folder; choose another -o"),
    (["report", "{log}", "--steps", "abc"], "rltrace report: --steps 'abc': expected A:B"),
    (["report", "{log}", "--top", "0"], "--top must be at least 1"),
    (["report", "{log}", "-k", "-1"], "-k must be >= 0"),
    (["report", "{log}", "--format", "pdf"], "argument --format: invalid choice"),
    (["convert", "{missing}"], "input '{missing}' does not exist"),
    (["frobnicate"], "argument command: invalid choice"),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A real (small) run's log dir, a plain file, a path that does not exist."""
    root = tmp_path_factory.mktemp("wrong")
    out = subprocess.run([sys.executable, "-m", "rltrace.cli", "demo", "--fileroot", str(root),
                          "--ranks", "1", "--steps", "1", "--tasks", "2"],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr
    log = next(p for p in root.rglob("session_tracer")).parent
    (root / "plain-file").write_text("not a folder")
    return {"log": str(log), "file": str(root / "plain-file"), "missing": str(root / "no-such-dir"),
            "tmp": str(root)}


@pytest.mark.parametrize(("args", "says"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_wrong_input_is_one_line_exit_code_2_and_no_traceback(
        places: dict[str, str], args: list[str], says: str) -> None:
    argv = [a.format(**places) for a in args]
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", *argv], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    if lines and lines[0].startswith("usage:"):  # argparse: its usage, then the one line
        lines = [line for line in lines if not line.startswith(("usage:", " "))]
    assert len(lines) == 1, proc.stderr
    assert says.format(**places) in lines[0], lines[0]


def test_convert_writes_next_to_its_input_without_o(places: dict[str, str]) -> None:
    log = Path(places["log"])
    (log / "trace.json").unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(log)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {log / 'trace.json'}" in proc.stdout and (log / "trace.json").is_file()
    assert "perfetto_check" not in proc.stdout and "https://ui.perfetto.dev" in proc.stdout


@pytest.mark.parametrize("command", ["demo", "report", "convert", "top"])
def test_every_option_has_help_and_shows_its_default(command: str) -> None:
    from rltrace.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    for action in sub._actions:
        if action.dest == "help":
            continue
        assert action.help, f"rltrace {command} {action.option_strings or action.dest}: no help"
        if action.option_strings and action.default not in (None, False):
            text = " ".join(sub.format_help().split())  # wrapped lines joined
            assert f"default: {action.default}" in text, (command, action.dest)


@pytest.mark.parametrize("argv", [["top", "{log}", "--once"], ["demo", "--live", "--ranks", "1"]])
def test_without_rich_the_command_names_the_extra_to_install(places: dict[str, str], argv: list[str]) -> None:
    code = ("import sys; sys.modules['rich'] = None; from rltrace.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *(a.format(**places) for a in argv)],
                          capture_output=True, text=True, timeout=120, cwd=places["tmp"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith("the README's install, '.[dev]', has it)")
    assert "pip install 'rltrace[analysis]'" in proc.stderr


@pytest.mark.parametrize("args", [["report", "{log}"], ["top", "{log}", "--once"]],
                         ids=["report", "top"])
def test_a_reader_that_went_away_ends_the_command_quietly(places: dict[str, str],
                                                          args: list[str]) -> None:
    """``rltrace report ... | head`` : the reader closes its end; the command stops with status 0
    and nothing on stderr (rich's console would exit 1).  The read end is closed before the
    command starts, so its first write meets the closed pipe whatever its timing."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "rltrace.cli",
                               *[a.format(**places) for a in args]],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
