"""SIGTERM: write every finished record to disk on the main thread, then let the previous
disposition act (by default: terminate, by the same signal).

The handler runs on the main thread, so the user's main-thread code (an asyncio loop, a training
loop) is paused while the records are written.  If the signal interrupts rltrace itself holding
a lock on the main thread (an explicit flush, configure), it is deferred and raised again as soon
as that lock is released (:meth:`TerminationHandler.resume_pending`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from rltrace.recording.recorder import internal_error


class TerminationHandler:
    """Installs the SIGTERM handler once, and defers a signal that meets one of rltrace's locks.

    ``drain(final)`` writes everything (``final``: the process ends right after it returns);
    ``holds_lock()`` says whether the main thread holds one of the locks ``drain`` needs.
    """

    def __init__(self, drain: Callable[[bool], None], holds_lock: Callable[[], bool]) -> None:
        self._drain = drain
        self._holds_lock = holds_lock
        self._installed = False
        #: a termination signal that arrived while the main thread held one of rltrace's locks
        self.pending: list[int] = []

    def install(self) -> None:
        """Install the handler (on the main thread only; once per process)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._holds_lock():
                if not self.pending:
                    self.pending.append(signum)
                return
            final = not callable(previous) and previous != signal.SIG_IGN
            try:
                self._drain(final)
            except Exception as exc:  # pragma: no cover - defensive
                internal_error("SIGTERM flush", exc)
            if callable(previous):
                previous(signum, frame)  # e.g. a launcher's handler; tracing stays on until exit
            elif final:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)  # the default action, with the records on disk

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
            self._installed = True
        except (ValueError, OSError):
            pass

    def resume_pending(self) -> None:
        """Re-raise a deferred termination signal once the main thread left rltrace's locks."""
        if not self.pending or threading.current_thread() is not threading.main_thread() \
                or self._holds_lock():
            return
        signum = self.pending.pop()
        signal.raise_signal(signum)  # handled at the next bytecode, now at a safe point

    def after_fork_in_child(self) -> None:
        """In a forked child: a signal deferred in the parent is the parent's."""
        self.pending.clear()
