"""The ``rltrace`` command: ``demo``, ``report``, ``convert``, ``top`` (:mod:`.main`), each in a
room of its own here; the runtime does not import this package."""

from rltrace.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
