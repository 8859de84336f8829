"""rltrace's pytest plugin, opt-in: ``pytest -p rltrace.testing.pytest_plugin``, or
``pytest_plugins = ["rltrace.testing.pytest_plugin"]`` in your ``conftest.py``.

It is not registered through an entry point, so a project that merely has rltrace installed runs
its tests untouched: nothing of rltrace is imported into its pytest sessions.

Fixtures:

* ``rltrace_capture`` - rltrace configured into the test's ``tmp_path`` with its spans captured
  in memory (:func:`rltrace.testing.capture_spans`), shut down after the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rltrace.testing import CapturedSpans, capture_spans

__all__ = ["rltrace_capture"]


@pytest.fixture
def rltrace_capture(tmp_path: Path) -> Iterator[CapturedSpans]:
    """rltrace configured into ``tmp_path`` with spans captured in memory."""
    with capture_spans(tmp_path) as cap:
        yield cap
