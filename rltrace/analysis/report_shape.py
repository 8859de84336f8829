"""The shape of the report of one run (:func:`~.report.build_report`): its sections by name.

Each section is the JSON-ready dict its analysis returns (:mod:`.groups`, :mod:`.goodput`, ...);
keys starting with ``_`` hold what the plots and tables need beyond the JSON (``_units``: each
view's time unit) and are left out of the JSON file (:func:`~.report.public`).
"""

from __future__ import annotations

from typing import Any, TypedDict


class Report(TypedDict, total=False):
    """The report of one run, section by section."""

    rltrace_report: int
    generated_at: str
    logdir: str
    options: dict[str, object]
    inputs: dict[str, Any]
    groups: dict[str, Any]
    longtail: dict[str, Any]
    stragglers: dict[str, Any]
    phases: dict[str, Any]
    turns: dict[str, Any]
    status: dict[str, Any]
    summary: dict[str, Any]
    goodput: dict[str, Any]
    critical_path: dict[str, Any]
    findings: list[dict[str, Any]]
    #: plot key -> file name of the plot written beside the report
    plots: dict[str, str]
    #: view -> its time unit (:mod:`.units`)
    _units: dict[str, str]
