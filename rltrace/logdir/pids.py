"""Whether a process still runs: files named after their writer's pid (flight recorder rings,
secrets folders off Linux) outlive a killed writer and are cleaned up by the next run."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (or cannot be told apart from running: another user's); never
    for a pid no process can have (0 and below, which ``kill`` reads as a process group, or
    above Linux's largest, 2**22)."""
    if type(pid) is not int or not 0 < pid <= 1 << 22:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
