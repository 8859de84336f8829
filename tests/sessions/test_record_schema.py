"""The session record's one schema (``rltrace.readers.session_schema``): the writer's records, the
readers' check and AReaL's ``SessionRecord`` agree with it, and a field added to it reaches all
three."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

import rltrace
from rltrace import runtime
from rltrace.perf_tracer import SessionRecord, register_session, register_task, trace_session_phase
from rltrace.readers.session_record import CHECKS, RecordChecks, check_session_record
from rltrace.readers.session_schema import (
    SESSION_RECORD,
    Kind,
    RecordField,
    areal,
    areal_attributes,
    copied,
    names,
)
from rltrace.sessions.metrics_processor import build_record
from rltrace.testing import capture_spans, read_jsonl

SESSIONS_ON = {"session_tracer": {"enabled": True}}


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env(monkeypatch)


def rich_record(tmp_path: Path) -> dict[str, Any]:
    """A record the real pipeline wrote for a session that sets every optional field: a role,
    a step, counters, tokens, a reason and a policy version that moved before its finalize."""
    rltrace.set_policy_version(3)
    try:
        with capture_spans(tmp_path, role="rollout", **SESSIONS_ON):
            with rltrace.step(7):
                sid = register_session(register_task("item-1"))
                with trace_session_phase("generate", {"input_tokens": 12}, {"output_tokens": 40},
                                         session_id=sid):
                    pass
                rltrace.trace_session_event("increment_counter", session_id=sid, name="retries")
                rltrace.set_policy_version(4)
                rltrace.trace_session_event("mark_finalized", session_id=sid, status="rejected",
                                            reason="stale_weight")
            path = runtime.get_pipeline().sessions_path
            rltrace.flush()
            assert path is not None
            [rec] = read_jsonl(path)
    finally:
        rltrace.set_policy_version(None)
    return rec


def test_a_written_record_holds_every_schema_field_in_the_schemas_order(tmp_path: Path) -> None:
    rec = rich_record(tmp_path)
    assert list(rec) == list(names(SESSION_RECORD))
    assert rec["policy_version"] == 3 and rec["policy_version_at_finalize"] == 4
    assert rec["counters"] == {"retries": 1} and rec["input_tokens"] == 12


def test_a_written_record_passes_the_readers_check_unchanged(tmp_path: Path) -> None:
    rec = rich_record(tmp_path)
    checked = dict(rec)
    notes: list[str] = []
    assert check_session_record(checked, notes.append) is None
    assert notes == [] and checked == rec


def test_the_readers_check_covers_every_schema_field_but_counters_and_checks_times_inline() -> None:
    inline = {f.name for f in SESSION_RECORD if f.kind in (Kind.SECONDS, Kind.COUNTERS)}
    assert set(CHECKS.fields) == set(names(SESSION_RECORD)) - inline
    assert CHECKS.times == ("submit_ts", "finalized_ts", "total_s")


def test_areal_session_record_has_exactly_the_schemas_areal_fields() -> None:
    attributes = {f.name for f in dataclasses.fields(SessionRecord)} - {"extra"}
    assert attributes == set(areal_attributes(SESSION_RECORD))
    serialised = [s.key_name() for s in SessionRecord.FIELD_SPECS]
    arealnames = [f.name for f in areal(SESSION_RECORD)]
    assert serialised == [n for n in arealnames if n not in ("phases", "counters")]


def test_areal_session_record_reads_a_written_record_back(tmp_path: Path) -> None:
    rec = rich_record(tmp_path)
    back = SessionRecord.from_dict(rec)
    assert (back.task_id, back.role, back.status, back.reason) == ("item-1", "rollout", "rejected",
                                                                   "stale_weight")
    assert back.counters == {"retries": 1}
    assert back.to_dict()["total_s"] == pytest.approx(rec["total_s"], abs=1e-6)
    assert set(back.extra) == set(rec) - set(areal_attributes(SESSION_RECORD))


def test_a_field_added_to_the_schema_is_written_checked_and_read_by_areals_type() -> None:
    added = RecordField("sampler", Kind.TEXT, optional=True, attr="rl.session.sampler")
    schema = (*SESSION_RECORD, added)
    attrs = {"rl.session.id": "s1", "rl.task.id": "t1", "rl.session.sampler": "top-p"}
    rec = build_record(attrs, 1_000_000_000, 3_000_000_000, 1, {}, 0, None, (),
                       copied=copied(schema))
    assert list(rec)[-1] == "sampler" and rec["sampler"] == "top-p"

    checks = RecordChecks.of(schema)
    notes: list[str] = []
    bad = {**rec, "sampler": ["not", "text"]}
    assert check_session_record(bad, notes.append, checks) is None
    assert "sampler" not in bad and notes == ["sampler: expected a string, got a list of 2"]

    assert SessionRecord.from_dict(rec).extra["sampler"] == "top-p"


def test_a_phase_total_added_to_areals_fields_is_serialised_by_areals_type() -> None:
    schema = (*SESSION_RECORD,
              RecordField("judge_s", Kind.SECONDS, optional=True, areal=True, derived=True))
    specs = SessionRecord.default_field_specs(schema)
    assert specs[-1].key_name() == "judge_s"
    rec = SessionRecord.from_dict({"task_id": "t", "session_id": "s", "rank": 0, "submit_ts": 1.0,
                                   "phases": {"judge": [{"start_ts": 1.0, "end_ts": 1.5}]}})
    assert specs[-1].resolve(rec) == 0.5


def test_the_default_writer_copies_no_attribute_the_schema_does_not_name() -> None:
    attrs = {"rl.session.id": "s1", "rl.session.sampler": "top-p"}
    rec = build_record(attrs, 1_000_000_000, 2_000_000_000, 1, {}, 0, None, ())
    assert "sampler" not in rec and list(rec) == [
        n for n in names(SESSION_RECORD) if n in rec]
