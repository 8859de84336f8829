"""``rltrace convert`` is total: damaged trace and session lines (wrong types, huge numbers,
NaN/inf, negative times, missing keys, deep nesting, binary junk) are skipped and counted, and
never crash the conversion, to JSON or to Perfetto's native ``.pftrace``.

The log dir is a real run's (rltrace recording steps, tasks, sessions and phases); each case
damages copies of its lines, then converts them with the real entry point (in process, and once
through the real CLI), and one damaged conversion is loaded in Perfetto's real trace processor.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, need, perfetto_check

import rltrace
from rltrace.cli.convert import ConvertError, convert

need("perfetto", "the native format needs the perfetto package: pip install 'rltrace[perfetto]'")

SEEDS = 200
#: values a damaged field takes
JUNK: list[Any] = [None, True, "abc", "", -1, 0, 1e308, -1e308, float("nan"), float("inf"),
                   -float("inf"), 2**64, -(2**63), 2**70, [], {}, [1, 2], {"a": {"b": [{}]}},
                   "\x00\n", 1.5, -0.0, "1e308"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: two steps of tasks with sessions and phases, one train step each."""
    root = tmp_path_factory.mktemp("run")
    mp = pytest.MonkeyPatch()
    clean_env(mp)
    try:
        rltrace.configure(fileroot=str(root), user="me", experiment_name="e", trial_name="t",
                          flush_at_exit=False, handle_sigterm=False, session_tracer={"enabled": True})
        for step in range(2):
            with rltrace.step(step):
                for _ in range(2):
                    task = rltrace.register_task()
                    for _ in range(2):
                        sid = rltrace.register_session(task)
                        with rltrace.trace_session_phase("generate", session_id=sid):
                            pass
                        with rltrace.trace_session_phase("reward", session_id=sid):
                            pass
                        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
                with rltrace.trace_scope("train.update"):
                    pass
        rltrace.shutdown()
    finally:
        mp.undo()
    return root / "logs" / "me" / "e" / "t"


def _deep(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


def _damage(obj: Any, rng: random.Random) -> Any:
    if not isinstance(obj, dict) or not obj:
        return rng.choice(JUNK)
    obj = dict(obj)
    for _ in range(rng.randint(1, 3)):
        if not obj:
            break
        k = rng.choice(list(obj))
        r = rng.random()
        if r < 0.15:
            del obj[k]
        elif r < 0.25 and isinstance(obj[k], dict):
            obj[k] = _damage(obj[k], rng)
        elif r < 0.3:
            obj[k] = _deep(rng.choice([50, 300, 3000]))
        elif r < 0.4 and isinstance(obj[k], dict) and obj[k]:
            sub = dict(obj[k])
            sub[rng.choice(list(sub))] = rng.choice(JUNK)
            obj[k] = sub
        else:
            obj[k] = rng.choice(JUNK)
    return obj


def _encode(obj: Any) -> bytes:
    try:
        return json.dumps(obj, allow_nan=True).encode()  # NaN/Infinity: not JSON, as a bad writer's
    except (ValueError, RecursionError):
        return b"[" * 5000


def _damaged_copy(src: Path, dst: Path, seed: int) -> Path:
    """``src`` copied to ``dst`` with about a third of its JSONL lines damaged (seeded)."""
    rng = random.Random(seed)
    shutil.copytree(src, dst)
    for f in sorted(dst.rglob("*.jsonl")):
        out = []
        for line in f.read_bytes().splitlines():
            r = rng.random()
            if r < 0.3:
                out.append(_encode(_damage(json.loads(line), rng)))
            elif r < 0.33:
                out.append(line[: rng.randint(0, len(line))])
            elif r < 0.36:
                out.append(rng.randbytes(rng.randint(1, 200)))
            else:
                out.append(line)
            if rng.random() < 0.05:
                out.append(_encode(rng.choice(JUNK)))
        f.write_bytes(b"\n".join(out) + b"\n")
    return dst


def _set_line(logdir: Path, name: str, key: str, value: Any) -> None:
    """Set ``key`` of the first trace event named ``name`` to ``value`` (written as raw JSON)."""
    f = logdir / "perf_tracer" / "traces-r0.jsonl"
    lines = f.read_bytes().splitlines()
    i = next(i for i, ln in enumerate(lines) if json.loads(ln).get("name") == name)
    ev = json.loads(lines[i])
    ev[key] = value
    lines[i] = _encode(ev) if not isinstance(value, str) or not value.startswith("RAW:") else \
        _encode(ev).replace(json.dumps(value).encode(), value[4:].encode())
    f.write_bytes(b"\n".join(lines) + b"\n")


@pytest.mark.parametrize(("name", "key", "value"), [
    ("rl.session", "dur", "abc"),          # a dur that is not a number (the arrow pass's columns)
    ("rl.session", "dur", 1e308),          # OverflowError
    ("train.step", "ts", 1e308),
    ("rl.session", "ts", "RAW:1e400"),     # parsed as inf
    ("generate", "ts", 0),                 # a phase at ts 0
    ("generate", "ts", -1),                # negative: the native trace's times are unsigned
    ("rl.session", "ts", -5),
    ("train.step", "dur", float("nan")),
    ("rl.session", "args", {"rank": [1], "rl.session.id": 0, "rl.session.status": "accepted",
                            "rl.step": 0}),  # a rank no dict can key
])
@pytest.mark.parametrize("suffix", [".json", ".pftrace"])
def test_convert_skips_an_event_with_unusable_times_without_crashing(
        run_dir: Path, tmp_path: Path, name: str, key: str, value: Any, suffix: str) -> None:
    logdir = shutil.copytree(run_dir, tmp_path / "run")
    _set_line(logdir, name, key, value)
    res = convert([logdir], tmp_path / f"out{suffix}", progress=False)
    assert res.events > 10 and (tmp_path / f"out{suffix}").stat().st_size > 0


def test_convert_survives_200_fuzzed_log_dirs_to_json_and_pftrace(
        run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="rltrace")  # the skipped lines' warnings: counted below
    crashes: list[str] = []
    skipped = 0
    for seed in range(SEEDS):
        d = _damaged_copy(run_dir, tmp_path / f"d{seed}", seed)
        for out in (tmp_path / "o.json", tmp_path / "o.pftrace"):
            try:
                res = convert([d], out, progress=False)
                skipped += len(res.skipped)
            except ConvertError:
                pass  # a clear refusal (no trace file left) is not a crash
            except Exception as exc:
                crashes.append(f"seed {seed} -> {out.suffix}: {exc!r}")
        shutil.rmtree(d)
    assert crashes == [], crashes[:5]
    assert skipped > SEEDS  # the damage was seen (and counted), not silently passed over


def test_a_fuzzed_dir_converts_through_the_cli_to_a_trace_perfetto_loads(run_dir: Path,
                                                                        tmp_path: Path) -> None:
    d = _damaged_copy(run_dir, tmp_path / "d", 7)
    out = tmp_path / "run.pftrace"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLTRACE_")}
    proc = subprocess.run([sys.executable, "-m", "rltrace.cli", "convert", str(d), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "skipped" in proc.stdout + proc.stderr
    report = perfetto_check(out)
    assert report["ok"], report
