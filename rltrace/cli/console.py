"""The CLI's ``rich`` console: a reader that goes away (``rltrace report ... | head``) ends the
command quietly with status 0, as for the rest of the CLI, rather than rich's status 1."""

from __future__ import annotations

from rich.console import Console


class CliConsole(Console):
    """A ``rich`` console whose closed pipe reaches :func:`rltrace.cli.main.main` as the
    ``BrokenPipeError`` it is (answered there with status 0)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the output went away")
