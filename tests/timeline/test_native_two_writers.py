"""Two processes of the same rank with ``exporters.native``: one ``traces-r0.pftrace``, written
by the first, refused to the second with a warning, and loadable in Perfetto's real trace
processor (two writers from offset 0 used to interleave into a file that does not parse)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import need, perfetto_check

from rltrace.logdir.files import FileBusyError, open_fresh

need("perfetto", "the native trace needs the perfetto package: pip install 'rltrace[perfetto]'")

WRITER = """
import json, sys
import rltrace
fileroot, who = sys.argv[1:3]
rltrace.configure(fileroot=fileroot, user="me", experiment_name="e", trial_name="t", rank=0,
                  flush_at_exit=False, handle_sigterm=False, exporters={"native": True})

def burst(tag):
    for i in range(200):
        with rltrace.trace_scope(f"{who}.{tag}.{i}", args={"pad": "x" * 200}):
            pass
    rltrace.flush()

burst("before")
if who == "first":
    print("ready", flush=True)
    sys.stdin.readline()  # the second process runs meanwhile
burst("after")
native = rltrace.diagnostics()["native"]
rltrace.shutdown()
print(json.dumps(native), flush=True)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLTRACE_", "OTEL_"))}
    env.pop("RANK", None)
    return env


def test_a_second_process_of_the_same_rank_leaves_the_native_trace_whole(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER))
    root = tmp_path / "root"
    first = subprocess.Popen([sys.executable, str(script), str(root), "first"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "ready"  # bounded by the communicate below
        second = subprocess.run([sys.executable, str(script), str(root), "second"],
                                capture_output=True, text=True, timeout=120, env=_env())
        first.stdin.write("go\n")
        first.stdin.flush()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
    first_stats = json.loads(out.strip().splitlines()[-1])
    second_stats = json.loads(second.stdout.strip().splitlines()[-1])
    assert first_stats["errors"] == 0 and not first_stats["stopped"]
    assert second_stats["errors"] == 1 and second_stats["stopped"]
    assert "being written by another process" in second.stderr
    trace = root / "logs" / "me" / "e" / "t" / "perf_tracer" / "traces-r0.pftrace"
    ours = "select count(*) as n from slice where name like 'first.%'"
    theirs = "select count(*) as n from slice where name like 'second.%'"
    report = perfetto_check(trace, ours, theirs)
    assert report["ok"], report
    assert (report["queries"][ours][0]["n"], report["queries"][theirs][0]["n"]) == (400, 0)


def test_open_fresh_refuses_a_file_another_open_holds_and_keeps_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "traces-r0.pftrace"
    with open_fresh(path) as fh:
        fh.write(b"first")
        try:
            open_fresh(path)
        except FileBusyError as exc:
            assert "being written by another process" in str(exc)
        else:
            raise AssertionError("a second writer was let in")
        assert path.read_bytes() == b"first"
    with open_fresh(path) as fh:  # the lock goes with the first writer
        fh.write(b"x")
    assert path.read_bytes() == b"x"
