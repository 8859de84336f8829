"""setup_logging: one format, main.log in the log dir, trace/span ids of the current span."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import rltrace
from rltrace.stats import setup_logging
from rltrace.stats.logs import reset_logging
from rltrace.testing import capture_spans


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    reset_logging()
    root.setLevel(level)


def test_log_records_inside_a_span_carry_its_trace_and_span_ids_in_main_log(tmp_path: Path) -> None:
    console = io.StringIO()
    with capture_spans(tmp_path) as cap:
        path = setup_logging(logging.INFO, stream=console)
        assert path == cap.log_dir / "main.log"
        log = logging.getLogger("my.trainer")
        log.info("before any span")
        with rltrace.trace_scope("train.step"):
            log.info("inside the step")
        span = cap.one("train.step")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and console.getvalue().splitlines() == lines
    outside, inside = lines
    assert "INFO my.trainer [rank 0]: before any span" in outside and "trace_id" not in outside
    ids = f" trace_id={span.context.trace_id:032x} span_id={span.context.span_id:016x}:"
    assert f"INFO my.trainer [rank 0]{ids} inside the step" in inside


def test_records_also_get_otel_attribute_names_for_custom_formats(tmp_path: Path) -> None:
    out = io.StringIO()
    setup_logging("DEBUG", log_dir=tmp_path, rank=2, stream=out,
                  fmt="%(rank)s %(otelTraceID)s %(otelSpanID)s %(message)s")
    logging.getLogger("x").debug("hello")
    assert out.getvalue() == "2 0 0 hello\n"
    assert (tmp_path / "main-r2.log").read_text() == "2 0 0 hello\n"  # ranks > 0 get their own file


def test_calling_setup_logging_again_replaces_its_handlers(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    setup_logging(log_dir=tmp_path, stream=False)
    setup_logging(log_dir=tmp_path, stream=False)
    assert len(root.handlers) == before + 1
    logging.getLogger("y").warning("once")
    assert (tmp_path / "main.log").read_text().count("once") == 1
