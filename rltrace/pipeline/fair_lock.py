"""A reentrant lock granted in arrival order, for the pipeline's flush/close path.

``threading.RLock`` is not fair: a thread that releases it and asks again at once (a flushing
loop, the exporter thread under load) usually gets it back before a waiter wakes, so a
``configure()`` or ``shutdown()`` waiting to close the pipeline can starve for as long as the
others keep flushing.  :class:`FairRLock` hands the lock to the longest waiter on release, so
a waiter gets it after at most the cycles queued ahead of it.  Only the flush path uses it;
the recording hot path takes no lock.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

_get_ident = threading.get_ident


class FairRLock:
    """Reentrant lock with FIFO hand-off (see module docstring); the ``RLock`` interface."""

    __slots__ = ("_depth", "_inside", "_mutex", "_owner", "_waiters")

    def __init__(self) -> None:
        # reentrant, and ``_inside`` marks its holder: a signal handler running on a thread
        # interrupted in here must see the lock as held (``held_by_me``) and stay out
        self._mutex = threading.RLock()
        self._inside: int | None = None
        self._owner: int | None = None
        self._depth = 0
        self._waiters: deque[tuple[int, Any]] = deque()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (again, if this thread holds it); False if not granted in ``timeout``.

        An exception while queued (``KeyboardInterrupt`` from Ctrl-C) leaves the queue, and a
        lock handed over meanwhile is passed on: it never goes to a thread that stopped
        waiting for it."""
        me = _get_ident()
        entry = None
        try:
            with self._mutex:
                self._inside = me
                try:
                    if self._owner == me:
                        self._depth += 1
                        return True
                    if self._owner is None and not self._waiters:
                        self._owner, self._depth = me, 1
                        return True
                    if not blocking:
                        return False
                    gate = threading.Lock()
                    gate.acquire()
                    entry = (me, gate)
                    self._waiters.append(entry)
                finally:
                    self._inside = None
            if gate.acquire(timeout=timeout) if timeout is not None and timeout >= 0 \
                    else gate.acquire():
                return True  # the releaser made this thread the owner
        except BaseException:
            if entry is not None:
                self._leave(entry)
            raise
        with self._mutex:
            try:
                self._waiters.remove(entry)
            except ValueError:
                return True  # handed over between the timeout and here: ours after all
            return False

    def _leave(self, entry: tuple[int, Any]) -> None:
        """A waiter that stops waiting: out of the queue, or, if the lock was handed to it
        already, released to the next one."""
        with self._mutex:
            try:
                self._waiters.remove(entry)
            except ValueError:
                self.release()

    def release(self) -> None:
        """Release one level; the last one hands the lock to the longest waiter."""
        me = _get_ident()
        with self._mutex:
            self._inside = me
            try:
                if self._owner != me:
                    raise RuntimeError("cannot release un-acquired lock")
                self._depth -= 1
                if self._depth:
                    return
                if self._waiters:
                    owner, gate = self._waiters.popleft()
                    self._owner, self._depth = owner, 1
                    gate.release()
                else:
                    self._owner = None
            finally:
                self._inside = None

    def held_by_me(self) -> bool:
        """True when the calling thread holds the lock, is inside acquiring or releasing it, or
        is queued for it (a signal handler interrupting any of these must not take it)."""
        me = _get_ident()
        return self._owner == me or self._inside == me or any(
            w[0] == me for w in list(self._waiters))

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
