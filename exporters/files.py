"""Append-only JSON-lines files shared by the exporters."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO


def open_for_append(path: Path) -> BinaryIO:
    """Open ``path`` for appending whole lines, creating its directory.

    If a previous writer crashed mid-line, the cut-off fragment is ended with a newline first,
    so the first new line stays valid JSON (readers skip the fragment and say so).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "ab")  # noqa: SIM115 - the caller keeps it open
    try:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with open(path, "rb") as rd:
                rd.seek(size - 1)
                if rd.read(1) != b"\n":
                    fh.write(b"\n")
                    fh.flush()
    except OSError:
        fh.close()
        raise
    return fh
