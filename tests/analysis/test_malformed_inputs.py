"""Readers that never crash on data: ``rltrace report``, ``rltrace top``, ``rltrace convert`` (to JSON
and to the native Perfetto trace) and ``rltrace diff`` on
damaged log dirs (issue 30).

A valid run (``synth_run``'s GRPO groups, and live files from a real publisher) is damaged by
hypothesis: wrong-typed fields, huge, negative and non-int steps, lists where scalars belong,
NaN and infinity, truncated lines, binary garbage, over-long lines, missing keys.  Every reader
must finish (exit 0, or 2 with a one-line message when nothing is left to read), print no
traceback, and count what it skipped: at least one skipped line or ignored field for each line
(live: file) damaged in a way its check must see.  Most examples run in-process (the JSON
report, convert and top, with the line cap lowered to 4 KiB so over-long lines cost little); a
few also render HTML and Markdown, and a few run the real CLI.  Then one regression test per
finding of the adversarial probe (``tests/cli/test_malformed_live_and_traces.py`` has those of
top and convert).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, REPO

pytest.importorskip("numpy", reason="rltrace report needs the analysis extra")
pytest.importorskip("matplotlib", reason="rltrace report needs the analysis extra")
pytest.importorskip("jinja2", reason="rltrace report needs the analysis extra")
pytest.importorskip("rich", reason="rltrace report needs the analysis extra")

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

sys.path.insert(0, str(HELPERS))
from synth_run import GrpoSpec, write_grpo_run

import rltrace
from rltrace.analysis import ReportError, ReportOptions, StepRange, report
from rltrace.cli.convert import convert
from rltrace.cli.top import TopView
from rltrace.readers import MAX_TEXT, iter_lines
from rltrace.readers import lines as line_reader
from rltrace.readers.trace_event import check_in_full, plain_complete
from rltrace.runtime import get_pipeline

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
#: the line cap of the in-process examples (the real one is 32 MiB)
FUZZ_CAP = 4096
SKIP_COUNTS = re.compile(r"\d+ unreadable line\(s\) skipped|\d+ malformed field\(s\) ignored")


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rltrace.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def assert_no_crash(proc: subprocess.CompletedProcess[str]) -> None:
    """Exit 0, or 2 with a one-line message; never a traceback."""
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    if proc.returncode == 2:
        msg = proc.stderr.strip()
        assert msg.startswith("rltrace ") and "\n" not in msg, msg


# ---- the valid run ------------------------------------------------------------------------------


def real_live_doc(fileroot: Path) -> dict[str, Any]:
    """A live state as rltrace's publisher writes it: sessions open in generate, in toolcall and
    between phases, and finished ones of three statuses, in step 3."""
    rltrace.configure(fileroot=str(fileroot), session_tracer__enabled=True, flush_at_exit=False, rank=0,
                      world_size=2, live_interval_s=0.05, flush_interval_s=0.05)
    try:
        pipeline = get_pipeline()
        assert pipeline is not None and pipeline.live is not None
        path = pipeline.live.path
        with rltrace.step(3):
            sids = [rltrace.register_session() for _ in range(6)]
            for sid in sids[:2]:
                rltrace.trace_session_event("mark_generate_start", session_id=sid)
            rltrace.trace_session_event("mark_toolcall_start", session_id=sids[2])
            for sid, status in zip(sids[3:], ("accepted", "failed", "rejected"), strict=True):
                rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
        deadline = time.monotonic() + 30
        while True:
            try:
                doc: dict[str, Any] = orjson.loads(path.read_bytes())
                if doc["finished"]["total"] == 3 and doc["open"]["sessions"] == 3:
                    return doc
            except (FileNotFoundError, orjson.JSONDecodeError):
                pass
            assert time.monotonic() < deadline, "the live file was not published"
            time.sleep(0.02)
    finally:
        rltrace.shutdown()


class Base:
    """A valid log dir and its files' lines (a live file is one line)."""

    def __init__(self, root: Path, lines: dict[str, list[bytes]], kinds: dict[str, str]) -> None:
        self.root = root
        self.lines = lines  # path relative to root -> lines
        self.kinds = kinds  # path relative to root -> session | trace | live

    def __repr__(self) -> str:  # hypothesis prints it with a failing example
        return f"Base({self.root})"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("valid") / "logs" / "u" / "exp" / "t0"
    write_grpo_run(root, GrpoSpec(ranks=2, steps=3, tasks=2, samples=3))
    doc = real_live_doc(tmp_path_factory.mktemp("publisher"))
    (root / "live").mkdir()
    for rank in (0, 1):
        (root / "live" / f"live-r{rank}.json").write_bytes(orjson.dumps({**doc, "rank": rank}))
    lines, kinds = {}, {}
    for p in sorted(root.rglob("*.json*")):
        rel = str(p.relative_to(root))
        lines[rel] = p.read_bytes().splitlines()
        kinds[rel] = ("live" if p.suffix == ".json" else
                      "session" if p.name.startswith("sessions") else "trace")
        assert max(map(len, lines[rel])) < FUZZ_CAP
    return Base(root, lines, kinds)


# ---- damage ---------------------------------------------------------------------------------------

#: fields each check reads (a list there is always wrong: the line or the field must be counted)
CHECKED = {
    "session": ("step", "rank", "status", "reason", "task_id", "session_id", "turns", "trace_id", "role",
                "submit_ts", "finalized_ts", "total_s", "generate_s", "phases", "phase_counts"),
    "trace": ("ph", "pid", "tid", "ts", "name", "cat", "args", "s", "id"),
    "live": ("ts", "rank", "step", "pid", "world_size", "interval_s", "closed", "role", "host", "experiment",
             "open", "finished", "steps"),
}
WRONG = st.sampled_from([[1], [[1, 2]], [None]])
WEIRD = st.one_of(
    st.sampled_from([None, True, False, "", "abc", "older", [], [1], {}, {"a": [1]}, 0, -1, -3, 3.0, 0.5,
                     -0.0, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1, 1e308, -1e308, 1e12, -1e12,
                     1e-300]),
    st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.lists(st.integers(-5, 5), max_size=3),
)
STEPS = st.one_of(st.sampled_from([-3, -2, -1, 0, -(2**63), 2**31, 2**31 - 1, -(2**31), 1.5, 2.0, "3", [1],
                                   None, True]), st.integers(-(2**63), 2**64 - 1))
STEP_ARGS = ("rl.step", "global_step", "step", "epoch_step")
NONFINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e999")
KINDS = ("set", "drop", "step", "wrong", "truncate", "garbage", "not_object", "nonfinite", "long")


@dataclass(frozen=True)
class Damage:
    """One line damaged: how (``kind``), where (indices taken modulo what is there), with what."""

    kind: str
    file: int
    line: int
    walk: tuple[int, ...]
    value: Any
    step: Any
    wrong: Any
    cut: float
    junk: bytes


DAMAGE = st.builds(Damage, kind=st.sampled_from(KINDS), file=st.integers(0, 99), line=st.integers(0, 9999),
                   walk=st.lists(st.integers(0, 99), min_size=1, max_size=4).map(tuple), value=WEIRD,
                   step=STEPS, wrong=WRONG, cut=st.floats(0, 1), junk=st.binary(max_size=40))
PLANS = st.lists(DAMAGE, min_size=1, max_size=12)


def _walk_to(obj: Any, walk: tuple[int, ...]) -> tuple[Any, Any]:
    """The container and key (or index) a walk through ``obj`` ends at."""
    parent, key = obj, None
    cur = obj
    for w in walk:
        if isinstance(cur, dict) and cur:
            parent, key = cur, list(cur)[w % len(cur)]
        elif isinstance(cur, list) and cur:
            parent, key = cur, w % len(cur)
        else:
            break
        cur = parent[key]
    return parent, key


def _edit(obj: Any, d: Damage, kind: str) -> bool:
    """Damage a decoded record in place; whether its check must see it."""
    if d.kind == "wrong":
        obj[CHECKED[kind][d.file % len(CHECKED[kind])]] = d.wrong
        return True
    if d.kind == "step":
        args = obj.get("args")
        if kind == "trace" and isinstance(args, dict):
            args[STEP_ARGS[d.file % 4]] = d.step
        else:
            obj["step"] = d.step
        return False
    parent, key = _walk_to(obj, d.walk)
    if key is None:
        return False
    if d.kind == "drop":
        del parent[key]
    else:
        parent[key] = d.value
    return False


def damage_line(raw: bytes, d: Damage, kind: str, small_cap: bool) -> tuple[bytes, bool]:
    """The damaged line, and whether its reader must count it (as a line skipped or a field ignored)."""
    if d.kind == "truncate":
        return raw[:1 + int(d.cut * (len(raw) - 2))], True
    if d.kind == "garbage":
        return b"\xff" + d.junk.replace(b"\n", b""), True
    if d.kind == "not_object":
        return orjson.dumps([d.value]), True
    if d.kind == "long":  # over the fuzz cap; with the real cap a session record of just a reason
        return b'{"reason":"' + b"x" * FUZZ_CAP + b'"}', small_cap or kind != "session"
    if d.kind == "nonfinite":
        token = NONFINITE[int(d.cut * 3.99)]
        new, n = re.subn(rb":-?\d+(\.\d+)?([eE][-+]?\d+)?(?=[,}\]])", b":" + token, raw, count=1)
        return new, n == 1
    obj = orjson.loads(raw)
    sure = _edit(obj, d, kind)
    return orjson.dumps(obj), sure


def damaged_copy(base: Base, plan: list[Damage], dest: Path, small_cap: bool) -> Counter[str]:
    """``base`` written under ``dest`` with ``plan`` applied (one damage per line at most); returns,
    per file kind, how many lines (live: files) were damaged in a way their check must see."""
    names = sorted(base.lines)
    lines = {n: list(base.lines[n]) for n in names}
    done: set[tuple[str, int]] = set()
    sure: Counter[str] = Counter()
    for d in plan:
        name = names[d.file % len(names)]
        i = d.line % len(lines[name])
        if (name, i) in done:
            continue
        done.add((name, i))
        lines[name][i], seen = damage_line(lines[name][i], d, base.kinds[name], small_cap)
        sure[base.kinds[name]] += seen
    for name, ls in lines.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(ls) + (b"" if base.kinds[name] == "live" else b"\n"))
    return sure


# ---- checks -------------------------------------------------------------------------------------


def check_report(logdir: Path, out: Path, sure: Counter[str], fmts: tuple[str, ...],
                 steps: str | None) -> None:
    """The report in ``fmts`` finishes (or says there is nothing to report) and counts the damage."""
    for fmt in fmts:
        try:
            rep, files = report(logdir, out / f"report.{fmt}", fmt,
                                options=ReportOptions(steps=StepRange.parse(steps), progress=False))
        except ReportError as exc:
            assert str(exc).startswith("rltrace report: no sessions or trace events") and "\n" not in str(exc)
            return
        inp = rep["inputs"]
        assert inp["skipped_lines"] + inp["skipped_fields"] >= sure["session"] + sure["trace"], inp["skipped"]
        if fmt != "json" and sure["session"] + sure["trace"]:
            assert SKIP_COUNTS.search(files[0].read_text()), "the skip counts are not in the report"


def is_number(v: Any) -> bool:
    return type(v) in (int, float)


def placed(ev: dict[str, Any]) -> bool:
    """What Perfetto needs of an event to place it (this test's own reading of the Chrome format)."""
    ph, name = ev.get("ph"), ev.get("name")
    return (type(ph) is str and type(ev.get("pid", 0)) is int and type(ev.get("tid", 0)) in (int, str)
            and (ph == "M" or is_number(ev.get("ts"))) and (name is None or type(name) is str)
            and (ph != "X" or (is_number(ev.get("dur")) and ev["dur"] >= 0))
            and type(ev.get("args", {})) is dict and type(ev.get("cat", "")) is str)


def check_convert(logdir: Path, out: Path, sure: Counter[str]) -> None:
    """Convert finishes, counts the damage, and writes only events that can be placed."""
    res = convert([logdir], out / "merged.json", progress=False)
    assert res.skipped_lines + res.skipped_fields >= sure["trace"], res.skipped
    for ev in orjson.loads((out / "merged.json").read_bytes())["traceEvents"]:
        assert placed(ev), ev


def check_native(logdir: Path, out: Path, sure: Counter[str]) -> None:
    """The native Perfetto trace of the damaged run is written, with the damage counted."""
    res = convert([logdir], out / "merged.pftrace", progress=False)
    assert res.skipped_lines + res.skipped_fields >= sure["trace"], res.skipped
    assert (out / "merged.pftrace").stat().st_size > 0


def check_diff(logdir: Path) -> None:
    """``rltrace diff`` of the damaged run against itself finds nothing, or says why it cannot."""
    from rltrace.analysis import ReportError, diff

    try:
        d = diff.compare(diff.side(logdir, None, "A"), diff.side(logdir, None, "B"))
    except ReportError:
        return
    assert d["changed"] == [] and (d["step_time"] is None or not d["step_time"]["changed"])


def check_top(logdir: Path, sure: Counter[str]) -> None:
    """A frame of top renders and its footer counts the damaged live files."""
    view = TopView(logdir)
    screen = io.StringIO()
    Console(file=screen, width=200).print(view.frame())
    assert view.unread.files + view.unread.fields >= sure["live"]
    if sure["live"]:
        assert re.search(r"\d+ live file\(s\) skipped|\d+ malformed field\(s\) ignored", screen.getvalue())


def fuzz_in_process(base: Base, plan: list[Damage], fmts: tuple[str, ...], steps: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setattr(line_reader, "LINE_CAP", FUZZ_CAP)
        logdir, out = Path(tmp) / "run", Path(tmp) / "out"
        sure = damaged_copy(base, plan, logdir, small_cap=True)
        check_report(logdir, out, sure, fmts, steps)
        check_convert(logdir, out, sure)
        check_native(logdir, out, sure)
        check_diff(logdir)
        check_top(logdir, sure)


FUZZ = settings(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_the_valid_run_reads_with_nothing_skipped(base: Base, tmp_path: Path) -> None:
    """The checks accept what rltrace writes: the base run has no skipped line or ignored field."""
    rep, _ = report(base.root, tmp_path / "r.json", "json", options=ReportOptions(progress=False))
    assert (rep["inputs"]["skipped_lines"], rep["inputs"]["skipped_fields"]) == (0, 0)
    assert rep["inputs"]["sessions"] == 2 * 3 * 2 * 3
    res = convert([base.root], tmp_path / "m.json", progress=False)
    assert (res.skipped_lines, res.skipped_fields, res.skipped) == (0, 0, [])
    view = TopView(base.root)
    view.frame()
    assert len(view.states()) == 2 and (view.unread.files, view.unread.fields) == (0, 0)


@settings(FUZZ, max_examples=120)
@given(plan=PLANS, steps=st.sampled_from([None, None, None, "1:3", "-5:2"]))
def test_json_report_convert_and_top_survive_damaged_files(base: Base, plan: list[Damage],
                                                           steps: str | None) -> None:
    fuzz_in_process(base, plan, ("json",), steps)


@settings(FUZZ, max_examples=5)
@given(plan=PLANS)
def test_html_and_markdown_reports_survive_damaged_files(base: Base, plan: list[Damage]) -> None:
    fuzz_in_process(base, plan, ("html", "md"))


@settings(FUZZ, max_examples=3)
@given(plan=PLANS)
def test_the_cli_survives_damaged_files_and_prints_what_it_skipped(base: Base, plan: list[Damage]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        logdir, out = Path(tmp) / "run", Path(tmp) / "out"
        sure = damaged_copy(base, plan, logdir, small_cap=False)
        for fmt in ("json", "md", "html"):
            proc = cli("report", str(logdir), "-o", str(out / f"r.{fmt}"), "--no-progress")
            assert_no_crash(proc)
            if proc.returncode == 0 and sure["session"] + sure["trace"]:
                assert SKIP_COUNTS.search(proc.stdout.splitlines()[0]), proc.stdout[:2000]
        proc = cli("convert", str(logdir), "-o", str(out / "merged.json"))
        assert_no_crash(proc)
        if sure["trace"]:
            assert re.search(r"\d+ line\(s\) skipped|\d+ malformed field\(s\) removed", proc.stdout), \
                proc.stdout
        assert_no_crash(cli("convert", str(logdir), "-o", str(out / "merged.pftrace")))
        assert_no_crash(cli("diff", str(logdir), str(logdir)))
        proc = cli("top", str(logdir), "--once")
        assert_no_crash(proc)
        if sure["live"]:
            assert re.search(r"\d+ live file\(s\) skipped|\d+ malformed field\(s\) ignored", proc.stdout)


PLAIN_X = {"pid": 7, "tid": 1, "ph": "X", "ts": 1_800_000_000_000_000, "dur": 2.5, "name": "train.step",
           "cat": "compute", "args": {"rl.step": 3}}


@settings(FUZZ, max_examples=300)
@given(changes=st.dictionaries(st.sampled_from(sorted(PLAIN_X)),
                               st.one_of(WEIRD, st.text(min_size=299, max_size=302)), max_size=2))
def test_the_shortcut_for_plain_complete_events_agrees_with_the_full_check(changes: dict[str, Any]) -> None:
    """What the trace-event check's shortcut accepts, its full definition accepts unchanged."""
    ev = {**PLAIN_X, **changes}
    if len(ev) == 8 and ev.get("ph") == "X" and plain_complete(ev, MAX_TEXT):
        full, notes = dict(ev), []
        assert check_in_full(full, notes.append) is None and not notes and full == ev


# ---- regressions: the probe's findings ------------------------------------------------------------


@pytest.fixture
def small_run(tmp_path: Path) -> Path:
    logdir = tmp_path / "run"
    write_grpo_run(logdir, GrpoSpec(ranks=1, steps=2, tasks=2, samples=2))
    return logdir


def edit_first_record(logdir: Path, **fields: Any) -> Path:
    path = logdir / "session_tracer" / "sessions-r0.jsonl"
    lines = path.read_bytes().splitlines()
    rec = orjson.loads(lines[0])
    rec.update(fields)
    lines[0] = orjson.dumps(rec)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def json_report(logdir: Path, out: Path) -> dict[str, Any]:
    proc = cli("report", str(logdir), "-o", str(out), "--no-progress")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rep: dict[str, Any] = orjson.loads(out.read_bytes())
    return rep


def test_a_real_run_with_negative_steps_reports_them_in_every_format(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="neg", session_tracer__enabled=True,
                      flush_at_exit=False)
    for step in (-3, -2):
        with rltrace.step(step):
            task = rltrace.register_task()
            for status in ("accepted", "rejected"):
                sid = rltrace.register_session(task)
                with rltrace.trace_session_phase("generate", session_id=sid):
                    pass
                rltrace.trace_session_event("mark_finalized", session_id=sid, status=status)
    rltrace.shutdown()
    logdir = next(tmp_path.rglob("session_tracer")).parent
    for fmt in ("md", "html"):
        proc = cli("report", str(logdir), "-o", str(tmp_path / f"r.{fmt}"), "--no-progress")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rep = json_report(logdir, tmp_path / "r.json")
    assert rep["inputs"]["steps"] == [-3, -2] and rep["inputs"]["sessions"] == 4
    assert [r["step"] for r in rep["status"]["per_step"]] == [-3, -2]
    assert [(r["rank"], r["step"]) for r in rep["turns"]["workers"]] == [(0, -3), (0, -2)]
    assert (rep["inputs"]["skipped_lines"], rep["inputs"]["skipped_fields"]) == (0, 0)


def test_a_step_of_minus_2_to_the_63_is_ignored_and_the_session_kept(small_run: Path, tmp_path: Path) -> None:
    path = edit_first_record(small_run, step=-(2**63))
    rep = json_report(small_run, tmp_path / "r.json")
    assert rep["inputs"]["sessions"] == 8 and rep["inputs"]["skipped_fields"] == 1
    assert rep["inputs"]["skipped"] == [
        f"{path}:1: session record field step: expected an integer in [-2147483647, 2147483647], "
        f"got -9223372036854775808, ignored"]
    assert any(f["kind"] == "input" and "1 malformed field(s) ignored" in f["text"] for f in rep["findings"])


def test_a_turn_that_is_a_list_is_ignored_and_its_phase_kept(small_run: Path, tmp_path: Path) -> None:
    rec = orjson.loads((small_run / "session_tracer" / "sessions-r0.jsonl").read_bytes().splitlines()[0])
    rec["phases"]["generate"][0]["turn"] = [1]
    edit_first_record(small_run, phases=rec["phases"])
    for fmt in ("md", "html"):
        proc = cli("report", str(small_run), "-o", str(tmp_path / f"r.{fmt}"), "--no-progress")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "1 malformed field(s) ignored" in proc.stdout.splitlines()[0]
    rep = json_report(small_run, tmp_path / "r.json")
    assert rep["inputs"]["sessions"] == 8 and rep["inputs"]["skipped_fields"] == 1
    assert "phases.generate.turn: expected an integer" in rep["inputs"]["skipped"][0]
    gen = {r["turn"]: r["executions"] for r in rep["turns"]["generate_by_turn"]}
    assert gen == {0: 7, 1: 8}  # the damaged execution still counts, without its turn


def test_a_20_mb_reason_and_long_ids_are_capped_in_the_html_report(small_run: Path, tmp_path: Path) -> None:
    edit_first_record(small_run, status="failed", reason="E" * (20 << 20), session_id="S" * 5000,
                      task_id="T" * 5000)
    out = tmp_path / "r.html"
    proc = cli("report", str(small_run), "-o", str(out), "--no-progress")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    html = out.read_text()
    assert len(html) < 2 << 20 and len(proc.stdout) < 20_000
    assert "E" * 300 + "…(+20971220 chars)" in html
    assert "S" * 300 + "…(+4700 chars)" in html and "T" * 301 not in html
    rep = json_report(small_run, tmp_path / "r.json")
    assert rep["status"]["reasons"][0]["reason"] == "E" * 300 + "…(+20971220 chars)"


def peak_rss_of(*args: str) -> tuple[int, int, str]:
    """Run ``rltrace ARGS`` from a small launcher process; (exit code, the command's peak RSS in
    bytes from ``getrusage(RUSAGE_CHILDREN)``, its stdout).  The launcher keeps the measure
    free of this test process's memory (a forked child starts with its parent's pages)."""
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.stdout.write(p.stdout.decode()); sys.exit(p.returncode)")
    proc = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "rltrace.cli", *args],
                          capture_output=True, text=True, timeout=180, env=ENV)
    first, _, rest = proc.stdout.partition("\n")
    return proc.returncode, int(first) * 1024, rest


def append_long_line(path: Path, head: bytes, size: int) -> None:
    """Append a JSON line of ``size`` bytes, written in chunks (never held whole here either)."""
    with open(path, "ab") as fh:
        fh.write(head)
        chunk = b"x" * (1 << 20)
        for _ in range(size >> 20):
            fh.write(chunk)
        fh.write(b'"}\n')


def test_a_200_mb_line_is_skipped_in_bounded_memory(small_run: Path, tmp_path: Path) -> None:
    sessions = small_run / "session_tracer" / "sessions-r0.jsonl"
    traces = small_run / "perf_tracer" / "traces-r0.jsonl"
    rc, small_rss, _ = peak_rss_of("report", str(small_run), "-o", str(tmp_path / "s.json"), "--no-progress")
    assert rc == 0
    head = b'{"task_id":1,"reason":"'
    append_long_line(sessions, head, 200 << 20)
    append_long_line(traces, b'{"ph":"X","ts":1,"dur":1,"name":"', 200 << 20)
    rc, rss, out = peak_rss_of("report", str(small_run), "-o", str(tmp_path / "big.json"), "--no-progress")
    assert rc == 0, out
    assert "8 sessions" in out and "2 unreadable line(s) skipped" in out
    size = len(head) + (200 << 20) + 3
    assert f"{sessions}:9: line of {size} bytes, over the {32 << 20} byte cap, skipped" in out
    print(f"report: peak RSS {rss / 1e6:.0f} MB with the 200 MB lines, {small_rss / 1e6:.0f} MB without")
    assert rss < 300e6 and rss - small_rss < 100e6
    rc, rss, out = peak_rss_of("convert", str(small_run), "-o", str(tmp_path / "m.json"))
    assert rc == 0 and "1 line(s) skipped" in out.splitlines()[0], out
    print(f"convert: peak RSS {rss / 1e6:.0f} MB")
    assert rss < 300e6


def test_lines_at_the_cap_are_kept_and_longer_ones_reported_by_length(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"a" * 9 + b"\n" + b"b" * 10 + b"\n" + b"c" * 25 + b"\n" + b"d" * 3)
    with open(path, "rb") as fh:
        got = list(iter_lines(fh, cap=10))
    assert got == [b"a" * 9 + b"\n", 11, 26, b"ddd"]
    assert [type(x).__name__ for x in got] == ["bytes", "Oversize", "Oversize", "bytes"]
    with open(path, "rb") as fh:
        assert b"".join(x for x in iter_lines(fh) if isinstance(x, bytes)) == path.read_bytes()
