"""The column (numpy) side of the session decomposition: the group split of many sessions'
tails at once.  The per-record part, and the names of the buckets, are in
:mod:`rltrace.readers.session_time` (one implementation, shared with the native Perfetto trace)."""

from __future__ import annotations

import numpy as np

from rltrace.readers.session_time import (
    FINALIZE,
    GROUP,
    KIND_FINALIZE,
    KIND_GAP,
    KIND_GROUP,
    KIND_NONE,
    KIND_PHASE,
    KIND_QUEUE,
    KIND_TAIL,
    MAX_TURN,
    NO_PHASE,
    QUEUE,
    Decomposition,
    Raw,
    Segment,
    decompose,
    executions,
    gap_name,
    split_segments,
)

__all__ = ["FINALIZE", "GROUP", "KIND_FINALIZE", "KIND_GAP", "KIND_GROUP", "KIND_NONE", "KIND_PHASE",
           "KIND_QUEUE", "KIND_TAIL", "MAX_TURN", "NO_PHASE", "QUEUE", "Decomposition", "Raw",
           "Segment", "decompose", "executions", "gap_name", "group_reduce", "split_segments",
           "split_tail"]


def split_tail(own_end: np.ndarray, final: np.ndarray,
               group_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per session: (group wait, before finalize) seconds of its tail (own end to finalize)."""
    tail = np.maximum(final - own_end, 0.0)
    wait = np.clip(group_end - own_end, 0.0, None)
    wait = np.minimum(wait, tail)
    return wait, tail - wait


def group_reduce(keys: tuple[np.ndarray, ...], values: np.ndarray, how: str = "max") -> np.ndarray:
    """Per element: the max (or min) of ``values`` over the elements sharing its key columns."""
    if values.size == 0:
        return values.astype(np.float64)
    order = np.lexsort(keys)
    change = np.zeros(order.size, dtype=bool)
    change[0] = True
    for k in keys:
        ks = k[order]
        change[1:] |= ks[1:] != ks[:-1]
    starts = np.flatnonzero(change)
    v = values[order].astype(np.float64)
    red = (np.maximum if how == "max" else np.minimum).reduceat(v, starts)
    per = np.repeat(red, np.diff(np.append(starts, order.size)))
    out = np.empty(order.size)
    out[order] = per
    return out
