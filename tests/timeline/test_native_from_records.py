"""The rank's native trace is drawn from the records the Chrome exporter wrote, not from its lines
read back: packet for packet what the same builder draws from those lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import HELPERS, need

import rltrace
from rltrace.config import current_user

sys.path.insert(0, str(HELPERS))
from step_loop import loop

need("perfetto", "the native trace needs the perfetto package: pip install 'rltrace[perfetto]'")


def _packets(path: Path) -> list[object]:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    return list(Trace.FromString(path.read_bytes()).packet)  # a stream of Traces is one Trace


@pytest.mark.parametrize("with_ids", [False, True], ids=["plain", "otel-ids"])
def test_records_draw_the_same_packets_as_their_chrome_lines_read_back(tmp_path: Path,
                                                                       with_ids: bool) -> None:
    from rltrace.timeline.stream import RankTraceWriter

    rltrace.configure(fileroot=str(tmp_path), experiment_name="n", trial_name="t", flush_at_exit=False,
                      session_tracer={"enabled": True}, exporters={"native": True})
    pipe = rltrace.runtime.get_pipeline()
    pipe.chrome.encoder.with_ids = with_ids  # as when spans also go out over OTLP
    for step in range(3):
        loop(step)
        with rltrace.trace_scope("io.save", args={"path": "ckpt-é", "bytes": 3, "ratio": 0.5,
                                                  "ok": True, "nothing": None, "big": 1 << 63}):
            pass
        rltrace.save()
        # a batch holding what only its line says (an error, a list, a NaN) is read back instead
        with pytest.raises(ValueError), rltrace.trace_scope("io.fail"):
            raise ValueError("disk")
        with rltrace.trace_scope("io.odd", args={"shape": [2, 3], "loss": float("nan")}):
            pass
        rltrace.save()
    native = pipe.native
    assert native is not None
    drawn = native.records
    rltrace.shutdown()
    assert drawn >= 3 * 18  # every step's sessions, phases, task, scopes: from the records

    folder = tmp_path / "logs" / current_user() / "n" / "t" / "perf_tracer"
    again = RankTraceWriter(tmp_path / "again.pftrace", lambda p: p.open("wb"))
    again.lines((folder / "traces-r0.jsonl").read_bytes().splitlines(keepends=True))
    again.close()
    streamed, read_back = _packets(folder / "traces-r0.pftrace"), _packets(tmp_path / "again.pftrace")
    assert again.records == 0 and len(read_back) > 200
    assert streamed == read_back
