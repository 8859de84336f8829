"""The merged Chrome JSON's arrow from an accepted session to the train step that consumed it
starts at the session's slice, as the README describes, not at one of its phases (issue 41,
item 3), checked with Perfetto's real trace processor on a real run of rltrace's API
(``tests/helpers/skew_rank.py``, one rank, injected clock: deterministic timestamps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HELPERS, perfetto_available, perfetto_check

from rltrace.config import current_user

ARROWS = """select so.name as src, si.name as dst, so.ts + so.dur as send, si.ts as cts,
    extract_arg(so.arg_set_id, 'args.rl.session.id') as sid
  from flow f join slice so on so.id = f.slice_out join slice si on si.id = f.slice_in
  where si.category = 'rl.consume'"""


def test_each_consumed_arrow_leaves_the_session_slice(tmp_path: Path) -> None:
    if (why := perfetto_available()) is not None:
        pytest.skip(why)
    env = {k: v for k, v in os.environ.items()
           if (k not in ("RANK", "WORLD_SIZE") and not k.startswith(("OTEL_", "RLTRACE_")))
           or k == "RLTRACE_PERFETTO_CHECK"}
    proc = subprocess.run([sys.executable, str(HELPERS / "skew_rank.py"), str(tmp_path), "arrows", "0", "1",
                           "0"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    logdir = tmp_path / "logs" / current_user() / "arrows" / "trial0"
    out = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(logdir), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    rep = perfetto_check(out, ARROWS)
    assert rep["ok"] is True and rep["import_errors"] == []
    rows = rep["queries"][ARROWS]
    assert len(rows) == 4 * 3  # every accepted session of the 4 steps x 3 samples
    assert {r["src"] for r in rows} == {"rl.session"}, rows
    assert sorted(r["sid"] for r in rows) == list(range(12))
    assert all(r["cts"] >= r["send"] for r in rows), rows  # each drawn forwards: after the session
