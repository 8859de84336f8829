"""OTel metrics sink: committed stats as gauges and histograms of the pipeline's MeterProvider.

Uses the same ``MeterProvider`` as the session metrics (``rltrace.configure(metric_readers=...)``
and the OTLP metric exporter), so the stats reach the collector beside ``rl.session.*``:

* one gauge per key, ``rl.stats.<key>`` (characters OTel does not allow in names become ``_``);
* ``rl.commit.step``: the step of the last committed row;
* the histogram ``rl.timeperf.duration`` (seconds) with attribute ``rl.timeperf.name`` for every
  ``timeperf/<name>`` key, so step-time percentiles can be charted.

With no MeterProvider (no OTLP endpoint and no metric readers) it does nothing and says so once.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from rltrace import runtime
from rltrace.stats.sinks import CommitInfo
from rltrace.version import __version__

__all__ = ["OTelMetricsSink", "instrument_name"]

logger = logging.getLogger("rltrace.stats")

_BAD = re.compile(r"[^-_./a-zA-Z0-9]")
TIMEPERF_PREFIX = "timeperf/"


def instrument_name(key: str, prefix: str = "rl.stats.") -> str:
    """A valid OTel instrument name for a stats key (``actor/loss/avg`` -> ``rl.stats.actor/loss/avg``)."""
    return (prefix + _BAD.sub("_", key))[:255]


class OTelMetricsSink:
    """Records each row on gauges (and timings on a histogram) of the pipeline's MeterProvider."""

    name = "otel"

    def __init__(self, meter_provider: Any = None) -> None:
        self._explicit = meter_provider
        self._provider: Any = None
        self._gauges: dict[str, Any] = {}
        self._step: Any = None
        self._hist: Any = None
        self._told = False

    def _meter_provider(self) -> Any:
        if self._explicit is not None:
            return self._explicit
        p = runtime.get_pipeline()
        return p.meter_provider if p is not None else None

    def write(self, row: Mapping[str, float], info: CommitInfo) -> None:
        mp = self._meter_provider()
        if mp is None:
            if not self._told:
                self._told = True
                logger.info("rltrace.stats: no OTel MeterProvider (set otlp.endpoint or pass "
                            "metric_readers to rltrace.configure); stats are not sent as OTel metrics")
            return
        if mp is not self._provider:  # first use, or rltrace was reconfigured
            self._provider = mp
            meter = mp.get_meter("rltrace.stats", __version__)
            self._meter = meter
            self._gauges = {}
            self._step = meter.create_gauge("rl.commit.step", unit="{step}",
                                            description="step of the last committed stats row")
            self._hist = meter.create_histogram("rl.timeperf.duration", unit="s",
                                                description="per-step time of a timeperf/ key")
        gauges = self._gauges
        for key, value in row.items():
            if not math.isfinite(value):
                continue
            g = gauges.get(key)
            if g is None:
                g = gauges[key] = self._meter.create_gauge(instrument_name(key))
            g.set(value)
            if key.startswith(TIMEPERF_PREFIX):
                self._hist.record(value, {"rl.timeperf.name": key[len(TIMEPERF_PREFIX):]})
        self._step.set(info.step)

    def close(self) -> None:
        return None  # the MeterProvider belongs to the pipeline
