"""``rltrace report``: what happened in a run, from its log dir, with no backend running.

Needs the ``analysis`` extra (``pip install 'rltrace[analysis]'``: numpy, matplotlib, jinja2,
rich); the core package never imports it.

    from rltrace.analysis import ReportOptions, StepRange, report
    rep, files = report("logs/me/grpo/t0", "out/report.html", options=ReportOptions(steps=StepRange(10, 20)))

Modules: ``load`` (files, streaming lines), ``timeline`` (one session's time decomposed:
queue wait, phases by turn, gaps, group wait, before finalize), ``sessions`` and ``traces``
(readers aggregating as they read), ``run`` (a log dir read into compact columns),
``groups``, ``longtail``, ``stragglers``, ``phases``, ``turns``, ``status``, ``summary`` (one
analysis each), ``report`` (all of them plus findings), ``plots`` (PNG), ``render`` (HTML,
Markdown, JSON).
"""

from __future__ import annotations

import importlib.util

EXTRA_MODULES = ("numpy", "matplotlib", "jinja2", "rich")
INSTALL_HINT = "pip install 'rltrace[analysis]'"


class MissingDependencyError(ImportError):
    """The ``analysis`` extra is not installed."""


def _missing() -> list[str]:
    out = []
    for m in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):  # sys.modules[m] = None, or a broken entry
            found = False
        if not found:
            out.append(m)
    return out


_MISSING = _missing()
if _MISSING:
    raise MissingDependencyError(
        f"rltrace report needs the analysis extra ({', '.join(_MISSING)} missing): {INSTALL_HINT}"
    )

from pathlib import Path  # noqa: E402

from rltrace.analysis.load import ReportError, StepRange  # noqa: E402
from rltrace.analysis.render import FORMATS, resolve_output, write  # noqa: E402
from rltrace.analysis.report import build_report  # noqa: E402
from rltrace.analysis.report_shape import Report  # noqa: E402
from rltrace.analysis.run import ReportOptions, Run, load_run  # noqa: E402

__all__ = ["FORMATS", "MissingDependencyError", "ReportError", "ReportOptions", "Run", "StepRange",
           "build_report", "load_run", "report"]


def report(logdir: str | Path, out: str | Path | None = None, fmt: str | None = None, *,
           options: ReportOptions | None = None) -> tuple[Report, list[Path]]:
    """Read ``logdir``, analyse it and write the report; return it and the files written."""
    resolve_output(out, Path(logdir), fmt)  # a bad -o fails before the run is read
    run = load_run(logdir, options)
    path, f = resolve_output(out, run.logdir, fmt)
    rep = build_report(run)
    return rep, write(rep, path, f)
