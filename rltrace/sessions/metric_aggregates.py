"""Session metrics aggregated in place, handed to the SDK's metric readers as finished points.

Recording a measurement through the OTel SDK costs several µs (a ``Measurement`` object, its
attributes cleaned and hashed, every reader's storage visited), and rltrace records one per
finished session and one per phase execution: about half of what the exporter thread spent
on a session.  :class:`SessionAggregates` keeps the same aggregation the SDK would (explicit
bucket histograms with the reader's boundaries, count, sum, min, max; a monotonic sum for the
counter) in plain lists, per metric reader and in the reader's temporality, and adds the
finished points to what each reader collects (:func:`rltrace.recording.otel_context.add_collect_source`).
Readers see ``rl.session.duration``, ``rl.phase.duration`` and ``rl.sessions`` exactly as if
they had been recorded one by one (``tests/sessions/test_metrics_agg.py`` compares the two), from
OTLP's periodic reader, a Prometheus reader or an in-memory one alike.

Where a reader asks for an aggregation this module does not reproduce (exponential
histograms, a drop or last-value view), :func:`make_aggregates` returns None and the session
processor records through the SDK, one measurement at a time, as before.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from rltrace.recording import otel_context
from rltrace.semconv import ATTR_PHASE, ATTR_STATUS

#: (name, unit, description) of the session metrics, as the SDK instruments declared them
SESSION_DURATION = ("rl.session.duration", "s", "session time from register to finalize")
PHASE_DURATION = ("rl.phase.duration", "s", "duration of one phase execution")
SESSIONS = ("rl.sessions", "{session}", "finalized sessions by status")


class _Series:
    """One histogram time series: bucket counts, count, sum, min, max.

    ``sum`` is this collection interval's; a cumulative point reports ``total``, to which each
    interval's sum is added at collection, as the SDK adds them (float sums depend on order).
    """

    __slots__ = ("count", "counts", "max", "min", "start", "sum", "total")

    def __init__(self, n_buckets: int, start: int) -> None:
        self.counts = [0] * n_buckets
        self.count = 0
        self.sum = 0.0
        self.total = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.start = start


class _ReaderState:
    """What one metric reader will collect next, in its temporality."""

    def __init__(self, bounds: Sequence[float], record_min_max: bool, hist_delta: bool,
                 counter_delta: bool) -> None:
        self.bounds = tuple(bounds)
        self.record_min_max = record_min_max
        self.hist_delta = hist_delta
        self.counter_delta = counter_delta
        self.hists: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        self.counts: dict[tuple[tuple[str, str], ...], list[int]] = {}  # [value, start]
        self.lock = threading.Lock()
        #: the previous collection's time: a delta point's start, as the SDK sets it
        self.prev: int | None = None

    def hist(self, name: str, key: tuple[tuple[str, str], ...], value: float, now: int) -> None:
        s = self.hists.get((name, key))
        if s is None:
            s = self.hists[(name, key)] = _Series(len(self.bounds) + 1, now)
        s.counts[bisect_left(self.bounds, value)] += 1
        s.count += 1
        s.sum += value
        if value < s.min:
            s.min = value
        if value > s.max:
            s.max = value

    def collect(self, now: int) -> list[Metric]:
        with self.lock:
            hists, counts = self.hists, self.counts
            prev, self.prev = self.prev, now
            if self.hist_delta:
                self.hists = {}
            if self.counter_delta:
                self.counts = {}
            by_name: dict[str, list[HistogramDataPoint]] = {}
            for (name, key), s in hists.items():
                if self.hist_delta:
                    total = s.sum
                else:
                    total = s.total = s.sum + s.total
                    s.sum = 0.0
                by_name.setdefault(name, []).append(HistogramDataPoint(
                    attributes=dict(key), time_unix_nano=now,
                    start_time_unix_nano=prev if self.hist_delta and prev is not None else s.start,
                    count=s.count, sum=total, bucket_counts=tuple(s.counts),
                    explicit_bounds=self.bounds,
                    min=s.min if self.record_min_max else float("inf"),
                    max=s.max if self.record_min_max else float("-inf"),
                ))
            points = [NumberDataPoint(attributes=dict(key), time_unix_nano=now, value=value,
                                      start_time_unix_nano=(prev if self.counter_delta and prev
                                                            is not None else start))
                      for key, (value, start) in counts.items()]
        hist_t = AggregationTemporality.DELTA if self.hist_delta else AggregationTemporality.CUMULATIVE
        out = []
        for name, unit, desc in (SESSION_DURATION, PHASE_DURATION):
            if by_name.get(name):
                out.append(Metric(name=name, description=desc, unit=unit,
                                  data=Histogram(data_points=by_name[name],
                                                 aggregation_temporality=hist_t)))
        if points:
            name, unit, desc = SESSIONS
            out.append(Metric(name=name, description=desc, unit=unit, data=Sum(
                data_points=points, is_monotonic=True,
                aggregation_temporality=(AggregationTemporality.DELTA if self.counter_delta
                                         else AggregationTemporality.CUMULATIVE))))
        return out


class SessionAggregates:
    """The session metrics of one pipeline, aggregated for each of its metric readers."""

    def __init__(self, states: list[_ReaderState], resource: Resource,
                 scope: InstrumentationScope) -> None:
        self._states = states
        self.resource = resource
        self.scope = scope

    def record(self, status: str, total_s: float, phases: Any) -> None:
        """One finished session: its total and every phase execution's duration.

        ``phases``: ``{phase: [(phase, start_ns, end_ns, ...), ...]}`` as the session processor
        holds them (:data:`rltrace.sessions.records.Execution`).
        """
        now = time.time_ns()
        skey = ((ATTR_STATUS, status),)
        session_name, phase_name = SESSION_DURATION[0], PHASE_DURATION[0]
        for st in self._states:
            with st.lock:
                st.hist(session_name, skey, total_s, now)
                c = st.counts.get(skey)
                if c is None:
                    st.counts[skey] = [1, now]
                else:
                    c[0] += 1
                for p, execs in phases.items():
                    pkey = ((ATTR_PHASE, p), (ATTR_STATUS, status))
                    for ex in execs:
                        st.hist(phase_name, pkey, (ex[2] - ex[1]) / 1e9, now)

    def _merge(self, state: _ReaderState, data: MetricsData | None) -> MetricsData | None:
        metrics = state.collect(time.time_ns())
        if not metrics:
            return data
        ours = ScopeMetrics(scope=self.scope, metrics=metrics, schema_url="")
        if data is None or not data.resource_metrics:
            return MetricsData(resource_metrics=[ResourceMetrics(
                resource=self.resource, scope_metrics=[ours], schema_url=self.resource.schema_url)])
        first, *rest = data.resource_metrics
        merged = ResourceMetrics(resource=first.resource,
                                 scope_metrics=[*first.scope_metrics, ours],
                                 schema_url=first.schema_url)
        return MetricsData(resource_metrics=[merged, *rest])


def make_aggregates(readers: list[Any], resource: Resource,
                    scope: InstrumentationScope) -> SessionAggregates | None:
    """Aggregates feeding ``readers`` (registered on a MeterProvider), or None when any of them
    wants an aggregation this module does not reproduce (record through the SDK then)."""
    settings = []
    for reader in readers:
        s = otel_context.reader_histogram_settings(reader)
        if s is None:
            return None
        settings.append(s)
    states = [_ReaderState(bounds, mm, hd, cd) for bounds, mm, hd, cd in settings]
    agg = SessionAggregates(states, resource, scope)
    for reader, state in zip(readers, states, strict=True):
        otel_context.add_collect_source(reader, _merger(agg, state))
    return agg


def _merger(agg: SessionAggregates, state: _ReaderState) -> Callable[[object], object]:
    """What one reader's collection passes through: its session metrics merged in."""

    def merge(data: object) -> object:
        if data is None or isinstance(data, MetricsData):
            return agg._merge(state, data)
        return data

    return merge
