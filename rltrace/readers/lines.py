"""Lines of a file in bounded memory: a line longer than the cap is discarded in chunks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

#: the longest line kept (bytes, with its newline); longer ones are skipped and reported
LINE_CAP = 32 << 20
#: bytes read at a time while discarding the rest of an over-long line
DISCARD_CHUNK = 1 << 20


class Oversize(int):
    """An over-long line in place of its bytes: its length (it was read in chunks and discarded)."""


def iter_lines(fh: BinaryIO, cap: int | None = None) -> Iterator[bytes | Oversize]:
    """Every line of ``fh`` (with its newline, the last one maybe without): as bytes when it is at
    most ``cap`` bytes long (default: ``LINE_CAP`` as it is now), else as :class:`Oversize` (its
    length), never held whole in memory."""
    readline = fh.readline
    limit = (LINE_CAP if cap is None else cap) + 1
    while True:
        raw = readline(limit)
        if len(raw) < limit:
            if not raw:
                return
            yield raw
            continue
        yield Oversize(len(raw) + (0 if raw.endswith(b"\n") else _discard_line(fh)))


def _discard_line(fh: BinaryIO) -> int:
    """Read and drop the rest of the current line; return how many bytes that was."""
    n = 0
    while True:
        chunk = fh.readline(DISCARD_CHUNK)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return n
