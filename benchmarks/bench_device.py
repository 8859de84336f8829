"""Device-sync overhead benchmark (JSON): what ``device_sync=True`` costs where there is nothing
to wait for (a CPU-only torch process: torch ops are synchronous, no accelerator in use), next
to a plain ``trace_scope``; JAX's sync with 10, 1,000 and 10,000 live arrays beside the raw
calls.  On a GPU host it also times a loop of small kernels bare, in a plain scope, in
synchronize and events modes, and the raw calls those modes wrap (skipped, with the reason, when
no CUDA device is present).
Run: ``python benchmarks/bench_device.py [--spans N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

import rltrace


def _per_scope_ns(n: int, **kw: object) -> float:
    """Caller-side cost, in batches; the exporter cycle runs between batches, untimed."""
    scope = rltrace.trace_scope
    total = 0
    for _ in range(max(1, n // 2000)):
        t0 = time.perf_counter_ns()
        for _ in range(2000):
            with scope("s", **kw):  # type: ignore[arg-type]
                pass
        total += time.perf_counter_ns() - t0
        rltrace.flush()
    return total / (max(1, n // 2000) * 2000)


def _gpu(n: int, rounds: int = 5) -> dict[str, object]:
    """µs per small kernel (a 256² matmul) in a loop: bare, inside a plain scope, with each
    device option, and the raw framework calls the options wrap.  The variants run in
    interleaved rounds (median reported) and the exporter's cycle runs between loops,
    untimed, so that no variant pays for another's backlog."""
    try:
        import torch
    except ImportError:
        return {"gpu": "skipped: torch not installed"}
    if not torch.cuda.is_available():
        return {"gpu": "skipped: no CUDA device on this machine"}
    x = torch.randn(256, 256, device="cuda")

    def bare() -> None:
        x @ x

    def plain_scope() -> None:
        with rltrace.trace_scope("k"):
            x @ x

    def synchronize() -> None:
        with rltrace.trace_scope("k", device_sync=True):
            x @ x

    def events() -> None:
        with rltrace.trace_scope("k", device_timing="events"):
            x @ x

    def raw_synchronize() -> None:
        torch.cuda.synchronize()
        x @ x
        torch.cuda.synchronize()

    def raw_event_pair() -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        x @ x
        end.record()

    variants = {"bare": bare, "plain_scope": plain_scope, "synchronize": synchronize,
                "events": events, "raw_synchronize": raw_synchronize, "raw_event_pair": raw_event_pair}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for label, fn in variants.items():
            torch.cuda.synchronize()
            rltrace.flush()  # resolves the events of the loop before; untimed
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            times[label].append((time.perf_counter() - t0) / n * 1e6)
    out: dict[str, object] = {"gpu_name": torch.cuda.get_device_name(0)}
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, us in med.items():
        out[f"gpu_loop_{label}_us_per_kernel"] = round(us, 2)
    for label in ("plain_scope", "synchronize", "events"):
        out[f"gpu_loop_{label}_overhead_us"] = round(med[label] - med["bare"], 2)
    return out


def _jax_sync_by_live_arrays(reps: int = 200) -> dict[str, object]:
    """``device_sync="jax"`` per call (µs) with N small arrays alive, beside the raw calls:
    ``block_until_ready(jax.live_arrays())`` (what rltrace did before) and the per-device
    fence op rltrace uses now.  Nothing is queued: this is the cost of syncing alone."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {"jax": "skipped: jax not installed"}
    from rltrace.device import _jax_fence, device_sync

    out: dict[str, object] = {"jax_devices": [str(d) for d in jax.local_devices()]}
    keep = []
    for n in (10, 1_000, 10_000):
        keep.extend(jnp.full((4,), float(i)) for i in range(n - len(keep)))
        jax.block_until_ready(keep)
        for label, fn in (("device_sync_jax", lambda: device_sync("jax")),
                          ("raw_fence", lambda: _jax_fence(jax)),
                          ("raw_block_on_live_arrays", lambda: jax.block_until_ready(jax.live_arrays()))):
            fn()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            out[f"{label}_us_{n}_arrays"] = round((time.perf_counter() - t0) / reps * 1e6, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=20_000)
    a = ap.parse_args()
    import torch  # noqa: F401 - a CPU-only torch process, as on a machine without accelerator

    with tempfile.TemporaryDirectory() as root:
        rltrace.configure(fileroot=root, flush_interval_s=3600)
        plain, synced, annotated = [], [], []
        for _ in range(5):
            plain.append(_per_scope_ns(a.spans))
            synced.append(_per_scope_ns(a.spans, device_sync=True))
            annotated.append(_per_scope_ns(a.spans, annotate=True))
        gpu = _gpu(1000)
        jax_sync = _jax_sync_by_live_arrays()
        rltrace.shutdown()
    m = statistics.median
    print(json.dumps({
        "benchmark": "device",
        "python": sys.version.split()[0],
        "jax_imported": "jax" in sys.modules,
        "plain_scope_ns": round(m(plain)),
        "device_sync_scope_ns": round(m(synced)),
        "device_sync_overhead_ns": round(m(synced) - m(plain)),
        "annotate_scope_ns": round(m(annotated)),
        **gpu,
        **jax_sync,
    }, indent=2))


if __name__ == "__main__":
    main()
