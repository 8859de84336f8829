"""Perfetto's native trace format (``TracePacket``/``TrackEvent`` protobuf, from the ``perfetto``
package's own protos): the run as RL people think of it — rank, task, session, turn and phase
on named tracks, arrows from each task to its sessions and from each accepted session to the
train step that consumed it, and counter tracks — written by ``rltrace convert`` (an output
ending in ``.pftrace``, or ``--format perfetto``) and by ``rltrace demo``.

:mod:`.plan` (which step consumed which session: a first pass), :mod:`.build` (the tracks and
events, one pass per file), :mod:`.sessions` (a session's subtree), :mod:`.lanes` (nesting
order) and :mod:`.packets` (the protobuf, streamed in batches).  Needs the ``perfetto`` extra
(``pip install 'rltrace[perfetto]'``).
"""

from __future__ import annotations

from .build import NativeTrace
from .packets import PacketWriter
from .plan import Plan, plan_arrows

__all__ = ["NativeTrace", "PacketWriter", "Plan", "plan_arrows"]
