"""Device-sync overhead benchmark (JSON): what ``device_sync=True`` costs where there is nothing
to wait for (a CPU-only torch process: torch ops are synchronous, no accelerator in use), next
to a plain ``trace_scope``.  On a GPU host it also compares events mode with synchronize mode on
a loop of small kernels (skipped, with the reason, when no CUDA device is present).
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


def _gpu(n: int) -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {"gpu": "skipped: torch not installed"}
    if not torch.cuda.is_available():
        return {"gpu": "skipped: no CUDA device on this machine"}
    x = torch.randn(256, 256, device="cuda")
    out: dict[str, object] = {}
    for mode, kw in (("synchronize", {"device_sync": True}), ("events", {"device_timing": "events"})):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            with rltrace.trace_scope("k", **kw):  # type: ignore[arg-type]
                x @ x
        torch.cuda.synchronize()
        out[f"gpu_loop_{mode}_us_per_kernel"] = (time.perf_counter() - t0) / n * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--spans", type=int, default=20_000)
    a = ap.parse_args()
    import torch  # noqa: F401 - a CPU-only torch process, as on a machine without accelerator

    with tempfile.TemporaryDirectory() as root:
        rltrace.configure(fileroot=root, flush_interval_s=3600)
        plain, synced = [], []
        for _ in range(5):
            plain.append(_per_scope_ns(a.spans))
            synced.append(_per_scope_ns(a.spans, device_sync=True))
        gpu = _gpu(2000)
        rltrace.shutdown()
    m = statistics.median
    print(json.dumps({
        "benchmark": "device",
        "python": sys.version.split()[0],
        "jax_imported": "jax" in sys.modules,
        "plain_scope_ns": round(m(plain)),
        "device_sync_scope_ns": round(m(synced)),
        "device_sync_overhead_ns": round(m(synced) - m(plain)),
        **gpu,
    }, indent=2))


if __name__ == "__main__":
    main()
