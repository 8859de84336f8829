"""Device-aware timing: JAX async dispatch on the CPU, torch, annotations, torch.profiler merge.

GPU-only behaviour (torch.cuda.synchronize, CUDA events without host stalls, NVTX) is tested in
the CUDA section at the end, which skips with its reason when no CUDA device is present.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import need, perfetto_check

import rltrace
from rltrace.cli.convert import convert
from rltrace.testing import capture_spans, read_jsonl

jax = need("jax", "jax is not installed (pip install jax)")
jnp = need("jax.numpy", "jax is not installed (pip install jax)")


def _dur(span: object) -> float:
    return (span.end_time - span.start_time) / 1e9  # type: ignore[attr-defined]


#: how long the fixture's product must take, so that dispatching it (a fraction of a millisecond)
#: is small beside its compute on any backend
MIN_COMPUTE_S = 0.04


def _product_time(a: object) -> float:
    (a @ a).block_until_ready()  # type: ignore[operator]  # compile once for this shape
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        (a @ a).block_until_ready()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]


@pytest.fixture(scope="module")
def matmul() -> tuple[object, float]:
    """A matrix big enough that its product takes a while on this backend; and that product's
    compute time.  A 2,500² product takes about 0.3 s on two CPU cores but 0.4 ms on an H100,
    less than dispatching it: the size grows until the product takes ``MIN_COMPUTE_S``."""
    n = 2500
    a = jnp.ones((n, n), dtype=jnp.float32)
    compute = _product_time(a)
    while compute < MIN_COMPUTE_S and n < 32_768:
        n = min(32_768, int(n * min(4.0, (2 * MIN_COMPUTE_S / compute) ** (1 / 3))) // 256 * 256 + 256)
        a = jnp.ones((n, n), dtype=jnp.float32)
        compute = _product_time(a)
    return a, compute


def test_without_sync_a_jax_scope_measures_dispatch_and_with_sync_it_covers_the_compute(
    tmp_path: Path, matmul: tuple[object, float]
) -> None:
    a, compute = matmul
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("dispatch.only"):
            y = a @ a  # type: ignore[operator]
        y.block_until_ready()
        with rltrace.trace_scope("synced", device_sync=True):
            y = a @ a  # type: ignore[operator]
        nosync, synced = cap.one("dispatch.only"), cap.one("synced")
    assert _dur(nosync) < compute / 4, (_dur(nosync), compute)
    assert _dur(synced) >= compute / 2, (_dur(synced), compute)
    assert synced.attributes["rl.device.sync"] == "jax"
    assert synced.attributes["rl.device.sync_wait_s"] > 0
    assert "rl.device.sync" not in nosync.attributes


def test_jax_sync_waits_for_queued_work_on_every_device_without_touching_live_arrays(
    tmp_path: Path, matmul: tuple[object, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting on ``jax.live_arrays()`` cost grew with the model (5.8 ms per scope with 5,000
    arrays on an H100): the sync must cover queued compute without ever listing them, with
    10,000 small arrays alive as a model's parameters would be."""
    a, compute = matmul
    params = [jnp.full((4,), float(i)) for i in range(10_000)]
    jax.block_until_ready(params)

    def forbidden() -> None:
        raise AssertionError("device_sync listed every live array")

    monkeypatch.setattr(jax, "live_arrays", forbidden)
    with capture_spans(tmp_path) as cap:
        y = a @ a  # type: ignore[operator]  # queued before the scope: waited for at entry
        with rltrace.trace_scope("entry.wait", device_sync=True):
            pass
        entry = cap.one("entry.wait")
        assert y.is_ready()  # the entry sync waited for the matmul queued before it
        with rltrace.trace_scope("covers.compute", device_sync=True):
            y = a @ a  # type: ignore[operator]
        synced = cap.one("covers.compute")
    assert y.is_ready()
    assert entry.attributes["rl.device.sync_wait_s"] >= compute / 2, (entry.attributes, compute)
    assert _dur(entry) < compute / 4, (_dur(entry), compute)  # earlier work does not leak in
    assert _dur(synced) >= compute / 2, (_dur(synced), compute)
    assert len(params) == 10_000


def test_device_timestamps_follow_the_deterministic_clock(tmp_path: Path) -> None:
    """``device.py`` once imported ``now_ns`` by value, so under ``deterministic()`` an
    ``annotate=True`` span ended on the wall clock (it lasted 95,413,033 s)."""
    from rltrace.testing import deterministic

    with capture_spans(tmp_path) as cap:
        with deterministic() as (clock, _):
            with rltrace.trace_scope("annotated", annotate=True):
                pass
            with rltrace.trace_scope("synced", device_sync=True):
                pass
        spans = {n: cap.one(n) for n in ("annotated", "synced")}
    for name, span in spans.items():
        assert 0 < span.end_time - span.start_time < 10 * clock.step, (name, span.start_time, span.end_time)


def test_trace_perf_device_sync_waits_on_the_functions_outputs(
    tmp_path: Path, matmul: tuple[object, float]
) -> None:
    a, compute = matmul

    @rltrace.trace_perf("jax.step", device_sync=True)
    def step(x: object) -> object:
        return x @ x  # type: ignore[operator]

    @rltrace.trace_perf("jax.step.nosync")
    def step_nosync(x: object) -> object:
        return x @ x  # type: ignore[operator]

    with capture_spans(tmp_path) as cap:
        step_nosync(a).block_until_ready()  # type: ignore[attr-defined]
        out = step(a)
        assert out.shape == a.shape  # type: ignore[attr-defined]
        synced, nosync = cap.one("jax.step"), cap.one("jax.step.nosync")
    assert _dur(synced) >= compute / 2 and _dur(nosync) < compute / 4


def test_session_phase_device_sync_covers_the_compute(tmp_path: Path, matmul: tuple[object, float]) -> None:
    a, compute = matmul
    with capture_spans(tmp_path, session_tracer={"enabled": True}) as cap:
        sid = rltrace.register_session()
        with rltrace.trace_session_phase("reward", session_id=sid, device_sync=True):
            _ = a @ a  # type: ignore[operator]
        rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        phase = cap.one("reward")
    assert _dur(phase) >= compute / 2 and phase.attributes["rl.device.sync"] == "jax"


def test_config_defaults_per_category_turn_sync_on_for_that_category_only(
    tmp_path: Path, matmul: tuple[object, float]
) -> None:
    a, compute = matmul
    with capture_spans(tmp_path, device={"sync_categories": ["comm"]}) as cap:
        with rltrace.trace_scope("allreduce", rltrace.Category.COMM):
            _ = a @ a  # type: ignore[operator]
        with rltrace.trace_scope("forward", rltrace.Category.COMPUTE):
            y = a @ a  # type: ignore[operator]
        y.block_until_ready()

        @rltrace.trace_perf("bcast", category="comm")
        def bcast() -> object:
            return a @ a  # type: ignore[operator]

        bcast()
        comm, compute_span, deco = cap.one("allreduce"), cap.one("forward"), cap.one("bcast")
    assert comm.attributes["rl.device.sync"] == "jax" and _dur(comm) >= compute / 2
    assert deco.attributes["rl.device.sync"] == "jax" and _dur(deco) >= compute / 2
    assert "rl.device.sync" not in compute_span.attributes and _dur(compute_span) < compute / 4


def test_annotate_puts_rltrace_names_into_a_jax_profiler_trace(tmp_path: Path) -> None:
    a = jnp.ones((128, 128))
    with capture_spans(tmp_path / "logs"):
        with jax.profiler.trace(str(tmp_path / "jaxprof"), create_perfetto_trace=True):
            with rltrace.trace_scope("rltrace.annotated.block", annotate=True):
                (a @ a).block_until_ready()
    traces = list((tmp_path / "jaxprof").rglob("*.trace.json.gz"))
    assert traces, list((tmp_path / "jaxprof").rglob("*"))
    assert any(b"rltrace.annotated.block" in gzip.decompress(t.read_bytes()) for t in traces)


def test_device_timing_events_without_cuda_is_reported_not_silent(tmp_path: Path) -> None:
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("evt", device_timing="events"):
            pass
        span = cap.one("evt")
        with pytest.raises(ValueError, match="device_timing"):
            rltrace.trace_scope("bad", device_timing="cupti")
    assert "unavailable" in span.attributes["rl.device.timing"]


NO_ACCEL = """
import sys, time, rltrace
import torch  # CPU build: torch ops are synchronous, nothing to wait for
from rltrace.device import device_sync
rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False)
with rltrace.trace_scope("cpu.only", device_sync=True):
    torch.ones(10).sum()
assert device_sync(True)[0] == "none"
rltrace.shutdown()
assert "jax" not in sys.modules
"""

MISSING = """
import sys
sys.modules["torch"] = None  # torch is not installed in this process
sys.modules["jax"] = None
import rltrace
rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False)
with rltrace.trace_scope("auto", device_sync=True):
    pass
try:
    with rltrace.trace_scope("wants.torch", device_sync="torch"):
        pass
except ImportError as exc:
    print("ERROR:", exc)
rltrace.shutdown()
"""


def test_without_an_accelerator_device_sync_is_a_no_op(tmp_path: Path) -> None:
    need("torch", "torch is not installed (pip install torch==2.13.0)")
    proc = subprocess.run([sys.executable, "-c", NO_ACCEL, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path))  # the installed package
    assert proc.returncode == 0, proc.stderr
    (ev,) = [e for e in read_jsonl(next(tmp_path.rglob("traces-r0.jsonl"))) if e.get("ph") == "X"]
    assert ev["name"] == "cpu.only"
    assert "rl.device.sync" not in ev["args"]  # nothing was waited for: a plain span


IMPORTED_UNUSED = """
import json, sys
import jax  # imported, as a library may, but no JAX work yet: no backend initialised
import torch
from jax._src import xla_bridge
import rltrace
rltrace.configure(fileroot=sys.argv[1], flush_at_exit=False)
if torch.cuda.is_available():
    torch.ones(4, device="cuda").sum()  # a torch job on the GPU
with rltrace.trace_scope("auto", device_sync=True):
    pass
untouched = not xla_bridge.backends_are_initialized()
import jax.numpy as jnp
(jnp.ones(3) + 1).block_until_ready()  # now JAX is in use
with rltrace.trace_scope("after", device_sync=True):
    pass
rltrace.shutdown()
print(json.dumps({"untouched": untouched, "cuda": torch.cuda.is_available()}))
"""


def test_auto_sync_never_initialises_a_jax_that_was_only_imported(tmp_path: Path) -> None:
    """``device_sync=True`` in a torch process that imported jax listed JAX's devices, which
    initialises its backend: on a GPU, JAX then preallocates most of the GPU's memory under the
    torch job.  It waits for JAX only once JAX has a backend of its own."""
    need("torch", "torch is not installed (pip install torch==2.13.0)")
    proc = subprocess.run([sys.executable, "-c", IMPORTED_UNUSED, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["untouched"], "device_sync=True initialised JAX's backend"
    spans = {e["name"]: e["args"] for e in read_jsonl(next(tmp_path.rglob("traces-r0.jsonl")))
             if e.get("ph") == "X"}
    assert spans["auto"].get("rl.device.sync") == ("torch.cuda" if result["cuda"] else None)
    assert spans["after"]["rl.device.sync"] == ("torch.cuda+jax" if result["cuda"] else "jax")


def test_missing_frameworks_are_handled_and_named(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", MISSING, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path))  # the installed package
    assert proc.returncode == 0, proc.stderr
    assert "ERROR:" in proc.stdout and "pip install 'rltrace[torch]'" in proc.stdout
    names = [e["name"] for e in read_jsonl(next(tmp_path.rglob("traces-r0.jsonl"))) if e.get("ph") == "X"]
    assert "auto" in names


@pytest.mark.perfetto
def test_torch_profiler_steps_merge_on_one_clock_and_the_wrapping_span_encloses_the_op(
    tmp_path: Path,
) -> None:
    torch = need("torch", "torch is not installed (pip install torch==2.13.0)")
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    prof = rltrace.profile_steps([1])
    for step in range(3):
        with rltrace.step(step), prof.step(step):
            with rltrace.trace_scope("matmul.wrap"):
                a = torch.randn(300, 300)  # ops before and after the matmul give the enclosure
                a @ a  # a margin of tens of µs for the profiler's own clock alignment
                a.add(1.0)
    rltrace.shutdown()
    assert len(prof.written) == 1 and prof.written[0].endswith("step1-r0.json")
    out = tmp_path / "merged.json"
    res = convert([tmp_path], out)
    assert any(f.name == "step1-r0.json" for f in res.files)
    sql = ("select s.name, s.ts, s.dur from slice s where s.name in ('matmul.wrap', 'aten::mm') "
           "order by s.ts")
    report = perfetto_check(out, sql, "select name from process order by name")
    assert report["ok"] and report["import_errors"] == [], {k: v for k, v in report.items() if k != "queries"}
    rows = report["queries"][sql]
    (mm,) = [r for r in rows if r["name"] == "aten::mm"]
    wraps = [r for r in rows if r["name"] == "matmul.wrap"]
    enclosing = [w for w in wraps if w["ts"] <= mm["ts"] and mm["ts"] + mm["dur"] <= w["ts"] + w["dur"]]
    assert len(enclosing) == 1  # step 1's span, on the same epoch clock
    names = [r["name"] for r in report["queries"]["select name from process order by name"]]
    assert any(n and "torch.profiler" in n for n in names)


# ---- CUDA (skipped on machines without a CUDA device) ------------------------------------------

_torch = need("torch", "torch is not installed (pip install torch==2.13.0)")
cuda = pytest.mark.skipif(not _torch.cuda.is_available(),
                          reason="no CUDA device on this machine (run on a GPU host)")


@cuda
def test_cuda_sync_makes_the_span_cover_the_kernels(tmp_path: Path) -> None:
    x = _torch.randn(8192, 8192, device="cuda")
    _torch.cuda.synchronize()
    start, end = _torch.cuda.Event(enable_timing=True), _torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        x @ x
    end.record()
    end.synchronize()
    gpu_s = start.elapsed_time(end) / 1000
    with capture_spans(tmp_path) as cap:
        with rltrace.trace_scope("gpu.nosync"):
            for _ in range(5):
                x @ x
        _torch.cuda.synchronize()
        with rltrace.trace_scope("gpu.sync", device_sync=True):
            for _ in range(5):
                x @ x
        nosync, synced = cap.one("gpu.nosync"), cap.one("gpu.sync")
    assert synced.attributes["rl.device.sync"].startswith("torch.cuda")
    assert _dur(synced) >= gpu_s / 2 and _dur(nosync) < gpu_s / 2


@cuda
def test_cuda_events_time_the_gpu_without_stalling_the_host(tmp_path: Path) -> None:
    x = _torch.randn(8192, 8192, device="cuda")
    _torch.cuda.synchronize()
    with capture_spans(tmp_path) as cap:
        t0 = time.perf_counter()
        with rltrace.trace_scope("gpu.events", device_timing="events"):
            for _ in range(5):
                x @ x
        host_s = time.perf_counter() - t0
        _torch.cuda.synchronize()
        span = cap.one("gpu.events")
    assert span.attributes["rl.device.time_s"] > host_s  # the host did not wait for the kernels


@cuda
def test_cuda_event_timing_matches_events_the_test_records_itself_and_reuses_pooled_events(
        tmp_path: Path) -> None:
    """rltrace's ``rl.device.time_s`` against a pair of CUDA events the test records around the
    same kernels on the same stream; after resolution the events go back to the pool and the
    next scopes take them instead of creating new ones."""
    from rltrace.recording.recorder import STATE

    x = _torch.randn(4096, 4096, device="cuda")
    _torch.cuda.synchronize()
    with capture_spans(tmp_path) as cap:
        for i in range(3):
            mine0, mine1 = _torch.cuda.Event(enable_timing=True), _torch.cuda.Event(enable_timing=True)
            with rltrace.trace_scope(f"k{i}", device_timing="events"):
                mine0.record()
                for _ in range(4):
                    x @ x
                mine1.record()
            _torch.cuda.synchronize()
            rltrace.flush()
            theirs = cap.one(f"k{i}").attributes["rl.device.time_s"]
            ours = mine0.elapsed_time(mine1) / 1000
            assert ours <= theirs <= ours * 1.2 + 2e-4, (i, ours, theirs)
        pool = STATE.held_events.pools.get(_torch.cuda.current_device(), [])
        assert pool, "resolved events were not returned to the pool"
