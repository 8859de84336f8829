"""Session counts that outlive their process: a small file-backed shared page.

A Ray actor killed with ``ray.kill`` (SIGKILL) or an OOM kill runs no handler, so what it had
not exported is lost; these counts say how much.  The session registry counts each session
registered and finalized, the session record writer each record on disk, as plain stores into
a shared memory map of the file: the kernel keeps the stores of a killed process, so the parent
(the Ray driver) reads exact figures from the file afterwards.  One store per session event,
done under the lock that already guards it; processes that do not ask for a tally pay one
``is None`` check.  A last slot, ``exited``, is set once the process has flushed at its
exit: an actor that ended gracefully (its handles went out of scope, ``exit_actor``) is told
apart from one that was killed.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from rltrace.logdir.files import GuardedDirs, open_no_follow

__all__ = ["EXITED", "FIELDS", "FINALIZED", "REGISTERED", "WRITTEN", "SessionTally",
           "read_tally"]

#: the slots, in order (int64 each)
FIELDS = ("registered", "finalized", "written", "exited")
REGISTERED, FINALIZED, WRITTEN, EXITED = range(len(FIELDS))
_SIZE = 8 * len(FIELDS)


class SessionTally:
    """This process's counts, in ``path`` (created, or truncated, at zero)."""

    def __init__(self, path: str | os.PathLike[str], guard: GuardedDirs | None = None) -> None:
        self.path = Path(path)
        # the folder made and checked, the file never through a link (another user's log dir)
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644, guard=guard)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)  # the map keeps the file
        #: the writable slots (``view[REGISTERED] += 1``): what the registry and writer hold
        self.view: memoryview = memoryview(self._map).cast("q")

    def counts(self) -> dict[str, int]:
        """The counts now, by name."""
        return dict(zip(FIELDS, self.view.tolist(), strict=True))


def read_tally(path: str | os.PathLike[str]) -> dict[str, int] | None:
    """Counts another process left in ``path`` (None when the file is missing or short), with
    ``unwritten``: sessions registered there whose record never reached the file."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if len(data) < _SIZE:
        return None
    values = memoryview(data[:_SIZE]).cast("q").tolist()
    out = dict(zip(FIELDS, values, strict=True))
    out["unwritten"] = max(0, out["registered"] - out["written"])
    return out
