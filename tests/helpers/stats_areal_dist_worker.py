"""One gloo rank for tests/compat/areal/test_stats_areal_compat.py: ``export_all``'s ``reduce_group``.

Usage: ``python stats_areal_dist_worker.py MODE PORT RANK WORLD``, MODE ``local`` or ``group``.
Both modes initialise a torch.distributed gloo world of WORLD ranks (so a default group
exists) and record :func:`rank_data` with ``rltrace.stats``.  Output: one JSON object per line
on stdout; commands arrive as lines on stdin.

``local``: rank 0 exports with ``export_all(reduce_group=None)`` and prints
``{"rank", "stats"}`` while the other ranks do not export; they print ``{"rank", "ready"}``
and wait for a ``go`` line, then export the same way.  Every rank then waits for an
``exit`` line, so no rank leaves while another still runs.

``group``: every rank exports over an explicit group (``dist.new_group``) with rltrace and,
when AReaL's wheel is available (``RLTRACE_AREAL_WHEEL``; tests/helpers/areal_wheel.py), with
AReaL's released ``stats_tracker`` on the same data; prints ``{"rank", "stats", "areal"}``
(``areal`` is null without the wheel).

The worker restores default signal handlers first and uses no relative path, so it behaves
the same whatever the parent's signal dispositions and working directory.
"""

from __future__ import annotations

import json
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

HELPERS = Path(__file__).resolve().parent
TIMEOUT = timedelta(seconds=60)  # every collective and the rendezvous give up after this


def rank_data(rank: int) -> dict[str, Any]:
    """Deterministic data of one rank (numpy): two micro-batches, a scalar per micro-batch."""
    rng = np.random.default_rng(7 + rank)
    out: dict[str, Any] = {"mbs": []}
    for mb in range(2):
        shape = (2, 3 + rank + mb)  # ranks and micro-batches differ in size
        mask = rng.random(shape) < 0.6
        mask[0, 0] = True  # never empty
        out["mbs"].append({
            "mask": mask,
            "logp": rng.normal(size=shape).round(3).astype(np.float32),
            "adv": rng.normal(size=shape).round(3).astype(np.float32),
            "loss": float(np.round(rng.normal(), 3)),
        })
    return out


def record(st: Any, torch: Any, rank: int) -> None:
    """The same calls for rltrace.stats and for AReaL's module ``st``."""
    for mb in rank_data(rank)["mbs"]:
        adv = torch.from_numpy(mb["adv"])
        with st.scope("actor"):
            st.denominator(n_tokens=torch.from_numpy(mb["mask"]))
            st.stat(denominator="n_tokens", logp=torch.from_numpy(mb["logp"]))
            st.stat(denominator="n_tokens", reduce_type=st.ReduceType.SUM, adv_sum=adv)
            st.stat(denominator="n_tokens", reduce_type=st.ReduceType.MAX, adv_max=adv)
            st.scalar(loss=mb["loss"])
    st.get("rollout").scalar(reward=0.25 * (rank + 1))


def _say(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _wait_for(word: str) -> None:
    line = sys.stdin.readline()
    if line.strip() != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mode, port, rank_s, world_s = argv
    rank, world = int(rank_s), int(world_s)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    from rltrace import stats

    stats.disable_span_timings()  # only what this worker records
    record(stats, torch, rank)
    if mode == "local":
        if rank != 0:
            _say({"rank": rank, "ready": True})
            _wait_for("go")  # rank 0 has exported by now, without this rank taking part
        _say({"rank": rank, "stats": stats.export_all(reduce_group=None),
              "default_group_size": dist.get_world_size()})
        _wait_for("exit")
    else:
        group = dist.new_group(list(range(world)), timeout=TIMEOUT)
        ours = stats.export_all(reduce_group=group)
        theirs = None
        sys.path.insert(0, str(HELPERS))
        import areal_wheel

        if areal_wheel.skip_reason() is None:
            with areal_wheel.areal_modules() as m:
                record(m.stats_tracker, torch, rank)
                theirs = m.stats_tracker.export_all(reduce_group=group)
        _say({"rank": rank, "stats": ours, "areal": theirs})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
