"""User counters (Chrome counter tracks) and the end-of-run summary."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import perfetto_check

import rltrace
from rltrace.cli.convert import convert
from rltrace.testing import deterministic, read_jsonl


def test_counter_adds_from_many_threads_are_all_counted(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    c = rltrace.counter("test.threads.samples")
    start = c.value

    def work() -> None:
        for _ in range(5000):
            c.add(2)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.value - start == 8 * 5000 * 2
    assert rltrace.counter("test.threads.samples") is c
    with pytest.raises(TypeError, match="non-empty str"):
        rltrace.counter("")


def test_counters_are_written_as_chrome_counter_events_only_when_they_change(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    c = rltrace.counter("test.chrome.tokens")
    c.add(100)
    rltrace.flush()
    rltrace.flush()  # unchanged: no second sample
    c.add(50)
    rltrace.shutdown()
    events = read_jsonl(next(tmp_path.rglob("traces-r0.jsonl")))
    samples = [e for e in events if e.get("ph") == "C" and e["name"] == "test.chrome.tokens"]
    values = [e["args"]["value"] for e in samples]
    assert values[-2:] == [values[-2], values[-2] + 50] and len(values) == 2
    assert all(isinstance(e["ts"], int) for e in samples)


@pytest.mark.perfetto
def test_counter_tracks_load_in_perfetto(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    c = rltrace.counter("test.perfetto.queue")
    for i in range(3):
        with rltrace.trace_scope("step", args={"i": i}):
            c.add(1)
        rltrace.flush()
    rltrace.shutdown()
    out = tmp_path / "merged.json"
    convert([tmp_path], out)
    sql = ("select c.value as value from counter c join counter_track t on c.track_id = t.id "
           "where t.name = 'test.perfetto.queue value' order by c.ts")  # Perfetto: '<name> <arg>'
    report = perfetto_check(out, sql)
    assert report["ok"] and report["import_errors"] == []
    values = [r["value"] for r in report["queries"][sql]]
    assert len(values) == 3 and [v - values[0] for v in values] == [0, 1, 2]


def test_summary_reports_count_total_and_quantiles_per_scope(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False, print_summary=True)
    p = rltrace.runtime.get_pipeline()
    assert p is not None
    with deterministic(rltrace.testing.IncrementingClock(step_ns=1000)):
        for _ in range(10):
            with rltrace.trace_scope("fixed"):  # enter and exit each read the clock once
                pass
    rltrace.flush()
    (row,) = [r for r in p.summary.rows() if r["name"] == "fixed"]
    assert row["count"] == 10
    assert row["total_s"] == pytest.approx(10 * 1000 / 1e9)
    assert row["p50_s"] == pytest.approx(1e-6) and row["p99_s"] == pytest.approx(1e-6)
    text = rltrace.summary()
    assert "fixed" in text and "count" in text


def test_summary_is_not_collected_unless_asked_for(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    assert rltrace.runtime.get_pipeline().summary is None
    assert "print_summary=True" in rltrace.summary()


def test_print_summary_prints_at_shutdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rltrace.configure(fileroot=str(tmp_path), print_summary=True, flush_at_exit=False)
    rltrace.counter("test.print.samples").add(3)
    with rltrace.trace_scope("printed.scope"):
        pass
    rltrace.shutdown()
    out = capsys.readouterr().out
    assert "rltrace summary" in out and "printed.scope" in out and "test.print.samples" in out
